"""Real users' checkpoints: custom-trained YOLOv8 (other class counts, names, float16, as `yolo
train` saves them), fine-tuned torchvision ResNets, files from a model's own save_weights, and
exact (float32) conversion. Goldens from scripts/goldens/golden_custom.py (ultralytics 8.4, torchvision)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import torch
from mlx.utils import tree_flatten
from safetensors.numpy import load_file

import mlxnet
from mlxnet.models import resnet, yolo
from mlxnet.weights import convert_checkpoint, read_labels, read_safetensors_header
from mlxnet.weights.seeded import seeded_state_dict
from testutil import assert_close, save_ultralytics_pt

FIXTURES = Path(__file__).parent / "fixtures" / "custom"
MLXNET = [sys.executable, "-m", "mlxnet"]


def golden() -> dict[str, np.ndarray]:
    return load_file(str(FIXTURES / "custom_golden.safetensors"))


def meta() -> dict:
    return json.loads((FIXTURES / "custom_golden.json").read_text())


def custom_yolo_pt(path: Path, *, scale: str = "s", yaml: dict | None = None) -> Path:
    """A two-class YOLOv8s as `yolo train` leaves it: the seeded weights of the golden, float16,
    in a pickled DetectionModel with its yaml and names."""
    m = meta()
    state = yolo.seeded_torch_state(scale, m["seed"], *m["gains"], nc=len(m["names"]))
    names = dict(enumerate(m["names"]))
    return save_ultralytics_pt(path, state, yaml=yaml or {"nc": len(names), "scale": scale, "backbone": [], "head": []},
                               names=names)


@pytest.fixture(scope="module")
def custom_pt(tmp_path_factory) -> Path:
    return custom_yolo_pt(tmp_path_factory.mktemp("ckpt") / "best.pt")


def small_input() -> mx.array:
    return mx.array(golden()["yolo.input"].transpose(0, 2, 3, 1))


def test_custom_trained_yolo_loads_with_its_classes_and_matches_ultralytics(custom_pt):
    det = yolo.YOLO.from_pretrained(custom_pt, fuse=False)
    assert det.net.scale == "s" and det.net.nc == 2 and det.names == ("cat", "dog")
    assert det.net.model[0].conv.weight.dtype == mx.float32  # float16 file, computed in float32
    assert_close(det.net(small_input()).transpose(0, 2, 1), golden()["yolo.head"], mx.float32, scale=20)
    fused = yolo.YOLO.from_pretrained(custom_pt)  # BN folded, as ultralytics' predictor runs it
    assert_close(fused.net(small_input()).transpose(0, 2, 1), golden()["yolo.head_fused"], mx.float32, scale=20)
    # names given by the caller win; their count must fit
    assert yolo.YOLO.from_pretrained(custom_pt, names=["a", "b"]).names == ("a", "b")
    with pytest.raises(mlxnet.MlxnetError, match="3 class names for a 2-class model"):
        yolo.YOLO.from_pretrained(custom_pt, names=["a", "b", "c"])


def test_scale_comes_from_the_structure_when_the_file_does_not_say(tmp_path):
    m = meta()
    state = yolo.seeded_torch_state("n", m["seed"], nc=3)
    det = yolo.YOLO.from_pretrained(save_ultralytics_pt(tmp_path / "weights.pt", state))
    assert det.net.scale == "n" and det.net.nc == 3 and det.names == ("class0", "class1", "class2")


def test_checkpoints_that_fit_no_variant_are_one_line_errors(tmp_path):
    m = meta()
    state = yolo.seeded_torch_state("n", m["seed"], nc=2)
    with pytest.raises(mlxnet.MlxnetError, match=r"its yaml says scale='m' but its tensors are for scale='n'"):
        yolo.YOLO.from_pretrained(save_ultralytics_pt(tmp_path / "a.pt", state, yaml={"scale": "m", "nc": 2}))
    state["model.0.conv.weight"] = np.zeros((24, 3, 3, 3), np.float32)
    with pytest.raises(mlxnet.MlxnetError, match=r"a YOLOv8 stem 24 channels wide fits no scale"):
        yolo.YOLO.from_pretrained(save_ultralytics_pt(tmp_path / "b.pt", state))
    seg = {k: v for k, v in yolo.seeded_torch_state("n", m["seed"]).items() if not k.startswith("model.22.cv3")}
    with pytest.raises(mlxnet.MlxnetError, match=r"not a YOLOv8 detection checkpoint \(no model.22.cv3.0.2.weight"):
        yolo.YOLO.from_pretrained(save_ultralytics_pt(tmp_path / "c.pt", seg))
    names = dict(enumerate("abc"))
    with pytest.raises(mlxnet.MlxnetError, match=r"3 class names for a 2-class model"):
        yolo.YOLO.from_pretrained(save_ultralytics_pt(tmp_path / "d.pt", yolo.seeded_torch_state("n", 1, nc=2),
                                                      names=names))
    # the CLI says it in one line
    out = subprocess.run(MLXNET + ["detect", str(Path(__file__).parent / "fixtures/yolo/bus.jpg"), "-o",
                                   str(tmp_path / "out"), "-w", str(tmp_path / "b.pt")], capture_output=True, text=True)
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1 and "fits no scale" in out.stderr


def test_float16_checkpoint_folded_in_float32_equals_the_unfolded_model(custom_pt, tmp_path):
    """Issue: folding BatchNorm in the checkpoint's float16 moved boxes by 1.9 px."""
    folded = convert_checkpoint(custom_pt, tmp_path / "folded.safetensors", "yolov8s", fold_bn=True, dtype="float32")
    plain = convert_checkpoint(custom_pt, tmp_path / "plain.safetensors", "yolov8s")  # float32 by default
    header, info = read_safetensors_header(folded)
    assert {e["dtype"] for e in header.values()} == {"F32"}
    assert json.loads(info["names"]) == ["cat", "dog"] and json.loads(info["config"]) == {"nc": 2}
    assert {e["dtype"] for e in read_safetensors_header(plain)[0].values()} == {"F32"}
    a = yolo.YOLO.from_pretrained(folded)
    b = yolo.YOLO.from_pretrained(plain, fuse=False)
    assert "bn" not in a.net.model[0] and "bn" in b.net.model[0] and a.names == b.names == ("cat", "dog")
    ya, yb = np.array(a.net(small_input())), np.array(b.net(small_input()))
    boxes, scores = np.abs(ya[..., :4] - yb[..., :4]).max(), np.abs(ya[..., 4:] - yb[..., 4:]).max()
    assert boxes < 1e-3 and scores < 1e-5, (boxes, scores)  # float32 rounding, not float16's 1.9 px


def test_save_weights_file_loads_back_unchanged(custom_pt, tmp_path):
    for fuse in (False, True):
        det = yolo.YOLO.from_pretrained(custom_pt, fuse=fuse)
        path = tmp_path / f"mine{int(fuse)}.safetensors"
        det.net.save_weights(str(path))  # MLX layouts, no metadata
        again = yolo.YOLO.from_pretrained(path, fuse=False)
        assert again.net.nc == 2 and again.net.scale == "s" and ("bn" in again.net.model[0]) != fuse
        np.testing.assert_array_equal(np.array(again.net(small_input())), np.array(det.net(small_input())))
    net = resnet.resnet("resnet18", 7)
    net.save_weights(str(tmp_path / "r.safetensors"))
    back = resnet.from_pretrained(str(tmp_path / "r.safetensors"))
    x = mx.random.normal((1, 32, 32, 3))
    net.eval()
    np.testing.assert_array_equal(np.array(back(x)), np.array(net(x)))


def test_fine_tuned_torchvision_resnet_with_labels(tmp_path):
    g = golden()
    model = resnet.resnet("resnet18", meta()["resnet_classes"])
    shapes = [(k, (v.shape[0], v.shape[3], v.shape[1], v.shape[2]) if v.ndim == 4 else v.shape)
              for k, v in tree_flatten(model.parameters())]
    state = {k: torch.from_numpy(v) for k, v in seeded_state_dict(shapes, meta()["seed"]).items()}
    torch.save(state, tmp_path / "finetuned.pth")  # torch.save(model.state_dict()) of torchvision's resnet18(num_classes=10)
    net = resnet.from_pretrained(str(tmp_path / "finetuned.pth"))
    assert net.fc.weight.shape == (10, 512)
    assert_close(net(mx.array(g["resnet.input"].transpose(0, 2, 3, 1))), g["resnet.logits"], mx.float32, scale=20)
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(f"kind {i}" for i in range(10)) + "\n")
    assert read_labels(labels)[3] == "kind 3"
    (tmp_path / "labels.json").write_text(json.dumps({str(i): f"k{i}" for i in range(10)}))
    assert read_labels(tmp_path / "labels.json")[9] == "k9"
    image = (np.random.default_rng(0).random((40, 50, 3)) * 255).astype(np.uint8)
    classifier = resnet.ResNetFamily().predictor(str(tmp_path / "finetuned.pth"), None, names=read_labels(labels))
    assert classifier.predict(image, 3).top[0][0].startswith("kind ")
    # the names travel into a converted file and come back
    out = convert_checkpoint(tmp_path / "finetuned.pth", tmp_path / "c.safetensors", "resnet18",
                             names=read_labels(labels))
    again = resnet.ResNetFamily().predictor(str(out), None)
    assert again.names == read_labels(labels)
    with pytest.raises(mlxnet.MlxnetError, match="2 class names for a 10-class model"):
        resnet.ResNetFamily().predictor(str(out), None, names=["a", "b"])


def test_convert_cli_writes_float32_with_the_names(custom_pt, tmp_path):
    (tmp_path / "names.txt").write_text("tabby\nterrier\n")
    out = subprocess.run(MLXNET + ["convert", str(custom_pt), str(tmp_path / "c.safetensors"), "--model", "yolov8s",
                                   "--fold-bn", "--labels", str(tmp_path / "names.txt")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    header, info = read_safetensors_header(tmp_path / "c.safetensors")
    assert {e["dtype"] for e in header.values()} == {"F32"} and json.loads(info["names"]) == ["tabby", "terrier"]
    assert yolo.YOLO.from_pretrained(tmp_path / "c.safetensors").names == ("tabby", "terrier")
    wrong = subprocess.run(MLXNET + ["convert", str(custom_pt), str(tmp_path / "d.safetensors"), "--model", "yolov8n"],
                           capture_output=True, text=True)
    assert wrong.returncode == 1 and wrong.stderr.strip().splitlines() == [
        f"error: {custom_pt} holds a yolov8s model, not yolov8n"]
    helptext = subprocess.run(MLXNET + ["convert", "--help"], capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}).stdout
    assert "float32 (default, whatever the checkpoint stores)" in helptext


def test_integer_or_nonfinite_weights_are_refused(tmp_path):
    net = resnet.resnet("resnet18", 4)
    state = {k: np.array(v) for k, v in tree_flatten(net.parameters())}
    bad = dict(state, **{"fc.bias": state["fc.bias"].astype(np.int32)})
    mx.save_safetensors(str(tmp_path / "int.safetensors"), {k: mx.array(v) for k, v in bad.items()})
    with pytest.raises(mlxnet.MlxnetError, match=r"fc.bias: int32 values for a floating-point parameter"):
        resnet.from_pretrained(str(tmp_path / "int.safetensors"))
    nan = dict(state)
    nan["layer1.0.bn1.running_var"] = nan["layer1.0.bn1.running_var"].copy()
    nan["layer1.0.bn1.running_var"][:3] = [np.nan, np.inf, -np.inf]
    mx.save_safetensors(str(tmp_path / "nan.safetensors"), {k: mx.array(v) for k, v in nan.items()})
    with pytest.raises(mlxnet.MlxnetError, match=r"layer1.0.bn1.running_var: 3 of 64 values are NaN or infinite"):
        resnet.from_pretrained(str(tmp_path / "nan.safetensors"))


def test_convert_reads_the_variant_from_the_checkpoint_without_model(tmp_path):
    """`mlxnet convert best.pt out.safetensors`: the checkpoint says what it holds, so -m is
    not needed; a file that does not say is one line asking for -m."""
    from typer.testing import CliRunner

    from mlxnet.cli import app
    custom = custom_yolo_pt(tmp_path / "best.pt")
    out = tmp_path / "best.safetensors"
    result = CliRunner().invoke(app, ["convert", str(custom), str(out)])
    assert result.exit_code == 0, result.output + str(result.exception)
    assert "(model yolov8s)" in result.output
    det = yolo.YOLO.from_pretrained(out)
    assert det.net.scale == "s" and det.names == tuple(meta()["names"])
    again = CliRunner().invoke(app, ["convert", str(custom), str(out)])  # refused before the file is read
    assert again.exit_code != 0 and "exists; pass --force" in str(again.exception)
    bare = tmp_path / "bare.safetensors"
    from safetensors.numpy import save_file
    save_file({"w": np.zeros((2, 2), np.float32)}, str(bare))
    result = CliRunner().invoke(app, ["convert", str(bare), str(tmp_path / "x.safetensors")])
    assert result.exit_code != 0
    assert "does not say which model it holds; give --model/-m" in str(result.exception)
