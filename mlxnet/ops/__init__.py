"""mlxnet's ops: one registry; each op has a definition, and optionally a CPU fast path and a
GPU kernel (see :mod:`.core.registry`).

Import an op from here (``from mlxnet.ops import layer_norm``); the dispatcher picks the face
from the device in force when it runs.

Layout: ``core/`` is the machinery every op shares (registry and dispatcher, argument helpers,
the portable-kernel loader and launcher); every other package is one family of ops. A family
registers its ops in ``__init__.py`` and keeps each face in the file named after it:
``definition.py``, plus ``cpu.py``, ``kernel.py`` (with the kernel's backward) and ``check.py``
where its ops have that face; what faces share gets a file named for it (``pooling/geometry.py``).
A new op goes into its family's package (or a new one of that shape), its kernel into ``custom_kernels/``.
"""
from .core.registry import REGISTRY, Op, get, register
from .norm import batch_norm_train, layer_norm
from .conv import conv2d, depthwise_conv2d, pointwise_conv_of_concat
from .activations import bias_act, gelu, sigmoid, silu, softmax
from .attention import scaled_dot_product_attention
from .nms import nms, nms_many
from .dfl_decode import dfl_decode
from . import fft  # noqa: E402  (NHWC rfft2 / irfft2)
from . import pooling  # noqa: E402  (registers the pooling ops)
from .pooling import *  # noqa: F401,F403
from .conv_transpose import conv_transpose1d, conv_transpose2d
from .pad import bias_act_pad2d, pad2d
from .window import window_merge, window_partition

__all__ = ["REGISTRY", "Op", "get", "register", "layer_norm", "batch_norm_train", "conv2d", "depthwise_conv2d", "pointwise_conv_of_concat", "nms", "nms_many", "dfl_decode", "bias_act", "gelu", "sigmoid", "silu", "scaled_dot_product_attention", "softmax",
           "conv_transpose1d", "conv_transpose2d", "bias_act_pad2d", "pad2d", "window_partition", "window_merge"]
__all__ += pooling.__all__
