"""ops.depthwise_conv2d (depthwise conv + per-channel affine + activation) and nn.conv_bn_act."""
from __future__ import annotations

import mlxnet  # noqa: F401  (binds OpenBLAS before mlx.core)
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mlxnet import ops
from mlxnet.errors import MlxnetError
from mlxnet.nn import Conv2d, conv_bn_act
from testutil import assert_close

TORCH_ACT = {None: lambda t: t, "relu": F.relu, "gelu": F.gelu, "silu": F.silu}


def inputs(shape, k, seed=0):
    rng = np.random.default_rng(seed)
    c = shape[-1]
    return (rng.standard_normal(shape).astype(np.float32), rng.standard_normal((c, k, k, 1)).astype(np.float32),
            rng.uniform(0.5, 1.5, c).astype(np.float32), rng.standard_normal(c).astype(np.float32))


def torch_reference(x, w, scale, shift, stride, padding, activation):
    y = F.conv2d(torch.from_numpy(x).permute(0, 3, 1, 2), torch.from_numpy(w).permute(0, 3, 1, 2),
                 stride=stride, padding=padding, groups=x.shape[-1])
    y = y * torch.from_numpy(scale)[:, None, None] + torch.from_numpy(shift)[:, None, None]
    return TORCH_ACT[activation](y).permute(0, 2, 3, 1).numpy()


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu"])
@pytest.mark.parametrize("stride,padding,k", [(1, 1, 3), (2, 1, 3), ((2, 1), (2, 0), 5)])
def test_matches_torch(activation, stride, padding, k):
    x, w, scale, shift = inputs((2, 13, 11, 6), k)
    with mlxnet.use_device("cpu"):
        got = ops.depthwise_conv2d(*map(mx.array, (x, w, scale, shift)), stride=stride, padding=padding,
                                   activation=activation)
    assert_close(got, torch_reference(x, w, scale, shift, stride, padding, activation))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("activation", [None, "gelu", "silu"])
def test_gpu_kernel_matches_definition(gpu, dtype, activation):
    op = ops.get("depthwise_conv2d")
    for shape, stride in (((2, 33, 17, 64), 1), ((1, 64, 48, 256), 2)):
        x, w, scale, shift = (mx.array(a) for a in inputs(shape, 3, seed=shape[0]))
        x = x.astype(dtype)
        assert op.face() == "kernel"
        got = ops.depthwise_conv2d(x, w, scale, shift, stride=stride, padding=1, activation=activation)
        want = op.definition(x, w, scale, shift, stride=stride, padding=1, activation=activation)
        assert got.dtype == dtype
        assert_close(got, want, dtype, 2.0)


@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("bias", [False, True])
def test_conv_bn_act_fuses_only_an_inference_depthwise_block(activation, bias):
    mx.random.seed(3)
    c = 8
    conv, bn = Conv2d(c, c, 3, 2, 1, groups=c, bias=bias), nn.BatchNorm(c)
    bn.update({"running_mean": mx.random.normal((c,)), "running_var": mx.random.uniform(0.5, 2, (c,)),
               "weight": mx.random.normal((c,)), "bias": mx.random.normal((c,))})
    bn.eval()
    x = mx.random.normal((2, 9, 10, c))
    act = {None: lambda v: v, "gelu": ops.gelu}[activation]
    calls = []
    original = ops.depthwise_conv2d
    try:
        ops.depthwise_conv2d = lambda *a, **k: calls.append(1) or original(*a, **k)
        assert_close(conv_bn_act(conv, bn, x, activation), act(bn(conv(x))))
        assert calls == [1]
        bn.train()  # batch statistics: the layers as they are
        assert_close(conv_bn_act(conv, bn, x, activation), act(bn(conv(x))))
        full = Conv2d(c, 4, 3, 1, 1)  # not depthwise
        assert conv_bn_act(full, nn.BatchNorm(4), x).shape == (2, 9, 10, 4)
        assert calls == [1]
    finally:
        ops.depthwise_conv2d = original


def test_bad_arguments_are_one_line_errors():
    x, w, scale, shift = (mx.array(a) for a in inputs((1, 6, 6, 4), 3))
    with pytest.raises(MlxnetError, match=r"needs a \(C, KH, KW, 1\) weight with C = 4, got \(5, 3, 3, 1\)"):
        ops.depthwise_conv2d(x, mx.zeros((5, 3, 3, 1)), scale, shift)
    with pytest.raises(MlxnetError, match=r"scale and shift must be \(4,\), got \(3,\) and \(4,\)"):
        ops.depthwise_conv2d(x, w, scale[:3], shift)
    with pytest.raises(MlxnetError, match="unknown activation 'tanh'"):
        ops.depthwise_conv2d(x, w, scale, shift, activation="tanh")
