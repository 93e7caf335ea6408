"""Hostile PyTorch checkpoints (memory bombs), each built by hand from pickle opcodes, zip
records and struct: refused in one clear line naming the file, while the memory the load takes
stays bounded (measured in a child process under an address-space limit); honest checkpoints,
views and shared storages included, still load with the right values."""
from __future__ import annotations

import collections
import datetime
import io
import json
import os
import pickletools
import re
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path
from typing import Callable

import mlx.core as mx
import numpy as np
import pytest
import torch

from mlxnet.weights import read_torch_checkpoint

ROOT = Path(__file__).resolve().parents[1]
GiB = 1 << 30
MAX_GROWTH_MB = 200  # peak RSS growth allowed for any hostile load; the bombs declare GBs

# --- pickle opcodes, by hand -----------------------------------------------------------------


def glob(module: str, name: str) -> bytes:
    return b"c" + f"{module}\n{name}\n".encode()


def num(n: int) -> bytes:
    if -2**31 <= n < 2**31:
        return b"J" + struct.pack("<i", n)
    data = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(data)]) + data  # LONG1


def item(x: int | bytes) -> bytes:
    return x if isinstance(x, bytes) else num(x)


def text(s: str) -> bytes:
    data = s.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def blob(b: bytes) -> bytes:
    return b"B" + struct.pack("<I", len(b)) + b


def tup(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


def call(fn: bytes, *args: bytes) -> bytes:
    return fn + tup(*args) + b"R"


def dict_of(**items: bytes) -> bytes:
    return b"}(" + b"".join(text(k) + v for k, v in items.items()) + b"u"


def list_of(items: list[bytes]) -> bytes:
    return b"](" + b"".join(items) + b"e"


FALSE, TRUE, FLOAT4 = b"\x89", b"\x88", b"G" + struct.pack(">d", 4.0)


def pickle_of(body: bytes, proto: int = 2) -> bytes:
    return bytes([0x80, proto]) + body + b"."


def storage(key: str, numel: int, kind: str = "FloatStorage") -> bytes:
    return tup(text("storage"), glob("torch", kind), text(key), text("cpu"), num(numel)) + b"Q"  # BINPERSID


def tensor(stor: bytes, offset: int | bytes, size: tuple, stride: tuple) -> bytes:
    return call(glob("torch._utils", "_rebuild_tensor_v2"), stor, item(offset), tup(*map(item, size)),
                tup(*map(item, stride)), FALSE, call(glob("collections", "OrderedDict")))


def np_dtype(code: str) -> bytes:
    return call(glob("numpy", "dtype"), text(code), FALSE, TRUE)


def np_array(shape: tuple, dtype: bytes, data: bytes) -> bytes:
    """numpy's own pickle layout: _reconstruct(ndarray, (0,), b'b') then BUILD with the state."""
    empty = call(glob("numpy._core.multiarray", "_reconstruct"), glob("numpy", "ndarray"), tup(num(0)), blob(b"b"))
    return empty + tup(num(1), tup(*map(num, shape)), dtype, FALSE, data) + b"b"


def arange_array(n: int) -> bytes:
    return np_array((n,), np_dtype("f4"), blob(np.arange(n, dtype=np.float32).tobytes()))


# --- zip archives, by hand -------------------------------------------------------------------


def zip_checkpoint(path: Path, pkl: bytes, storages: dict[str, bytes] | None = None) -> Path:
    """The layout torch.save writes (members stored), for a hand-made pickle."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("x/data.pkl", pkl)
        zf.writestr("x/byteorder", "little")
        for key, data in (storages or {}).items():
            zf.writestr(f"x/data/{key}", data)
    return path


def local_header(name: bytes, method: int, crc: int, csize: int, size: int) -> tuple[bytes, bytes]:
    zip64 = max(size, csize) >= 0xFFFFFFFF
    extra = struct.pack("<HHQQ", 1, 16, size, csize) if zip64 else b""
    fs, cs = (0xFFFFFFFF, 0xFFFFFFFF) if zip64 else (size, csize)
    head = struct.pack("<4s5H3L2H", b"PK\x03\x04", 45, 0, method, 0, 33, crc, cs, fs, len(name), len(extra))
    return head + name + extra, extra


def raw_zip(path: Path, entries: list[tuple[str, int, bytes, int, int]]) -> Path:
    """A zip archive from (name, method, payload, declared size, crc) records, the declared size
    and method free to lie: what zipfile would refuse to write."""
    out, central = bytearray(), bytearray()
    for name, method, payload, size, crc in entries:
        n = name.encode()
        offset = len(out)
        head, extra = local_header(n, method, crc, len(payload), size)
        out += head + payload
        fs, cs = (0xFFFFFFFF, 0xFFFFFFFF) if extra else (size, len(payload))
        central += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 45, 45, 0, method, 0, 33, crc, cs, fs,
                               len(n), len(extra), 0, 0, 0, 0, offset) + n + extra
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(entries), len(entries), len(central), len(out), 0)
    path.write_bytes(bytes(out + central + end))
    return path


def deflated_zeros(nbytes: int) -> bytes:
    """A raw deflate stream of ``nbytes`` zeros (a multiple of 16 MiB), made in milliseconds:
    one fully flushed block of 16 MiB zeros decodes the same wherever it stands, so repeat it."""
    chunk = 1 << 24
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = c.compress(bytes(chunk)) + c.flush(zlib.Z_FULL_FLUSH)
    return block * (nbytes // chunk) + b"\x03\x00"  # then an empty final block


def float_tensor_pickle(numel: int) -> bytes:
    return pickle_of(dict_of(w=tensor(storage("0", numel), 0, (numel,), (1,))))


def view_checkpoint(path: Path, offset: int | bytes, size: tuple, stride: tuple, numel: int = 16) -> Path:
    pkl = pickle_of(dict_of(w=tensor(storage("0", numel), offset, size, stride)))
    return zip_checkpoint(path, pkl, {"0": bytes(4 * numel)})


# --- the hostile files ------------------------------------------------------------------------

def raw_pickle(body: bytes, proto: int = 2) -> Callable[[Path], Path]:
    """A bare pickle: read as the legacy format, whose first header pickle runs it."""
    def build(path: Path) -> Path:
        path.write_bytes(pickle_of(body, proto))
        return path
    return build


def declared_length(opcode: bytes) -> Callable[[Path], Path]:
    return raw_pickle(opcode + struct.pack("<Q", 3 * GiB) + b"x", proto=5)


def deflate_member(declared: int, stream_bytes: int, numel: int) -> Callable[[Path], Path]:
    """data/0 deflated: a stream of ``stream_bytes`` zeros whose header says ``declared``, for a
    pickle whose storage holds ``numel`` floats."""
    def build(path: Path) -> Path:
        pkl = float_tensor_pickle(numel)
        return raw_zip(path, [("x/data.pkl", 0, pkl, len(pkl), zlib.crc32(pkl)),
                              ("x/data/0", 8, deflated_zeros(stream_bytes), declared, 0)])
    return build


def overlapping_stored(path: Path, count: int = 100, payload_mb: int = 4) -> Path:
    """``count`` stored members nested inside each other (each one's data holds the next one's
    header and data), so that a file of ~4 MB names 100 storages of ~4 MB each."""
    payload = bytes(range(256)) * (payload_mb << 12)
    names = [f"x/data/{i}".encode() for i in range(count)]
    region, crc = payload, zlib.crc32(payload)
    sizes, crcs, headers = [0] * count, [0] * count, [b""] * count
    for i in reversed(range(count)):
        sizes[i], crcs[i] = len(region), crc
        headers[i], _ = local_header(names[i], 0, crc, len(region), len(region))
        crc = zlib.crc32(region, zlib.crc32(headers[i]))
        region = headers[i] + region
    pkl = pickle_of(dict_of(**{str(i): tensor(storage(str(i), sizes[i], "ByteStorage"), 0, (sizes[i],), (1,))
                               for i in range(count)}))
    pkl_head, _ = local_header(b"x/data.pkl", 0, zlib.crc32(pkl), len(pkl), len(pkl))
    out = bytearray(pkl_head + pkl)
    central = bytearray()
    records = [(b"x/data.pkl", zlib.crc32(pkl), len(pkl), 0)]
    offset = len(out)
    for i in range(count):
        records.append((names[i], crcs[i], sizes[i], offset))
        offset += len(headers[i])
    out += region
    for n, crc, size, off in records:
        central += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 0, 0, 33, crc, size, size,
                               len(n), 0, 0, 0, 0, 0, off) + n
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(records), len(records), len(central), len(out), 0)
    path.write_bytes(bytes(out + central + end))
    return path


def many_views(path: Path, identical: bool) -> Path:
    numel = 1 << 20  # a 4 MiB storage
    views = [tensor(storage("0", numel), 0 if identical else k, (numel - (0 if identical else k),), (1,))
             for k in range(1000)]
    return zip_checkpoint(path, pickle_of(list_of(views)), {"0": bytes(4 * numel)})


def legacy_with_count(count: int) -> Callable[[Path], Path]:
    """A real legacy torch.save file whose storage element count is rewritten."""
    def build(path: Path) -> Path:
        torch.save({"w": torch.ones(4)}, path, _use_new_zipfile_serialization=False)
        data = bytearray(path.read_bytes())
        f = io.BytesIO(bytes(data))
        for _ in range(5):  # magic, protocol, sys_info, the pickle, the storage keys
            for op, _arg, _pos in pickletools.genops(f):
                if op.name == "STOP":
                    break
        pos = f.tell()
        assert struct.unpack_from("<q", data, pos)[0] == 4
        data[pos:pos + 8] = struct.pack("<q", count)
        path.write_bytes(bytes(data))
        return path
    return build


def zip_builder(make_pkl: Callable[[], bytes], storages: dict[str, bytes] | None = None) -> Callable[[Path], Path]:
    return lambda path: zip_checkpoint(path, make_pkl(), storages)


TRUNCATED = r"truncated or corrupt PyTorch checkpoint \("
RECONSTRUCT = r"refusing to call numpy\.core\.multiarray\._reconstruct .*reconstruct an empty array"
CASES: dict[str, tuple[Callable[[Path], Path], str | None]] = {
    # 1. allow-listed constructors asked for huge sizes (a 33-byte pickle -> 3 GiB before)
    "bytearray-of-a-size": (raw_pickle(call(glob("builtins", "bytearray"), num(3 * GiB))),
                            r"refusing to call builtins\.bytearray .*only bytes"),
    "ndarray-called": (raw_pickle(call(glob("numpy", "ndarray"), tup(num(100000), num(100000)))),
                       r"refusing to call numpy\.ndarray from the pickle \(it is not callable\)"),
    "reconstruct-huge": (raw_pickle(call(glob("numpy._core.multiarray", "_reconstruct"), glob("numpy", "ndarray"),
                                         tup(num(100000), num(100000)), blob(b"b"))), RECONSTRUCT),
    "reconstruct-huge-old-name": (raw_pickle(call(glob("numpy.core.multiarray", "_reconstruct"), glob("numpy", "ndarray"),
                                                  tup(num(100000), num(100000)), blob(b"b"))), RECONSTRUCT),
    "object-array-state": (raw_pickle(np_array((10**9,), np_dtype("O8"), list_of([b"N"]))),
                           r"object array of shape \(1000000000,\) needs 1000000000 items, the pickle holds 1 items"),
    "raw-array-state": (raw_pickle(np_array((100000, 100000), np_dtype("f4"), blob(b"abc"))),
                        r"shape \(100000, 100000\) and dtype 'float32' needs 40000000000 bytes, the pickle holds 3"),
    "subarray-dtype": (raw_pickle(np_dtype("(100000,100000)f8")), r"refusing to call numpy\.dtype .*not a type code"),
    "scalar-of-huge-dtype": (raw_pickle(call(glob("numpy._core.multiarray", "scalar"), np_dtype("V1000000000"), blob(b"x"))),
                             r"numpy scalar of dtype '\|V1000000000' needs 1000000000 bytes, the pickle holds 1"),
    # iterating an array into Python objects: ~100 bytes per element of a 16 MB array
    "set-of-array": (raw_pickle(call(glob("builtins", "set"), arange_array(4 << 20))),
                     r"refusing to call builtins\.set .*not a list"),
    "frozenset-of-array": (raw_pickle(call(glob("builtins", "frozenset"), arange_array(1000))),
                           r"refusing to call builtins\.frozenset .*not a list"),
    "ordereddict-of-array": (raw_pickle(call(glob("collections", "OrderedDict"), arange_array(1000))),
                             r"refusing to call collections\.OrderedDict .*only a dict or a list of pairs"),
    "torch-size-of-array": (raw_pickle(call(glob("torch", "Size"), arange_array(1000))),
                            r"refusing to call torch\.Size .*not a tuple of ints"),
    "reduce-args-array": (raw_pickle(glob("builtins", "complex") + arange_array(1000) + b"R"),
                          r"REDUCE arguments are a ndarray, not a tuple"),
    # the unpickler's own allocations, sized by an opcode's declared length or memo index
    "binbytes8": (declared_length(b"\x8e"), TRUNCATED + r"3221225472 bytes are declared at byte 11 but only 2 remain"),
    "bytearray8": (declared_length(b"\x96"), TRUNCATED + r"3221225472 bytes are declared at byte 11 but only 2 remain"),
    "binunicode8": (declared_length(b"\x8d"), TRUNCATED + r"3221225472 bytes are declared"),
    "frame": (declared_length(b"\x95"), TRUNCATED + r"3221225472 bytes are declared"),
    "long4": (raw_pickle(b"\x8b" + struct.pack("<i", 2**31 - 1) + b"x"),
              TRUNCATED + r"2147483647 bytes are declared"),
    "memo-index": (raw_pickle(b"Nr" + struct.pack("<I", 200_000_000)), r"not a checkpoint \(a Python pickle without torch\.save's magic number\)"),  # 3 GB memo array before
    "zip-pickle-binbytes8": (zip_builder(lambda: pickle_of(b"\x8e" + struct.pack("<Q", 3 * GiB) + b"x", 5)),
                             TRUNCATED + r"3221225472 bytes are declared"),
    # 2. compressed storages
    "deflate-member-bigger-than-storage": (deflate_member(GiB, GiB, numel=4),
                                           r"x/data/0 holds 1073741824 bytes but its storage of 4 float32 elements needs 16"),
    "deflate-header-lies-small": (deflate_member(16, GiB, numel=4),
                                  r"x/data/0 decompresses to more than the 16 bytes it declares"),
    "deflate-declared-huge": (deflate_member(5 * GiB, 5 * GiB, numel=5 * GiB // 4),
                              r"x/data/0 inflates \d+ bytes to 5368709120; more than \d+ bytes in all from a \d+-byte archive"),
    "deflate-pickle": (lambda p: raw_zip(p, [("x/data.pkl", 8, deflated_zeros(GiB), GiB, 0)]),
                       r"x/data\.pkl inflates \d+ bytes to 1073741824"),
    "stored-member-bigger-than-storage": (zip_builder(lambda: float_tensor_pickle(4), {"0": bytes(1 << 20)}),
                                          r"x/data/0 holds 1048576 bytes but its storage of 4 float32 elements needs 16"),
    "overlapping-stored-members": (overlapping_stored, r"more than the whole \d+-byte archive \(overlapping entries\)"),
    "bzip2-member": (lambda p: raw_zip(p, [("x/data.pkl", 12, b"BZh9", 10**9, 0)]),
                     r"x/data\.pkl uses zip compression method 12"),
    # 3. strided views
    "stride-0-expansion": (lambda p: view_checkpoint(p, 0, (30000, 30000), (0, 0), numel=1),
                           r"shape \(30000, 30000\).* has 900000000 elements, more than its storage holds"),
    "offset-out-of-bounds": (lambda p: view_checkpoint(p, 100, (4,), (1,)), r"reaches element 103, past the storage's end"),
    "stride-out-of-bounds": (lambda p: view_checkpoint(p, 0, (4,), (1000,)), r"reaches element 3000, past the storage's end"),
    "negative-stride": (lambda p: view_checkpoint(p, 15, (4,), (-1,)), r"tensor stride is -1; expected 0 to 2\*\*63-1"),
    "negative-offset": (lambda p: view_checkpoint(p, -1, (4,), (1,)), r"tensor storage offset is -1; expected 0"),
    "negative-size": (lambda p: view_checkpoint(p, 0, (-4,), (1,)), r"tensor size is -4; expected 0"),
    "float-size": (lambda p: view_checkpoint(p, 0, (FLOAT4,), (1,)), r"tensor size is 4\.0, not an integer"),
    "huge-size-empty": (lambda p: view_checkpoint(p, 0, (0, 2**70), (1, 1)), r"tensor size is <an int of 71 bits>"),
    "absurd-ndim": (lambda p: view_checkpoint(p, 0, (1,) * 100, (1,) * 100), r"tensor size has 100 dimensions"),
    "size-stride-mismatch": (lambda p: view_checkpoint(p, 0, (4,), (1, 1)), r"tensor size \(4,\) and stride \(1, 1\) differ"),
    "repeated-views": (lambda p: many_views(p, identical=False),
                       r"tensors viewing storage x/data/0 would take \d+ bytes, more than 4x its 4194304 bytes"),
    "identical-views": (lambda p: many_views(p, identical=True), None),  # loads: one array, shared
    # 4. legacy format
    "legacy-count-beyond-file": (legacy_with_count(10**9),
                                 TRUNCATED + r"storage \S+ declares 1000000000 elements "
                                 r"of 4 bytes \(4000000000 bytes\) but only 16 bytes remain in the file\)"),
    "legacy-count-negative": (legacy_with_count(-1), r"\(storage \S+ declares -1 elements"),
}

CHILD = r"""
import json, os, resource, sys
sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
import mlxnet  # gives MLX OpenBLAS on Linux
from mlxnet.errors import MlxnetError
from mlxnet.weights.torch_pickle import read_torch_checkpoint
from fuzz_worker import reset_peak, status  # the fuzzer's child measures the same way

limit = status("VmSize") + (1 << 30)  # 1 GiB of address space beyond what the interpreter holds now
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:  # the limit works: an allocation the bombs used to make fails
    bytearray(3 << 30)
    active = False
except MemoryError:
    active = True
print(json.dumps({"case": "__limit__", "active": active}), flush=True)
for case, path in json.loads(sys.argv[1]).items():
    before = status("VmRSS") if reset_peak() else status("VmHWM")
    try:
        read_torch_checkpoint(path)
        kind, msg = None, ""
    except MlxnetError as e:
        kind, msg = "MlxnetError", str(e)
    except BaseException as e:
        kind, msg = type(e).__name__, str(e)[:500]
    growth = (status("VmHWM") - before) / 2**20
    print(json.dumps({"case": case, "type": kind, "msg": msg, "growth_mb": growth}), flush=True)
"""


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], dict[str, dict]]:
    """Build every hostile file, then load them all in one child process (fast) with its address
    space limited to 1 GiB beyond its start, recording each load's error and peak RSS growth."""
    where = tmp_path_factory.mktemp("hostile")
    paths = {case: str(build(where / f"{case}.pt")) for case, (build, _) in CASES.items()}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(paths)], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    results = {r["case"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert proc.returncode == 0 and len(results) == len(CASES) + 1, proc.stderr[-3000:]
    assert results["__limit__"]["active"], "RLIMIT_AS did not take effect in the child"
    return paths, results


def test_hostile_files_are_small(hostile):
    paths, _ = hostile
    sizes = {case: os.path.getsize(p) for case, p in paths.items()}
    assert max(sizes.values()) < 20 << 20, sizes  # the bombs are in what they declare, not in their size
    assert sizes["bytearray-of-a-size"] <= 40 and sizes["stride-0-expansion"] < 1000


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_checkpoint_refused_in_bounded_memory(hostile, case):
    paths, results = hostile
    r, expected = results[case], CASES[case][1]
    assert r["growth_mb"] < MAX_GROWTH_MB, f"{case}: peak RSS grew {r['growth_mb']:.0f} MB"
    if expected is None:
        assert r["type"] is None, r["msg"]
        return
    assert r["type"] == "MlxnetError", f"{case}: {r['type']}: {r['msg']}"
    msg = r["msg"]
    assert msg.startswith(paths[case] + ": ") and "\n" not in msg and len(msg) < 400, msg
    assert re.search(expected, msg), msg


# --- honest checkpoints still load -----------------------------------------------------------

FORMATS = pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])


def as_numpy(t) -> np.ndarray:
    return np.array(t.astype(mx.float32)) if isinstance(t, mx.array) else t


@FORMATS
def test_honest_dtypes_and_views_load_exactly(tmp_path, legacy):
    torch.manual_seed(0)
    base = torch.randn(6, 8)
    half = torch.randn(4, 5).half()
    bf = torch.randn(3, 7).bfloat16()
    tensors = {
        "f32": base, "f16": half, "bf16": bf,
        "transposed": base.t(), "slice": base[2:5, 1:], "strided": base[::2, ::3], "row": base[3],
        "f16_t": half.t(), "bf16_slice": bf[:, 2:6],
        "position_ids": torch.arange(16).expand(1, -1),  # stride 0 on a size-1 axis: n elements on n
        "column": torch.arange(5.0).unsqueeze(1).expand(5, 1),
        "empty": torch.zeros(0, 3), "scalar": torch.tensor(1.5),
    }
    path = tmp_path / "honest.pt"
    torch.save(tensors, path, _use_new_zipfile_serialization=not legacy)
    out = read_torch_checkpoint(path)
    for k, t in tensors.items():
        want = t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()
        got = as_numpy(out[k])
        assert got.shape == want.shape and np.array_equal(got, want), k
    assert out["f16"].dtype == np.float16 and out["bf16"].dtype == mx.bfloat16
    assert out["transposed"].flags.owndata  # materialised: an own copy, not a view of the file's bytes


@FORMATS
def test_tied_weights_share_one_array(tmp_path, legacy):
    # state_dict() detaches each name separately: two tensor objects on one storage
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    sd = {"emb.weight": emb.weight.detach(), "head.weight": head.weight.detach()}
    path = tmp_path / "tied.pt"
    torch.save(sd, path, _use_new_zipfile_serialization=not legacy)
    out = read_torch_checkpoint(path)
    assert out["emb.weight"] is out["head.weight"]
    np.testing.assert_array_equal(out["emb.weight"], emb.weight.detach().numpy())


def test_deflated_rezip_of_an_honest_checkpoint_loads(tmp_path):
    torch.manual_seed(1)
    sd = {"w": torch.randn(64, 64), "zeros": torch.zeros(256, 256), "b": torch.randn(64).half()}
    path = tmp_path / "w.pt"
    torch.save(sd, path)
    rezipped = tmp_path / "deflated.pt"
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(rezipped, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info))
    out = read_torch_checkpoint(rezipped)
    for k, t in sd.items():
        np.testing.assert_array_equal(out[k], t.numpy())


@pytest.mark.parametrize("protocol", [2, 4])
def test_honest_plain_data_still_loads(tmp_path, protocol):
    extras = {
        "array": np.arange(6, dtype=np.float64).reshape(2, 3), "objects": np.array([1, "a", None], dtype=object),
        "strings": np.array(["ab", "c"]), "record": np.array([(1, 2.5)], dtype=[("a", "i4"), ("b", "f8")]),
        "scalar": np.float32(1.5), "raw": bytearray(b"xyz"), "set": {1, 2}, "frozen": frozenset({3}),
        "od": collections.OrderedDict(a=1), "size": torch.Size([2, 3]), "cplx": 1 + 2j, "sl": slice(1, 5, 2),
        "when": datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc), "dt": datetime.timedelta(days=2),
    }
    path = tmp_path / "extras.pt"
    torch.save({"w": torch.ones(2), "extras": extras}, path, pickle_protocol=protocol)
    out = read_torch_checkpoint(path)["extras"]
    for k, v in extras.items():
        if isinstance(v, np.ndarray):
            assert out[k].dtype == v.dtype and out[k].shape == v.shape and (out[k] == v).all(), k
        else:
            assert out[k] == (tuple(v) if k == "size" else v), k
