"""mlxnet's ops: one registry; each op has a definition, and optionally a CPU fast path and a
GPU kernel (see :mod:`.registry`).

Import an op from here (``from mlxnet.ops import layer_norm``); the dispatcher picks the face
from the device in force when it runs.
"""
from .registry import REGISTRY, Op, get, register
from .norm import layer_norm
from .conv import conv2d, pointwise_conv_of_concat
from .activations import gelu, sigmoid, silu
from .attention import scaled_dot_product_attention, softmax
from .nms import nms
from .dfl_decode import dfl_decode
from . import fft  # noqa: E402  (NHWC rfft2 / irfft2)
from . import pooling  # noqa: E402  (registers the pooling ops)
from .pooling import *  # noqa: F401,F403
from .conv_transpose import conv_transpose1d, conv_transpose2d
from .pad import pad2d

__all__ = ["REGISTRY", "Op", "get", "register", "layer_norm", "conv2d", "pointwise_conv_of_concat", "nms", "dfl_decode", "gelu", "sigmoid", "silu", "scaled_dot_product_attention", "softmax",
           "conv_transpose1d", "conv_transpose2d", "pad2d"]
__all__ += pooling.__all__
__all__ += ["conv_transpose1d", "conv_transpose2d"]
