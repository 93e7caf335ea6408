"""Pooling ops against torch.nn.functional, property-based: drawn input shapes (empty batches
included), kernel sizes, strides, paddings, dilations, ceil_mode, count_include_pad,
divisor_override and every argument spelling PyTorch takes (ints, 1-tuples, pairs, lists,
numpy ints, ``stride=()``) or refuses (empty and over-long tuples, floats, bools, strings).

For each drawn call: where torch raises, mlxnet raises an MlxnetError, and where torch returns,
mlxnet returns the same shape, values (NaN and infinities in the same places: max pooling
propagates NaN and picks PyTorch's index) and gradients of a weighted sum (not on empty
inputs). mlxnet runs on the CPU (its definitions); torch on NCHW copies of the same values.

Then the same one by one: the NaN picks, every spelling in a table, the few spellings where
mlxnet differs from torch on purpose, and the launch parameters that carry divisor_override
to the GPU kernels (tests/test_pooling.py runs those kernels on a GPU).

The default run is derandomized (the same examples every run); ``HYPOTHESIS_PROFILE=sweep``
draws fresh, more of them.
"""
from __future__ import annotations

import os
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

import mlxnet
from mlxnet import ops
from mlxnet.ops.core import kernel_source
from mlxnet.ops.pooling.geometry import float32_value
from testutil import assert_agree

_SWEEP = os.environ.get("HYPOTHESIS_PROFILE") == "sweep"


def _settings(examples: int) -> settings:
    return settings(max_examples=8 * examples if _SWEEP else examples, deadline=None,
                    derandomize=not _SWEEP, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# Relative tolerance (of the larger of 1 and the reference's finite magnitude) by input dtype.
TOL = {mx.float32: 2e-5, mx.float16: 4e-3, mx.bfloat16: 3e-2}


@st.composite
def weighted(draw: Any, options: tuple, weights: tuple) -> Any:
    """One of ``options`` with these relative weights (Hypothesis's own choices lean towards
    the ends of a range, which would make empty batches and low precision most draws)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    p = np.asarray(weights, dtype=np.float64)
    return options[rng.choice(len(options), p=p / p.sum())]


def pick(options: Any) -> st.SearchStrategy:
    """Any of ``options``, evenly."""
    options = tuple(options)
    return weighted(options, (1,) * len(options))


# Mostly float32; low precision compares against torch on the same rounded values.
DTYPES = weighted((mx.float32, mx.float16, mx.bfloat16), (6, 1, 1))
BATCHES = weighted((0, 1, 2, 3), (1, 3, 3, 2))
SPECIALS = (np.inf, -np.inf, np.nan, 0.0, -0.0, 1e30, -1e30)
HUGE = (3.0e38, -3.0e38)  # near float32's largest: max pooling only (sums would overflow)
TORCH_ERRORS = (RuntimeError, ValueError, TypeError, IndexError)

# What PyTorch refuses for a size argument (kernel_size, padding, dilation; stride also takes
# None and ()), drawn now and then in place of a valid spelling.
BAD_SIZES = ((), [], (2, 2, 2), [1, 1, 1], 2.0, (2.0, 2), True, "2", None)
BAD_STRIDES = ((2, 2, 2), 2.0, (1.0,), False, "1")


# ---- drawing ----------------------------------------------------------------------------

@st.composite
def values(draw: Any, shape: tuple[int, ...], dtype: mx.Dtype, specials: bool,
           huge: bool = False) -> mx.array:
    """Normal draws at a drawn magnitude; with ``specials``, ±inf, NaN, ±0 and large values
    (with ``huge``, float32's largest too) planted at drawn positions (and sometimes a plane
    of ties)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    a = rng.standard_normal(shape) * draw(pick((1.0, 100.0, 1e6)))
    if a.size and draw(st.booleans()):
        a = np.round(a)  # ties between window elements: the pick must be PyTorch's
    if specials and a.size and draw(st.booleans()):
        flat = a.reshape(-1)
        count = draw(st.integers(1, max(1, flat.size // 3)))
        flat[rng.integers(0, flat.size, count)] = rng.choice(SPECIALS + HUGE * huge, count)
    return mx.array(a.astype(np.float32)).astype(dtype)


@st.composite
def spelled(draw: Any, per_axis: tuple[int, ...], one: bool = True) -> Any:
    """A spelling PyTorch takes for these per-axis ints: an int (or with ``one`` a numpy int,
    1-tuple or 1-list) where every axis is the same, else a tuple or list of all of them."""
    options: list[Any] = [tuple(per_axis), list(per_axis)]
    if len(set(per_axis)) == 1:
        v = per_axis[0]
        options += [v, v] + ([np.int64(v), (v,), [v]] if one else [])
    return draw(pick(options))


@st.composite
def size_arg(draw: Any, ints: tuple[int, ...], bad: tuple, one: bool = True) -> Any:
    """A spelling of ``ints``, or one time in eight a spelling from ``bad``."""
    if draw(st.integers(0, 7)) == 0:
        return draw(pick(bad))
    return draw(spelled(ints, one))


@st.composite
def per_axis(draw: Any, nd: int, low: int, high: int) -> tuple[int, ...]:
    if nd == 2 and draw(st.booleans()):
        v = draw(st.integers(low, high))
        return (v, v)
    return tuple(draw(st.integers(low, high)) for _ in range(nd))


# What one drawn call in four gets wrong (the rest are valid calls).
FLAWS = ("kernel_size", "stride", "padding", "dilation", "wide padding", "empty axis",
         "no channels", "big kernel")


@st.composite
def geometry(draw: Any, nd: int, dilated: bool) -> dict:
    """Input shape and window arguments, in a drawn spelling; one call in four has a flaw:
    a spelling PyTorch refuses, padding over half the kernel, an empty spatial or channel
    axis, or a window larger than the padded input (some of these PyTorch still takes)."""
    flaw = draw(weighted((None,) + FLAWS, (3 * len(FLAWS),) + (1,) * len(FLAWS)))
    if flaw == "dilation" and not dilated:
        flaw = None
    kernel = draw(per_axis(nd, 1, 4))
    if flaw == "wide padding":
        padding = draw(per_axis(nd, 0, 3))
    else:
        padding = tuple(draw(st.integers(0, k // 2)) for k in kernel)
    dilation = draw(per_axis(nd, 1, 3)) if dilated else (1,) * nd
    least = [max(1, d * (k - 1) + 1 - 2 * p) for k, p, d in zip(kernel, padding, dilation)]
    spatial = [draw(st.integers(low, max(low, 9))) for low in least]
    if flaw == "empty axis":
        spatial[draw(st.integers(0, nd - 1))] = 0
    if flaw == "big kernel":
        axis = draw(st.integers(0, nd - 1))
        reach = dilation[axis] * (kernel[axis] - 1) - 2 * padding[axis]
        spatial[axis] = draw(st.integers(1, max(1, reach)))
    channels = 0 if flaw == "no channels" else draw(st.integers(1, 3))
    batch = draw(BATCHES)

    def arg(name: str, ints: tuple[int, ...]) -> Any:
        return draw(pick(BAD_SIZES)) if flaw == name else draw(spelled(ints))

    kwargs: dict = dict(kernel_size=arg("kernel_size", kernel), padding=arg("padding", padding),
                        ceil_mode=draw(st.booleans()))
    if dilated:
        kwargs["dilation"] = arg("dilation", dilation)
    if flaw == "stride":
        kwargs["stride"] = draw(pick(BAD_STRIDES))
    else:
        how = draw(pick(("default", "left out", "given")))
        if how == "default":
            kwargs["stride"] = draw(pick((None, (), [])))
        elif how == "given":
            kwargs["stride"] = draw(spelled(draw(per_axis(nd, 1, 3))))
    return dict(shape=(batch, *spatial, channels), kwargs=kwargs)


# ---- running both -----------------------------------------------------------------------

def _to_torch(x: mx.array, grad: bool) -> torch.Tensor:
    """NHWC / NLC mlx → NCHW / NCL torch float32, the same values."""
    t = torch.from_numpy(np.array(x.astype(mx.float32))).movedim(-1, 1).contiguous()
    return t.requires_grad_(grad)


def _from_torch(t: torch.Tensor) -> np.ndarray:
    return t.detach().movedim(1, -1).numpy()


def _weights(shape: tuple[int, ...]) -> np.ndarray:
    return np.cos(np.arange(int(np.prod(shape)), dtype=np.float32) * 0.7).reshape(shape)


def _first(out: Any) -> Any:
    return out[0] if isinstance(out, (tuple, list)) else out


def _torch_call(fn: Any, x: mx.array, args: tuple, kwargs: dict, grad: bool) -> Any:
    """(outputs, input) or the exception torch raised."""
    t = _to_torch(x, grad)
    try:
        return fn(t, *args, **kwargs), t
    except TORCH_ERRORS as e:
        return e


def _mlx_call(fn: Any, x: mx.array, args: tuple, kwargs: dict) -> Any:
    with mlxnet.use_device("cpu"):
        try:
            return fn(x, *args, **kwargs)
        except mlxnet.MlxnetError as e:
            return e


def _note(what: str) -> None:
    """A statistic for ``--hypothesis-show-statistics`` (in drawn tests only)."""
    if currently_in_test_context():
        event(what)


def compare(mlx_fn: Any, torch_fn: Any, x: mx.array, args: tuple = (), kwargs: dict | None = None,
            torch_kwargs: dict | None = None, exact: bool = False, indices: bool = False,
            values: bool = True, grads: bool = True) -> None:
    """mlxnet and torch on the same call: both refuse, or both agree on the output's shape
    and, with ``values``, its values (``exact``: bit for bit, NaN where NaN), indices (but
    mlxnet's -1, a window with no input, where PyTorch's is past the input) and, with
    ``grads``, the gradient of a weighted sum of the first output (where neither is empty)."""
    kwargs = kwargs or {}
    grad = x.size > 0
    want = _torch_call(torch_fn, x, args, kwargs if torch_kwargs is None else torch_kwargs, grad)
    got = _mlx_call(mlx_fn, x, args, kwargs)
    if isinstance(want, Exception) or isinstance(got, Exception):
        assert isinstance(want, Exception) and isinstance(got, Exception), \
            f"torch: {want!r:.300}, mlxnet: {got!r:.300}"
        _note("both refuse")
        _note(f"refused: {str(got).split(', got')[0]}")
        return
    t_out, t_in = want
    y, ty = _first(got), _first(t_out)
    assert y.dtype == x.dtype
    if not values:
        assert y.shape == _from_torch(ty).shape
        return
    tol = 0.0 if exact else TOL[x.dtype]
    assert_agree(y, _from_torch(ty), tol, "values")
    if indices:
        idx = np.array(got[1])
        assert got[1].dtype == mx.int32
        picked = idx >= 0
        np.testing.assert_array_equal(idx[picked], _from_torch(t_out[1])[picked])
        assert (np.array(y.astype(mx.float32))[~picked] == -np.inf).all()
    if not grads:
        return
    if not grad or y.size == 0:  # torch's backward refuses empty outputs
        _note("both agree, empty")
        return
    _note(f"both agree, with gradients, {x.dtype}")
    w = _weights(y.shape)
    (tg,) = torch.autograd.grad((ty * torch.from_numpy(w).movedim(-1, 1)).sum(), t_in)

    def loss(x: mx.array) -> mx.array:
        return (_first(mlx_fn(x, *args, **kwargs)).astype(mx.float32) * mx.array(w)).sum()

    with mlxnet.use_device("cpu"):
        g = mx.grad(loss)(x)
    assert g.dtype == x.dtype
    assert_agree(g, _from_torch(tg), 0.0 if x.dtype == mx.float32 and exact else 4 * TOL[x.dtype],
                 "gradient")


# ---- fixed-window pooling ---------------------------------------------------------------

def _has_empty_window(fn: Any, x: mx.array, kwargs: dict) -> bool:
    """Whether a window of this (valid) call holds no real input: mlxnet's index -1."""
    out = _mlx_call(fn, x, (), dict(kwargs, return_indices=True))
    return not isinstance(out, Exception) and bool((np.array(out[1]) < 0).any())


@_settings(50)
@given(data=st.data(), nd=pick((1, 2)))
def test_max_pool_matches_torch(data, nd):
    g = data.draw(geometry(nd, dilated=True))
    dtype = data.draw(DTYPES)
    x = data.draw(values(g["shape"], dtype, specials=True, huge=True))
    kwargs = dict(g["kwargs"], return_indices=data.draw(st.booleans()))
    mlx_fn, torch_fn = (ops.max_pool1d, F.max_pool1d) if nd == 1 else (ops.max_pool2d, F.max_pool2d)
    # Values and indices are picks: exact. Gradients are sums of the weights of the windows
    # that picked an input, in either order: close. Not where a (dilated) window holds no
    # input: PyTorch's backward writes out of bounds there.
    compare(mlx_fn, torch_fn, x, kwargs=kwargs, exact=True, indices=kwargs["return_indices"],
            grads=not _has_empty_window(mlx_fn, x, kwargs))


@_settings(50)
@given(data=st.data(), nd=pick((1, 2)))
def test_avg_pool_matches_torch(data, nd):
    g = data.draw(geometry(nd, dilated=False))
    dtype = data.draw(DTYPES)
    # Specials too: a window with +inf is +inf, with both infinities or a NaN NaN, in any
    # summation order (finite values stay far from float32 overflow).
    x = data.draw(values(g["shape"], dtype, specials=data.draw(st.booleans())))
    kwargs = dict(g["kwargs"], count_include_pad=data.draw(st.booleans()))
    if nd == 2 and data.draw(st.booleans()):
        kwargs["divisor_override"] = data.draw(pick(
            (1, 2, 3, 7, -2, 0, 2**31 + 5, 2**40 + 12345, -(2**62) - 1, np.int64(5), 2.0, True)))
    mlx_fn, torch_fn = (ops.avg_pool1d, F.avg_pool1d) if nd == 1 else (ops.avg_pool2d, F.avg_pool2d)
    compare(mlx_fn, torch_fn, x, kwargs=kwargs)


def test_avg_pool1d_has_no_divisor_override_like_torch():
    x = mx.zeros((1, 4, 2))
    with pytest.raises(TypeError):
        F.avg_pool1d(_to_torch(x, False), 2, divisor_override=2)
    with pytest.raises(TypeError):
        ops.avg_pool1d(x, 2, divisor_override=2)


# ---- adaptive pooling -------------------------------------------------------------------

@st.composite
def output_size(draw: Any) -> Any:
    options = [draw(st.integers(0, 6)), (draw(st.integers(0, 6)), draw(st.integers(0, 6))),
               [draw(st.integers(1, 6)), None], (None, draw(st.integers(1, 6))), (None, None)]
    if draw(st.integers(0, 4)) == 0:
        options = [(2,), (), (1, 2, 3), None, -1, (2, -1), 2.0, (2, 2.0), True, "2"]
    return draw(pick(options))


@_settings(40)
@given(data=st.data(), kind=pick(("avg", "max")))
def test_adaptive_pool_matches_torch(data, kind):
    n = data.draw(BATCHES)
    h, w, c = data.draw(st.integers(1, 9)), data.draw(st.integers(1, 9)), data.draw(st.integers(1, 3))
    dtype = data.draw(DTYPES)
    x = data.draw(values((n, h, w, c), dtype, specials=kind == "max", huge=True))
    size = data.draw(output_size())
    if kind == "avg":
        compare(ops.adaptive_avg_pool2d, F.adaptive_avg_pool2d, x, (size,))
    else:
        ret = data.draw(st.booleans())
        compare(ops.adaptive_max_pool2d, F.adaptive_max_pool2d, x, (size,), dict(return_indices=ret),
                exact=True, indices=ret)


# ---- max unpooling ----------------------------------------------------------------------

@_settings(40)
@given(data=st.data())
def test_max_unpool2d_matches_torch(data):
    n, h, w, c = (data.draw(BATCHES), data.draw(st.integers(1, 5)),
                  data.draw(st.integers(1, 5)), data.draw(st.integers(1, 3)))
    x = data.draw(values((n, h, w, c), mx.float32, specials=False))
    k, s = data.draw(per_axis(2, 1, 3)), data.draw(per_axis(2, 1, 3))
    # Mostly padding max_pool2d could have used; sometimes more (the output may then be empty,
    # or negative: refused).
    p = data.draw(per_axis(2, 0, 2)) if data.draw(st.integers(0, 4)) == 0 else \
        tuple(data.draw(st.integers(0, kk // 2)) for kk in k)
    # PyTorch's max_unpool2d takes ints or pairs only (a 1-tuple or () fails in its _pair).
    # Not drawn: numpy ints (PyTorch fails on them in its output-size check), floats (it takes
    # them where output_size is given) and a stride or padding of more than two (it reads the
    # first two): accidents not mirrored.
    bad = ((2,), ())
    kwargs: dict = dict(kernel_size=data.draw(size_arg(k, bad + ((1, 2, 3),), one=False)),
                        padding=data.draw(size_arg(p, bad, one=False)))
    if data.draw(st.booleans()):
        kwargs["stride"] = data.draw(size_arg(s, bad, one=False))
    else:
        s = k
    default = [(size - 1) * st_ - 2 * pp + kk for size, kk, st_, pp in zip((h, w), k, s, p)]
    target = default
    how = data.draw(pick(("default", "default", "(H, W)", "(N, C, H, W)", "bad")))
    if how in ("(H, W)", "(N, C, H, W)"):
        # Within the stride of the default size, as PyTorch requires; sometimes just outside.
        reach = [st_ if data.draw(st.integers(0, 4)) == 0 else st_ - 1 for st_ in s]
        target = [d + data.draw(st.integers(-r, r)) for d, r in zip(default, reach)]
        kwargs["output_size"] = tuple(target) if how == "(H, W)" else [n, c] + target
    elif how == "bad":
        kwargs["output_size"] = data.draw(pick(((5,), (1, 2, 3), 7, (4.0, 4))))
    # Distinct in-range indices in each plane where they fit (duplicates write in no defined
    # order; out-of-range ones PyTorch refuses and mlxnet drops, on purpose); else zeros.
    plane = target[0] * target[1] if min(target) > 0 else 0
    if plane == 0:
        # No index is in range (PyTorch refuses each, mlxnet drops them): an empty batch, so
        # only the arguments decide.
        n, x = 0, x[:0]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    idx = np.zeros((n * c, h * w), np.int64)
    distinct = h * w <= plane
    if distinct:
        for i in range(n * c):
            idx[i] = rng.permutation(plane)[: h * w]
    idx = idx.reshape(n, c, h, w)
    t_idx = torch.from_numpy(idx)
    mlx_idx = mx.array(idx.transpose(0, 2, 3, 1).astype(np.int32))
    compare(lambda x, **kw: ops.max_unpool2d(x, mlx_idx, **kw),
            lambda t, **kw: F.max_unpool2d(t, t_idx, **kw), x, kwargs=kwargs, exact=True,
            values=distinct)


# ---- NaN and the picked input -----------------------------------------------------------

NAN, INF = np.nan, np.inf


@pytest.mark.parametrize("row, picked", [
    ([1.0, NAN, 2.0, NAN], 3),      # several NaNs: PyTorch's loop keeps the last
    ([INF, NAN, 3.0, 4.0], 1),      # a NaN after +inf still wins (value NaN, not inf)
    ([NAN, INF, 1.0, 1.0], 0),      # nothing beats a NaN
    ([-INF, NAN, -INF, -INF], 1),
    ([2.0, 5.0, 5.0, 1.0], 1),      # no NaN: the first maximum
    ([-INF, -INF, -INF, -INF], 0),  # all -inf: the first input
])
def test_max_pools_pick_the_input_torch_picks(row, picked):
    x = mx.array(np.array(row, np.float32).reshape(1, 1, 4, 1))
    t = _to_torch(x, False)
    ty, ti = F.max_pool2d(t, (1, 4), return_indices=True)
    assert ti.item() == picked
    w = mx.ones((1, 1, 1, 1))
    with mlxnet.use_device("cpu"):
        calls = {
            "max_pool2d": lambda x, **kw: ops.max_pool2d(x, (1, 4), **kw),
            "max_pool1d": lambda x, **kw: ops.max_pool1d(x[:, 0], 4, **kw),
            "adaptive_max_pool2d": lambda x, **kw: ops.adaptive_max_pool2d(x, 1, **kw),
        }
        for name, f in calls.items():
            y, idx = f(x, return_indices=True)
            assert idx.item() == picked, name
            for out in (y, f(x)):  # the value is the picked input's, with or without indices
                np.testing.assert_array_equal(np.array(out).reshape(-1), _from_torch(ty).reshape(-1))
            g = mx.grad(lambda x: (f(x).reshape(1, 1, 1, 1) * w).sum())(x)
            assert np.array(g).reshape(-1).tolist() == [float(i == picked) for i in range(4)], name


def test_a_window_with_no_input_is_minus_inf_and_picks_nothing():
    # Kernel 2, dilation 3, padding 1, ceil_mode: the last window's taps fall on the left
    # padding and past the input. PyTorch: -inf, with an index past the input (its backward
    # then writes out of bounds, so it is not run here).
    x = mx.array(np.arange(1.0, 13.0, dtype=np.float32).reshape(1, 2, 6, 1))
    kwargs = dict(kernel_size=(2, 2), padding=1, dilation=(3, 1), ceil_mode=True, stride=(2, 1))
    want = F.max_pool2d(_to_torch(x, False), **kwargs)
    with mlxnet.use_device("cpu"):
        y, idx = ops.max_pool2d(x, **kwargs, return_indices=True)
        g = mx.grad(lambda x: ops.max_pool2d(x, **kwargs).sum())(x)
    assert_agree(y, _from_torch(want), 0.0, "values")
    empty = np.array(idx) == -1
    assert empty.any() and (np.array(y)[empty] == -np.inf).all()
    # Each gradient goes to a picked input: as many ones as windows that picked one.
    assert np.array(g).sum() == (~empty).sum()
    compare(ops.max_pool1d, F.max_pool1d, x[:, 0], kwargs=dict(kernel_size=2, padding=1, dilation=3,
            ceil_mode=True, return_indices=True), exact=True, indices=True, grads=False)


def test_nan_picks_in_two_dimensional_windows_match_torch():
    # The last NaN in (kh, kw) scan order: row 1 before row 2, whatever the columns.
    x = np.zeros((1, 4, 4, 2), np.float32)
    x[0, 1, 2, 0] = x[0, 2, 0, 0] = NAN
    x[0, 0, 3, 1] = x[0, 0, 1, 1] = NAN
    x[0, 3, 3, 1] = INF
    x = mx.array(x)
    for kwargs in (dict(kernel_size=3, stride=1), dict(kernel_size=(3, 2), stride=1, padding=1),
                   dict(kernel_size=2, dilation=2, stride=1)):
        compare(ops.max_pool2d, F.max_pool2d, x, kwargs=dict(kwargs, return_indices=True),
                exact=True, indices=True)
    compare(ops.adaptive_max_pool2d, F.adaptive_max_pool2d, x, ((3, 2),), dict(return_indices=True),
            exact=True, indices=True)


@_settings(25)
@given(data=st.data())
def test_sppf_propagates_nan_like_three_torch_max_pools(data):
    n, h, w = data.draw(BATCHES), data.draw(st.integers(1, 9)), data.draw(st.integers(1, 9))
    x = data.draw(values((n, h, w, 2), mx.float32, specials=True, huge=True))
    with mlxnet.use_device("cpu"):
        outs = ops.sppf_pool(x)
    t = _to_torch(x, False)
    for y in outs:
        t = F.max_pool2d(t, 5, 1, 2)
        assert_agree(y, _from_torch(t), 0.0, "sppf")


# ---- spellings, one by one --------------------------------------------------------------

X2, X1 = mx.zeros((1, 6, 6, 2)), mx.zeros((1, 6, 2))


SPELLINGS = [
    *[(name, dict(kernel_size=k, stride=s, padding=p, **extra))
      for name, extra in (("max_pool2d", {}), ("avg_pool2d", {}), ("max_pool2d", {"dilation": (2,)}))
      for k, s, p in (((2,), None, 0), (2, (), 0), (2, [], 0), (2, (2,), (1,)), ([3], [1], [1]),
                      ((3, 2), (1,), (1, 0)), ((), None, 0), ([], None, 0), (2, None, ()),
                      ((2, 2, 2), None, 0), (2, (1, 2, 3), 0), (2.0, None, 0), ((2.0, 2), None, 0),
                      (True, None, 0), (2, True, 0), (2, None, False), ("2", None, 0), (None, None, 0),
                      (np.int64(2), None, 0), ((np.int32(3),), None, (np.int64(1),)),
                      (np.array([2, 2]), None, 0), (2, (None,), 0), (2, (1, None), 0),
                      (2**31, None, 0), (2, 2**31, 0), (0, None, 0), (2, 0, 0), (2, (0,), 0),
                      (2, None, -1), (-1, None, 0))],
    ("max_pool2d", dict(kernel_size=2, dilation=())), ("max_pool2d", dict(kernel_size=2, dilation=(1, 1, 1))),
    ("max_pool2d", dict(kernel_size=1, dilation=2**31 - 1)), ("max_pool2d", dict(kernel_size=2, stride=2**31 - 1)),
    ("max_pool2d", dict(kernel_size=1, dilation=2**31)),
    *[(name, dict(kernel_size=k, stride=s, padding=p))
      for name in ("max_pool1d", "avg_pool1d")
      for k, s, p in (((2,), None, 0), ([2], (), 0), (2, [], (1,)), (2, (2,), [1]), ((2, 2), None, 0),
                      (2, (1, 2), 0), ((), None, 0), (2, None, ()), (2.0, None, 0), (True, None, 0),
                      (2, True, 0), (np.int64(2), None, 0), (0, None, 0), (2, 0, 0), (2**31, None, 0))],
    ("avg_pool1d", dict(kernel_size=2, stride=2**31)),
    ("max_pool1d", dict(kernel_size=2, dilation=(2,))), ("max_pool1d", dict(kernel_size=2, dilation=())),
    ("max_pool1d", dict(kernel_size=2, dilation=(1, 1))),
    *[(name, dict(kernel_size=2, **{flag: v}))
      for name, flag in (("max_pool2d", "ceil_mode"), ("max_pool1d", "ceil_mode"), ("avg_pool2d", "ceil_mode"),
                         ("avg_pool1d", "count_include_pad"), ("avg_pool2d", "count_include_pad"))
      for v in (True, False, 1, 0, None, np.bool_(True), "yes")],
    *[("avg_pool2d", dict(kernel_size=2, divisor_override=d))
      for d in (None, 1, 3, -2, 0, 2**31, 2**40 + 1, 2**63 - 1, -(2**63), 2**63, 2.0, True, False, (2,),
                "2", np.int64(3))],
    *[(name, dict(output_size=o)) for name in ("adaptive_avg_pool2d", "adaptive_max_pool2d")
      for o in (2, (2, 3), [2, 3], (None, 2), (2, None), (None, None), (0, 2), (2,), (), (1, 2, 3), None,
                -1, (2, -1), 2.0, (2, 2.0), True, (True, 2), "2", (np.int64(2), None), 2**31)],
]


@pytest.mark.parametrize("name, kwargs", SPELLINGS, ids=lambda v: " ".join(repr(v).split()))
def test_each_spelling_is_taken_or_refused_as_torch_does(name, kwargs):
    x = X1 if name.endswith("1d") else X2
    want = _torch_call(getattr(F, name), x, (), kwargs, grad=True)
    got = _mlx_call(getattr(ops, name), x, (), kwargs)
    if isinstance(got, Exception):
        assert isinstance(got, mlxnet.MlxnetError) and "\n" not in str(got)
    want_shape = "refused" if isinstance(want, Exception) else tuple(_from_torch(_first(want[0])).shape)
    got_shape = "refused" if isinstance(got, Exception) else tuple(_first(got).shape)
    assert got_shape == want_shape, (want, got)


Y3 = mx.arange(9, dtype=mx.float32).reshape(1, 3, 3, 1)  # a 2x2 pool's output of 6x6


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=2), dict(kernel_size=(2, 2), stride=[2, 2], padding=(0, 0)),
    dict(kernel_size=2, output_size=(7, 6)), dict(kernel_size=2, output_size=[1, 1, 6, 7]),
    dict(kernel_size=(2,)), dict(kernel_size=2, stride=()), dict(kernel_size=2, stride=(2,)),
    dict(kernel_size=2, padding=(0,)), dict(kernel_size=(2, 2, 2)), dict(kernel_size=2.0),
    dict(kernel_size=2, output_size=(8, 6)), dict(kernel_size=2, output_size=(7,)),
    dict(kernel_size=2, output_size=(1, 7, 6)), dict(kernel_size=2, output_size=7),
    dict(kernel_size=2, output_size=(7.0, 6)), dict(kernel_size=2, padding=5),
    dict(kernel_size=3, stride=3, padding=1), dict(kernel_size=2, stride=0),
    dict(kernel_size=2, padding=-1), dict(kernel_size=2, padding=2),
], ids=lambda v: " ".join(repr(v).split()))
def test_each_unpool_spelling_is_taken_or_refused_as_torch_does(kwargs):
    # Index 0 is in range for every non-empty output size (PyTorch refuses indices past it,
    # mlxnet drops them on purpose): only the arguments decide.
    y, idx = Y3, mx.zeros(Y3.shape, mx.int32)
    t_idx = torch.from_numpy(np.array(idx).astype(np.int64)).movedim(-1, 1)
    want = _torch_call(lambda t, **kw: F.max_unpool2d(t, t_idx, **kw), y, (), kwargs, grad=False)
    got = _mlx_call(lambda x, **kw: ops.max_unpool2d(x, idx, **kw), y, (), kwargs)
    want_shape = "refused" if isinstance(want, Exception) else tuple(_from_torch(want[0]).shape)
    got_shape = "refused" if isinstance(got, Exception) else tuple(got.shape)
    assert got_shape == want_shape, (want, got)


def test_where_mlxnet_differs_from_torch_on_purpose():
    """Spellings where PyTorch's own behaviour is an accident of its implementation."""
    x = _to_torch(X2, False)
    # PyTorch checks only the first element's type: [2, True] passes, [True, 2] does not.
    # mlxnet refuses a bool anywhere.
    assert F.max_pool2d(x, [2, True]).shape[-2:] == (3, 6)
    with pytest.raises(TypeError):
        F.max_pool2d(x, [True, 2])
    with pytest.raises(mlxnet.MlxnetError, match="kernel_size must be"):
        ops.max_pool2d(X2, [2, True])
    # max_pool1d without gradients or indices takes sizes past a C int (its other paths, and
    # every other pooling op, refuse them); mlxnet's kernels index with int32 and refuse.
    t1 = _to_torch(X1, False)
    assert F.max_pool1d(t1, 2, stride=2**31).shape[-1] == 1
    with pytest.raises(RuntimeError, match="overflow"):
        F.max_pool1d(t1.requires_grad_(), 2, stride=2**31)
    with pytest.raises(mlxnet.MlxnetError, match="stride must fit in a 32-bit int"):
        ops.max_pool1d(X1, 2, stride=2**31)
    # max_unpool2d's Python wrapper uses kernel_size, stride and padding only to check a given
    # output_size, so floats pass there; mlxnet wants ints, as everywhere else.
    y, i = F.max_pool2d(x, 2, return_indices=True)
    assert F.max_unpool2d(y, i, 2.5, stride=1.5, output_size=(6, 6)).shape[-2:] == (6, 6)
    with pytest.raises(mlxnet.MlxnetError, match="kernel_size must be"):
        ops.max_unpool2d(Y3, mx.zeros(Y3.shape, mx.int32), 2.5, stride=1.5, output_size=(6, 6))
    # ... and it reads two entries of stride and padding, whatever their length.
    assert F.max_unpool2d(y, i, 2, stride=(2, 2, 9), padding=(0, 0, 9)).shape[-2:] == (6, 6)
    with pytest.raises(mlxnet.MlxnetError, match="stride must be"):
        ops.max_unpool2d(Y3, mx.zeros(Y3.shape, mx.int32), 2, stride=(2, 2, 9))
    # adaptive pooling's output_size: PyTorch's Python wrapper wants a Python int or a
    # sequence; mlxnet takes integer scalars of any kind, as the other ops' sizes.
    with pytest.raises(TypeError):
        F.adaptive_avg_pool2d(x, np.int64(2))
    assert ops.adaptive_avg_pool2d(X2, np.int64(2)).shape == (1, 2, 2, 2)


# ---- the GPU kernels' launch parameters (recorded here, run on a GPU by test_pooling.py) --

@pytest.mark.parametrize("override", [None, 3, -7, 2**24 + 1, 2**40 + 12345, -(2**63)])
def test_divisor_override_reaches_both_avg_kernels_exactly(override):
    op = ops.get("avg_pool2d")
    x = mx.zeros((2, 5, 6, 3))
    kwargs = dict(kernel_size=(2,), stride=(), padding=1, divisor_override=override)
    with kernel_source.record_launches() as launches:
        (out,) = [op.kernel(x, **kwargs)]
        op.kernel_vjp([x], mx.ones_like(out), out, **kwargs)
    assert [launch.kernel.kernel for launch in launches] == ["avg_pool2d", "avg_pool2d_grad"]
    for launch in launches:
        p = np.array(launch.inputs[-1]).tolist()
        assert len(p) == 15
        mantissa, shift = p[13:]
        if override is None:
            assert mantissa == 0
        else:
            # The kernel's float divisor: mantissa * 2^shift, PyTorch's float(divisor_override).
            assert abs(mantissa) < 2**24
            assert np.float32(mantissa) * np.float32(2.0**shift) == float32_value(override)
            assert float32_value(override) == torch.tensor(override).float().item()
