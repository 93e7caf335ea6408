"""batch_norm_train's GPU kernels at training sizes: many partial statistics per channel (the
property tests' small maps need one), channel counts off the group width, a mean far from zero
(the one-pass statistics' weak spot), and the gradients of every input, against the definition
differentiated by MLX."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxnet
from mlxnet import ops
from mlxnet.ops.norm import kernel as bn_kernel

SHAPES = [(4, 40, 40, 48), (16, 20, 20, 1), (2, 9, 7, 300), (3, 64, 64, 16)]


def _case(shape, dtype, offset):
    rng = np.random.default_rng(sum(shape))
    c = shape[-1]
    x = mx.array(rng.normal(offset, 3.0, shape).astype(np.float32)).astype(dtype)
    w = mx.array(rng.uniform(0.5, 1.5, c).astype(np.float32)).astype(dtype)
    b = mx.array(rng.normal(0, 1, c).astype(np.float32)).astype(dtype)
    dy = mx.array(rng.normal(0, 1, shape).astype(np.float32)).astype(dtype)
    return x, w, b, dy


def _value_and_grads(x, w, b, dy, activation):
    def f(x, w, b):
        y, mean, var = ops.batch_norm_train(x, w, b, eps=1e-3, activation=activation)
        # the statistics' own cotangents reach the backward too
        return (y.astype(mx.float32) * dy.astype(mx.float32)).sum() + 0.5 * mean.sum() + 0.25 * var.sum(), (y, mean, var)
    (_, outs), grads = mx.value_and_grad(f, argnums=(0, 1, 2))(x, w, b)
    mx.eval(outs, grads)
    return [np.array(a.astype(mx.float32)) for a in (*outs, *grads)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("dtype,offset,tol", [(mx.float32, 0.0, 2e-4), (mx.float32, 100.0, 2e-4),
                                              (mx.bfloat16, 5.0, 3e-2)])
def test_kernels_equal_the_definition(gpu, shape, activation, dtype, offset, tol):
    x, w, b, dy = _case(shape, dtype, offset)
    rows = x.size // shape[-1]
    assert bn_kernel._reduction_grid(rows, shape[-1])[1] > 1 or rows < 256
    assert ops.get("batch_norm_train").face() == "kernel"
    got = _value_and_grads(x, w, b, dy, activation)
    with mlxnet.use_kernels(False):
        want = _value_and_grads(x, w, b, dy, activation)
    names = ("y", "mean", "var", "dx", "dweight", "dbias")
    for name, g, r in zip(names, got, want):
        scale = max(float(np.abs(r).max()), 1.0)
        err = float(np.abs(g - r).max()) / scale
        assert err < tol, f"{name}: relative error {err:.3g}"


def _with_running(x, w, b, dy, activation, momentum=0.03):
    """The op with running statistics, differentiated through y only (as a training step: the
    statistics' cotangents are MLX's zeros), and the updated running statistics."""
    c = x.shape[-1]
    rm, rv = mx.linspace(-1, 1, c), mx.linspace(0.5, 2, c)

    def f(x, w, b):
        y, _, _, new_mean, new_var = ops.batch_norm_train(x, w, b, rm, rv, eps=1e-3, activation=activation,
                                                          momentum=momentum)
        return (y.astype(mx.float32) * dy.astype(mx.float32)).sum(), (new_mean, new_var)
    (_, running), grads = mx.value_and_grad(f, argnums=(0, 1, 2))(x, w, b)
    mx.eval(running, grads)
    return [np.array(a.astype(mx.float32)) for a in (*running, *grads)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype,offset,tol", [(mx.float32, 0.0, 2e-4), (mx.float32, 100.0, 2e-4),
                                              (mx.bfloat16, 5.0, 3e-2)])
def test_running_statistics_in_the_kernels_equal_the_definition(gpu, shape, dtype, offset, tol):
    """bn_finish's running-statistics update, and the backward with the statistics' cotangents
    the zeros MLX makes for outputs the loss does not read."""
    x, w, b, dy = _case(shape, dtype, offset)
    got = _with_running(x, w, b, dy, "silu")
    with mlxnet.use_kernels(False):
        want = _with_running(x, w, b, dy, "silu")
    for name, g, r in zip(("running_mean", "running_var", "dx", "dweight", "dbias"), got, want):
        scale = max(float(np.abs(r).max()), 1.0)
        err = float(np.abs(g - r).max()) / scale
        assert err < tol, f"{name}: relative error {err:.3g}"
