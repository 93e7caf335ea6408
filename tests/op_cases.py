"""Hypothesis strategies that draw a valid call of every registered op, for the property tests.

Each strategy draws shapes, arguments, dtype, memory layout (contiguous, strided, transposed
or broadcast views) and values (normal draws at several magnitudes, with ±inf, NaN, ±0 and
huge values planted where the op's result stays well defined), and returns a :class:`Case`:
the call, and where PyTorch has the same op, the same call in PyTorch (NCHW, float64).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import mlx.core as mx
import numpy as np
import torch
import torch.nn.functional as F
from hypothesis import strategies as st

DTYPES = (mx.float32, mx.float16, mx.bfloat16)
SPECIALS = (np.inf, -np.inf, np.nan, 0.0, -0.0, 1e30, -1e30, 88.8, -88.8, -104.0, 1e-30)


@dataclass
class Case:
    args: tuple
    kwargs: dict
    # The same call in PyTorch, on float64 tensors made from ``args``' arrays (in order),
    # returning the output in mlxnet's layout; None where PyTorch has no such op.
    torch_fn: Callable[..., Any] | None = None
    # Whether the call has gradients to compare (nms: indices only).
    grads: bool = True
    # Widens the PyTorch tolerance for ill-conditioned draws (float32 rounding of the input
    # itself is amplified; PyTorch's float32 result moves as much)
    conditioning: float = 1.0

    def __repr__(self) -> str:
        shapes = [(tuple(a.shape), str(a.dtype)) if isinstance(a, mx.array) else a for a in self.args]
        return f"Case(args={shapes}, kwargs={self.kwargs})"


def _layout(a: np.ndarray, layout: str, dtype: mx.Dtype) -> mx.array:
    """``a`` as an mlx array of ``dtype`` laid out as asked: the values are the same."""
    if layout == "strided" and a.ndim:
        wide = np.repeat(a, 2, axis=-1)
        return mx.array(wide).astype(dtype)[..., ::2]
    if layout == "transposed" and a.ndim >= 2:
        return mx.array(np.ascontiguousarray(a.swapaxes(-1, -2))).astype(dtype).swapaxes(-1, -2)
    if layout == "broadcast" and a.ndim >= 1 and a.shape[0] > 1:
        a[:] = a[:1]  # every row the same, so the array is a broadcast of its first
        return mx.broadcast_to(mx.array(a[:1]).astype(dtype), a.shape)
    return mx.array(a).astype(dtype)


@st.composite
def arrays(draw: Any, shape: tuple[int, ...], dtype: mx.Dtype, *, specials: bool = True,
           magnitude: tuple[float, ...] = (1.0, 4.0, 100.0)) -> mx.array:
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape) * draw(st.sampled_from(magnitude))
    if specials and a.size and draw(st.booleans()):
        count = draw(st.integers(1, min(4, a.size)))
        where = rng.choice(a.size, count, replace=False)
        a.flat[where] = [draw(st.sampled_from(SPECIALS)) for _ in range(count)]
    layout = draw(st.sampled_from(("contiguous", "strided", "transposed", "broadcast")))
    return _layout(a.astype(np.float32), layout, dtype)


def t(a: mx.array) -> torch.Tensor:
    return torch.tensor(np.array(a.astype(mx.float32)), dtype=torch.float64)


def nchw(x: torch.Tensor) -> torch.Tensor:
    return x.movedim(-1, 1)


def nhwc(x: torch.Tensor) -> torch.Tensor:
    return x.movedim(1, -1)


def ill_conditioned(amplification: float, terms: int) -> float:
    """How much wider than the base tolerance (1e-4) a float32 result may stray when rounding
    errors of ``terms`` summed inputs (2^-24 each, growing as their square root) are multiplied
    by ``amplification`` on the way to the output."""
    return max(1.0, amplification * 2.0**-24 * (4 + terms**0.5) / 1e-4)


small = st.integers(1, 6)
# a batch of one first (Hypothesis starts from the first choice), empty batches among the rest
batch = st.sampled_from((1, 2, 3, 0))
dtypes = st.sampled_from(DTYPES)


# ---- elementwise and row ops ----------------------------------------------------------------

@st.composite
def elementwise(draw: Any, name: str) -> Case:
    dtype = draw(dtypes)
    shape = tuple(draw(st.lists(small, min_size=0, max_size=4)))
    x = draw(arrays(shape, dtype, magnitude=(1.0, 10.0, 1e3)))
    if name == "silu":
        if draw(st.booleans()) and shape:
            bias = draw(arrays(shape[-1:], dtype, specials=False))
            return Case((x, bias), {}, lambda x, b: F.silu(x + b))
        return Case((x,), {}, F.silu)
    if name == "gelu":
        form = draw(st.sampled_from(("none", "tanh")))
        # PyTorch's erf GELU gives NaN at +inf; mlxnet gives the limit, inf (as its tanh form does)
        return Case((x,), {"approximate": form},
                    lambda x: torch.where(x == np.inf, x, F.gelu(x, approximate=form)))
    return Case((x,), {}, torch.sigmoid)


@st.composite
def softmax_case(draw: Any) -> Case:
    dtype = draw(dtypes)
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=0, max_size=3)))
    x = draw(arrays(shape, dtype, magnitude=(1.0, 30.0)))
    axis = draw(st.integers(-max(len(shape), 1), max(len(shape), 1) - 1))
    out_dtype = draw(st.sampled_from((None, mx.float32)))
    kwargs = {"axis": axis} if out_dtype is None else {"axis": axis, "dtype": out_dtype}
    return Case((x,), kwargs, lambda x: F.softmax(x, dim=axis))


@st.composite
def layer_norm_case(draw: Any) -> Case:
    dtype = draw(dtypes)
    shape = (*draw(st.lists(st.integers(0, 4), min_size=0, max_size=3)), draw(st.integers(1, 40)))
    x = draw(arrays(shape, dtype, magnitude=(1.0, 1e3), specials=False))
    eps = draw(st.sampled_from((1e-5, 1e-6)))
    xs = np.array(x.astype(mx.float32), dtype=np.float64).reshape(-1, shape[-1])
    # (x − mean)/σ: float32's error in the mean, |x|·2^-24, divided by σ (and times the weight)
    amplification = float(np.abs(xs).max(initial=0) / np.sqrt(xs.var(axis=1).min(initial=np.inf) + eps))
    if draw(st.booleans()):
        w, b = (draw(arrays(shape[-1:], dtype, specials=False)) for _ in range(2))
        cond = ill_conditioned(amplification * float(mx.abs(w.astype(mx.float32)).max()), shape[-1])
        return Case((x, w, b), {"eps": eps}, lambda x, w, b: F.layer_norm(x, shape[-1:], w, b, eps),
                    conditioning=cond)
    return Case((x,), {"eps": eps}, lambda x: F.layer_norm(x, shape[-1:], eps=eps),
                conditioning=ill_conditioned(amplification, shape[-1]))


@st.composite
def batch_norm_train_case(draw: Any) -> Case:
    dtype = draw(dtypes)
    c = draw(st.integers(1, 24))
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(2, 5)), c)
    x = draw(arrays(shape, dtype, magnitude=(1.0, 1e2), specials=False))
    w, b = (draw(arrays((c,), dtype, specials=False)) for _ in range(2))
    eps = draw(st.sampled_from((1e-3, 1e-5)))
    activation = draw(st.sampled_from((None, "silu")))
    xs = np.array(x.astype(mx.float32), dtype=np.float64).reshape(-1, c)
    amplification = float(np.abs(xs).max(initial=0) / np.sqrt(xs.var(axis=0).min(initial=np.inf) + eps))
    cond = ill_conditioned(amplification * float(mx.abs(w.astype(mx.float32)).max()), xs.shape[0])

    def reference(x, w, b):
        nchw = x.permute(0, 3, 1, 2)
        y = F.batch_norm(nchw, None, None, w, b, training=True, eps=eps).permute(0, 2, 3, 1)
        if activation == "silu":
            y = F.silu(y)
        return y, x.mean(dim=(0, 1, 2)), x.var(dim=(0, 1, 2), unbiased=False)
    return Case((x, w, b), {"eps": eps, "activation": activation}, reference, conditioning=cond)


@st.composite
def attention_case(draw: Any) -> Case:
    dtype = draw(dtypes)
    lead = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    L, S, E, Ev = (draw(st.integers(1, 9)) for _ in range(4))
    q = draw(arrays((*lead, L, E), dtype, specials=False))
    k = draw(arrays((*lead, S, E), dtype, specials=False))
    v = draw(arrays((*lead, S, Ev), dtype, specials=False))
    scale = draw(st.sampled_from((None, 0.25, 1.0)))
    kwargs = {} if scale is None else {"scale": scale}
    # rounding in scores as large as |q|·|k|·E moves a saturated softmax by that much
    mags = [float(mx.abs(a.astype(mx.float32)).max()) for a in (q, k, v)]
    cond = ill_conditioned(mags[0] * mags[1] * E * (scale or E**-0.5) * max(1.0, mags[2]), S)
    if draw(st.booleans()):
        bias = draw(arrays((L, S), dtype, specials=False))
        return Case((q, k, v, bias), kwargs,
                    lambda q, k, v, b: F.scaled_dot_product_attention(q, k, v, attn_mask=b, scale=scale),
                    conditioning=cond)
    return Case((q, k, v), kwargs, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=scale),
                conditioning=cond)


# ---- convolutions -------------------------------------------------------------------------------

@st.composite
def conv_geometry(draw: Any, k_max: int, w_max: int) -> tuple:
    """(kh, kw, stride, dilation, padding, h, w) of a conv with an output of at least one pixel;
    padding sometimes 'same' or 'valid' (stride 1)."""
    kh, kw = draw(st.integers(1, k_max)), draw(st.integers(1, k_max))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding: Any = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    if draw(st.integers(0, 4)) == 0:
        padding, stride = draw(st.sampled_from(("same", "valid"))), (1, 1)
    h = draw(st.integers(dilation[0] * (kh - 1) + 1, 14))
    w = draw(st.integers(dilation[1] * (kw - 1) + 1, w_max))
    return kh, kw, stride, dilation, padding, h, w


@st.composite
def conv2d_case(draw: Any) -> Case:
    dtype = draw(dtypes)
    groups = draw(st.sampled_from((1, 1, 2, 3)))
    c_in_g, c_out_g = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    if draw(st.booleans()):  # depthwise
        c_in_g, c_out_g, groups = 1, 1, draw(st.integers(1, 9))
    kh, kw, stride, dilation, padding, h, w = draw(conv_geometry(4, 14))
    n = draw(batch)
    x = draw(arrays((n, h, w, c_in_g * groups), dtype, specials=False))
    weight = draw(arrays((c_out_g * groups, kh, kw, c_in_g), dtype, specials=False, magnitude=(0.3,)))
    spell = draw(st.sampled_from(("pair", "int", "one-tuple")))
    kwargs: dict = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    if spell != "pair":  # the same call spelled with ints or 1-tuples where both axes agree
        for key in ("stride", "padding", "dilation"):
            v = kwargs[key]
            if not isinstance(v, str) and v[0] == v[1]:
                kwargs[key] = v[0] if spell == "int" else (v[0],)
    activation = draw(st.sampled_from((None, None, "silu", "relu")))
    bias = draw(arrays((c_out_g * groups,), dtype, specials=False)) if draw(st.booleans()) else None
    residual = None
    if draw(st.booleans()):  # a shortcut added before the activation
        oh, ow = (_conv_out(h, kh, stride[0], padding, dilation[0], 0), _conv_out(w, kw, stride[1], padding, dilation[1], 1))
        residual = draw(arrays((n, oh, ow, c_out_g * groups), dtype, specials=False))
    args = (x, weight, bias) + ((residual,) if residual is not None else ())
    args = args if residual is not None or bias is not None else (x, weight)

    def ref(x: torch.Tensor, w: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        b = rest[0] if bias is not None else None
        y = nhwc(F.conv2d(nchw(x), w.permute(0, 3, 1, 2), b, stride=stride, padding=padding,
                          dilation=dilation, groups=groups))
        y = y + rest[-1] if residual is not None else y
        return F.silu(y) if activation == "silu" else F.relu(y) if activation == "relu" else y
    return Case(args, {**kwargs, "activation": activation}, ref)


def _conv_out(size: int, k: int, stride: int, padding: Any, dilation: int, axis: int) -> int:
    """A conv's output size along one axis, PyTorch's rule; 'same' keeps the size."""
    if padding == "same":
        return size
    pad = 0 if padding == "valid" else padding[axis]
    return (size + 2 * pad - dilation * (k - 1) - 1) // stride + 1


@st.composite
def bias_act_case(draw: Any) -> Case:
    dtype = draw(dtypes)
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=0, max_size=3))) + (draw(st.integers(1, 40)),)
    x = draw(arrays(shape, dtype))
    bias = draw(arrays(shape[-1:], dtype))
    residual = draw(arrays(shape, dtype)) if draw(st.booleans()) else None
    activation = draw(st.sampled_from(("relu", None)))

    def ref(x: torch.Tensor, b: torch.Tensor, r: torch.Tensor | None = None) -> torch.Tensor:
        y = x + b if r is None else x + b + r
        return F.relu(y) if activation == "relu" else y
    args = (x, bias) if residual is None else (x, bias, residual)
    return Case(args, {"activation": activation}, ref)


@st.composite
def depthwise_case(draw: Any) -> Case:
    """One filter per channel, at the strides, dilations and paddings conv2d's cases draw."""
    dtype = draw(dtypes)
    c = draw(st.sampled_from((1, 2, 3, 5, 8, 9, 16, 33)))
    if draw(st.booleans()):  # what the GPU kernel takes: square 3×3 / 5×5 windows, equal strides 1-2
        k, step = draw(st.sampled_from((3, 5))), draw(st.integers(1, 2))
        kh, kw, stride, dilation, padding = k, k, (step, step), (1, 1), (draw(st.integers(0, 2)),) * 2
        h, w = draw(st.integers(k, 14)), draw(st.integers(k, 17))
    else:
        kh, kw, stride, dilation, padding, h, w = draw(conv_geometry(5, 17))
    x = draw(arrays((draw(batch), h, w, c), dtype, specials=False))
    weight = draw(arrays((c, kh, kw, 1), dtype, specials=False, magnitude=(0.3,)))
    bias = draw(arrays((c,), dtype, specials=False)) if draw(st.booleans()) else None
    args = (x, weight) if bias is None else (x, weight, bias)

    def ref(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        return nhwc(F.conv2d(nchw(x), w.permute(0, 3, 1, 2), b, stride=stride, padding=padding,
                             dilation=dilation, groups=c))
    return Case(args, {"stride": stride, "padding": padding, "dilation": dilation}, ref)


@st.composite
def window_partition_case(draw: Any) -> Case:
    window = draw(st.integers(1, 5))
    x = draw(arrays((draw(batch), draw(st.integers(1, 12)), draw(st.integers(1, 12)), draw(small)), draw(dtypes)))

    def ref(x: torch.Tensor, window: int) -> torch.Tensor:
        b, h, w, c = x.shape
        nh, nw = -(-h // window), -(-w // window)
        x = F.pad(x, (0, 0, 0, nw * window - w, 0, nh * window - h))
        return x.reshape(b, nh, window, nw, window, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, window * window, c)
    return Case((x, window), {}, ref)


@st.composite
def window_merge_case(draw: Any) -> Case:
    window, h, w, b, c = draw(st.integers(1, 5)), draw(st.integers(1, 12)), draw(st.integers(1, 12)), draw(batch), draw(small)
    nh, nw = -(-h // window), -(-w // window)
    tiles = draw(arrays((b * nh * nw, window * window, c), draw(dtypes)))

    def ref(tiles: torch.Tensor, window: int, h: int, w: int) -> torch.Tensor:
        x = tiles.reshape(b, nh, nw, window, window, c).permute(0, 1, 3, 2, 4, 5)
        return x.reshape(b, nh * window, nw * window, c)[:, :h, :w]
    return Case((tiles, window, h, w), {}, ref)


@st.composite
def conv_transpose_case(draw: Any, nd: int) -> Case:
    dtype = draw(dtypes)
    groups = draw(st.sampled_from((1, 1, 2)))
    c_in_g, c_out_g = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    kernel = tuple(draw(st.integers(1, 4)) for _ in range(nd))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    padding = tuple(draw(st.integers(0, (dilation[i] * (kernel[i] - 1)) // 2 + 0)) for i in range(nd))
    output_padding = tuple(draw(st.integers(0, max(stride[i], dilation[i]) - 1)) for i in range(nd))
    spatial = tuple(draw(st.integers(1, 7)) for _ in range(nd))
    n = draw(batch)
    x = draw(arrays((n, *spatial, c_in_g * groups), dtype, specials=False))
    weight = draw(arrays((c_out_g * groups, *kernel, c_in_g), dtype, specials=False, magnitude=(0.3,)))
    bias = draw(arrays((c_out_g * groups,), dtype, specials=False)) if draw(st.booleans()) else None
    args = (x, weight) if bias is None else (x, weight, bias)
    kwargs = dict(stride=stride, padding=padding, output_padding=output_padding, dilation=dilation, groups=groups)
    fn = F.conv_transpose2d if nd == 2 else F.conv_transpose1d

    def ref(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        # MLX layout (C_out, *k, C_in/g) -> PyTorch's (C_in, C_out/g, *k)
        wt = w.movedim(-1, 1).reshape(groups, c_out_g, c_in_g, *kernel).transpose(1, 2)
        return nhwc(fn(nchw(x), wt.reshape(groups * c_in_g, c_out_g, *kernel).contiguous(), b, **kwargs))
    return Case(args, kwargs, ref)


# ---- padding and pooling ---------------------------------------------------------------------

@st.composite
def pad_geometry(draw: Any) -> tuple:
    """(dtype, NHWC shape, mode, pads) of a padding call, each pad within what its mode reaches."""
    dtype = draw(dtypes)
    n, h, w, c = draw(batch), draw(st.integers(1, 7)), draw(st.integers(1, 7)), draw(small)
    mode = draw(st.sampled_from(("reflect", "symmetric", "replicate")))
    reach = {"reflect": (h - 1, w - 1), "symmetric": (h, w), "replicate": (9, 9)}[mode]
    return dtype, (n, h, w, c), mode, tuple(draw(st.integers(0, reach[i // 2])) for i in range(4))


def torch_pad(x: torch.Tensor, pads: tuple, mode: str) -> torch.Tensor:
    """PyTorch's F.pad of an NHWC tensor by (top, bottom, left, right)."""
    return nhwc(F.pad(nchw(x), (pads[2], pads[3], pads[0], pads[1]), mode=mode))


@st.composite
def pad_case(draw: Any) -> Case:
    dtype, shape, mode, pads = draw(pad_geometry())
    x = draw(arrays(shape, dtype))
    return Case((x,), {"pads": pads, "mode": mode},
                None if mode == "symmetric" else lambda x: torch_pad(x, pads, mode))


@st.composite
def bias_act_pad_case(draw: Any) -> Case:
    """A convolution's epilogue padded for the next one; every input may be a view (the GPU
    kernel reads each through its strides)."""
    dtype, shape, mode, pads = draw(pad_geometry())
    x = draw(arrays(shape, dtype))
    bias = draw(arrays(shape[-1:], dtype))
    residual = draw(arrays(shape, dtype)) if draw(st.booleans()) else None
    skip = draw(arrays(shape, dtype)) if draw(st.booleans()) else None
    activation = draw(st.sampled_from(("relu", None)))
    kwargs = {"pads": pads, "mode": mode, "activation": activation}
    # ReLU's gradient at NaN is a convention (PyTorch 0, MLX's maximum 1): forward only there
    grads = activation is None or not any(mx.isnan(a).any().item() for a in (x, bias, residual) if a is not None)
    if mode == "symmetric":
        return Case((x, bias, residual, skip), kwargs, None, grads=grads)

    def ref(x: torch.Tensor, b: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        given = iter(rest)
        r = next(given) if residual is not None else None
        s = next(given) if skip is not None else None
        y = x + b if r is None else x + b + r
        y = F.relu(y) if activation == "relu" else y
        return torch_pad(y if s is None else y + s, pads, mode)
    return Case((x, bias, residual, skip), kwargs, ref, grads=grads)


@st.composite
def pool_case(draw: Any, name: str) -> Case:
    dtype = draw(dtypes)
    nd = 1 if name.endswith("1d") else 2
    kernel = tuple(draw(st.integers(1, 4)) for _ in range(nd))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    padding = tuple(draw(st.integers(0, k // 2)) for k in kernel)
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(nd)) if name.startswith("max") else (1,) * nd
    ceil_mode = draw(st.booleans())
    spatial = tuple(draw(st.integers(dilation[i] * (kernel[i] - 1) + 1, 9)) for i in range(nd))
    x = draw(arrays((draw(batch), *spatial, draw(small)), dtype,
                    specials=name.startswith("max")))
    kwargs: dict = dict(kernel_size=kernel, stride=stride, padding=padding, ceil_mode=ceil_mode)
    fn = getattr(F, name)
    if name.startswith("max"):
        kwargs["dilation"] = dilation
    else:
        kwargs["count_include_pad"] = draw(st.booleans())
    return Case((x,), kwargs, lambda x: nhwc(fn(nchw(x), **kwargs)))


@st.composite
def adaptive_case(draw: Any, name: str) -> Case:
    dtype = draw(dtypes)
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    out = (draw(st.integers(1, 6)), draw(st.integers(1, 6)))
    x = draw(arrays((draw(batch), h, w, draw(small)), dtype, specials=name.startswith("adaptive_max")))
    fn = getattr(F, name)
    return Case((x,), {"output_size": out}, lambda x: nhwc(fn(nchw(x), out)))


@st.composite
def unpool_case(draw: Any) -> Case:
    from mlxnet import ops
    dtype = draw(dtypes)
    k = draw(st.integers(1, 3))
    x = draw(arrays((draw(batch), draw(st.integers(k, 8)), draw(st.integers(k, 8)), draw(small)),
                    dtype, specials=False))
    y, indices = ops.max_pool2d.op.definition(x, k, return_indices=True)
    return Case((y, indices), {"kernel_size": k}, None)


@st.composite
def sppf_case(draw: Any) -> Case:
    dtype = draw(dtypes)
    x = draw(arrays((draw(batch), draw(st.integers(1, 9)), draw(st.integers(1, 9)), draw(small)), dtype))

    def ref(x: torch.Tensor) -> tuple:
        y1 = F.max_pool2d(nchw(x), 5, 1, 2)
        y2 = F.max_pool2d(y1, 5, 1, 2)
        return nhwc(y1), nhwc(y2), nhwc(F.max_pool2d(y2, 5, 1, 2))
    return Case((x,), {}, ref)


# ---- detection heads --------------------------------------------------------------------------

@st.composite
def dfl_case(draw: Any) -> Case:
    dtype = draw(dtypes)
    bins, nc, n = draw(st.integers(1, 6)), draw(st.integers(1, 4)), draw(st.integers(0, 2))
    levels = draw(st.integers(1, 3))
    maps = []
    for _ in range(levels):
        h, w = draw(st.integers(1, 4)), draw(st.integers(1, 4))
        maps += [draw(arrays((n, h, w, 4 * bins), dtype, specials=False)),
                 draw(arrays((n, h, w, nc), dtype, specials=False))]
    strides = tuple(8 * 2 ** i for i in range(levels))
    return Case((mx.arange(bins, dtype=mx.float32), *maps), {"strides": strides}, None)


@st.composite
def nms_case(draw: Any) -> Case:
    count = draw(st.integers(0, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    xy = rng.uniform(0, 50, (count, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(1, 20, (count, 2))], axis=1).astype(np.float32)
    scores = rng.uniform(size=count).astype(np.float32)
    classes = mx.array(rng.integers(0, 3, count)) if draw(st.booleans()) else None
    kwargs = {"iou_threshold": draw(st.sampled_from((0.3, 0.5, 0.7))), "max_det": draw(st.integers(1, 50))}
    return Case((mx.array(boxes), mx.array(scores), classes), kwargs, None, grads=False)


CASES: dict[str, st.SearchStrategy[Case]] = {
    "sigmoid": elementwise("sigmoid"),
    "silu": elementwise("silu"),
    "gelu": elementwise("gelu"),
    "softmax": softmax_case(),
    "layer_norm": layer_norm_case(),
    "batch_norm_train": batch_norm_train_case(),
    "scaled_dot_product_attention": attention_case(),
    "conv2d": conv2d_case(),
    "bias_act": bias_act_case(),
    "depthwise_conv2d": depthwise_case(),
    "conv_transpose1d": conv_transpose_case(1),
    "conv_transpose2d": conv_transpose_case(2),
    "pad2d": pad_case(),
    "bias_act_pad2d": bias_act_pad_case(),
    "window_partition": window_partition_case(),
    "window_merge": window_merge_case(),
    "max_pool1d": pool_case("max_pool1d"),
    "max_pool2d": pool_case("max_pool2d"),
    "avg_pool1d": pool_case("avg_pool1d"),
    "avg_pool2d": pool_case("avg_pool2d"),
    "adaptive_avg_pool2d": adaptive_case("adaptive_avg_pool2d"),
    "adaptive_max_pool2d": adaptive_case("adaptive_max_pool2d"),
    "max_unpool2d": unpool_case(),
    "sppf_pool": sppf_case(),
    "dfl_decode": dfl_case(),
    "nms": nms_case(),
}
