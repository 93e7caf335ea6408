"""The fuzzer's cases and its client of the child process (tests/fuzz_worker.py).

A case is a seed file (tests/fuzz_seeds.py), a short list of mutations and a loader. Hypothesis
draws the mutations (seeded, so every run draws the same cases, and it shrinks a failing case
to a small one); this module applies them. Besides blind ones (bit flips, bytes set, runs
inserted and deleted, truncation, a 1-8 byte integer overwritten with a boundary value), each
format gets the edits that reach past its integrity checks: a zip member rewritten and re-zipped
with a valid CRC, a pickle's opcode swapped for another (in data.pkl or a legacy stream), a safetensors header edited as JSON and
re-framed, PNG chunks given valid CRCs again, and image headers given other sizes.
"""
from __future__ import annotations

import io
import json
import os
import pickletools
import select
import struct
import subprocess
import sys
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from fuzz_seeds import SEED_LOADERS, SEEDS

ROOT = Path(__file__).resolve().parents[1]
# Integers at the edges of the widths file formats use for sizes, counts and offsets.
BOUNDARY_INTS = (0, 1, 2, 7, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53, 2**63 - 1,
                 2**64 - 1, -1, -2**31, 3_000_000_000, 9500, 40_000)
JSON_VALUES = ("5", "[1e400]", "null", "{}", "[]", '"x"', '{"nc": 1000000000}', '{"num_classes": -1}',
               '{"bogus": 1}', '[{"a": 1}]', '{"0": "a"}', "1e400", "true", '{"nc": "2"}', "[[[[[[[[[[]]]]]]]]]]")

OPCODES = tuple(sorted({op.code.encode("latin-1") for op in pickletools.opcodes}))

_position = st.floats(0, 1, exclude_max=True)
MUTATIONS = st.one_of(
    st.tuples(st.just("flip"), _position, st.integers(0, 7)),
    st.tuples(st.just("byte"), _position, st.integers(0, 255)),
    st.tuples(st.just("truncate"), _position),
    st.tuples(st.just("insert"), _position, st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("delete"), _position, st.integers(1, 256)),
    st.tuples(st.just("int"), _position, st.sampled_from([1, 2, 4, 8]), st.sampled_from(["<", ">"]),
              st.sampled_from(BOUNDARY_INTS)),
    st.tuples(st.just("duplicate"), _position, _position, st.integers(1, 512)),
)
# Edits that know the format (applied first, then the blind ones).
FORMAT_EDITS = st.one_of(
    st.none(),
    st.tuples(st.just("member"), st.integers(0, 15), st.lists(MUTATIONS, min_size=1, max_size=3)),
    st.tuples(st.just("header"), st.integers(0, 31), st.sampled_from(["dtype", "shape", "data_offsets", "meta"]),
              st.one_of(st.sampled_from(BOUNDARY_INTS), st.sampled_from(JSON_VALUES))),
    st.tuples(st.just("size"), st.sampled_from(BOUNDARY_INTS + (1, 3000, 9000, 100_000)),
              st.sampled_from(BOUNDARY_INTS + (1, 4096, 9500, 100_000))),
    st.tuples(st.just("recrc"),),
    st.tuples(st.just("opcode"), st.integers(0, 2**16), st.sampled_from(OPCODES)),
)


@dataclass(frozen=True)
class Case:
    seed: str
    loader: str
    edit: Any
    mutations: tuple
    keep: int = 0  # the blind mutations spare this many leading bytes (a signature, a length)

    def data(self) -> bytes:
        data = (SEEDS / self.seed).read_bytes()
        if self.edit is not None:
            data = format_edit(self.seed, data, self.edit)
        head, body = data[:self.keep], data[self.keep:]
        for m in self.mutations:
            body = mutate(body, m)
        return head + body


@st.composite
def cases(draw: st.DrawFn, seeds: tuple[str, ...] = tuple(SEED_LOADERS)) -> Case:
    seed = draw(st.sampled_from(seeds))
    loader = draw(st.sampled_from(SEED_LOADERS[seed]))
    edit = draw(FORMAT_EDITS)
    mutations = draw(st.lists(MUTATIONS, min_size=0 if edit else 1, max_size=4))
    # Most cases keep the signature (or safetensors' header length), so that mutations reach the
    # parsers behind it rather than only the "what is this file" check.
    keep = draw(st.sampled_from([0, 8, 8, 16]))
    return Case(seed, loader, edit, tuple(mutations), keep)


# --- blind mutations ---------------------------------------------------------------------------

def mutate(data: bytes, m: tuple) -> bytes:
    kind, at = m[0], int(m[1] * len(data)) if data else 0
    if kind == "flip" and data:
        return data[:at] + bytes([data[at] ^ (1 << m[2])]) + data[at + 1:]
    if kind == "byte" and data:
        return data[:at] + bytes([m[2]]) + data[at + 1:]
    if kind == "truncate":
        return data[:at]
    if kind == "insert":
        return data[:at] + m[2] + data[at:]
    if kind == "delete":
        return data[:at] + data[at + m[2]:]
    if kind == "int":
        width, order, value = m[2], m[3], m[4]
        raw = (value % (1 << (8 * width))).to_bytes(width, "little" if order == "<" else "big")
        return data[:at] + raw + data[at + width:]
    if kind == "duplicate":  # a run of the file copied elsewhere (repeated chunks, records, opcodes)
        src = int(m[2] * len(data)) if data else 0
        return data[:at] + data[src:src + m[3]] + data[at:]
    return data


# --- edits that know the format ----------------------------------------------------------------

def format_edit(seed: str, data: bytes, edit: tuple) -> bytes:
    kind = edit[0]
    if kind == "opcode" and seed.endswith(".pt"):  # in data.pkl of a zip, in the stream of a legacy file
        if data[:4] == b"PK\x03\x04":
            return _rewrite_member(data, 0, [], lambda pkl: _swap_opcode(pkl, edit[1], edit[2]))
        return _swap_opcode(data, edit[1], edit[2])
    if kind == "member" and data[:4] == b"PK\x03\x04":
        return _rewrite_member(data, edit[1], edit[2])
    if kind == "member" and seed.endswith(".pt"):  # a legacy file is one pickle stream after another
        for m in edit[2]:
            data = mutate(data, m)
        return data
    if kind == "header" and seed.endswith(".safetensors"):
        return _edit_safetensors(data, edit[1], edit[2], edit[3])
    if kind == "size":
        return _set_size(seed, data, edit[1], edit[2])
    if kind == "recrc" or (kind == "member" and seed.endswith(".png")):
        if kind == "member":
            for m in edit[2]:
                data = mutate(data, m)
        return _png_recrc(data) if seed.endswith(".png") else data
    return data


def _swap_opcode(pkl: bytes, k: int, code: bytes) -> bytes:
    """The ``k``-th opcode (counted over every pickle in the stream) replaced by ``code``: the
    arguments stay, so the machine reads them as something else."""
    stream, starts = io.BytesIO(pkl), []
    while stream.tell() < len(pkl) and len(starts) < 100_000:
        try:
            starts += [pos for _, _, pos in pickletools.genops(stream)]
        except Exception:  # noqa: BLE001  (the raw storages after a legacy file's pickles)
            break
    if not starts:
        return pkl
    at = starts[k % len(starts)]
    return pkl[:at] + code + pkl[at + 1:]


def _rewrite_member(data: bytes, which: int, mutations: list, change: Any = None) -> bytes:
    """The archive again with one member's bytes mutated (``change``: a function of them; which
    0: data.pkl) and a valid CRC (deflated sometimes, so the inflating path is exercised too)."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        members = [(info, zf.read(info)) for info in zf.infolist()]
    pickles = [i for i, (info, _) in enumerate(members) if info.filename.endswith("/data.pkl")]
    index = pickles[0] if which % 4 == 0 and pickles else which % len(members)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zw:
        for i, (info, body) in enumerate(members):
            if i == index:
                for m in mutations:
                    body = mutate(body, m)
                body = change(body) if change else body
            method = zipfile.ZIP_DEFLATED if (which >= 8 and i == index) else zipfile.ZIP_STORED
            zw.writestr(zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0)), body, compress_type=method)
    return out.getvalue()


def _edit_safetensors(data: bytes, which: int, field: str, value: Any) -> bytes:
    """One field of one entry (or one metadata value) set to ``value``; the header re-framed."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    names = [k for k in header if k != "__metadata__"]
    if field == "meta":
        meta = header.setdefault("__metadata__", {})
        keys = sorted(meta) + ["config", "names", "format", "model", "fold_bn"]
        meta[keys[which % len(keys)]] = value if isinstance(value, str) else str(value)
    else:
        entry = header[names[which % len(names)]]
        if isinstance(value, str):
            value = json.loads(value)
        elif field == "shape":
            value = (entry["shape"] or [1])[:-1] + [value] if which % 3 else [0, value]
        elif field == "data_offsets":
            value = [entry["data_offsets"][0], value] if which % 2 else [value, entry["data_offsets"][1]]
        entry[field] = value
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + body


def _png_recrc(data: bytes) -> bytes:
    """Every PNG chunk's CRC made right again, so Pillow reads on past a mutated chunk."""
    out, at = bytearray(data[:8]), 8
    while at + 8 <= len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        end = at + 8 + length
        if end + 4 > len(data):
            out += data[at:]
            return bytes(out)
        out += data[at:end] + struct.pack(">I", zlib.crc32(data[at + 4:end]))
        at = end + 4
    out += data[at:]
    return bytes(out)


def _set_size(seed: str, data: bytes, width: int, height: int) -> bytes:
    """The image's header claims ``width`` x ``height`` (where the format keeps them)."""
    w32, h32 = width % 2**32, height % 2**32
    w16, h16 = width % 2**16, height % 2**16
    if seed.endswith(".png"):
        return _png_recrc(data[:16] + struct.pack(">II", w32, h32) + data[24:])
    if seed.endswith(".gif"):  # the logical screen, then the first image descriptor
        data = data[:6] + struct.pack("<HH", w16, h16) + data[10:]
        at = data.find(b"\x2c", 13)
        return data[:at + 5] + struct.pack("<HH", w16, h16) + data[at + 9:] if at > 0 else data
    if seed.endswith(".jpg"):
        for marker in (b"\xff\xc0", b"\xff\xc2"):
            at = data.find(marker)
            if at > 0:
                return data[:at + 5] + struct.pack(">HH", h16, w16) + data[at + 9:]
    if seed.endswith(".tif"):  # the first IFD's ImageWidth (256) and ImageLength (257)
        order = "<" if data[:2] == b"II" else ">"
        (ifd,) = struct.unpack(order + "I", data[4:8])
        out = bytearray(data)
        if ifd + 2 <= len(data):
            (count,) = struct.unpack(order + "H", data[ifd:ifd + 2])
            for i in range(min(count, 64)):
                at = ifd + 2 + 12 * i
                if at + 12 > len(data):
                    break
                tag, typ = struct.unpack(order + "HH", data[at:at + 4])
                if tag in (256, 257):
                    value = w32 if tag == 256 else h32
                    out[at + 2:at + 12] = struct.pack(order + "HII", 4, 1, value)  # LONG
        return bytes(out)
    if seed.endswith(".webp") and data[12:16] == b"VP8L":  # 14-bit width-1, height-1
        bits = ((w16 - 1) & 0x3FFF) | (((h16 - 1) & 0x3FFF) << 14) | (data[21 + 3] >> 4 << 28)
        return data[:21] + struct.pack("<I", bits) + data[25:]
    return data


# --- the child process -------------------------------------------------------------------------

class Worker:
    """One tests/fuzz_worker.py process; restarted when a case kills it."""

    def __init__(self, env: dict[str, str] | None = None, timeout: float = 60.0) -> None:
        self.env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", **(env or {})}
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None

    def _start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fuzz_worker.py")], cwd=ROOT,
                                     env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        ready = self._answer()
        assert ready is not None and ready.get("ready"), "the fuzz worker did not start"

    def _answer(self) -> dict | None:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        line = self.proc.stdout.readline() if ready else ""
        return json.loads(line) if line else None

    def load(self, loader: str, path: Path) -> dict:
        """How loading ``path`` with ``loader`` ended: the worker's answer, or the process's end
        (``crash``: it died, ``timeout``: no answer in time; it is restarted for the next case)."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"loader": loader, "path": str(path)}) + "\n")
        self.proc.stdin.flush()
        answer = self._answer()
        if answer is None:
            timed_out = self.proc.poll() is None
            self.close()
            return {"outcome": "timeout" if timed_out else "crash", "message": f"exit {self.proc.returncode}",
                    "growth_mb": float("nan")}
        return answer

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # our own child, by its handle
            self.proc.wait()


def breach(path: Path, result: dict, bound_mb: float) -> str | None:
    """What breaks the contract in one result (None: nothing): the load ends normally or in an
    MlxnetError of one line that names the file, within ``bound_mb`` of peak memory growth."""
    outcome, message = result["outcome"], result["message"]
    if outcome not in ("loaded", "error"):
        return f"{outcome}: {message[:300]}"
    if outcome == "error":
        if "\n" in message:
            return f"a message of {len(message.splitlines())} lines: {message[:200]!r}"
        if str(path) not in message:
            return f"a message not naming the file: {message[:200]!r}"
    if not result["growth_mb"] <= bound_mb:
        return f"peak memory grew {result['growth_mb']:.0f} MB, over the {bound_mb:.0f} MB bound"
    return None
