"""What image commands (and the app) run on CUDA when the user has not chosen: no GPU code compiled at run time.

MLX's CUDA back end compiles every ``mx.compile``-fused kernel when a machine first needs it
(kept in MLX's PTX cache, an empty one after a reboot or in a fresh ``TMPDIR``): seconds each
before the first result, for a forward only a few milliseconds faster. A command on a folder of
photos never wins them back, so it starts with MLX's built-in ops, run eagerly (mlxnet's own
kernels are compiled once per machine, :mod:`mlxnet.ops.core.cuda_build`, but were measured for
this choice when every process compiled them). ``MLXNET_KERNELS`` and ``MLXNET_COMPILE``, when
set, decide as they do everywhere else (the figures are in docs/benchmarks.md, "Cold start").
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
