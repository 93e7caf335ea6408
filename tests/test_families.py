"""The model interface: every bundled family through it, and a toy family registered here
(nothing under mlxnet/ edited) showing up in `mlxnet check` and in the benchmark list."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from typer.testing import CliRunner

import mlxnet
from mlxnet import families, ops
from mlxnet.cli import app


class ToyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = mlxnet.nn.Conv2d(3, 16, 3, padding=1)
        self.head = nn.Linear(16, 4)

    def __call__(self, x: mx.array) -> mx.array:
        return self.head(ops.silu(self.conv(x)).mean(axis=(1, 2)))


class ToyFamily(families.ModelFamily):
    name = "toy"
    variants = ("toy-net",)
    default_size = 16

    def build(self, variant: str) -> ToyNet:
        return ToyNet()

    def example_inputs(self, variant: str, size: int) -> list[mx.array]:
        return [mx.random.normal((1, size, size, 3), key=mx.random.key(1))]


@pytest.fixture
def toy():
    family = families.register(ToyFamily())
    yield family
    families._FAMILIES.pop("toy")


def test_a_family_registered_outside_mlxnet_is_checked_and_benchmarked(toy):
    result = CliRunner().invoke(app, ["--device", "cpu", "check", "toy-net", "--size", "16", "--all"])
    assert result.exit_code == 0, result.output
    assert "conv" in result.output and "passed:" in result.output
    from mlxnet.benchmark.workloads import entries

    assert "toy-net" in entries()
    bench = CliRunner().invoke(app, ["--device", "cpu", "bench", "toy-net", "--reps", "1", "--warmup", "0"])
    assert bench.exit_code == 0, bench.output
    assert any(line.startswith("toy-net") for line in bench.output.splitlines())


def test_every_bundled_variant_is_reachable_through_the_interface():
    known = families.variants()
    for variant in ("resnet18", "resnet152", "yolov8n", "yolov8x", "sam-tiny", "lama", "lama-fourier"):
        assert variant in known
    with pytest.raises(mlxnet.MlxnetError, match="unknown model 'nope'; known: .*resnet50"):
        families.family_of("nope")


def test_a_variant_cannot_be_claimed_twice(toy):
    class Thief(ToyFamily):
        name = "thief"
    with pytest.raises(mlxnet.MlxnetError, match="registered by 'toy' already"):
        families.register(Thief())


@pytest.mark.parametrize("variant, size", [("resnet18", 64), ("yolov8n", 128), ("lama-fourier", 64)])
def test_random_weights_give_a_meaningful_float16_check(variant, size):
    """Activations keep their scale: nothing underflows to zero in float16, the output is not
    constant, and the float16 run is within tolerance of the float32 definitions."""
    from mlxnet import check

    mx.random.seed(0)
    with mlxnet.use_device("cpu"):
        model, inputs = families.build_for_check(variant, None, None, size)
        report = check.compare(model, inputs, dtype="float16")
    assert report.passed, report.first_failure
    flagged = [l.path for l in report.layers if {"all-zero", "constant", "NaN", "Inf"} & set(l.flags)]
    assert not flagged, flagged
    out = report.layers[-1]
    assert out.max_abs > 0 and "constant" not in out.flags


def test_the_core_never_imports_a_model_module():
    """mlxnet/ reaches models only through the family registry (which imports the package)."""
    import re

    root = Path(mlxnet.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        for line in path.read_text().splitlines():
            if re.search(r"(from|import)\s+mlxnet\.models\.\w+|from\s+mlxnet\.models\s+import", line):
                offenders.append(f"{path.relative_to(root)}: {line.strip()}")
    assert not offenders, offenders


@pytest.mark.parametrize("command, variant", [("detect", "resnet50"), ("classify", "yolov8n")])
def test_a_command_names_the_models_it_runs(command, variant):
    with pytest.raises(mlxnet.MlxnetError, match=f"{variant} is not a model for `mlxnet {command}`"):
        families.for_task(variant, command)


def test_results_render_and_serialise_themselves():
    import json

    import numpy as np

    from mlxnet.models.resnet import Classification
    from mlxnet.models.yolo_process import Detections

    image = np.full((40, 60, 3), 128, np.uint8)
    det = Detections(np.array([[5, 5, 30, 20]], np.float32), np.array([0.9], np.float32),
                     np.array([1], np.int32), ("cat", "dog"))
    drawn = det.render(image)
    assert drawn.shape == image.shape and (drawn != image).any() and (image == 128).all()
    assert json.loads(json.dumps(det.to_dict()))["detections"][0]["name"] == "dog"
    assert det.summary() == "1 dog"
    top = Classification([("tabby", 0.75), ("tiger", 0.2)])
    assert (top.render(image) != image).any()
    assert json.loads(json.dumps(top.to_dict()))["top"][0] == {"label": "tabby", "probability": 0.75}


def test_segmentation_and_inpainting_results_render_and_serialise():
    import json

    import numpy as np

    from mlxnet.models.lama import Inpainting
    from mlxnet.models.sam import Segmentation

    image = np.full((20, 30, 3), 100, np.uint8)
    small, big = np.zeros((20, 30), bool), np.zeros((20, 30), bool)
    small[2:5, 2:5], big[:, :15] = True, True
    chosen = Segmentation((20, 30), [small, big], [0.5, 0.9], best=1,
                          prompts=(np.array([[3.0, 3.0]]), np.array([1]), None))
    assert (chosen.render(image) != image).any()
    assert set(np.unique(chosen.mask_image())) == {0, 255}
    assert json.loads(json.dumps(chosen.to_dict()))["best"] == 1
    everything = Segmentation((20, 30), [small, big], [0.5, 0.9],
                              records=[{"bbox": [0, 0, 1, 1], "area": 9, "predicted_iou": 0.5,
                                        "stability_score": 0.9, "point_coords": [[1, 1]]}] * 2)
    labels = everything.mask_image()
    assert labels[3, 3] == 1 and labels[10, 10] == 2  # the small mask drawn over the big one
    assert Segmentation((20, 30), [], [], records=[]).mask_image().shape == (20, 30)
    mask = np.zeros((20, 30), np.uint8)
    mask[:10] = 255
    done = Inpainting(image, mask)
    assert done.render() is image and done.to_dict()["filled_fraction"] == 0.5
