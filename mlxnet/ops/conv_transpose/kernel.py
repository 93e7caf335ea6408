"""The GPU face of the transposed convolutions: the gather kernel or MLX's built-in by shape
class, and the backward through ordinary convolutions or autodiff of the decomposition."""
from __future__ import annotations

from typing import Any

import mlx.core as mx

from ..core.kernel_source import PortableKernel, int_params
from .definition import _run, decomposed_nhwc
from .plan import IntOrTuple, Plan, as_2d, plan

GATHER = PortableKernel("conv_transpose.kern", "conv_transpose2d_gather",
                        ["x", "wt", "bias", "p"], ["out"])
PIX = 4  # output pixels per thread (along W, one stride phase)


def gather_nhwc(x: mx.array, weight: mx.array, bias: mx.array | None, p: Plan) -> mx.array:
    """The portable gather kernel on 4-D NHWC input (plan from :func:`.plan.plan`)."""
    ah, aw = p.axes
    n = x.shape[0]
    kh_n, kw_n = weight.shape[1:3]
    # (KH, KW, C_in/groups, C_out): consecutive threads (output channels) read consecutive weights.
    wt = weight.astype(x.dtype).transpose(1, 2, 3, 0)
    has_bias = bias is not None
    b = bias.astype(x.dtype) if has_bias else mx.zeros((1,), x.dtype)
    nbw = -(-aw.out // (aw.stride * PIX))
    total = n * ah.out * nbw * aw.stride * p.c_out
    params = int_params((ah.size, aw.size, p.c_in, ah.out, aw.out, p.c_out, ah.padding, aw.padding,
                         p.c_in // p.groups, p.c_out // p.groups, nbw, total))
    (out,) = GATHER(
        [x, wt, b, params],
        template=[("T", x.dtype), ("PIX", PIX), ("HAS_BIAS", has_bias), ("KH", kh_n), ("KW", kw_n),
                  ("SH", ah.stride), ("SW", aw.stride), ("DH", ah.dilation), ("DW", aw.dilation)],
        grid=(total, 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(n, ah.out, aw.out, p.c_out)], output_dtypes=[x.dtype],
    )
    return out


def builtin_nhwc(x: mx.array, weight: mx.array, bias: mx.array | None, p: Plan) -> mx.array:
    """MLX's own transposed convolution (cuDNN backward-data on CUDA)."""
    ah, aw = p.axes
    y = mx.conv_transpose2d(x, weight.astype(x.dtype), stride=(ah.stride, aw.stride),
                            padding=(ah.padding, aw.padding), dilation=(ah.dilation, aw.dilation),
                            output_padding=(ah.output_padding, aw.output_padding), groups=p.groups)
    return y if bias is None else y + bias.astype(x.dtype)


FORWARD = {"gather": gather_nhwc, "decomposition": decomposed_nhwc, "builtin": builtin_nhwc}


def forward_method(x: mx.array, p: Plan) -> str:
    """Fastest forward by shape class (measured on an H100; docs/performance-notes.md): the
    gather kernel for at most 4 input channels per group, else MLX's built-in (cuDNN). The
    decomposition (the definition) never wins on the GPU."""
    ah, aw = p.axes
    if x.shape[0] * ah.out * aw.out * p.c_out >= 2**31 - 2**24:  # the kernel indexes with int32
        return "builtin"
    return "gather" if p.c_in // p.groups <= 4 else "builtin"


def forward_nhwc(x: mx.array, weight: mx.array, bias: mx.array | None, p: Plan,
                 method: str | None = None) -> mx.array:
    return FORWARD[method or forward_method(x, p)](x, weight, bias, p)


def vjp_method(p: Plan) -> str:
    """Backward by shape class: ordinary convolutions ("conv") for groups == 1 and no dilation,
    the fastest measured; else autodiff of the decomposition, because MLX 0.32's CUDA convolution
    returns a wrong weight gradient for grouped convolutions with batch >= 2 and for the dilated
    convolution this backward would run (docs/performance-notes.md, "Known MLX defects")."""
    undilated = all(a.dilation == 1 for a in p.axes)
    return "conv" if p.groups == 1 and undilated else "decomposition"


def vjp_nhwc(x: mx.array, weight: mx.array, bias: mx.array | None, p: Plan, dy: mx.array,
             method: str | None = None) -> tuple[mx.array, ...]:
    """(dx, dw[, db]) by ``method``: "conv" (below), or MLX autodiff of "decomposition" / "builtin"
    (the latter wrong with output_padding: MLX 0.32's conv_transpose vjp misshapes dx)."""
    method = method or vjp_method(p)
    if method != "conv":
        fn = FORWARD[method]
        primals = [x, weight] + ([] if bias is None else [bias])
        _, grads = mx.vjp(lambda *a: fn(a[0], a[1], a[2] if len(a) > 2 else None, p), primals, [dy])
        return tuple(grads)
    return _conv_vjp(x, weight, bias, p, dy)


def _conv_vjp(x: mx.array, weight: mx.array, bias: mx.array | None, p: Plan,
              dy: mx.array) -> tuple[mx.array, ...]:
    """Gradients through ordinary convolutions (cuDNN / MPS on GPU).

    A transposed convolution is the input-adjoint of the convolution ``c(z, w2)`` with the same
    stride/padding/dilation/groups, where ``w2`` is the weight with its channel roles swapped. So
    ``dx = c(dy, w2)``, and ``dw2`` is the weight-vjp of that same call with cotangent ``x``:
    one ``mx.vjp`` returns both.
    """
    ah, aw = p.axes
    g = p.groups
    c_out, kh_n, kw_n, cig = weight.shape
    cog = c_out // g
    w2 = weight.reshape(g, cog, kh_n, kw_n, cig).transpose(0, 4, 2, 3, 1).reshape(p.c_in, kh_n, kw_n, cog)

    def conv(w2_: mx.array) -> mx.array:
        z = mx.conv_general(dy, w2_, stride=(ah.stride, aw.stride), padding=(ah.padding, aw.padding),
                            kernel_dilation=(ah.dilation, aw.dilation), groups=g)
        return z[:, :ah.size, :aw.size]  # output_padding >= stride yields one extra row

    (dx,), (dw2,) = mx.vjp(conv, [w2], [x])
    dw = dw2.reshape(g, cig, kh_n, kw_n, cog).transpose(0, 4, 2, 3, 1).reshape(c_out, kh_n, kw_n, cig)
    grads = (dx.astype(x.dtype), dw.astype(weight.dtype))
    if bias is not None:
        grads += (dy.astype(mx.float32).sum(axis=(0, 1, 2)).astype(bias.dtype),)
    return grads


def _vjp(nd: int, primals: list, cotangent: Any, outputs: Any, *, bias: mx.array | None = None,
         stride: IntOrTuple = 1, padding: IntOrTuple = 0, output_padding: IntOrTuple = 0,
         dilation: IntOrTuple = 1, groups: int = 1) -> tuple:
    """Backward for the kernel path; one cotangent per array among the positional arguments."""
    x, weight, *rest = primals
    bias = rest[0] if rest and rest[0] is not None else bias
    dy = cotangent[0] if isinstance(cotangent, (list, tuple)) else cotangent
    p = plan(x, weight, bias, nd, stride, padding, output_padding, dilation, groups)
    x2, w2, p2 = as_2d(x, weight, p)
    grads = vjp_nhwc(x2, w2, bias, p2, dy[:, None] if nd == 1 else dy)
    if nd == 1:
        grads = (grads[0][:, 0], grads[1][:, 0], *grads[2:])
    return tuple(g for g, a in zip(grads, primals) if isinstance(a, mx.array))


def conv_transpose2d(x, weight, bias=None, *, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    return _run(2, forward_nhwc, x, weight, bias, stride, padding, output_padding, dilation, groups)


def conv_transpose1d(x, weight, bias=None, *, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    return _run(1, forward_nhwc, x, weight, bias, stride, padding, output_padding, dilation, groups)


def conv_transpose2d_vjp(primals, cotangent, outputs, **params):
    return _vjp(2, primals, cotangent, outputs, **params)


def conv_transpose1d_vjp(primals, cotangent, outputs, **params):
    return _vjp(1, primals, cotangent, outputs, **params)
