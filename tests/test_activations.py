"""SiLU, sigmoid and GELU: the arithmetic-only CPU references against PyTorch."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import torch

import mlxnet
from mlxnet import ops
from mlxnet.ops.activations.cpu import _exp
from testutil import assert_close, to_numpy

TORCH = {"silu": torch.nn.functional.silu, "sigmoid": torch.sigmoid, "gelu": torch.nn.functional.gelu}


def test_arithmetic_exp_is_float32_accurate():
    x = mx.concatenate([mx.linspace(-87, 88.3, 20001), mx.array([0.0, -1e-8, 1e-8])])
    ref = np.exp(np.array(x).astype(np.float64))
    np.testing.assert_allclose(np.array(_exp(x)), ref, rtol=2e-7)
    # Outside float32's range it goes to 0 and inf, as float32 exp does.
    assert float(_exp(mx.array([-1000.0]))) == 0.0 and float(_exp(mx.array([1000.0]))) == float("inf")


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


@pytest.mark.parametrize("name", list(TORCH))
def test_extreme_inputs_stay_finite_and_right(name):
    """The range reduction must not turn huge finite inputs into NaN (r = z − n·ln2 loses
    all precision there); SiLU and sigmoid also take ±inf like PyTorch."""
    x = mx.array([-1e30, -1e10, -1e4, -100.0, -88.5, -30.0, 30.0, 88.5, 100.0, 1e4, 1e10, 1e30])
    with mlxnet.use_device("cpu"):
        y = np.array(getattr(ops, name)(x))
    ty = TORCH[name](torch.tensor(np.array(x))).numpy()
    np.testing.assert_allclose(y, ty, rtol=1e-6, atol=1e-30)
    if name != "gelu":
        inf = mx.array([float("inf")])
        assert float(getattr(ops, name)(inf)[0]) == float(TORCH[name](torch.tensor([float("inf")]))[0])


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_gelu_tanh_form_matches_torch(dtype):
    x = (mx.random.normal((4, 5, 6, 33), key=mx.random.key(2)) * 5).astype(dtype)
    tx = torch.tensor(to_numpy(x), dtype=torch.float64, requires_grad=True)
    with mlxnet.use_device("cpu"):
        y = ops.gelu(x, approximate="tanh")
        g = mx.grad(lambda v: (ops.gelu(v, approximate="tanh").astype(mx.float32)
                               * mx.cos(v.astype(mx.float32))).sum())(x)
    ty = torch.nn.functional.gelu(tx, approximate="tanh")
    (ty * torch.cos(tx)).sum().backward()
    assert y.dtype == dtype and g.dtype == dtype
    assert_close(y, ty.detach().numpy(), dtype, scale=2)
    assert_close(g, tx.grad.numpy(), dtype, scale=4)
