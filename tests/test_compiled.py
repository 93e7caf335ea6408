"""Compiled inference forwards (mlxnet.nn.compiled_for_inference): the default on GPUs, forced
here with use_compile(True) so that the CPU runs the same machinery."""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map

import mlxnet
from mlxnet import families
from mlxnet.nn import compiled_for_inference, evaluated, handoff, recompile
from mlxnet.models import yolo, yolo_arch
from mlxnet.nn.compiled import _CACHE


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = mlxnet.nn.Conv2d(3, 16, 3, padding=1)
        self.fc = nn.Linear(16, 5)
        self.scale = 1.0  # a Python attribute the forward reads

    @compiled_for_inference
    def __call__(self, x: mx.array, pooled: bool = True) -> mx.array:
        y = mlxnet.ops.silu(self.conv(x))
        return self.fc(y.mean(axis=(1, 2)) if pooled else y) * self.scale


def _compiled_calls(module: nn.Module) -> dict:
    return module.__dict__.get(_CACHE, {})


def test_eval_mode_compiles_once_and_matches_eager():
    net = Net()
    net.eval()
    x = mx.random.normal((2, 8, 8, 3))
    with mlxnet.use_compile(False):
        eager = net(x)
    assert not _compiled_calls(net)
    with mlxnet.use_compile(True):
        compiled = net(x)
        again = net(x)
    assert len(_compiled_calls(net)) == 1
    np.testing.assert_allclose(np.array(compiled), np.array(eager), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.array(again), np.array(compiled))


def test_new_shapes_arguments_and_weights_are_seen():
    net = Net()
    net.eval()
    with mlxnet.use_compile(True):
        a = net(mx.ones((1, 8, 8, 3)))
        b = net(mx.ones((3, 5, 7, 3)), pooled=False)  # another shape and a constant argument
        assert b.shape == (3, 5, 7, 5)
        net.fc.weight = mx.zeros_like(net.fc.weight)  # new weights: read at every call
        c = net(mx.ones((1, 8, 8, 3)))
    assert a.shape == c.shape == (1, 5)
    np.testing.assert_allclose(np.array(c), np.broadcast_to(np.array(net.fc.bias), (1, 5)), atol=1e-6)


def test_python_attributes_need_recompile():
    net = Net()
    net.eval()
    x = mx.ones((1, 4, 4, 3))
    with mlxnet.use_compile(True):
        before = np.array(net(x))
        net.scale = 2.0
        recompile(net)
        after = np.array(net(x))
    np.testing.assert_allclose(after, 2 * before, rtol=1e-6)


def test_training_mode_runs_eagerly_and_differentiates():
    net = Net()
    net.train()
    x = mx.random.normal((2, 8, 8, 3))
    with mlxnet.use_compile(True):
        loss, grads = nn.value_and_grad(net, lambda m, v: m(v).sum())(net, x)
    assert not _compiled_calls(net)
    assert float(mx.abs(grads["conv"]["weight"]).sum()) > 0


def test_the_default_follows_the_back_end_and_the_switch(monkeypatch):
    monkeypatch.delenv("MLXNET_COMPILE", raising=False)
    assert mlxnet.compile_enabled() == (mlxnet.backend() != "cpu")
    monkeypatch.setenv("MLXNET_COMPILE", "on")
    assert mlxnet.compile_enabled()
    monkeypatch.setenv("MLXNET_COMPILE", "0")
    assert not mlxnet.compile_enabled()
    with mlxnet.use_compile(True):
        assert mlxnet.compile_enabled()
    monkeypatch.setenv("MLXNET_COMPILE", "sometimes")
    with pytest.raises(mlxnet.MlxnetError, match="MLXNET_COMPILE.*'auto'"):
        mlxnet.compile_enabled()


def test_switching_kernels_traces_again():
    net = Net()
    net.eval()
    x = mx.random.normal((1, 6, 6, 3))
    with mlxnet.use_compile(True):
        with mlxnet.use_kernels(False):
            definition = net(x)
        fast = net(x)
    assert len(_compiled_calls(net)) == 2
    np.testing.assert_allclose(np.array(fast), np.array(definition), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("variant", ["resnet18", "yolov8n", "sam-tiny", "lama"])
def test_every_family_compiles_to_its_eager_output(variant):
    """Each bundled family's network, compiled, gives its eager output (CPU fast paths in both)."""
    family = families.family_of(variant)
    model = family.checked(family.build(variant))
    model.eval()
    inputs = family.example_inputs(variant, 64)
    with mlxnet.use_compile(False):
        eager = model(*inputs)
    with mlxnet.use_compile(True):
        compiled = model(*inputs)
    for e, c in zip(_leaves(eager), _leaves(compiled)):
        assert e.shape == c.shape
        np.testing.assert_allclose(np.array(c), np.array(e), rtol=2e-4, atol=2e-4 * float(mx.abs(e).max()) + 1e-6)


# SAM's staged forward is the slowest to build on a CPU: it runs with the slow tests.
@pytest.mark.parametrize("variant", ["yolov8n", pytest.param("sam-tiny", marks=pytest.mark.slow), "lama"])
def test_staged_forwards_see_new_weights(variant, monkeypatch):
    """The staged models compile each stage with only the submodules it reads as inputs
    (``reads=``): every weight must be among them, or a stage would keep the weights it was
    traced with. All weights are changed (each element moved on its own) after the first compiled call; the compiled forward
    must then give the eager output of the new weights."""
    family = families.family_of(variant)
    model = family.checked(family.build(variant))
    model.eval()
    inputs = family.example_inputs(variant, 64)
    if variant == "sam-tiny":  # the staged part; the random prompt decoder's masks are all zero
        model = model.sam.image_encoder
    monkeypatch.setattr(yolo_arch, "STAGED_MIN_WORK", 0)  # YOLOv8 stages large batches only
    with mlxnet.use_compile(True):
        before = _leaves(model(*inputs))
    assert len(_all_compiled_calls(model)) >= 2  # staged
    mx.random.seed(1)  # each element moved on its own: LayerNorms make uniform scaling invisible
    model.update(tree_map(lambda a: (a + 0.05 * (mx.abs(a).mean() + 0.1) * mx.random.normal(a.shape)).astype(a.dtype)
                          if mx.issubdtype(a.dtype, mx.floating) else a, model.parameters()))
    with mlxnet.use_compile(False):
        eager = _leaves(model(*inputs))
    with mlxnet.use_compile(True):
        compiled = _leaves(model(*inputs))
    assert any(not np.allclose(np.array(b), np.array(e)) for b, e in zip(before, eager))
    for e, c in zip(eager, compiled):
        np.testing.assert_allclose(np.array(c), np.array(e), rtol=2e-4, atol=2e-4 * float(mx.abs(e).max()) + 1e-6)


def test_yolov8_stages_large_inputs_only(monkeypatch):
    """Below STAGED_MIN_WORK (pixels × stem width²) the compiled YOLOv8 is one graph; from it,
    the first layers in stages handed off one by one, then the rest; both give the same output."""
    net = yolo.YOLOv8("n")
    net.eval()
    x = mx.random.uniform(shape=(2, 64, 96, 3))
    with mlxnet.use_compile(True):
        whole = net(x)
        assert [key[0] for key in _compiled_calls(net)] == ["YOLONet._whole"]
        monkeypatch.setattr(yolo_arch, "STAGED_MIN_WORK", 2 * 64 * 96 * 16 ** 2)  # yolov8n: 16 wide
        staged = net(x)
    stages = list(zip(yolo_arch.BACKBONE_STAGES, yolo_arch.BACKBONE_STAGES[1:]))
    assert [(key[0], key[-1]) for key in _compiled_calls(net)] == (
        [("YOLONet._whole", ())] + [("YOLONet._layers", b) for b in stages] + [("YOLONet._rest", ())])
    # the staged rows are the opening chain: each reads only the row before
    assert stages[0][0] == 0 and all(net._sources[i] == i - 1 for i in range(1, stages[-1][1] + 1))
    np.testing.assert_allclose(np.array(staged), np.array(whole), rtol=1e-5, atol=1e-5)


def _all_compiled_calls(model: nn.Module) -> list:
    return [c for _, m in model.named_modules() for c in _compiled_calls(m).values()]


@pytest.mark.parametrize("stage_end", [handoff, evaluated])
def test_handoff_and_evaluated_are_lazy_inside_transformations(stage_end):
    """handoff starts arrays on the device, evaluated computes them; inside mx.compile, vmap and
    grad, where nothing may be evaluated, the values pass through and the transformation's
    result is unchanged."""
    def f(x):
        return stage_end(x * 2) + 1

    x = mx.array([1.0, 2.0])
    assert mx.array_equal(f(x), mx.array([3.0, 5.0]))
    assert mx.array_equal(mx.compile(f)(x), mx.array([3.0, 5.0]))
    assert mx.array_equal(mx.vmap(f)(x), mx.array([3.0, 5.0]))
    assert mx.array_equal(mx.grad(lambda x: f(x).sum())(x), mx.array([2.0, 2.0]))
    pair = stage_end((x, None))
    assert pair[0] is x and pair[1] is None


def test_staged_forwards_inside_user_transformations():
    """LaMa's forward runs as compiled stages handed to the device one after another; under a
    caller's own mx.compile or grad the stages join the caller's graph with the same result."""
    from mlxnet.models.lama import LaMa

    mx.random.seed(3)
    model = LaMa(n_blocks=4)
    model.eval()
    x = mx.random.uniform(shape=(1, 32, 24, 4))
    assert len(model._stages()) == 4  # encoder, 3 + 1 blocks, decoder
    with mlxnet.use_compile(False):
        eager = model(x)
        grad_eager = mx.grad(lambda v: model(v).sum())(x)
    with mlxnet.use_compile(True):
        staged = model(x)
        wrapped = mx.compile(model)(x)
        grad_staged = mx.grad(lambda v: model(v).sum())(x)
    for got, want in ((staged, eager), (wrapped, eager), (grad_staged, grad_eager)):
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["resnet50", "yolov8n", "sam-tiny", "lama"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_compiled_gpu_forward_matches_eager(gpu, variant, dtype):
    # As `mlxnet check` builds it: random weights whose BatchNorm statistics fit the input, so
    # that float16 activations stay in range.
    model, inputs = families.build_for_check(variant, None, None, 128)
    model.eval()
    if dtype != "float32":
        model.set_dtype(getattr(mx, dtype))
    inputs = [x.astype(getattr(mx, dtype)) if isinstance(x, mx.array) and mx.issubdtype(x.dtype, mx.floating) else x
              for x in inputs]
    assert mlxnet.compile_enabled()  # the GPU default
    with mlxnet.use_compile(False):
        eager = model(*inputs)
    compiled = model(*inputs)
    tol = 2e-3 if dtype == "float32" else 2e-2  # TF32 / half: fusion changes rounding
    for e, c in zip(_leaves(eager), _leaves(compiled)):
        e32, c32 = np.array(e.astype(mx.float32)), np.array(c.astype(mx.float32))
        assert np.isfinite(e32).all() and np.isfinite(c32).all()
        assert np.abs(c32 - e32).max() <= tol * (np.abs(e32).max() + 1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_staged_yolov8_gpu_forward_matches_eager(gpu, monkeypatch, dtype):
    """YOLOv8's compiled stages (taken from STAGED_MIN_WORK, forced here) on the GPU."""
    monkeypatch.setattr(yolo_arch, "STAGED_MIN_WORK", 0)
    model, inputs = families.build_for_check("yolov8s", None, None, 256)
    model.eval()
    model.set_dtype(getattr(mx, dtype))
    x = inputs[0].astype(getattr(mx, dtype))
    with mlxnet.use_compile(False):
        eager = np.array(model(x).astype(mx.float32))
    staged = np.array(model(x).astype(mx.float32))
    assert [key[0] for key in _compiled_calls(model)] == ["YOLONet._layers"] * (len(yolo_arch.BACKBONE_STAGES) - 1) + ["YOLONet._rest"]
    tol = 2e-3 if dtype == "float32" else 2e-2
    assert np.isfinite(staged).all()
    assert np.abs(staged - eager).max() <= tol * (np.abs(eager).max() + 1e-6)


def _leaves(tree) -> list[mx.array]:
    return [a for _, a in tree_flatten(tree) if isinstance(a, mx.array)]


_FORWARD = """
import sys, numpy as np, mlx.core as mx, mlxnet
from mlx.utils import tree_flatten, tree_map
from mlxnet import families
mlxnet.use_device("gpu")
mx.random.seed(0)
out = {}
for variant in ("resnet18", "yolov8n", "lama"):
    model, inputs = families.build_for_check(variant, None, None, 128)
    model.eval()
    for i, (_, a) in enumerate(tree_flatten(model(*inputs))):
        out[f"{variant}{i}"] = np.array(a.astype(mx.float32))
np.savez(sys.argv[1], **out)
"""


@pytest.mark.gpu
def test_direct_launches_give_the_cuda_graph_outputs(gpu, tmp_path):
    """mlxnet.tune_gpu (the command's default) only changes how MLX launches kernels."""
    import os
    import subprocess
    import sys

    results = []
    for graphs in ("1", "0"):
        path = tmp_path / f"graphs{graphs}.npz"
        subprocess.run([sys.executable, "-c", _FORWARD, str(path)], check=True, timeout=600,
                       env={**os.environ, "MLX_USE_CUDA_GRAPHS": graphs})
        results.append(np.load(path))
    with_graphs, direct = results
    assert set(with_graphs.files) == set(direct.files) and len(direct.files) >= 3
    for name in direct.files:
        a, b = with_graphs[name], direct[name]
        assert np.isfinite(b).all()
        assert np.abs(a - b).max() <= 1e-3 * (np.abs(a).max() + 1e-6), name
