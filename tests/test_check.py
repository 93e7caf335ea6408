"""`mlxnet check`: parity reports that name the first diverging layer."""
from __future__ import annotations

import json
import subprocess
import sys

import mlx.core as mx
import mlx.nn as nn
import pytest

import mlxnet
from mlxnet import check, ops
from mlxnet.ops.core import registry


class Block(nn.Module):
    def __init__(self, dims: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dims, dims)
        self.norm = mlxnet.nn.LayerNorm(dims)

    def __call__(self, x: mx.array) -> mx.array:
        return x + nn.gelu(self.norm(self.proj(x)))


class Tiny(nn.Module):
    def __init__(self, dims: int = 32, depth: int = 4) -> None:
        super().__init__()
        self.blocks = [Block(dims) for _ in range(depth)]
        self.head = nn.Linear(dims, 5)

    def __call__(self, x: mx.array) -> mx.array:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


@pytest.fixture
def model() -> Tiny:
    mx.random.seed(3)
    m = Tiny()
    for b in m.blocks:  # non-trivial affine parameters, so a dropped operand shows
        b.norm.weight = mx.random.uniform(0.5, 1.5, (32,))
        b.norm.bias = mx.random.normal((32,))
    mx.eval(m.parameters())
    return m


@pytest.fixture
def x() -> mx.array:
    return mx.random.normal((2, 7, 32), key=mx.random.key(4))


@pytest.fixture
def fake_kernel(monkeypatch):
    """Install a Python "kernel" for layer_norm that runs even on the CPU, to inject faults."""
    op = ops.get("layer_norm")

    def install(fn):
        monkeypatch.setattr(op, "kernel", fn)
        monkeypatch.setattr(registry.Op, "uses_kernel",
                            lambda self: self.kernel is not None and mlxnet.kernels_enabled())
    return install


def test_healthy_model_passes_on_this_machine(model, x):
    report = check.compare(model, [x], against="definitions")
    assert report.passed, report.first_failure
    paths = [l.path for l in report.layers]
    assert paths[0] == "blocks.0.proj" and paths[-1] == "<output>"
    assert "blocks.3.norm" in paths


def test_dropped_operand_is_traced_to_its_layer(model, x, fake_kernel):
    # As in a Metal add that ignored one operand: the bias is silently dropped.
    fake_kernel(lambda x, w=None, b=None, *, eps=1e-5: ops.get("layer_norm").definition(x, w, None, eps=eps))
    report = check.compare(model, [x], against="definitions")
    assert not report.passed
    assert report.first_failure == "blocks.0.norm"  # born here, not in the head where it shows
    before = {l.path: l for l in report.layers}
    assert before["blocks.0.proj"].ok and not before["<output>"].ok


def test_zeros_in_float16_are_flagged(model, x, fake_kernel):
    reference = ops.get("layer_norm").definition

    def zero_in_fp16(x, w=None, b=None, *, eps=1e-5):
        y = reference(x, w, b, eps=eps)
        return mx.zeros_like(y) if x.dtype == mx.float16 else y

    fake_kernel(zero_in_fp16)
    report = check.compare(model, [x], against="definitions", dtype="float16")
    assert report.first_failure == "blocks.0.norm"
    layer = next(l for l in report.layers if l.path == "blocks.0.norm")
    assert "all-zero" in layer.flags
    # The same model without the fault passes in float16 within its tolerance.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ops.get("layer_norm"), "kernel", None)
        assert check.compare(model, [x], against="definitions", dtype="float16").passed


def test_model_is_left_unchanged(model, x):
    before = model(x)
    check.compare(model, [x], dtype="bfloat16")
    assert type(model.blocks[0].norm) is mlxnet.nn.LayerNorm
    assert model.blocks[0].proj.weight.dtype == mx.float32
    assert mx.array_equal(model(x), before)


def test_nan_is_flagged():
    class Bad(nn.Module):
        def __call__(self, x):
            return mx.log(x) if x.dtype == mx.float16 else x

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Bad()

        def __call__(self, x):
            return self.inner(x)

    report = check.compare(Wrap(), [mx.array([-1.0, 2.0])], against="definitions", dtype="float16")
    assert report.first_failure == "inner" and "NaN" in report.layers[0].flags


@pytest.mark.gpu
def test_healthy_model_passes_gpu_against_cpu(gpu, model, x):
    report = check.compare(model, [x], against="cpu")
    assert report.passed, report.first_failure
    assert report.tested.startswith(gpu)


def test_cli_check_json_and_exit_codes(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mlxnet", "check", "resnet18", "--json", "--size", "64"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["passed"] and len(report["layers"]) > 20
    out = subprocess.run([sys.executable, "-m", "mlxnet", "check", "nosuchmodel"], capture_output=True, text=True)
    assert out.returncode == 1 and out.stderr.startswith("error: unknown model 'nosuchmodel'")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["resnet50", "yolov8s", "sam-tiny", "lama"])
def test_cli_check_passes_in_float16_on_the_gpu(gpu, name):
    """The command's GPU default (compiled forwards, direct launches) keeps every port within
    its float16 tolerance of the float32 definitions."""
    out = subprocess.run([sys.executable, "-m", "mlxnet", "check", name, "--json", "--size", "128",
                          "--dtype", "float16"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["passed"] and report["dtype"] == "float16" and report["tested"].startswith(gpu)


@pytest.mark.parametrize("name, dtype", [("yolov8n", "float32"), ("lama-fourier", "float16")])
def test_cli_check_covers_the_model_ports(name, dtype):
    out = subprocess.run([sys.executable, "-m", "mlxnet", "check", name, "--json", "--size", "64",
                          "--dtype", dtype], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["passed"] and report["dtype"] == dtype and len(report["layers"]) > 100


def test_check_locates_float16_underflow():
    """YOLOv8n with MLX's default initialisation on a 64² input: activations shrink towards
    ~1e-11, below float16's range. Precision fails first (subnormals), then outputs flush to
    zero; check names the first loss of precision, earlier than the first all-zero layer. (The
    CLI's random weights keep their scale, so this builds the network directly.)"""
    from mlxnet.models.yolo import YOLOv8

    mx.random.seed(0)
    net = YOLOv8("n")
    x = mx.random.uniform(shape=(1, 64, 64, 3), key=mx.random.key(0))
    report = check.compare(net, [x], dtype="float16").to_dict()
    assert not report["passed"]
    paths = [l["path"] for l in report["layers"]]
    zero = next(l["path"] for l in report["layers"] if "all-zero" in l["flags"])
    assert report["first_failure"].startswith("model.")
    assert paths.index(report["first_failure"]) < paths.index(zero)


def test_cli_check_compares_the_fast_paths_with_the_definitions():
    # YOLOv8n: its SiLUs take mlxnet's own CPU code on every x86 CPU (ResNet-18's convs, on a CPU
    # without AVX-512, are MLX's convolution in both).
    out = subprocess.run([sys.executable, "-m", "mlxnet", "--device", "cpu", "check", "yolov8n",
                          "--size", "64", "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["baseline"] == "cpu definitions, float32" and report["tested"] == "cpu fast paths, float32"
    # Real, small differences: the fast paths are different code from the definitions.
    assert 0 < max(layer["max_abs"] for layer in report["layers"]) and report["passed"]
