"""GPU side of the transposed convolutions: the gather kernel, the backward, the dispatch rule."""
from __future__ import annotations

import mlx.core as mx

from .conv_transpose_ref import Plan, decomposed_nhwc
from .kernel_source import PortableKernel

GATHER = PortableKernel("conv_transpose.kern", "conv_transpose2d_gather",
                        ["x", "wt", "bias", "p"], ["out"])
PIX = 4  # output pixels per thread (along W, one stride phase)


def gather_nhwc(x: mx.array, weight: mx.array, bias: mx.array | None, p: Plan) -> mx.array:
    """The portable gather kernel on 4-D NHWC input (plan from conv_transpose_ref.plan)."""
    ah, aw = p.axes
    n = x.shape[0]
    kh_n, kw_n = weight.shape[1:3]
    # (KH, KW, C_in/groups, C_out): consecutive threads (output channels) read consecutive weights.
    wt = weight.astype(x.dtype).transpose(1, 2, 3, 0)
    has_bias = bias is not None
    b = bias.astype(x.dtype) if has_bias else mx.zeros((1,), x.dtype)
    nbw = -(-aw.out // (aw.stride * PIX))
    total = n * ah.out * nbw * aw.stride * p.c_out
    params = mx.array([ah.size, aw.size, p.c_in, ah.out, aw.out, p.c_out, ah.padding, aw.padding,
                       p.c_in // p.groups, p.c_out // p.groups, nbw, total], mx.int32)
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
    """Fastest forward per shape class, measured on an H100 (scripts/bench_conv_transpose.py --gpu,
    float32, ms per call: gather / decomposition / built-in):

    - few input channels per group: the gather kernel. Grouped 8×32×32×128→128 k4 s2 g32 (4 per
      group): 0.137 / 1.007 / 0.488; depthwise 8×64×64×128 k4 s2: 0.217 / 1.244 / 0.555.
    - otherwise MLX's built-in (cuDNN): LaMa 1×64×64×512→256 k3 s2: 1.070 / 0.608 / 0.122;
      SAM 16×56×56×64→64 k2 s2: 0.305 / 0.203 / 0.191; 8 channels dense 8×64×64×8→8 k3 s2:
      0.110 / 0.608 / 0.097; grouped with 16 per group (g4): 0.133 / 0.660 / 0.110.
    The decomposition (the CPU reference) never wins on the GPU.
    """
    ah, aw = p.axes
    if x.shape[0] * ah.out * aw.out * p.c_out >= 2**31 - 2**24:  # the kernel indexes with int32
        return "builtin"
    return "gather" if p.c_in // p.groups <= 4 else "builtin"


def forward_nhwc(x: mx.array, weight: mx.array, bias: mx.array | None, p: Plan,
                 method: str | None = None) -> mx.array:
    return FORWARD[method or forward_method(x, p)](x, weight, bias, p)


def vjp_method(p: Plan) -> str:
    """Fastest backward per shape class (same bench, ms for dx+dw+db: conv / autodiff of the
    decomposition / autodiff of the built-in):

    - more than 4 input channels per group: "conv". LaMa 1×128×128×256→128 k3 s2: 0.282 / 1.200 /
      2.213; DCGAN 16×32×32×128→64 k4 s2: 0.296 / 2.532 / 6.560; SAM 16×56×56×64 k2 s2: 0.360 /
      0.366 / 1.459.
    - one input channel per group (depthwise): "decomposition", 8×64×64×128 k4 s2: 11.2 / 3.5 / 4.9
      (cuDNN's grouped weight gradient is slow).
    - 2 to 4 per group: "builtin", g32 8×32×32×128 k4 s2: 1.474 / 2.585 / 1.217; but never with
      output_padding, where MLX 0.32's own conv_transpose vjp returns a wrongly shaped dx.
    """
    per_group = p.c_in // p.groups
    if per_group > 4:
        return "conv"
    if per_group == 1:
        return "decomposition"
    return "builtin" if all(a.output_padding == 0 for a in p.axes) else "conv"


def vjp_nhwc(x: mx.array, weight: mx.array, bias: mx.array | None, p: Plan, dy: mx.array,
             method: str | None = None) -> tuple[mx.array, ...]:
    """(dx, dw[, db]) by ``method``: "conv" (below), or MLX autodiff of "decomposition" / "builtin"."""
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
