"""The GPU faces of gelu and softmax: MLX's own fused ops, measured fastest there (silu and
sigmoid register ``FUSED``: their definition compiled, see the registry); and bias_act's: one
portable kernel (custom_kernels/bias_act.kern). conv2d's GPU face sends it the epilogues of
small maps on CUDA, where the kernel is faster than MLX's fused one (see its MAX_EPILOGUE_ELEMENTS)."""
from __future__ import annotations

import mlx.core as mx

from ...dtypes import FLOATS
from ..core.kernel_source import PortableKernel, int_params
from . import definition

BIAS_ACT = PortableKernel("bias_act.kern", "bias_act", ["x", "bias", "p"], ["out"])
BIAS_ACT_RESIDUAL = PortableKernel("bias_act.kern", "bias_act_residual", ["x", "bias", "residual", "p"], ["out"])
GROUP = 256


def gelu(x: mx.array, *, approximate: str = "none") -> mx.array:
    return (_gelu_tanh_compiled if approximate == "tanh" else _gelu_erf_compiled)(x)


# The GPU face: each form's definition compiled, one fused kernel (see FUSED in the registry).
_gelu_erf_compiled = mx.compile(lambda x: definition.gelu(x))
_gelu_tanh_compiled = mx.compile(lambda x: definition.gelu(x, approximate="tanh"))


def softmax(x: mx.array, *, axis: int = -1) -> mx.array:
    return mx.softmax(x.astype(mx.float32), axis=axis).astype(x.dtype)


def bias_act(x: mx.array, bias: mx.array, residual: mx.array | None = None, *,
             activation: str | None = "relu") -> mx.array:
    arrays = [x, bias] if residual is None else [x, bias, residual]
    if x.dtype not in FLOATS or any(a.dtype != x.dtype for a in arrays) or x.size >= 2**31 - GROUP:
        return definition.bias_act(x, bias, residual, activation=activation)
    kernel = BIAS_ACT if residual is None else BIAS_ACT_RESIDUAL
    return kernel(arrays + [int_params((x.size, x.shape[-1]))], template=[("T", x.dtype), ("RELU", int(activation == "relu"))],
                  grid=(x.size, 1, 1), threadgroup=(GROUP, 1, 1), output_shapes=[x.shape],
                  output_dtypes=[x.dtype])[0]
