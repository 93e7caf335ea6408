"""softmax and scaled_dot_product_attention: CPU references against PyTorch."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import torch

import mlxnet
from mlxnet import ops
from testutil import assert_close, to_numpy


@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_softmax_matches_torch(axis, dtype):
    x = (mx.random.normal((3, 6, 40), key=mx.random.key(2)) * 8).astype(dtype)
    tx = torch.tensor(to_numpy(x), dtype=torch.float64, requires_grad=True)
    probe = np.random.default_rng(0).standard_normal(x.shape)
    ty = torch.softmax(tx, dim=axis)
    (ty * torch.from_numpy(probe)).sum().backward()
    with mlxnet.use_device("cpu"):
        y = ops.softmax(x, axis=axis)
        g = mx.grad(lambda v: (ops.softmax(v, axis=axis).astype(mx.float32) * mx.array(probe, mx.float32)).sum())(x)
    assert y.dtype == dtype
    assert_close(y, ty.detach().numpy(), dtype, scale=2)
    assert_close(g, tx.grad.numpy(), dtype, scale=4)


@pytest.mark.parametrize("with_bias", [False, True])
def test_attention_matches_torch(with_bias):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 3, 10, 16)).astype(np.float32) for _ in range(3))
    bias = rng.standard_normal((1, 3, 10, 10)).astype(np.float32) if with_bias else None
    want = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(a) for a in (q, k, v)), attn_mask=None if bias is None else torch.from_numpy(bias),
        scale=0.3).numpy()
    with mlxnet.use_device("cpu"):
        got = ops.scaled_dot_product_attention(mx.array(q), mx.array(k), mx.array(v),
                                               None if bias is None else mx.array(bias), scale=0.3)
    assert_close(got, want, scale=4)
