"""mlxnet: neural networks on Apple's MLX, every op on every back end.

Importing mlxnet binds an optimised BLAS on Linux (before ``mlx.core`` loads), keeps freed
memory for reuse on glibc (:mod:`mlxnet._malloc`), lets MLX's CPU JIT use this machine's
vector units (:mod:`mlxnet._jit`), builds its CPU primitives on first use
(:mod:`mlxnet._native`) and picks the process's one default device
(:mod:`mlxnet.device`).
"""
from . import _blas, _jit, _malloc, _native

_blas.bind()
_malloc.configure()
_jit.configure()

from .device import (  # noqa: E402  (after the BLAS binding, by design)
    available_devices,
    backend,
    current_device,
    kernels_enabled,
    use_device,
    use_kernels,
)
from .device import _choose_at_import  # noqa: E402
from .errors import MlxnetError  # noqa: E402

_choose_at_import()

from . import nn, ops  # noqa: E402

__version__ = "0.1.0"
blas_info = _blas.blas_info
malloc_info = _malloc.malloc_info
jit_info = _jit.jit_info
native_info = _native.native_info

__all__ = [
    "MlxnetError", "available_devices", "backend", "blas_info", "current_device",
    "jit_info", "kernels_enabled", "malloc_info", "native_info", "nn", "ops", "use_device", "use_kernels", "__version__",
]
