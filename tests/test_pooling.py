"""Pooling ops and layers: references against PyTorch (values, indices, gradients), and on a
GPU the custom kernels against the references on the same cases."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mlxnet
from mlxnet import ops
from testutil import TOLERANCE, assert_close, to_numpy

LOW_PRECISION = [mx.float16, mx.bfloat16]

# (shape NHWC, kernel_size, stride, padding, dilation, ceil_mode)
MAX2D = [
    ((2, 8, 8, 3), 2, None, 0, 1, False),
    ((1, 9, 11, 4), 3, 2, 1, 1, False),
    ((1, 9, 11, 4), 3, 2, 1, 1, True),
    ((2, 10, 7, 5), (3, 2), (2, 1), (1, 0), 1, True),
    ((1, 13, 12, 3), 3, 2, 1, 3, False),
    ((1, 13, 12, 3), (2, 3), (3, 2), (1, 1), (3, 1), True),
    ((1, 6, 6, 2), 4, 3, 2, 1, True),
    ((1, 5, 5, 2), 2, 2, 1, 1, True),  # a 4th window would start in the right padding: dropped
    ((3, 5, 7, 1), 5, 1, 2, 1, False),
    ((1, 1, 9, 6), (1, 3), (1, 2), 0, 1, True),
    ((1, 7, 7, 8), 7, 7, 0, 1, True),
    ((2, 9, 11, 6), (3, 2), (2, 1), 1, (1, 2), True),  # batch > 1, dilated columns
]
# (shape NHWC, kernel_size, stride, padding, ceil_mode, count_include_pad)
AVG2D = [
    ((2, 8, 8, 3), 2, None, 0, False, True),
    ((1, 9, 11, 4), 3, 2, 1, False, True),
    ((1, 9, 11, 4), 3, 2, 1, False, False),
    ((1, 9, 11, 4), 3, 2, 1, True, True),
    ((1, 9, 11, 4), 3, 2, 1, True, False),
    ((2, 10, 7, 5), (3, 2), (2, 1), (1, 0), True, True),
    ((1, 6, 6, 2), 4, 3, 2, True, True),
    ((1, 6, 6, 2), 4, 3, 2, True, False),
    ((1, 5, 5, 2), 2, 2, 1, True, True),
    ((2, 12, 5, 3), (5, 3), (3, 3), (2, 1), True, True),
]
# (shape NLC, kernel_size, stride, padding, dilation, ceil_mode)
MAX1D = [((2, 13, 5), 3, 2, 1, 1, True), ((1, 10, 3), 2, None, 0, 1, False),
         ((2, 17, 4), 3, 2, 1, 2, True), ((1, 8, 2), 4, 3, 2, 1, True)]
# (shape NLC, kernel_size, stride, padding, ceil_mode, count_include_pad)
AVG1D = [((2, 13, 5), 3, 2, 1, True, False), ((1, 10, 3), 2, None, 0, False, True),
         ((2, 9, 4), 4, 3, 2, True, True), ((2, 9, 4), 4, 3, 2, True, False)]
# (input H, W, output_size)
ADAPTIVE = [(7, 7, (1, 1)), (10, 7, (3, 4)), (10, 7, (4, None)), (9, 8, 5), (5, 6, (7, 3)),
            (12, 12, (6, 4)), (11, 13, (None, 1))]


def _x(shape, seed=0, dtype=mx.float32):
    return mx.random.normal(shape, key=mx.random.key(seed)).astype(dtype)


def _torch(x: mx.array) -> torch.Tensor:
    """NHWC / NLC mlx → NCHW / NCL torch float32 (float64 for exact sums), grad-enabled."""
    t = torch.from_numpy(to_numpy(x).astype(np.float64))
    return t.movedim(-1, 1).contiguous().requires_grad_(True)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().movedim(1, -1).numpy()


def _weights(shape) -> mx.array:
    return mx.cos(mx.arange(int(np.prod(shape)), dtype=mx.float32).reshape(shape) * 0.7)


def _grad(f, x):
    """d/dx of sum(f(x)[0] * w), w fixed per output shape."""
    def loss(x):
        out = f(x)
        y = out[0] if isinstance(out, tuple) else out
        return (y.astype(mx.float32) * _weights(y.shape)).sum()
    return mx.grad(loss)(x)


def _torch_grad(t_out: torch.Tensor, t_in: torch.Tensor) -> np.ndarray:
    w = torch.from_numpy(to_numpy(_weights(tuple(_np(t_out).shape)))).double().movedim(-1, 1)
    (g,) = torch.autograd.grad((t_out * w).sum(), t_in)
    return _np(g)


def _max2d_kwargs(case):
    _, k, s, p, d, ceil = case
    return dict(kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil)


def _avg_kwargs(case):
    _, k, s, p, ceil, cip = case
    return dict(kernel_size=k, stride=s, padding=p, ceil_mode=ceil, count_include_pad=cip)


def _torch_kwargs(kwargs):
    out = dict(kwargs)
    if out.get("stride") is None:
        out.pop("stride", None)
    return out


# ---- references against PyTorch (CPU) ----------------------------------------------------

@pytest.mark.parametrize("case", MAX2D)
def test_max_pool2d_values_indices_and_gradient_match_torch(case):
    x = _x(case[0], seed=1)
    kw = _max2d_kwargs(case)
    with mlxnet.use_device("cpu"):
        y, idx = ops.max_pool2d(x, **kw, return_indices=True)
        g = _grad(lambda x: ops.max_pool2d(x, **kw), x)
    t = _torch(x)
    ty, tidx = F.max_pool2d(t, **_torch_kwargs(kw), return_indices=True)
    assert y.shape == _np(ty).shape and idx.dtype == mx.int32
    assert_close(y, _np(ty))
    np.testing.assert_array_equal(np.array(idx), _np(tidx))
    assert_close(g, _torch_grad(ty, t))


@pytest.mark.parametrize("case", AVG2D)
def test_avg_pool2d_values_and_gradient_match_torch(case):
    x = _x(case[0], seed=2)
    kw = _avg_kwargs(case)
    with mlxnet.use_device("cpu"):
        y = ops.avg_pool2d(x, **kw)
        g = _grad(lambda x: ops.avg_pool2d(x, **kw), x)
    t = _torch(x)
    ty = F.avg_pool2d(t, **_torch_kwargs(kw))
    assert_close(y, _np(ty))
    assert_close(g, _torch_grad(ty, t))


@pytest.mark.parametrize("case", MAX1D)
def test_max_pool1d_matches_torch(case):
    x = _x(case[0], seed=3)
    kw = _max2d_kwargs(case)
    with mlxnet.use_device("cpu"):
        y, idx = ops.max_pool1d(x, **kw, return_indices=True)
        g = _grad(lambda x: ops.max_pool1d(x, **kw), x)
    t = _torch(x)
    ty, tidx = F.max_pool1d(t, **_torch_kwargs(kw), return_indices=True)
    assert_close(y, _np(ty))
    np.testing.assert_array_equal(np.array(idx), _np(tidx))
    assert_close(g, _torch_grad(ty, t))


@pytest.mark.parametrize("case", AVG1D)
def test_avg_pool1d_matches_torch(case):
    x = _x(case[0], seed=4)
    kw = _avg_kwargs(case)
    with mlxnet.use_device("cpu"):
        y = ops.avg_pool1d(x, **kw)
        g = _grad(lambda x: ops.avg_pool1d(x, **kw), x)
    t = _torch(x)
    ty = F.avg_pool1d(t, **_torch_kwargs(kw))
    assert_close(y, _np(ty))
    assert_close(g, _torch_grad(ty, t))


@pytest.mark.parametrize("h, w, size", ADAPTIVE)
def test_adaptive_pools_match_torch(h, w, size):
    x = _x((2, h, w, 3), seed=5)
    with mlxnet.use_device("cpu"):
        ya = ops.adaptive_avg_pool2d(x, size)
        ga = _grad(lambda x: ops.adaptive_avg_pool2d(x, size), x)
        ym, idx = ops.adaptive_max_pool2d(x, size, return_indices=True)
        gm = _grad(lambda x: ops.adaptive_max_pool2d(x, size), x)
    t = _torch(x)
    tya = F.adaptive_avg_pool2d(t, size)
    tym, tidx = F.adaptive_max_pool2d(t, size, return_indices=True)
    assert_close(ya, _np(tya))
    assert_close(ga, _torch_grad(tya, t))
    assert_close(ym, _np(tym))
    np.testing.assert_array_equal(np.array(idx), _np(tidx))
    assert_close(gm, _torch_grad(tym, t))


@pytest.mark.parametrize("stride, padding, size", [(2, 0, None), (2, 0, (9, 11)), (3, 1, (9, 11)),
                                                   (2, 1, (10, 12))])
def test_unpool_roundtrip_matches_torch(stride, padding, size):
    x = _x((2, 9, 11, 3), seed=6)
    with mlxnet.use_device("cpu"):
        y, idx = ops.max_pool2d(x, 3, stride, padding, return_indices=True)
        up = ops.max_unpool2d(y, idx, 3, stride, padding, output_size=size)
        g = _grad(lambda y: ops.max_unpool2d(y, idx, 3, stride, padding, output_size=size), y)
    t = _torch(x)
    ty, tidx = F.max_pool2d(t, 3, stride, padding, return_indices=True)
    ty = ty.detach().requires_grad_(True)
    tup = F.max_unpool2d(ty, tidx, 3, stride, padding, output_size=size)
    assert_close(up, _np(tup))
    assert_close(g, _torch_grad(tup, ty))
    if stride == 3:  # disjoint windows, input-sized output: each maximum is back in place
        kept = to_numpy(up) != 0
        np.testing.assert_array_equal(to_numpy(up)[kept], to_numpy(x)[:, : up.shape[1], : up.shape[2]][kept])


def test_sppf_equals_three_sequential_pools_and_torch():
    x = _x((2, 11, 9, 4), seed=7)
    with mlxnet.use_device("cpu"):
        y1, y2, y3 = ops.sppf_pool(x)
        seq = [x]
        for _ in range(3):
            seq.append(ops.max_pool2d(seq[-1], 5, 1, 2))
        g = mx.grad(lambda x: sum((y * _weights(y.shape) * (i + 1)).sum()
                                  for i, y in enumerate(ops.sppf_pool(x))))(x)
        big = ops.max_pool2d(x, 13, 1, 6)
    for y, s in zip((y1, y2, y3), seq[1:]):
        np.testing.assert_array_equal(to_numpy(y), to_numpy(s))
    np.testing.assert_array_equal(to_numpy(y3), to_numpy(big))  # chained 5x5 = one 13x13
    t = _torch(x)
    outs, cur = [], t
    for _ in range(3):
        cur = F.max_pool2d(cur, 5, 1, 2)
        outs.append(cur)
    w = [torch.from_numpy(to_numpy(_weights(y1.shape))).double().movedim(-1, 1) * (i + 1)
         for i in range(3)]
    (tg,) = torch.autograd.grad(sum((o * wi).sum() for o, wi in zip(outs, w)), t)
    assert_close(y3, _np(outs[2]))
    assert_close(g, _np(tg))


@pytest.mark.parametrize("dtype", LOW_PRECISION)
def test_low_precision_matches_torch_on_rounded_inputs(dtype):
    x = _x((2, 11, 10, 6), seed=8, dtype=dtype)
    t = _torch(x)
    with mlxnet.use_device("cpu"):
        cases = [
            (ops.max_pool2d(x, 3, 2, 1, ceil_mode=True), F.max_pool2d(t, 3, 2, 1, ceil_mode=True)),
            (ops.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
             F.avg_pool2d(t, 3, 2, 1, count_include_pad=False)),
            (ops.adaptive_avg_pool2d(x, (4, 3)), F.adaptive_avg_pool2d(t, (4, 3))),
            (ops.adaptive_max_pool2d(x, 1), F.adaptive_max_pool2d(t, 1)),
            (ops.avg_pool1d(x[:, 0], 4, 3, 2, ceil_mode=True), F.avg_pool1d(t[:, :, 0], 4, 3, 2, ceil_mode=True)),
        ]
    for y, ty in cases:
        assert y.dtype == dtype
        assert_close(y, _np(ty), dtype)


def test_max_gradient_goes_to_the_first_maximum_like_torch():
    x = mx.ones((1, 6, 6, 2))  # every window is one big tie
    with mlxnet.use_device("cpu"):
        g = _grad(lambda x: ops.max_pool2d(x, 3, 2, 1), x)
        ga = _grad(lambda x: ops.adaptive_max_pool2d(x, (4, 4)), x)
    t = _torch(x)
    assert_close(g, _torch_grad(F.max_pool2d(t, 3, 2, 1), t))
    assert_close(ga, _torch_grad(F.adaptive_max_pool2d(t, (4, 4)), t))


def test_max_pool_special_values_match_torch():
    x = np.array(_x((1, 5, 5, 2), seed=9))
    x[0, :2, :2, 0] = -np.inf  # a window whose real inputs are all -inf (rest is padding)
    x[0, 3, 3, 1] = np.nan
    x = mx.array(x)
    with mlxnet.use_device("cpu"):
        y, idx = ops.max_pool2d(x, 3, 2, 1, return_indices=True)
    ty, tidx = F.max_pool2d(_torch(x), 3, 2, 1, return_indices=True)
    np.testing.assert_array_equal(to_numpy(y), _np(ty))
    np.testing.assert_array_equal(np.array(idx), _np(tidx))


def test_gradients_match_finite_differences():
    # Distinct values (no ties near the step) so max pooling is differentiable at x.
    perm = np.random.default_rng(0).permutation(2 * 7 * 6 * 2).reshape(2, 7, 6, 2)
    x = mx.array(perm.astype(np.float32) * 0.1)
    eps = 1e-2
    fns = [lambda x: ops.max_pool2d(x, 3, 2, 1, ceil_mode=True),
           lambda x: ops.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
           lambda x: ops.adaptive_avg_pool2d(x, (4, 5)),
           lambda x: ops.adaptive_max_pool2d(x, (3, 4)),
           lambda x: ops.sppf_pool(x)[2]]
    probe = np.random.default_rng(1).normal(size=x.shape).astype(np.float32)
    with mlxnet.use_device("cpu"):
        for f in fns:
            def loss(x, f=f):
                y = f(x)
                return (y * _weights(y.shape)).sum()
            g = np.array(mx.grad(loss)(x))
            fd = (loss(x + eps * mx.array(probe)).item() - loss(x - eps * mx.array(probe)).item()) / (2 * eps)
            np.testing.assert_allclose((g * probe).sum(), fd, rtol=1e-2, atol=1e-3)


def test_ops_work_under_compile():
    x = _x((2, 9, 8, 4), seed=10)

    def f(x):
        a = ops.max_pool2d(x, 3, 2, 1)
        b = ops.avg_pool2d(x, 3, 2, 1, count_include_pad=False)
        c = ops.adaptive_avg_pool2d(x, (5, 4))
        d = ops.adaptive_max_pool2d(x, (5, 4))
        return (a * b).sum() + (c * d).sum() + ops.sppf_pool(x)[2].sum()

    with mlxnet.use_device("cpu"):
        eager = mx.value_and_grad(f)(x)
        compiled = mx.compile(mx.value_and_grad(f))(x)
    for e, c in zip(eager, compiled):
        assert_close(c, e)


def test_layers_match_torch_modules():
    x = _x((2, 10, 9, 3), seed=11)
    t = _torch(x)
    pairs = [
        (mlxnet.nn.MaxPool2d(3, 2, 1, ceil_mode=True), torch.nn.MaxPool2d(3, 2, 1, ceil_mode=True)),
        (mlxnet.nn.MaxPool2d((2, 3), dilation=(2, 1)), torch.nn.MaxPool2d((2, 3), dilation=(2, 1))),
        (mlxnet.nn.AvgPool2d(3, 2, 1, count_include_pad=False),
         torch.nn.AvgPool2d(3, 2, 1, count_include_pad=False)),
        (mlxnet.nn.AvgPool2d(3, 2, 1, divisor_override=5), torch.nn.AvgPool2d(3, 2, 1, divisor_override=5)),
        (mlxnet.nn.AdaptiveAvgPool2d((4, None)), torch.nn.AdaptiveAvgPool2d((4, None))),
        (mlxnet.nn.AdaptiveMaxPool2d(3), torch.nn.AdaptiveMaxPool2d(3)),
    ]
    with mlxnet.use_device("cpu"):
        for ours, theirs in pairs:
            assert_close(ours(x), _np(theirs(t)))
            assert ours.parameters() == {}
        x1, t1 = x[:, 0], t[:, :, 0]
        assert_close(mlxnet.nn.MaxPool1d(3, 2, 1)(x1), _np(torch.nn.MaxPool1d(3, 2, 1)(t1)))
        assert_close(mlxnet.nn.AvgPool1d(4, 3, 2, ceil_mode=True)(x1),
                     _np(torch.nn.AvgPool1d(4, 3, 2, ceil_mode=True)(t1)))
        y, idx = mlxnet.nn.MaxPool2d(2, return_indices=True)(x)
        up = mlxnet.nn.MaxUnpool2d(2)(y, idx, output_size=(10, 9))
    ty, tidx = torch.nn.MaxPool2d(2, return_indices=True)(t)
    assert_close(up, _np(torch.nn.MaxUnpool2d(2)(ty, tidx, output_size=(10, 9))))
    assert "kernel_size=3" in repr(mlxnet.nn.MaxPool2d(3))


@pytest.mark.parametrize("call, message", [
    (lambda x: ops.max_pool2d(x, 3, 1, 2), r"padding should be at most half .*\(1\), got 2"),
    (lambda x: ops.avg_pool2d(x, 2, 1, 2), r"padding should be at most half"),
    (lambda x: ops.max_pool2d(x[0, 0], 2), r"expected a 4-D NHWC .* got shape \(5, 2\)"),
    (lambda x: ops.max_pool1d(x, 2), r"expected a 3-D NLC"),
    (lambda x: ops.max_pool2d(x, 7), r"too small for kernel 7"),
    (lambda x: ops.max_pool2d(x, (2, 2, 2)), r"kernel_size must be an int, a 1-tuple or a pair"),
    (lambda x: ops.max_pool2d(x.astype(mx.int32), 2), r"expected a floating-point input"),
    (lambda x: ops.adaptive_avg_pool2d(x, (-1, 2)), r"output sizes must be ints >= 0"),
    (lambda x: ops.max_unpool2d(x, mx.zeros(x.shape, mx.int32), 2, output_size=(12, 10)),
     r"output_size \(12, 10\) must lie strictly between \(8, 8\) and \(12, 12\)"),
    (lambda x: ops.max_unpool2d(x, mx.zeros((1, 5, 5, 1), mx.int32), 2), r"indices must have"),
])
def test_bad_arguments_are_clear_errors(call, message):
    with mlxnet.use_device("cpu"), pytest.raises(mlxnet.MlxnetError, match=message):
        call(_x((1, 5, 5, 2)))


# ---- kernels against references (GPU) ----------------------------------------------------

def _gpu_cases():
    cases = []
    for c in MAX2D:
        cases.append(("max_pool2d", c[0], dict(_max2d_kwargs(c), return_indices=True)))
        cases.append(("max_pool2d", c[0], _max2d_kwargs(c)))
    cases += [("avg_pool2d", c[0], _avg_kwargs(c)) for c in AVG2D]
    cases += [("max_pool1d", c[0], _max2d_kwargs(c)) for c in MAX1D]
    cases += [("avg_pool1d", c[0], _avg_kwargs(c)) for c in AVG1D]
    for h, w, size in ADAPTIVE:
        cases.append(("adaptive_avg_pool2d", (2, h, w, 3), dict(output_size=size)))
        cases.append(("adaptive_max_pool2d", (2, h, w, 3), dict(output_size=size)))
        cases.append(("adaptive_max_pool2d", (2, h, w, 3), dict(output_size=size, return_indices=True)))
    cases += [("sppf_pool", (2, 11, 9, 4), {}), ("sppf_pool", (1, 20, 20, 96), {}),
              ("sppf_pool", (1, 3, 4, 5), {})]
    # divisor_override through both avg kernels (int32-sized and not), PyTorch's 1-tuple and
    # () spellings
    cases += [("avg_pool2d", (2, 9, 11, 4), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True,
                                                 divisor_override=d)) for d in (5, -2, 2**40 + 12345)]
    cases += [("avg_pool2d", (1, 9, 11, 4), dict(kernel_size=(3,), stride=(), padding=(1,))),
              ("max_pool2d", (1, 9, 11, 4), dict(kernel_size=(3,), stride=[2], dilation=(2,),
                                                 return_indices=True)),
              ("max_pool1d", (2, 13, 5), dict(kernel_size=(3,), stride=(), padding=[1]))]
    # Dilated windows that hold no input (they start in the padding and step over it all):
    # -inf, index -1, no gradient on both faces
    cases += [("max_pool1d", (2, 2, 3), dict(kernel_size=2, padding=1, dilation=3, ceil_mode=True,
                                            return_indices=True)),
              ("max_pool2d", (2, 2, 6, 3), dict(kernel_size=2, stride=(2, 1), padding=1,
                                                dilation=(3, 1), ceil_mode=True))]
    return cases


def _leaves(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _kernel_vs_reference(name, x, kwargs, dtype, extra=()):
    op = ops.get(name)
    assert op.uses_kernel()

    def loss(x):
        return sum((o.astype(mx.float32) * _weights(o.shape)).sum()
                   for o in _leaves(op.dispatch(x, *extra, **kwargs))
                   if mx.issubdtype(o.dtype, mx.floating))

    out_k, g_k = _leaves(op.dispatch(x, *extra, **kwargs)), mx.grad(loss)(x)
    with mlxnet.use_kernels(False):
        out_r, g_r = _leaves(op.dispatch(x, *extra, **kwargs)), mx.grad(loss)(x)
    for k, r in zip(out_k, out_r):
        assert k.dtype == r.dtype and k.shape == r.shape
        if mx.issubdtype(k.dtype, mx.integer):
            np.testing.assert_array_equal(np.array(k), np.array(r))
        else:
            assert_close(k, r, dtype)
    assert_close(g_k, g_r, dtype, scale=8)


@pytest.mark.gpu
@pytest.mark.parametrize("name, shape, kwargs", _gpu_cases(),
                         ids=lambda v: str(v).replace(" ", ""))
def test_gpu_kernel_matches_reference(gpu, name, shape, kwargs):
    _kernel_vs_reference(name, _x(shape, seed=20), kwargs, mx.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", LOW_PRECISION)
@pytest.mark.parametrize("name, shape, kwargs", [
    ("max_pool2d", (2, 17, 15, 24), dict(kernel_size=3, stride=2, padding=1, return_indices=True)),
    ("avg_pool2d", (2, 17, 15, 24), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ("adaptive_avg_pool2d", (2, 17, 15, 24), dict(output_size=(5, 4))),
    ("adaptive_max_pool2d", (2, 17, 15, 24), dict(output_size=1)),
    ("sppf_pool", (1, 12, 12, 32), {}),
], ids=lambda v: str(v).replace(" ", ""))
def test_gpu_kernel_matches_reference_low_precision(gpu, name, shape, kwargs, dtype):
    _kernel_vs_reference(name, _x(shape, seed=21, dtype=dtype), kwargs, dtype)


def _with_specials(shape, seed):
    """Normal values with a fifth of them NaN or ±inf (several in most windows)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).astype(np.float32)
    flat = a.reshape(-1)
    at = rng.integers(0, flat.size, flat.size // 5)
    flat[at] = rng.choice(np.array([np.nan, np.inf, -np.inf], np.float32), at.size)
    return mx.array(a)


@pytest.mark.gpu
@pytest.mark.parametrize("name, shape, kwargs", [
    ("max_pool2d", (2, 9, 11, 4), dict(kernel_size=3, stride=2, padding=1, return_indices=True)),
    ("max_pool2d", (2, 9, 11, 4), dict(kernel_size=(3, 2), stride=1, dilation=(1, 2), ceil_mode=True)),
    ("max_pool1d", (2, 13, 4), dict(kernel_size=3, stride=2, padding=1, return_indices=True)),
    ("adaptive_max_pool2d", (2, 10, 7, 4), dict(output_size=(3, 4), return_indices=True)),
    ("adaptive_max_pool2d", (2, 10, 7, 4), dict(output_size=(4, 2))),
    ("sppf_pool", (2, 11, 9, 4), {}),
], ids=lambda v: str(v).replace(" ", ""))
def test_gpu_max_kernels_propagate_nan_like_the_reference(gpu, name, shape, kwargs):
    # NaN values, indices and the inputs that gradients reach: PyTorch's picks (the last NaN of a
    # window, else its first maximum) on both faces.
    _kernel_vs_reference(name, _with_specials(shape, 24), kwargs, mx.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("stride, padding, size", [(2, 0, None), (3, 1, (9, 11)), (2, 1, (10, 12))])
def test_gpu_unpool_kernel_matches_reference(gpu, stride, padding, size):
    y, idx = ops.max_pool2d.op.definition(_x((2, 9, 11, 8), seed=22), 3, stride, padding,
                                         return_indices=True)
    if stride == 2:  # overlapping windows repeat indices: keep the first of each to stay deterministic
        flat = np.array(idx).reshape(2, -1, 8)
        for n in range(2):
            for c in range(8):
                _, first = np.unique(flat[n, :, c], return_index=True)
                dup = np.setdiff1d(np.arange(flat.shape[1]), first)
                flat[n, dup, c] = -1  # dropped by both the kernel and the reference
        idx = mx.array(flat.reshape(idx.shape))
    _kernel_vs_reference("max_unpool2d", y, dict(kernel_size=3, stride=stride, padding=padding,
                                                 output_size=size), mx.float32, extra=(idx,))


@pytest.mark.gpu
def test_gpu_kernels_under_compile_and_large_case(gpu):
    x = _x((4, 56, 56, 64), seed=23)

    def f(x):
        return (ops.max_pool2d(x, 3, 2, 1) * ops.avg_pool2d(x, 2)[:, :28, :28]).sum() + \
            ops.adaptive_avg_pool2d(x, 1).sum() + ops.sppf_pool(x[:, :20, :20])[2].sum()

    eager = mx.value_and_grad(f)(x)
    compiled = mx.compile(mx.value_and_grad(f))(x)
    with mlxnet.use_kernels(False):
        ref = mx.value_and_grad(f)(x)
    for e, c, r in zip(eager, compiled, ref):
        assert_close(c, e)
        assert_close(c, r, scale=4)
