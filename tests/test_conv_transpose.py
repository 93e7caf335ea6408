"""Transposed convolutions: the shifted-gemm reference against PyTorch (values, gradients, layers,
errors), and on a GPU the gather kernel and the conv-based backward against the reference."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mlxnet
from mlxnet import ops
from mlxnet.ops.conv_transpose import kernel as ct_gpu
from mlxnet.ops.conv_transpose.definition import _run, decomposed_nhwc
from mlxnet.weights.layout import from_torch_layout
from testutil import assert_close, to_numpy

# (N, spatial, C_in, C_out, kernel, stride, padding, output_padding, dilation, groups, bias)
CASES_2D = [
    (2, (5, 6), 4, 6, 3, 1, 0, 0, 1, 1, True),
    (1, (7, 7), 8, 4, 3, 2, 1, 1, 1, 1, True),          # LaMa-style upsampler
    (2, (6, 5), 6, 4, 2, 2, 0, 0, 1, 1, False),         # SAM-style 2x2 s2 (kernel == stride)
    (1, (5, 4), 3, 5, 4, 2, 1, 0, 1, 1, True),          # DCGAN 4x4 s2 p1
    (2, (4, 5), 4, 6, (3, 2), (3, 2), (2, 0), (1, 1), 1, 1, True),  # non-square, odd
    (1, (5, 6), 6, 6, 3, 3, 1, 2, 1, 3, True),          # stride 3, groups
    (1, (6, 5), 4, 8, 3, 2, 1, 1, 2, 2, False),         # dilation 2 (shares a factor with stride)
    (2, (5, 5), 4, 4, 3, 2, 1, 1, 1, 4, True),          # depthwise
    (1, (4, 6), 3, 6, (2, 5), (2, 1), (0, 2), (1, 0), (1, 2), 3, True),  # depthwise, multiplier 2
    (1, (3, 4), 2, 3, 1, 2, 0, 1, 1, 1, True),          # kernel < stride: empty phases keep bias
    (1, (9, 8), 4, 2, 5, 2, 3, 0, 1, 1, True),          # padding >= stride: leading phase rows cut
    (1, (6, 7), 4, 4, 3, 3, 0, 1, 3, 2, True),          # dilation == stride
]
# (N, L, C_in, C_out, kernel, stride, padding, output_padding, dilation, groups, bias)
CASES_1D = [
    (2, 9, 4, 6, 3, 2, 1, 1, 1, 1, True),
    (1, 7, 6, 3, 4, 3, 0, 2, 1, 3, False),
    (2, 8, 4, 4, 3, 1, 2, 0, 2, 4, True),
    (1, 5, 2, 4, 5, 2, 2, 1, 2, 1, True),
]


def _torch_problem(case, nd, seed=0):
    n, spatial, c_in, c_out, k, s, p, op, d, g, bias = case
    spatial = spatial if isinstance(spatial, tuple) else (spatial,)
    k = (k,) * nd if isinstance(k, int) else k
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((n, c_in, *spatial), generator=gen)
    w = torch.randn((c_in, c_out // g, *k), generator=gen) / (c_in * np.prod(k)) ** 0.5
    b = torch.randn((c_out,), generator=gen) if bias else None
    return x, w, b, dict(stride=s, padding=p, output_padding=op, dilation=d, groups=g)


def _to_mlx(x, w, b, nd, groups, dtype=mx.float32):
    xm = mx.array(x.movedim(1, -1).numpy()).astype(dtype)
    wm = mx.array(from_torch_layout(w.numpy(), f"conv_transpose{nd}d", groups)).astype(dtype)
    bm = None if b is None else mx.array(b.numpy()).astype(dtype)
    return xm, wm, bm


def _ops(nd):
    return (ops.conv_transpose1d, F.conv_transpose1d) if nd == 1 else (ops.conv_transpose2d, F.conv_transpose2d)


ALL = [(2, c) for c in CASES_2D] + [(1, c) for c in CASES_1D]


@pytest.mark.parametrize("nd,case", ALL)
def test_reference_matches_torch(nd, case):
    x, w, b, kw = _torch_problem(case, nd)
    expected = _ops(nd)[1](x, w, b, **kw).movedim(1, -1).numpy()
    xm, wm, bm = _to_mlx(x, w, b, nd, kw["groups"])
    with mlxnet.use_device("cpu"):
        y = _ops(nd)[0](xm, wm, bm, **kw)
    assert_close(y, expected, scale=2)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
@pytest.mark.parametrize("nd,case", [ALL[1], ALL[5], ALL[7], ALL[-4]])
def test_reference_low_precision(nd, case, dtype):
    x, w, b, kw = _torch_problem(case, nd)
    expected = _ops(nd)[1](x, w, b, **kw).movedim(1, -1).numpy()
    xm, wm, bm = _to_mlx(x, w, b, nd, kw["groups"], dtype)
    with mlxnet.use_device("cpu"):
        y = _ops(nd)[0](xm, wm, bm, **kw)
    assert y.dtype == dtype
    assert_close(y, expected, dtype, scale=4)


def _torch_grads(nd, x, w, b, kw, cot):
    leaves = [t.clone().requires_grad_() for t in (x, w, b) if t is not None]
    y = _ops(nd)[1](*leaves, **kw) if b is not None else _ops(nd)[1](*leaves, None, **kw)
    (y * cot).sum().backward()
    return [t.grad.numpy() for t in leaves]


def _cotangent(shape):
    return torch.cos(torch.arange(int(np.prod(shape)), dtype=torch.float32)).reshape(shape)


@pytest.mark.parametrize("nd,case", [ALL[1], ALL[4], ALL[6], ALL[8], ALL[-4], ALL[-3]])
def test_reference_gradients_match_torch(nd, case):
    x, w, b, kw = _torch_problem(case, nd)
    y = _ops(nd)[1](x, w, b, **kw)
    cot = _cotangent(y.shape)
    expected = _torch_grads(nd, x, w, b, kw, cot)
    xm, wm, bm = _to_mlx(x, w, b, nd, kw["groups"])
    cot_m = mx.array(cot.movedim(1, -1).numpy())
    args = [a for a in (xm, wm, bm) if a is not None]
    with mlxnet.use_device("cpu"):
        grads = mx.grad(lambda *a: (_ops(nd)[0](*a, **kw) * cot_m).sum(), argnums=list(range(len(args))))(*args)
    assert_close(grads[0], np.moveaxis(expected[0], 1, -1), scale=4)
    assert_close(grads[1], from_torch_layout(expected[1], f"conv_transpose{nd}d", kw["groups"]), scale=4)
    if b is not None:
        assert_close(grads[2], expected[2], scale=4)


@pytest.mark.parametrize("method", ["conv", "decomposition", "builtin"])
@pytest.mark.parametrize("nd,case", [ALL[1], ALL[2], ALL[3], ALL[5], ALL[6], ALL[-2]])
def test_gpu_backward_methods_match_torch(nd, case, method, monkeypatch):
    """The kernel path's backward methods are plain MLX: check each here on CPU."""
    x, w, b, kw = _torch_problem(case, nd)
    if method == "builtin" and kw["output_padding"] != 0:
        pytest.skip("MLX's own conv_transpose vjp returns a wrongly shaped dx with output_padding")
    monkeypatch.setattr(ct_gpu, "vjp_method", lambda p: method)
    y = _ops(nd)[1](x, w, b, **kw)
    cot = _cotangent(y.shape)
    expected = _torch_grads(nd, x, w, b, kw, cot)
    xm, wm, bm = _to_mlx(x, w, b, nd, kw["groups"])
    primals = [a for a in (xm, wm, bm) if a is not None]
    with mlxnet.use_device("cpu"):
        grads = ops.get(f"conv_transpose{nd}d").kernel_vjp(
            primals, mx.array(cot.movedim(1, -1).numpy()), None, **kw)
    assert len(grads) == len(primals)
    assert_close(grads[0], np.moveaxis(expected[0], 1, -1), scale=4)
    assert_close(grads[1], from_torch_layout(expected[1], f"conv_transpose{nd}d", kw["groups"]), scale=4)
    if b is not None:
        assert_close(grads[2], expected[2], scale=4)


def test_reference_under_compile_equals_eager():
    x, w, b, kw = _torch_problem(CASES_2D[1], 2)
    xm, wm, bm = _to_mlx(x, w, b, 2, 1)
    fn = lambda x_, w_, b_: ops.conv_transpose2d(x_, w_, b_, **kw)  # noqa: E731
    with mlxnet.use_device("cpu"):
        eager = fn(xm, wm, bm)
        compiled = mx.compile(fn)(xm, wm, bm)
        g_eager = mx.grad(lambda a: fn(a, wm, bm).sum())(xm)
        g_comp = mx.compile(mx.grad(lambda a: fn(a, wm, bm).sum()))(xm)
    assert_close(compiled, eager)
    assert_close(g_comp, g_eager)


@pytest.mark.parametrize("nd", [1, 2])
def test_layers_match_torch_modules(nd):
    torch.manual_seed(3)
    tm = (torch.nn.ConvTranspose1d if nd == 1 else torch.nn.ConvTranspose2d)(
        6, 4, 3, stride=2, padding=1, output_padding=1, groups=2, dilation=1)
    layer = (mlxnet.nn.ConvTranspose1d if nd == 1 else mlxnet.nn.ConvTranspose2d)(
        6, 4, 3, stride=2, padding=1, output_padding=1, groups=2)
    assert layer.weight.shape == (4,) + (3,) * nd + (3,)
    # PyTorch's init range: uniform(±1/sqrt(C_out/groups * prod(kernel)))
    bound = 1 / (2 * 3 ** nd) ** 0.5
    assert float(mx.abs(layer.weight).max()) <= bound and float(mx.abs(layer.weight).max()) > bound / 2
    layer.weight = mx.array(from_torch_layout(tm.weight.detach().numpy(), f"conv_transpose{nd}d", 2))
    layer.bias = mx.array(tm.bias.detach().numpy())
    x = torch.randn((2, 6) + (5,) * nd)
    expected = tm(x).detach().movedim(1, -1).numpy()
    with mlxnet.use_device("cpu"):
        y = layer(mx.array(x.movedim(1, -1).numpy()))
    assert_close(y, expected, scale=2)
    no_bias = mlxnet.nn.ConvTranspose2d(4, 4, 2, stride=2, bias=False)
    assert "bias" not in no_bias and no_bias(mx.ones((1, 3, 3, 4))).shape == (1, 6, 6, 4)


@pytest.mark.parametrize("call,message", [
    (lambda x, w: ops.conv_transpose2d(x[0, 0], w), r"input must be 4-D NHWC, got shape \(6, 4\)"),
    (lambda x, w: ops.conv_transpose2d(x, w[0]), r"weight must be 4-D"),
    (lambda x, w: ops.conv_transpose2d(x, w, stride=2, output_padding=2),
     r"output_padding must be smaller than stride or dilation, got output_padding=2, stride=2, dilation=1"),
    (lambda x, w: ops.conv_transpose2d(x, w, groups=3), r"groups must divide C_in=4 and C_out=6, got groups=3"),
    (lambda x, w: ops.conv_transpose2d(x, w, groups=2), r"weight's last axis must be C_in/groups=2, got weight shape \(6, 3, 3, 4\)"),
    (lambda x, w: ops.conv_transpose2d(x, w, mx.zeros((5,))), r"bias must have shape \(6,\), got \(5,\)"),
    (lambda x, w: ops.conv_transpose2d(x, w, stride=(1, 2, 3)), r"stride must be an int, a 1-tuple or a pair of ints, got \(1, 2, 3\)"),
    (lambda x, w: ops.conv_transpose2d(x, w, padding=-1), r"padding >= 0"),
    (lambda x, w: ops.conv_transpose2d(x, w, padding=5), r"output size \(-3, -2\) is not positive"),
    (lambda x, w: ops.conv_transpose1d(x[:, 0], w[:, 0, :, :2]), r"weight's last axis must be C_in/groups=4, got weight shape \(6, 3, 2\)"),
    (lambda x, w: mlxnet.nn.ConvTranspose2d(4, 6, 3, groups=4), r"groups must divide in_channels=4 and out_channels=6"),
])
def test_bad_arguments_are_one_line_errors(call, message):
    x, w = mx.zeros((2, 5, 6, 4)), mx.zeros((6, 3, 3, 4))
    with pytest.raises(mlxnet.MlxnetError, match=message) as info:
        with mlxnet.use_device("cpu"):
            call(x, w)
    assert "\n" not in str(info.value)


# ---- GPU: the gather kernel, the dispatcher and the conv-based backward against the reference.


def _gpu_tolerance(dtype, exact: bool = False):
    """MLX's CUDA gemms and convolutions run float32 as TF32 (10-bit mantissa): fp16 tolerance."""
    return mx.float16 if dtype == mx.float32 and not exact else dtype


GPU_CASES = ALL + [(2, (2, (9, 13), 24, 16, 3, 2, 1, 1, 1, 1, True)),
                   (2, (1, (16, 16), 64, 32, 2, 2, 0, 0, 1, 1, True)),
                   (2, (2, (8, 8), 32, 32, 4, 2, 1, 0, 1, 32, False)),
                   # batch >= 2 with several channels per group: MLX's CUDA grouped weight
                   # gradient is wrong here, so the backward must not use it.
                   (2, (2, (7, 6), 8, 12, (3, 2), (2, 3), (1, 0), (1, 2), 1, 2, True)),
                   (2, (3, (6, 6), 32, 16, 3, 2, 1, 1, 1, 2, True))]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("nd,case", GPU_CASES)
def test_gpu_forward_methods_equal_reference(gpu, nd, case, dtype):
    x, w, b, kw = _torch_problem(case, nd)
    xm, wm, bm = _to_mlx(x, w, b, nd, kw["groups"], dtype)
    args = (xm, wm, bm, kw["stride"], kw["padding"], kw["output_padding"], kw["dilation"], kw["groups"])
    with mlxnet.use_device("cpu"):
        y_ref = _run(nd, decomposed_nhwc, *args)
    for method, impl in ct_gpu.FORWARD.items():
        assert_close(_run(nd, impl, *args), y_ref, _gpu_tolerance(dtype, method == "gather"), scale=4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
@pytest.mark.parametrize("nd,case", GPU_CASES)
def test_dispatch_forward_and_backward_equal_reference(gpu, nd, case, dtype):
    x, w, b, kw = _torch_problem(case, nd)
    xm, wm, bm = _to_mlx(x, w, b, nd, kw["groups"], dtype)
    op = ops.get(f"conv_transpose{nd}d")
    assert op.uses_kernel()
    args = [a for a in (xm, wm, bm) if a is not None]

    def loss(*a):
        y = op.dispatch(*a, **kw) if len(a) == 3 else op.dispatch(*a, None, **kw)
        return (y.astype(mx.float32) * mx.cos(mx.arange(y.size).reshape(y.shape))).sum()

    fwd_k = op.dispatch(*args, **kw)
    grads_k = mx.grad(loss, argnums=list(range(len(args))))(*args)
    with mlxnet.use_device("cpu"):
        fwd_r = op.dispatch(*args, **kw)
        grads_r = mx.grad(loss, argnums=list(range(len(args))))(*args)
    assert_close(fwd_k, fwd_r, _gpu_tolerance(dtype), scale=4)
    for gk, gr in zip(grads_k, grads_r):
        assert_close(gk, gr, _gpu_tolerance(dtype), scale=8)


@pytest.mark.parametrize("shape,k,stride,padding,out_pad,groups", [
    ((1, 96, 80, 32), 3, 2, 1, 1, 1),   # LaMa's upsampling
    ((2, 40, 30, 16), 4, 2, 1, 0, 2),   # grouped, four taps a phase
    ((1, 50, 60, 8), 3, 3, 0, 2, 8),    # depthwise, stride 3: nine phases
])
def test_large_outputs_fill_a_phase_at_a_time_with_the_same_result(monkeypatch, shape, k, stride, padding,
                                                                   out_pad, groups):
    from mlxnet.ops.conv_transpose import definition

    with mlxnet.use_device("cpu"):
        x = mx.random.normal(shape, key=mx.random.key(1))
        w = mx.random.normal((16, k, k, shape[-1] // groups), key=mx.random.key(2)) * 0.1
        b = mx.random.normal((16,), key=mx.random.key(3))
        mx.eval(x, w, b)

        def run() -> tuple[np.ndarray, int]:
            mx.reset_peak_memory()
            base = mx.get_active_memory()
            y = definition.conv_transpose2d(x, w, b, stride=stride, padding=padding, output_padding=out_pad,
                                            groups=groups)
            mx.eval(y)
            return np.array(y), mx.get_peak_memory() - base

        lazily, lazy_peak = run()
        monkeypatch.setattr(definition, "PHASED_BYTES", 0)
        phased, phased_peak = run()
    np.testing.assert_array_equal(phased, lazily)
    # The phases no longer coexist: at least one phase-sized buffer less at the peak.
    phase_bytes = lazily.nbytes // stride**2
    assert phased_peak <= lazy_peak - phase_bytes, (phased_peak, lazy_peak, phase_bytes)
