"""What image commands (and the app) run on CUDA when the user has not chosen: no GPU code compiled at run time.

MLX's CUDA back end compiles GPU code when a process first needs it: every ``mx.compile``-fused
kernel once per machine (kept in MLX's PTX cache, an empty one after a reboot or in a fresh
``TMPDIR``), and mlxnet's own kernels (``mx.fast.cuda_kernel``) again in every process, since MLX
keeps those only in memory. Seconds before the first result, for a forward only a few
milliseconds faster: a command on a folder of photos never wins them back, so it starts with
MLX's built-in ops, run eagerly. ``MLXNET_KERNELS`` and ``MLXNET_COMPILE``, when set, decide as
they do everywhere else (the figures are in docs/benchmarks.md, "Cold start").
"""
from __future__ import annotations

import contextlib
import os
from typing import ContextManager

import mlxnet


def runtime_compiling_off() -> ContextManager[None]:
    """Built-in ops, eager, on CUDA unless the user set MLXNET_KERNELS / MLXNET_COMPILE."""
    stack = contextlib.ExitStack()
    if mlxnet.backend() == "cuda":
        if "MLXNET_KERNELS" not in os.environ:
            stack.enter_context(mlxnet.use_kernels(False))
        if "MLXNET_COMPILE" not in os.environ:
            stack.enter_context(mlxnet.use_compile(False))
    return stack
