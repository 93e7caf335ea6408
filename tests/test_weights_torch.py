"""The safe PyTorch checkpoint reader against real torch.save files; malicious pickles refused."""
from __future__ import annotations

import argparse
import builtins
import datetime
import functools
import os
import pickle
import subprocess
import zipfile
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import torch

from fixtures.weights_torch_models import trained_tiny_net
from mlxnet import MlxnetError
from mlxnet.weights import Record, find_state_dict, open_checkpoint, read_torch_checkpoint

FORMATS = pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])


def save(obj, path, legacy: bool):
    torch.save(obj, path, _use_new_zipfile_serialization=not legacy)
    return path


def same(ours, theirs: torch.Tensor) -> None:
    """Exact equality, dtype included (bfloat16 comes back as an mx.array)."""
    theirs = theirs.detach().resolve_neg()
    if theirs.dtype == torch.bfloat16:
        assert isinstance(ours, mx.array) and ours.dtype == mx.bfloat16
        np.testing.assert_array_equal(np.array(ours.astype(mx.float32)), theirs.float().numpy())
        return
    assert isinstance(ours, np.ndarray), type(ours)
    assert ours.dtype == theirs.numpy().dtype and ours.shape == tuple(theirs.shape)
    np.testing.assert_array_equal(ours, theirs.numpy())


@FORMATS
def test_dtypes_views_and_shared_storage(tmp_path, legacy):
    torch.manual_seed(0)
    base = torch.randn(4, 6)
    tensors = {
        "f32": base, "f16": torch.randn(3, 2).half(), "bf16": torch.randn(5).bfloat16(),
        "f64": torch.randn(2).double(), "i64": torch.arange(-3, 4), "i32": torch.tensor([7, -8], dtype=torch.int32),
        "u8": torch.tensor([0, 200, 255], dtype=torch.uint8), "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3),
        # views of one storage: an offset, a transpose (non-contiguous strides), a strided slice
        "view_offset": base[2:], "view_t": base.t(), "view_step": base[::2, 1::3],
        "bf16_view": torch.arange(12.0).bfloat16().reshape(3, 4)[:, 1:3],
        "neg_view": base[1]._neg_view(),  # saved with its negative bit in the metadata
    }
    out = read_torch_checkpoint(save(tensors, tmp_path / "t.pt", legacy))
    assert set(out) == set(tensors)
    for k, t in tensors.items():
        same(out[k], t)
    # Rebuilt tensors own their memory: writing one never shows through another view.
    out["f32"][0, 0] = 1e9
    assert out["view_t"][0, 0] == base[0, 0].item()


@FORMATS
def test_module_saved_whole_becomes_records_with_its_state_dict(tmp_path, legacy):
    net = trained_tiny_net()
    ckpt = read_torch_checkpoint(save(net, tmp_path / "net.pt", legacy))
    assert isinstance(ckpt, Record)
    assert ckpt.class_name == "fixtures.weights_torch_models.TorchTinyNet"
    sd = find_state_dict(ckpt)
    expected = net.state_dict()
    assert list(sd) == list(expected)  # same order, non-persistent buffer "scratch" left out
    for k, t in expected.items():
        same(sd[k], t)


@FORMATS
def test_ultralytics_and_lightning_layouts(tmp_path, legacy):
    net = trained_tiny_net().half()
    # ultralytics: the whole model object (fp16) under "model", ema None, plain extras
    ultra = {"epoch": -1, "best_fitness": np.float64(0.5), "model": net, "ema": None,
             "train_args": {"imgsz": 640}, "date": "2024-01-01", "version": "8.1.0"}
    sd = find_state_dict(read_torch_checkpoint(save(ultra, tmp_path / "u.pt", legacy)))
    assert sd["stem.0.weight"].dtype == np.float16 and list(sd) == list(net.state_dict())
    # Lightning: "state_dict" plus optimizer state and hyper-parameters holding foreign objects
    model = trained_tiny_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(1, 3, 4, 4)).sum().backward()
    opt.step()
    lightning = {"epoch": 3, "global_step": 30, "pytorch-lightning_version": "2.2.0",
                 "state_dict": {f"generator.{k}": v for k, v in model.state_dict().items()},
                 "optimizer_states": [opt.state_dict()], "lr_schedulers": [],
                 "hyper_parameters": {"args": argparse.Namespace(lr=0.1, name="x"), "root": Path("/data/x"),
                                      "when": datetime.datetime(2024, 5, 1, 12, 30), "mean": np.array([0.5, 0.25])}}
    ckpt = read_torch_checkpoint(save(lightning, tmp_path / "l.ckpt", legacy))
    hp = ckpt["hyper_parameters"]
    ns = hp["args"]
    assert isinstance(ns, Record) and ns.class_name == "argparse.Namespace" and ns.attrs == {"lr": 0.1, "name": "x"}
    assert str(hp["root"]) == "/data/x" and hp["when"] == datetime.datetime(2024, 5, 1, 12, 30)
    np.testing.assert_array_equal(hp["mean"], [0.5, 0.25])
    sd = find_state_dict(ckpt)
    assert list(sd) == [f"generator.{k}" for k in model.state_dict()]
    same(sd["generator.fc.weight"], model.fc.weight.detach())
    assert find_state_dict(ckpt, "state_dict").keys() == sd.keys()
    with pytest.raises(MlxnetError, match=r"no 'weights' in the checkpoint"):
        find_state_dict(ckpt, "weights")


def test_open_checkpoint_gives_mlx_arrays(tmp_path):
    net = trained_tiny_net()
    sd = open_checkpoint(save({"model": net.state_dict()}, tmp_path / "n.pth", False)).tensors
    assert all(isinstance(v, mx.array) for v in sd.values())
    np.testing.assert_array_equal(np.array(sd["fc.bias"]), net.fc.bias.detach().numpy())


# --- malicious pickles ----------------------------------------------------------------------

class _Payload:
    def __init__(self, func, args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _payloads(marker):
    cmd = f"touch {marker}"
    return {
        "posix.system": _Payload(os.system, (cmd,)),
        "builtins.eval": _Payload(builtins.eval, (f"__import__('os').system({cmd!r})",)),
        "subprocess.Popen": _Payload(subprocess.Popen, (["touch", str(marker)],)),
        "functools.partial": _Payload(functools.partial, (os.system, cmd)),
    }


@pytest.mark.parametrize("how", ["zip", "legacy", "raw-pickle"])
def test_malicious_calls_are_refused_and_never_run(tmp_path, how):
    # The payloads are live: plain pickle runs them.
    live = tmp_path / "live"
    pickle.loads(pickle.dumps(_Payload(os.system, (f"touch {live}",)), protocol=2))
    assert live.exists()

    marker = tmp_path / "MARKER"
    for name, payload in _payloads(marker).items():
        path = tmp_path / f"evil-{how}.pt"
        obj = {"weight": torch.zeros(2), "extra": {"hook": payload}}
        if how == "raw-pickle":
            path.write_bytes(pickle.dumps(obj["extra"], protocol=2))
        else:
            save(obj, path, how == "legacy")
        with pytest.raises(MlxnetError) as err:
            read_torch_checkpoint(path)
        msg = str(err.value)
        assert f"refusing to call {name}" in msg and str(path) in msg and "\n" not in msg
        assert not marker.exists(), name


def test_pickle_cannot_modify_allowed_objects(tmp_path):
    # GLOBAL torch._utils._rebuild_tensor_v2, then BUILD with slot state: would rebind an attribute.
    data = (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n"
            b"N}q\x00X\x02\x00\x00\x00fnq\x01Ns\x86q\x02b.")
    path = tmp_path / "tamper.pt"
    path.write_bytes(data)
    with pytest.raises(MlxnetError, match=r"refusing to call torch\._utils\._rebuild_tensor_v2 .*setting attribute 'fn'"):
        read_torch_checkpoint(path)


# --- broken files -------------------------------------------------------------------------------

@FORMATS
def test_truncated_checkpoint_is_one_clear_line(tmp_path, legacy):
    path = save({"w": torch.randn(64, 64)}, tmp_path / "w.pt", legacy)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 5000])
    with pytest.raises(MlxnetError) as err:
        read_torch_checkpoint(path)
    msg = str(err.value)
    assert msg.startswith(str(path)) and ("truncated" in msg or "corrupt" in msg) and "\n" not in msg


def test_missing_and_garbage_files(tmp_path):
    with pytest.raises(MlxnetError, match="checkpoint file not found: .*nope.pt"):
        read_torch_checkpoint(tmp_path / "nope.pt")
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"this is not a checkpoint at all")
    with pytest.raises(MlxnetError, match=r"junk\.pth: not a checkpoint \(a text file beginning 'this is not a"):
        read_torch_checkpoint(junk)
    junk.write_bytes(b"\x80\x02garbage")  # a pickle's start, then nonsense
    with pytest.raises(MlxnetError, match=r"junk\.pth: truncated or corrupt PyTorch checkpoint"):
        read_torch_checkpoint(junk)
    # A zip archive whose storage entry is gone
    good = save({"w": torch.ones(3)}, tmp_path / "g.pt", False)
    bad = tmp_path / "nostorage.pt"
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(bad, "w") as zout:
        for item in zin.infolist():
            if "/data/" not in item.filename:
                zout.writestr(item, zin.read(item))
    with pytest.raises(MlxnetError, match=r"nostorage\.pt: corrupt PyTorch checkpoint: storage .*data/0 is missing"):
        read_torch_checkpoint(bad)
    with pytest.raises(MlxnetError, match=r"no state dict found"):
        find_state_dict({"epoch": 3, "note": "x"}, source="c.pt")
