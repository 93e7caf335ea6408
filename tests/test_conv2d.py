"""conv2d op (1×1 as GEMM, depthwise as shifted multiply-adds, per-tap GEMMs, the CPU primitives'
direct conv, else mx.conv2d) against PyTorch."""
from __future__ import annotations


import mlx.core as mx
import numpy as np
import pytest
import torch

import mlxnet
from mlxnet import ops
from testutil import assert_close

CASES = [  # (input NHWC, C_out, kernel, stride, padding, dilation, groups)
    ((2, 9, 11, 8), 8, 3, 1, 1, 1, 8),      # depthwise
    ((1, 10, 10, 16), 16, 5, 2, 2, 1, 16),  # depthwise, strided, 5×5
    ((1, 10, 12, 16), 16, 3, 1, 2, 2, 16),  # depthwise, dilated
    ((2, 8, 8, 12), 6, 1, 1, 0, 1, 1),      # 1×1 → GEMM
    ((2, 9, 9, 12), 6, 1, 2, 0, 1, 1),      # strided 1×1
    ((1, 8, 8, 12), 6, 3, 1, 1, 1, 3),      # grouped → mx.conv2d
    ((1, 11, 9, 16), 3, 7, 1, 3, 1, 1),     # few outputs → GEMM over taps, shifted sums
    ((2, 10, 10, 16), 2, 3, 1, 2, 2, 1),    # the same, dilated
    ((1, 7, 9, 5), 4, 3, 2, 1, 1, 1),       # plain → mx.conv2d
    ((2, 33, 35, 8), 12, 3, 1, 1, 1, 1),    # stride 1, ≥ 2048 pixels → one GEMM per tap on rows
    ((1, 50, 48, 10), 9, 3, 1, 2, 2, 1),    # the same, dilated
    ((1, 48, 50, 8), 8, 2, 1, 0, 1, 1),     # the same, even kernel, no padding
    ((1, 13, 29, 16), 32, 3, 1, 1, 1, 1),   # C_out % 16 == 0 → direct conv (CPU primitives)
    ((2, 17, 12, 3), 16, 3, 2, 1, 1, 1),    # the same, an RGB stride-2 stem
    ((1, 9, 13, 8), 112, 3, 1, 2, 2, 1),    # the same, dilated, 64 + 32 + 16 channel blocks
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_matches_torch_forward_and_backward(case, dtype):
    shape, c_out, k, s, p, d, g = case
    rng = np.random.default_rng(sum(shape) + k)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((c_out, k, k, shape[-1] // g)).astype(np.float32)
    b = rng.standard_normal(c_out).astype(np.float32)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2), b))
    ty = torch.nn.functional.conv2d(tx, tw, tb, stride=s, padding=p, dilation=d, groups=g)
    probe = rng.standard_normal(ty.shape).astype(np.float32)
    (ty * torch.from_numpy(probe)).sum().backward()
    kw = dict(stride=s, padding=p, dilation=d, groups=g)
    args = [mx.array(a).astype(dtype) for a in (x, w, b)]
    with mlxnet.use_device("cpu"):
        y = ops.conv2d(*args, **kw)
        grads = mx.grad(lambda *a: (ops.conv2d(*a, **kw).astype(mx.float32)
                                    * mx.array(probe.transpose(0, 2, 3, 1))).sum(), argnums=(0, 1, 2))(*args)
    scale = 4 if dtype == mx.float32 else 8
    assert_close(y, ty.detach().numpy().transpose(0, 2, 3, 1), dtype, scale)
    assert_close(grads[0], tx.grad.numpy().transpose(0, 2, 3, 1), dtype, scale)
    assert_close(grads[1], tw.grad.numpy().transpose(0, 2, 3, 1), dtype, scale)
    assert_close(grads[2], tb.grad.numpy(), dtype, scale)


def test_layer_keeps_mlx_parameter_names_and_bad_groups_error():
    layer = mlxnet.nn.Conv2d(6, 4, 3, padding=1)
    assert set(layer.parameters()) == {"weight", "bias"} and layer.weight.shape == (4, 3, 3, 6)
    with pytest.raises(mlxnet.MlxnetError, match=r"conv2d: weight \(4, 3, 3, 6\) with groups=1 does not fit an input of 5"):
        layer(mx.zeros((1, 4, 4, 5)))


def test_pointwise_conv_of_concat_equals_the_conv_of_the_concatenation():
    parts = [mx.random.normal((2, 5, 6, c)) for c in (3, 8, 4)]
    w, b = mx.random.normal((7, 1, 1, 15)), mx.random.normal((7,))
    want = mx.conv2d(mx.concatenate(parts, axis=-1), w) + b
    got = ops.pointwise_conv_of_concat(parts, w, b)
    tol = 1e-5 if mlxnet.backend() != "cuda" else 5e-3  # CUDA matmuls and convs run in TF32
    assert got.shape == want.shape and mx.abs(got - want).max().item() < tol * max(1.0, mx.abs(want).max().item())
    with pytest.raises(mlxnet.MlxnetError, match=r"weight \(7, 1, 1, 15\) does not fit parts"):
        ops.pointwise_conv_of_concat(parts[:2], w)
    # with the SiLU applied: 16 outputs, which the CPU primitives' direct conv takes; 24, which it cannot
    for c_out in (16, 24):
        w_a, b_a = mx.random.normal((c_out, 1, 1, 15)), mx.random.normal((c_out,))
        v = mx.conv2d(mx.concatenate(parts, axis=-1), w_a) + b_a
        got = ops.pointwise_conv_of_concat(parts, w_a, b_a, activation="silu")
        assert mx.abs(got - v * mx.sigmoid(v)).max().item() < tol * max(1.0, mx.abs(v).max().item())


def _silu_conv_against_torch() -> None:
    rng = np.random.default_rng(12)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((2, 15, 14, 8), (32, 3, 3, 8), (32,)))
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2), b))
    ty = torch.nn.functional.silu(torch.nn.functional.conv2d(tx, tw, tb, stride=2, padding=1))
    ty.square().sum().backward()
    args = [mx.array(a) for a in (x, w, b)]
    run = lambda *a: ops.conv2d(*a, stride=2, padding=1, activation="silu")  # noqa: E731
    y = run(*args)
    grads = mx.grad(lambda *a: run(*a).square().sum(), argnums=(0, 1, 2))(*args)
    scale = 4 if mlxnet.backend() != "cuda" else 2000  # CUDA convs run in TF32
    assert_close(y, ty.detach().numpy().transpose(0, 2, 3, 1), mx.float32, scale)
    assert_close(grads[0], tx.grad.numpy().transpose(0, 2, 3, 1), mx.float32, scale)
    assert_close(grads[1], tw.grad.numpy().transpose(0, 2, 3, 1), mx.float32, scale)
    assert_close(grads[2], tb.grad.numpy(), mx.float32, scale)


def test_silu_activation_matches_torch_and_bad_activations_error():
    with mlxnet.use_device("cpu"):
        _silu_conv_against_torch()
        with pytest.raises(mlxnet.MlxnetError, match="activation must be None, 'silu' or 'relu', got 'gelu'"):
            ops.conv2d(mx.zeros((1, 4, 4, 2)), mx.zeros((16, 3, 3, 2)), activation="gelu")
        with pytest.raises(mlxnet.MlxnetError, match=r"residual must have the output's shape \(1, 2, 2, 16\), got \(1, 4, 4, 16\)"):
            ops.conv2d(mx.zeros((1, 4, 4, 2)), mx.zeros((16, 3, 3, 2)), None, mx.zeros((1, 4, 4, 16)))


@pytest.mark.gpu
def test_silu_activation_on_gpu_matches_torch(gpu):
    _silu_conv_against_torch()


def _column_pairs_against_torch(shape: tuple, c_out: int, dtype: mx.Dtype, run, stride: int = 1) -> None:
    rng = np.random.default_rng(sum(shape) + c_out)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in (shape, (c_out, 3, 3, shape[-1]), (c_out,)))
    tx, tw = (torch.tensor(a, requires_grad=True) for a in (x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2)))
    ty = torch.nn.functional.silu(torch.nn.functional.conv2d(tx, tw, torch.from_numpy(b), stride=stride, padding=1))
    ty.square().sum().backward()
    args = [mx.array(a).astype(dtype) for a in (x, w, b)]
    y = run(*args)
    grads = mx.grad(lambda *a: run(*a).astype(mx.float32).square().sum(), argnums=(0, 1))(*args)
    scale = (4 if mlxnet.backend() != "cuda" else 2000) * (1 if dtype == mx.float32 else 4)  # CUDA: TF32
    assert_close(y, ty.detach().numpy().transpose(0, 2, 3, 1), dtype, scale)
    assert_close(grads[0], tx.grad.numpy().transpose(0, 2, 3, 1), dtype, scale)
    assert_close(grads[1], tw.grad.numpy().transpose(0, 2, 3, 1), dtype, scale)


@pytest.mark.parametrize("shape, c_out", [((2, 5, 8, 3), 5), ((1, 6, 10, 48), 48), ((1, 3, 2, 4), 2)])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_column_pair_conv_is_the_3x3_conv(shape, c_out, dtype):
    """Pairs of columns packed into channels, with the weight spread over the pairs: the same
    stride-1, padding-1 3×3 conv, forward and backward."""
    from mlxnet.ops.conv.kernel import column_pair_conv3x3

    def run(x, w, b):
        v = column_pair_conv3x3(x, w) + b
        return v * mx.sigmoid(v)

    with mlxnet.use_device("cpu"):
        _column_pairs_against_torch(shape, c_out, dtype, run)


@pytest.mark.parametrize("shape, c_out", [((2, 7, 8, 32), 16), ((1, 6, 10, 3), 5), ((1, 2, 2, 4), 2)])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_strided_column_pair_conv_is_the_stride_2_conv(shape, c_out, dtype):
    """Pairs of columns with a 3×2 kernel at stride (2, 1), padded one pair on the left: the
    same stride-2, padding-1 3×3 conv (odd heights too), forward and backward."""
    from mlxnet.ops.conv.kernel import column_pair_conv3x3_s2

    def run(x, w, b):
        v = column_pair_conv3x3_s2(x, w) + b
        return v * mx.sigmoid(v)

    with mlxnet.use_device("cpu"):
        _column_pairs_against_torch(shape, c_out, dtype, run, stride=2)


def test_cuda_face_takes_strided_pairs_only_by_its_rule(monkeypatch):
    from mlxnet.ops.conv import kernel as conv_kernel

    calls = []
    real = conv_kernel.column_pair_conv3x3_s2
    monkeypatch.setattr(conv_kernel, "column_pair_conv3x3_s2", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(conv_kernel, "backend", lambda: "cuda")
    monkeypatch.setattr(conv_kernel, "MIN_PAIRED_PIXELS", 2 * 6 * 8)
    run = lambda x, w, b=None: conv_kernel.conv2d(x, w, b, stride=2, padding=1, activation="silu")  # noqa: E731
    with mlxnet.use_device("cpu"):
        _column_pairs_against_torch((2, 12, 16, 32), 64, mx.float32, run, stride=2)
        assert calls
        calls.clear()
        for shape, dtype in [((2, 12, 15, 32), mx.float32),  # odd width
                             ((1, 12, 16, 32), mx.float32),  # fewer output pixels
                             ((2, 12, 16, 48), mx.float32),  # other channel counts
                             ((2, 12, 16, 32), mx.float16)]:  # cuDNN's float16 kernels are fine
            run(mx.zeros(shape, dtype), mx.zeros((64, 3, 3, shape[-1]), dtype))
        assert not calls


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_48_channel_and_strided_32_channel_convs_run_on_column_pairs_on_cuda(gpu, monkeypatch, dtype):
    from mlxnet.ops.conv import kernel as conv_kernel

    calls = []
    real = conv_kernel.column_pair_conv3x3
    monkeypatch.setattr(conv_kernel, "column_pair_conv3x3", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(conv_kernel, "MIN_PAIRED_PIXELS", 2 * 12 * 16)  # this test's small maps
    run = lambda *a: ops.conv2d(*a, padding=1, activation="silu")  # noqa: E731
    _column_pairs_against_torch((2, 12, 16, 48), 48, dtype, run)
    assert bool(calls) == (mlxnet.backend() == "cuda")
    calls.clear()
    _column_pairs_against_torch((2, 12, 15, 48), 48, dtype, run)  # odd width: the plain conv
    _column_pairs_against_torch((1, 12, 16, 48), 48, dtype, run)  # fewer pixels: the plain conv
    assert not calls

    strided = []
    real_s2 = conv_kernel.column_pair_conv3x3_s2
    monkeypatch.setattr(conv_kernel, "column_pair_conv3x3_s2", lambda *a: strided.append(a) or real_s2(*a))
    run2 = lambda *a: ops.conv2d(*a, stride=2, padding=1, activation="silu")  # noqa: E731
    _column_pairs_against_torch((8, 12, 16, 32), 64, dtype, run2, stride=2)  # 384 output pixels
    assert bool(strided) == (mlxnet.backend() == "cuda" and dtype == mx.float32)


def _few_outputs_against_torch(shape: tuple, c_out: int, k: int, padding: int, dilation: int, run) -> None:
    rng = np.random.default_rng(sum(shape) + c_out + k)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in (shape, (c_out, k, k, shape[-1]), (c_out,)))
    tx, tw = (torch.tensor(a, requires_grad=True) for a in (x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2)))
    ty = torch.nn.functional.conv2d(tx, tw, torch.from_numpy(b), padding=padding, dilation=dilation)
    ty.square().sum().backward()
    args = [mx.array(a) for a in (x, w, b)]
    kw = dict(padding=padding, dilation=dilation)
    y = run(*args, **kw)
    grads = mx.grad(lambda *a: run(*a, **kw).square().sum(), argnums=(0, 1))(*args)
    scale = 4 if mlxnet.backend() != "cuda" else 2000  # CUDA: TF32
    assert_close(y, ty.detach().numpy().transpose(0, 2, 3, 1), mx.float32, scale)
    assert_close(grads[0], tx.grad.numpy().transpose(0, 2, 3, 1), mx.float32, scale)
    assert_close(grads[1], tw.grad.numpy().transpose(0, 2, 3, 1), mx.float32, scale)


def _count_taps(monkeypatch) -> list:
    from mlxnet.ops.conv import kernel as conv_kernel

    calls = []
    real = conv_kernel._taps_then_shift
    monkeypatch.setattr(conv_kernel, "_taps_then_shift", lambda *a: calls.append(a) or real(*a))
    return calls


@pytest.mark.parametrize("shape, c_out, k, padding, dilation, taken", [
    ((2, 11, 9, 64), 3, 7, 0, 1, True),    # LaMa's head: 64 → 3, 7×7 on a reflect-padded map
    ((1, 10, 12, 96), 1, 3, 2, 2, True),   # zero-padded, dilated
    ((1, 9, 9, 64), 4, 3, 1, 1, False),    # four outputs: cuDNN's conv
    ((1, 9, 9, 32), 3, 5, 2, 1, False),    # too few input channels: cuDNN's conv
])
def test_cuda_face_runs_few_output_convs_as_tap_gemms(monkeypatch, shape, c_out, k, padding, dilation, taken):
    """The GPU face's rule for float32 convs to 1-3 channels, on the CPU with the back end read
    as CUDA: which convs it takes, and that they are the conv, forward and backward."""
    from mlxnet.ops.conv import kernel as conv_kernel

    calls = _count_taps(monkeypatch)
    monkeypatch.setattr(conv_kernel, "backend", lambda: "cuda")
    with mlxnet.use_device("cpu"):
        _few_outputs_against_torch(shape, c_out, k, padding, dilation, conv_kernel.conv2d)
    assert bool(calls) == taken


def test_tap_gemm_rule_keeps_float16_and_caps_memory(monkeypatch):
    from mlxnet.ops.conv import kernel as conv_kernel

    monkeypatch.setattr(conv_kernel, "backend", lambda: "cuda")
    x, w = mx.zeros((1, 20, 20, 64)), mx.zeros((3, 7, 7, 64))
    assert conv_kernel._taps_help(x, w, (1, 1), (0, 0), (1, 1), 1)
    assert not conv_kernel._taps_help(x.astype(mx.float16), w.astype(mx.float16), (1, 1), (0, 0), (1, 1), 1)
    assert not conv_kernel._taps_help(x, w, (2, 2), (0, 0), (1, 1), 1)
    monkeypatch.setattr(conv_kernel, "MAX_TAPS_BYTES", 20 * 20 * 49 * 3 * 4 - 1)
    assert not conv_kernel._taps_help(x, w, (1, 1), (0, 0), (1, 1), 1)


def test_tap_gemm_rule_yields_to_a_process_that_chose_memory(monkeypatch):
    """With one kernel per command buffer (tune_gpu(low_memory=True)) the taps' products, 49
    times a 7×7 conv's output, are not made: cuDNN's conv holds no such buffer."""
    from mlxnet.ops.conv import kernel as conv_kernel

    monkeypatch.setattr(conv_kernel, "backend", lambda: "cuda")
    x, w = mx.zeros((1, 20, 20, 64)), mx.zeros((3, 7, 7, 64))
    monkeypatch.delenv("MLX_MAX_OPS_PER_BUFFER", raising=False)
    assert conv_kernel._taps_help(x, w, (1, 1), (0, 0), (1, 1), 1)
    monkeypatch.setenv("MLX_MAX_OPS_PER_BUFFER", "1")
    assert mlxnet.device.memory_first()
    assert not conv_kernel._taps_help(x, w, (1, 1), (0, 0), (1, 1), 1)
    monkeypatch.setenv("MLX_MAX_OPS_PER_BUFFER", "40")
    assert conv_kernel._taps_help(x, w, (1, 1), (0, 0), (1, 1), 1)


@pytest.mark.gpu
def test_few_output_convs_run_as_tap_gemms_on_cuda(gpu, monkeypatch):
    calls = _count_taps(monkeypatch)
    _few_outputs_against_torch((2, 20, 18, 64), 3, 7, 3, 1, ops.conv2d)
    assert bool(calls) == (mlxnet.backend() == "cuda")


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("shapes", [((3, 2, 5, 2), (1, 1, 1, 2)), ((1, 1, 1, 1), (2, 1, 1, 1)), ((1, 3, 3, 1), (1, 3, 3, 1))])
def test_tiny_operands_widened_for_cuda_give_the_same_conv_and_gradients(monkeypatch, dtype, shapes):
    """MLX's CUDA convolution can pair a cached cuDNN plan with a misaligned small-pool copy of an
    operand of at most 8 bytes; the definition widens such convs with zero channels there. The
    widening (forced here on the CPU) leaves values and gradients as mx.conv2d's."""
    from mlxnet.ops.conv import definition

    rng = np.random.default_rng(0)
    x, w = (mx.array(rng.standard_normal(s).astype(np.float32)).astype(dtype) for s in shapes)
    geometry = dict(stride=(1, 2), padding=(1, 0), dilation=(2, 1))

    def loss(conv, x, w):
        return (conv(x, w, **geometry).astype(mx.float32) * 1.5).sum()
    want = mx.conv2d(x, w, **geometry)
    want_grads = mx.grad(lambda x, w: loss(mx.conv2d, x, w), argnums=[0, 1])(x, w)
    monkeypatch.setattr(definition, "backend", lambda: "cuda")
    got = definition.mlx_conv2d(x, w, **geometry)
    got_grads = mx.grad(lambda x, w: loss(definition.mlx_conv2d, x, w), argnums=[0, 1])(x, w)
    assert got.shape == want.shape
    np.testing.assert_allclose(np.array(got.astype(mx.float32)), np.array(want.astype(mx.float32)), rtol=1e-3, atol=1e-3)
    for g, wg in zip(got_grads, want_grads):
        np.testing.assert_allclose(np.array(g.astype(mx.float32)), np.array(wg.astype(mx.float32)), rtol=1e-3, atol=1e-3)
