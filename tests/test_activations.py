"""SiLU, sigmoid and GELU: the arithmetic-only CPU references against PyTorch."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import torch

import mlxnet
from mlxnet import ops
from mlxnet.ops.activations import _exp
from testutil import assert_close, to_numpy

TORCH = {"silu": torch.nn.functional.silu, "sigmoid": torch.sigmoid, "gelu": torch.nn.functional.gelu}


def test_arithmetic_exp_is_float32_accurate():
    x = mx.concatenate([mx.linspace(-87, 88.3, 20001), mx.array([0.0, -1e-8, 1e-8])])
    ref = np.exp(np.array(x).astype(np.float64))
    np.testing.assert_allclose(np.array(_exp(x)), ref, rtol=2e-7)
    # Saturates (documented) rather than overflowing: finite at both ends.
    assert float(_exp(mx.array([-1000.0]))) < 1e-37 and 2e38 < float(_exp(mx.array([1000.0]))) < 3.5e38


@pytest.mark.parametrize("name", list(TORCH))
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_forward_and_gradient_match_torch(name, dtype):
    x = (mx.random.normal((4, 5, 6, 33), key=mx.random.key(1)) * 5).astype(dtype)
    tx = torch.tensor(to_numpy(x), dtype=torch.float64, requires_grad=True)
    fn = getattr(ops, name)
    with mlxnet.use_device("cpu"):
        y = fn(x)
        g = mx.grad(lambda v: (fn(v).astype(mx.float32) * mx.cos(v.astype(mx.float32))).sum())(x)
    ty = TORCH[name](tx)
    (ty * torch.cos(tx)).sum().backward()
    assert y.dtype == dtype and g.dtype == dtype
    assert_close(y, ty.detach().numpy(), dtype, scale=2)
    assert_close(g, tx.grad.numpy(), dtype, scale=4)


def test_works_inside_compile():
    f = mx.compile(lambda v: ops.silu(v) + ops.gelu(v) * ops.sigmoid(v))
    x = mx.random.normal((3, 17))
    assert_close(f(x), ops.silu(x) + ops.gelu(x) * ops.sigmoid(x))
