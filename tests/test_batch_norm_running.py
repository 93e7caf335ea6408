"""batch_norm_train's running statistics (what a training step leaves in each BatchNorm) against
PyTorch's BatchNorm on the same batch, on every CPU face, and through the layer helper."""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mlxnet
from mlxnet import ops
from mlxnet.errors import MlxnetError
from mlxnet.nn import batch_norm_act


def _torch_running(x: np.ndarray, rm: np.ndarray, rv: np.ndarray, momentum: float, eps: float):
    rm_t, rv_t = torch.tensor(rm), torch.tensor(rv)
    nchw = torch.tensor(x).permute(0, 3, 1, 2)
    F.batch_norm(nchw, rm_t, rv_t, None, None, training=True, momentum=momentum, eps=eps)
    return rm_t.numpy(), rv_t.numpy()


@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("shape,momentum", [((2, 5, 7, 16), 0.03), ((1, 2, 1, 3), 0.1), ((4, 3, 3, 33), 1.0)])
def test_running_statistics_equal_pytorch(kernels, shape, momentum):
    rng = np.random.default_rng(shape[-1])
    x = rng.normal(2.0, 3.0, shape).astype(np.float32)
    rm = rng.normal(0, 1, shape[-1]).astype(np.float32)
    rv = rng.uniform(0.5, 2, shape[-1]).astype(np.float32)
    c = shape[-1]
    with mlxnet.use_kernels(kernels):
        y, mean, var, new_mean, new_var = ops.batch_norm_train(
            mx.array(x), mx.ones((c,)), mx.zeros((c,)), mx.array(rm), mx.array(rv), eps=1e-3, momentum=momentum,
            activation="silu")
        y3 = ops.batch_norm_train(mx.array(x), mx.ones((c,)), mx.zeros((c,)), eps=1e-3, activation="silu")
    want_mean, want_var = _torch_running(x, rm, rv, momentum, 1e-3)
    np.testing.assert_allclose(np.array(new_mean), want_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(new_var), want_var, rtol=1e-5, atol=1e-6)
    # the outputs the op had before running statistics were given are unchanged
    assert len(y3) == 3
    for a, b in zip((y, mean, var), y3):
        np.testing.assert_array_equal(np.array(a), np.array(b))


def test_running_statistics_pass_no_gradient():
    x = mx.random.normal((2, 4, 4, 8))
    rm, rv = mx.zeros((8,)), mx.ones((8,))

    def f(x, rm, rv):
        _, _, _, a, b = ops.batch_norm_train(x, mx.ones((8,)), mx.zeros((8,)), rm, rv)
        return a.sum() + b.sum()
    for g in mx.grad(f, argnums=(0, 1, 2))(x, rm, rv):
        assert float(mx.abs(g).max()) == 0.0


@pytest.mark.parametrize("bad,message", [
    ({"running_mean": mx.zeros((8,))}, "give both running_mean and running_var"),
    ({"running_mean": mx.zeros((7,)), "running_var": mx.ones((8,))}, "running_mean must have shape (8,)"),
    ({"running_mean": mx.zeros((8,)), "running_var": mx.ones((8,)), "momentum": 1.5}, "momentum must be a number in [0, 1]"),
])
def test_running_statistics_are_checked(bad, message):
    with pytest.raises(MlxnetError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        ops.batch_norm_train(mx.zeros((2, 3, 3, 8)), mx.ones((8,)), mx.zeros((8,)), **bad)


def test_layer_helper_updates_the_layer_as_mlx_batch_norm():
    """batch_norm_act in training mode leaves the running statistics MLX's own BatchNorm leaves."""
    rng = np.random.default_rng(0)
    x = mx.array(rng.normal(1.0, 2.0, (3, 6, 6, 12)).astype(np.float32))
    ours, theirs = nn.BatchNorm(12, momentum=0.03), nn.BatchNorm(12, momentum=0.03)
    ours.train()
    theirs.train()
    y = batch_norm_act(ours, x)
    want = theirs(x)
    mx.eval(y, want, ours.parameters(), theirs.parameters())
    np.testing.assert_allclose(np.array(y), np.array(want), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.array(ours.running_mean), np.array(theirs.running_mean), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(ours.running_var), np.array(theirs.running_var), rtol=1e-5, atol=1e-6)
