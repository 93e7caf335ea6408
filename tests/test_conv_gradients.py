"""A dense conv's gradients as two convolutions (mlxnet.ops.conv.cuda_grad), the form conv2d takes
on CUDA inside a training step: equal to MLX's own gradients of ``mx.conv2d`` at every stride,
padding and size (odd sizes, strides that do not divide the map, a padding wider than the
kernel's reach)."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxnet
from mlxnet import ops
from mlxnet.device import differentiating
from mlxnet.ops.conv import cuda_grad

GEOMETRIES = [  # (N, H, W, C, O, k, stride, padding)
    (2, 9, 11, 16, 8, 3, 1, 1), (2, 10, 10, 16, 8, 3, 2, 1), (2, 11, 9, 16, 5, 3, 2, 1),
    (1, 8, 8, 16, 4, 1, 1, 0), (3, 7, 7, 16, 6, 1, 2, 0), (2, 13, 12, 17, 3, 5, 2, 2),
    (2, 9, 9, 16, 4, 3, 3, 0), (1, 6, 6, 16, 2, 1, 1, 1), (2, 8, 9, 16, 3, 3, 1, 2),
]


def _grads(conv, x, w, g):
    y, (dx, dw) = mx.vjp(conv, [x, w], [g])
    mx.eval(y, dx, dw)
    return [np.array(a.astype(mx.float32)) for a in (y[0], dx, dw)]


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_gradients_equal_mlx(geometry):
    n, h, w, c, o, k, s, p = geometry
    rng = np.random.default_rng(h * w + c)
    x = mx.array(rng.normal(size=(n, h, w, c)).astype(np.float32))
    wt = mx.array(rng.normal(size=(o, k, k, c)).astype(np.float32))
    g = mx.array(rng.normal(size=mx.conv2d(x, wt, stride=s, padding=p).shape).astype(np.float32))
    got = _grads(lambda a, b: cuda_grad.conv2d(a, b, stride=(s, s), padding=(p, p)), x, wt, g)
    want = _grads(lambda a, b: mx.conv2d(a, b, stride=s, padding=p), x, wt, g)
    for name, a, b in zip(("y", "dx", "dweight"), got, want):
        assert a.shape == b.shape, name
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(np.abs(b).max()), err_msg=name)


def test_takes_dense_undilated_convs_of_enough_channels():
    x, w = mx.zeros((2, 8, 8, 16)), mx.zeros((4, 3, 3, 16))
    assert cuda_grad.takes(x, w, (1, 1), 1)
    assert not cuda_grad.takes(x, w, (2, 2), 1)
    assert not cuda_grad.takes(mx.zeros((2, 8, 8, 3)), mx.zeros((4, 3, 3, 3)), (1, 1), 1)  # an RGB input
    assert not cuda_grad.takes(x, mx.zeros((16, 3, 3, 1)), (1, 1), 16)  # depthwise
    assert not cuda_grad.takes(x.astype(mx.bfloat16), w, (1, 1), 1)


@pytest.mark.gpu
@pytest.mark.parametrize("geometry", GEOMETRIES[:6])
@pytest.mark.parametrize("dtype,tol", [(mx.float32, 2e-3), (mx.bfloat16, 3e-2)])
def test_conv2d_in_a_training_step_takes_them_on_cuda(gpu, monkeypatch, geometry, dtype, tol):
    """conv2d's GPU face inside ``differentiating()``: on CUDA its gradients are cuda_grad's (the
    call is seen), equal to the definition's differentiated by MLX; outside it, MLX's."""
    n, h, w, c, o, k, s, p = geometry
    rng = np.random.default_rng(h + c)
    x = mx.array(rng.normal(size=(n, h, w, c)).astype(np.float32)).astype(dtype)
    wt = mx.array(rng.normal(size=(o, k, k, c)).astype(np.float32) * 0.2).astype(dtype)
    b = mx.zeros((o,), dtype)
    calls = []
    real = cuda_grad.conv2d
    monkeypatch.setattr(cuda_grad, "conv2d", lambda *a, **kw: calls.append(1) or real(*a, **kw))

    def loss(x, wt):
        return (ops.conv2d(x, wt, b, stride=s, padding=p, activation="silu").astype(mx.float32) ** 2).sum()
    with differentiating():
        got = mx.grad(loss, argnums=(0, 1))(x, wt)
    mx.eval(got)
    assert calls == ([1] if gpu == "cuda" and cuda_grad.takes(x, wt, (1, 1), 1) else [])
    with mlxnet.use_kernels(False):
        want = mx.grad(loss, argnums=(0, 1))(x, wt)
    for name, a, r in zip(("dx", "dweight"), got, want):
        a, r = np.array(a.astype(mx.float32)), np.array(r.astype(mx.float32))
        err = float(np.abs(a - r).max()) / max(float(np.abs(r).max()), 1e-6)
        assert err < tol, f"{name}: relative error {err:.3g}"
    calls.clear()
    mx.eval(mx.grad(loss, argnums=(0, 1))(x, wt))
    assert calls == []
