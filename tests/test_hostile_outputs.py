"""Hostile outputs and weights files (issue 22): umask-honouring atomic writes whose errors name
the user's path, stale temporary files cleaned, output paths checked before the work, and
safetensors headers whose every defect is one line naming the file."""
from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import mlxnet
from mlxnet.image import OutputError, atomic_write, atomic_write_bytes, check_output_path, save_image
from mlxnet.weights import load_safetensors, read_safetensors_header, save_safetensors
from mlxnet.weights.safetensors_io import is_safetensors

ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False


# --- permissions -------------------------------------------------------------------------

@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_created_files_honour_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        written = [save_image(np.zeros((2, 2, 3), np.uint8), tmp_path / "a.png"),
                   atomic_write_bytes(tmp_path / "b.bin", b"x"),
                   save_safetensors(tmp_path / "c.safetensors", {"w": mx.zeros(2)})]
    finally:
        os.umask(old)
    for p in written:
        assert p.stat().st_mode & 0o777 == mode, p


# --- failures name the user's path -------------------------------------------------------

def test_write_errors_name_the_output_never_the_temporary_file(tmp_path):
    target = tmp_path / "out.png"
    target.write_bytes(b"old")

    def disk_full(tmp: Path) -> None:
        tmp.write_bytes(b"partial")
        raise OSError(28, "No space left on device", str(tmp))

    with pytest.raises(OutputError) as err:
        atomic_write(target, disk_full)
    assert str(err.value) == f"{target}: cannot write: No space left on device"
    assert isinstance(err.value, OSError) and isinstance(err.value, mlxnet.MlxnetError)
    assert err.value.errno == 28
    assert target.read_bytes() == b"old" and sorted(tmp_path.iterdir()) == [target]


def test_mlx_errors_in_a_safetensors_write_name_the_output(tmp_path, monkeypatch):
    def refuses(file, arrays, metadata=None):
        raise RuntimeError(f"[save_safetensors] Failed to open {file}")

    monkeypatch.setattr(mx, "save_safetensors", refuses)
    target = tmp_path / "w.safetensors"
    with pytest.raises(OutputError) as err:
        save_safetensors(target, {"a": mx.zeros(2)})
    assert str(err.value) == f"{target}: cannot write: [save_safetensors] Failed to open {target}"
    assert "mlxnet-tmp" not in str(err.value) and not list(tmp_path.iterdir())


def test_unencodable_images_name_the_output(tmp_path):
    with pytest.raises(mlxnet.MlxnetError) as err:
        save_image(np.zeros((2, 2, 4), np.uint8), tmp_path / "x.jpg")  # JPEG has no alpha
    assert str(err.value).startswith(f"{tmp_path / 'x.jpg'}: cannot write a uint8 2×2×4 image as JPEG")
    assert not list(tmp_path.iterdir())


# --- temporary files ---------------------------------------------------------------------

def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def backdate(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_stale_temporary_files_are_cleaned_when_we_write_there(tmp_path):
    dead, live = dead_pid(), os.getpid()
    files = {
        f".out.png.mlxnet-tmp-{dead}-0123abcd": (120, False),  # dead writer, 2 min old: removed
        f".w.safetensors.mlxnet-tmp-{dead}-89abcdef.safetensors": (120, False),
        f".out.png.mlxnet-tmp-{dead}-00000000": (5, True),  # dead here, but fresh: maybe another host's
        f".out.png.mlxnet-tmp-{live}-11111111": (120, True),  # a live writer's: kept
        f".out.png.mlxnet-tmp-{live}-22222222": (7200, False),  # untouched for 2 h: removed
        ".out.png.tmp": (7200, True),  # not our scheme: never touched
        "notes.txt": (7200, True),
    }
    for name, (age, _) in files.items():
        (tmp_path / name).write_bytes(b"x")
        backdate(tmp_path / name, age)
    save_image(np.zeros((1, 1, 3), np.uint8), tmp_path / "new.png")
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {"new.png"} | {name for name, (_, kept) in files.items() if kept}


def test_a_killed_write_leaves_nothing_that_lives_forever(tmp_path):
    # A writer killed (SIGKILL: no cleanup runs) in the middle of its write...
    code = ("import sys, time\n"
            "from mlxnet.image import atomic_write\n"
            "def slow(tmp):\n"
            "    tmp.write_bytes(b'half')\n"
            "    print(tmp, flush=True)\n"
            "    time.sleep(60)\n"
            f"atomic_write({str(tmp_path / 'out.png')!r}, slow)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    tmp = Path(child.stdout.readline().strip())
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert tmp.parent == tmp_path and tmp.exists() and not (tmp_path / "out.png").exists()
    # ... leaves its temporary file, which the next write there removes once it is stale.
    backdate(tmp, 120)
    save_image(np.zeros((1, 1, 3), np.uint8), tmp_path / "other.png")
    assert {p.name for p in tmp_path.iterdir()} == {"other.png"}


# --- output paths checked before the work ------------------------------------------------

def test_output_paths_are_checked_before_any_work(tmp_path):
    src = save_image(np.zeros((2, 2, 3), np.uint8), tmp_path / "in.png")
    (tmp_path / "link.png").symlink_to(src)
    os.link(src, tmp_path / "hard.png")
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "a_dir.png").mkdir()
    bad = {
        tmp_path / "out.xyz": "'.xyz' is not an image format Pillow can write",
        tmp_path / "out": "no file extension",
        tmp_path / "out.psd": "'.psd' is not an image format Pillow can write",  # Pillow reads PSD only
        tmp_path / "out.bufr": "'.bufr' is not an image format Pillow can write",  # a stub without a handler
        tmp_path / "a_file" / "sub" / "out.png": "is not a folder",
        tmp_path / "a_dir.png": "is a folder",
        tmp_path / "link.png": "would overwrite the input",
        tmp_path / "hard.png": "would overwrite the input",
    }
    for path, problem in bad.items():
        with pytest.raises(mlxnet.MlxnetError) as err:
            check_output_path(path, [src])
        assert str(err.value).startswith(f"{path}: ") and problem in str(err.value), str(err.value)
        assert "\n" not in str(err.value)
    with pytest.raises(mlxnet.MlxnetError, match="exists; pass --force"):
        check_output_path(src, [], force=False)
    # fine: a folder that the write will create, another format, a non-image file
    nested = tmp_path / "new" / "deeper" / "out.webp"
    assert check_output_path(nested, [src]) == nested
    assert not (tmp_path / "new").exists()  # the check creates nothing
    check_output_path(tmp_path / "w.safetensors", [src], kind="file")
    # save_image refuses what the check refuses
    with pytest.raises(mlxnet.MlxnetError, match="'.xyz' is not an image format"):
        save_image(np.zeros((1, 1, 3), np.uint8), tmp_path / "out.xyz")


@pytest.mark.skipif(ROOT, reason="root writes into read-only folders")
def test_an_unwritable_folder_is_found_before_the_work(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        with pytest.raises(mlxnet.MlxnetError, match="is not writable"):
            check_output_path(locked / "sub" / "out.png")
        with pytest.raises(OutputError) as err:
            save_image(np.zeros((1, 1, 3), np.uint8), locked / "out.png")
        assert str(err.value).startswith(f"{locked / 'out.png'}: cannot write: ")
    finally:
        locked.chmod(0o755)


# --- safetensors headers -----------------------------------------------------------------

def blob(header: object, data: bytes = b"", raw: bytes | None = None) -> bytes:
    text = raw if raw is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def entry(dtype: str = "F32", shape: object = (2,), offsets: object = (0, 8)) -> dict:
    return {"dtype": dtype, "shape": list(shape) if isinstance(shape, tuple) else shape,
            "data_offsets": list(offsets) if isinstance(offsets, tuple) else offsets}


HOSTILE = {
    "not_object": (blob([1, 2]), "a JSON list, not an object"),
    "string_header": (blob("hello"), "a JSON str, not an object"),
    "deep": (blob(None, raw=b"[" * 100_000 + b"]" * 100_000), "not JSON"),
    "string_offsets": (blob({"a": entry(offsets=["0", "8"])}, b"\0" * 8), "are not two non-negative integers"),
    "negative_offsets": (blob({"a": entry(offsets=(-8, 0))}, b"\0" * 8), "are not two non-negative integers"),
    "three_offsets": (blob({"a": entry(offsets=(0, 4, 8))}, b"\0" * 8), "are not two non-negative integers"),
    "out_of_file": (blob({"a": entry(shape=(2**38,), offsets=(0, 2**40))}, b"\0" * 8), "truncated"),
    "misordered": (blob({"a": entry(offsets=(8, 0))}, b"\0" * 8), "end before they begin"),
    "overlap": (blob({"a": entry(offsets=(0, 8)), "b": entry(offsets=(4, 12))}, b"\0" * 12), "overlaps 'a'"),
    "gap": (blob({"a": entry(offsets=(0, 8)), "b": entry(offsets=(12, 20))}, b"\0" * 20), "belong to no tensor"),
    "trailing": (blob({"a": entry()}, b"\0" * 12), "4 bytes after the last tensor"),
    "unknown_dtype": (blob({"a": entry(dtype="F8_E4M3")}, b"\0" * 8), "unknown dtype 'F8_E4M3'"),
    "dtype_not_string": (blob({"a": entry(dtype=4)}, b"\0" * 8), "unknown dtype 4"),
    "size_mismatch": (blob({"a": entry(shape=(3,))}, b"\0" * 8), "F32 [3] needs 12 bytes"),
    "huge_shape": (blob({"a": entry(shape=(2**40, 2**40))}, b"\0" * 8), "needs 4835703278458516698824704 bytes"),
    "bad_shape": (blob({"a": entry(shape=[2, -1])}, b"\0" * 8), "is not a list of non-negative integers"),
    "bool_shape": (blob({"a": entry(shape=[True, 2])}, b"\0" * 8), "is not a list of non-negative integers"),
    "entry_not_object": (blob({"a": [1, 2, 3]}), "expected dtype, shape and data_offsets"),
    "metadata_value": (blob({"__metadata__": {"format": 1}}), "metadata 'format' is 1, not a string"),
    "metadata_list": (blob({"__metadata__": ["x"]}), "__metadata__ is not an object"),
    "duplicate_name": (blob(None, b"\0" * 8, raw=b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, '
                                                b'"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}'),
                       "key 'a' appears twice"),
    "name_with_newline": (blob({"a\nb": entry(dtype="Q")}, b"\0" * 8), "entry 'a\\nb'"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_safetensors_headers_are_one_line_naming_the_file(tmp_path, case):
    data, problem = HOSTILE[case]
    path = tmp_path / f"{case}.safetensors"
    path.write_bytes(data)
    with pytest.raises(mlxnet.MlxnetError) as err:
        load_safetensors(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg and problem in msg, msg


def test_an_absurd_header_length_is_named_and_allocates_nothing(tmp_path):
    path = tmp_path / "huge.safetensors"
    path.write_bytes(struct.pack("<Q", 2**60) + b'{"a": 1}')
    assert is_safetensors(path)  # so it is not read as a (corrupt) PyTorch checkpoint
    claims = tmp_path / "claims.safetensors"  # within the format's limit but over the file
    claims.write_bytes(struct.pack("<Q", 90 * 2**20) + b"{}")
    tracemalloc.start()
    try:
        for p, problem in [(path, "header length 1152921504606846976 is over the format's"),
                           (claims, "header claims 94371840 bytes, the file has 10")]:
            with pytest.raises(mlxnet.MlxnetError) as err:
                read_safetensors_header(p)
            assert str(err.value).startswith(f"{p}: ") and problem in str(err.value), str(err.value)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20, peak
    assert "PyTorch" not in str(err.value)


def test_a_sound_file_still_loads(tmp_path):
    path = save_safetensors(tmp_path / "ok.safetensors", {"b": mx.ones((2, 3)), "a": mx.zeros((0,)),
                                                          "c": mx.arange(4, dtype=mx.int64)},
                            metadata={"format": "mlxnet"})
    header, meta = read_safetensors_header(path)
    assert meta == {"format": "mlxnet"} and set(header) == {"a", "b", "c"}
    assert load_safetensors(path)["c"].tolist() == [0, 1, 2, 3]
