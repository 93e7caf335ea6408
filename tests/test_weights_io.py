"""safetensors I/O (bfloat16 round trip, casts, atomic writes, broken files) and load_into."""
from __future__ import annotations

import json
import os
import struct

import mlx.core as mx
import numpy as np
import pytest

from fixtures.weights_models import TinyNet
from mlx.utils import tree_flatten
from mlxnet import MlxnetError
from mlxnet.weights import load_into, load_safetensors, read_safetensors_header, save_safetensors


def sample() -> dict[str, mx.array]:
    x = mx.arange(12, dtype=mx.float32).reshape(3, 4) / 7
    return {"f32": x, "f16": x.astype(mx.float16), "bf16": (x * 3.3).astype(mx.bfloat16),
            "i64": mx.array([-(2**40), 5], dtype=mx.int64), "i32": mx.array([1, -2], dtype=mx.int32),
            "u8": mx.array([0, 255], dtype=mx.uint8), "bool": mx.array([True, False])}


def test_round_trip_keeps_every_dtype_and_bit(tmp_path):
    w = sample()
    path = save_safetensors(tmp_path / "w.safetensors", w, metadata={"format": "test"})
    back = load_safetensors(path)
    assert back.keys() == w.keys()
    for k in w:
        assert back[k].dtype == w[k].dtype and back[k].shape == w[k].shape, k
        assert mx.array_equal(back[k], w[k]).item(), k
    assert read_safetensors_header(path)[1] == {"format": "test"}
    # and the reference implementation reads the same values (bf16 included)
    import torch
    from safetensors.torch import load_file

    ref = load_file(str(path))
    assert ref["bf16"].dtype == torch.bfloat16
    np.testing.assert_array_equal(ref["bf16"].float().numpy(), np.array(w["bf16"].astype(mx.float32)))
    np.testing.assert_array_equal(ref["i64"].numpy(), np.array(w["i64"]))


def test_cast_on_request_touches_only_floats(tmp_path):
    path = save_safetensors(tmp_path / "w.safetensors", sample())
    back = load_safetensors(path, dtype="bfloat16")
    assert {back[k].dtype for k in ("f32", "f16", "bf16")} == {mx.bfloat16}
    assert back["i64"].dtype == mx.int64 and back["bool"].dtype == mx.bool_
    with pytest.raises(MlxnetError, match="unsupported dtype 'int8'"):
        load_safetensors(path, dtype="int8")


def test_save_is_atomic_and_uses_normal_permissions(tmp_path, monkeypatch):
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"old")
    save_safetensors(path, {"a": np.ones(3, np.float32)})
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]  # no temp file left
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask

    def dies_midway(file, arrays, metadata=None):
        with open(file, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(mx, "save_safetensors", dies_midway)
    with pytest.raises(OSError, match="disk full"):  # the old file stays whole, no temp file left
        save_safetensors(path, {"a": mx.zeros(2)})
    assert load_safetensors(path)["a"].tolist() == [1, 1, 1]
    assert len(list(tmp_path.iterdir())) == 1


def test_a_host_snapshot_is_written_as_mlx_writes_it(tmp_path, monkeypatch):
    """host_copies + save_safetensors (what the training's writer thread gets): numpy where
    numpy has the dtype, bfloat16 left to MLX; the file is the one MLX writes, bit for bit in
    values and metadata, and a snapshot of host arrays never calls MLX's writer."""
    from mlxnet.weights.safetensors_io import host_copies

    w = sample()
    snapshot = host_copies(w)
    assert isinstance(snapshot["bf16"], mx.array)
    assert all(isinstance(v, np.ndarray) for k, v in snapshot.items() if k != "bf16")
    host_only = {k: v for k, v in snapshot.items() if k != "bf16"}

    def no_mlx(*args, **kwargs):
        raise AssertionError("MLX's writer was called for host arrays")
    with monkeypatch.context() as m:
        m.setattr(mx, "save_safetensors", no_mlx)
        ours = save_safetensors(tmp_path / "host.safetensors", host_only, metadata={"format": "test"})
    theirs = save_safetensors(tmp_path / "mlx.safetensors", {k: w[k] for k in host_only}, metadata={"format": "test"})
    a, b = load_safetensors(ours), load_safetensors(theirs)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and mx.array_equal(a[k], b[k]).item(), k
    assert read_safetensors_header(ours)[1] == {"format": "test"}
    mixed = save_safetensors(tmp_path / "mixed.safetensors", snapshot)  # bfloat16 among them: MLX's writer
    assert load_safetensors(mixed)["bf16"].dtype == mx.bfloat16


def test_broken_files_fail_with_one_line_naming_the_file(tmp_path):
    with pytest.raises(MlxnetError, match=r"weights file not found: .*absent\.safetensors"):
        load_safetensors(tmp_path / "absent.safetensors")
    good = save_safetensors(tmp_path / "good.safetensors", {"a": mx.zeros((64, 64))})
    data = good.read_bytes()
    cases = {
        "truncated.safetensors": data[:-100],
        "tiny.safetensors": data[:5],
        "badjson.safetensors": struct.pack("<Q", 10) + b"{not json}" + b"\0" * 16,
        "hugeheader.safetensors": struct.pack("<Q", 10**9) + b"{}",
        "badentry.safetensors": (lambda h: struct.pack("<Q", len(h)) + h + b"\0" * 8)(
            json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()),
    }
    for name, blob in cases.items():
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(MlxnetError) as err:
            load_safetensors(tmp_path / name)
        msg = str(err.value)
        assert msg.startswith(str(tmp_path / name)) and "\n" not in msg, msg
        assert "truncated" in msg or "corrupt" in msg, msg


def model_weights(model) -> dict[str, mx.array]:
    return {k: mx.random.normal(v.shape) for k, v in tree_flatten(model.parameters())}


def test_load_into_loads_and_keeps_dtypes():
    model = TinyNet()
    w = {k: v.astype(mx.float16) for k, v in model_weights(model).items()}
    load_into(model, w)
    got = dict(tree_flatten(model.parameters()))
    assert all(mx.array_equal(got[k], w[k]).item() and got[k].dtype == mx.float16 for k in w)


def test_load_into_reports_every_problem_at_once():
    model = TinyNet()
    w = model_weights(model)
    del w["stem_bn.bias"], w["head.bias"]
    w["head.weight"] = mx.zeros((4, 5))
    w["extra.weight"] = mx.zeros((2, 3))
    before = dict(tree_flatten(model.parameters()))
    with pytest.raises(MlxnetError) as err:
        load_into(model, w, source="tiny.safetensors")
    head, _, rest = str(err.value).partition(": 4 problem(s): ")
    assert head == "weights (tiny.safetensors) do not fit TinyNet" and "\n" not in rest
    shown, _, more = rest.partition("; ... and ")
    assert more == "1 more" and len(shown.split("; ")) == 3
    assert set(shown.split("; ")) < set([
        "missing key stem_bn.bias: expected shape (8,)",
        "missing key head.bias: expected shape (5,)",
        "shape mismatch for head.weight: expected (5, 4), found (4, 5)",
        "unexpected key extra.weight: found shape (2, 3)",
    ])
    after = dict(tree_flatten(model.parameters()))
    assert all(after[k] is before[k] for k in before)  # nothing loaded on failure


def test_load_into_non_strict_skips_missing_and_unexpected_but_not_shapes():
    model = TinyNet()
    keep = model.head.bias
    w = model_weights(model)
    del w["head.bias"]
    w["extra"] = mx.zeros(1)
    load_into(model, w, strict=False)
    assert model.head.bias is keep and mx.array_equal(model.head.weight, w["head.weight"]).item()
    w["head.weight"] = mx.zeros((1, 1))
    with pytest.raises(MlxnetError, match=r"shape mismatch for head.weight: expected \(5, 4\), found \(1, 1\)"):
        load_into(model, w, strict=False)
