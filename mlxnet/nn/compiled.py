"""Inference forwards under ``mx.compile``, by default where it pays (GPU back ends).

Run op by op, a forward pays per call for building its graph and for one kernel launch per op,
and the elementwise tails of convs and matmuls (bias, BatchNorm, activation, residual add)
each make their own pass over memory. Under ``mx.compile`` the graph is traced once per input
shape and dtype, and each elementwise chain becomes one fused kernel.

:func:`compiled_for_inference` decorates a model's ``__call__``: in eval mode, while
:func:`mlxnet.compile_enabled` says so, the call runs compiled; in training mode, or with
``MLXNET_COMPILE=0`` / ``with mlxnet.use_compile(False)``, it runs eagerly (the same code).
The module's arrays are inputs of the compiled function, read at every call, so loading new
weights or changing their dtype takes effect at once; a new input shape traces the forward
again (each shape once). Python attributes read by the forward (flags, sizes) are taken as
they were when a shape was first traced: after changing one, call :func:`recompile`.

A long forward compiled as one function is one graph that the host must build in full before
the device runs its first kernel. Models with many blocks (LaMa, SAM's TinyViT, YOLOv8 on large
batches) therefore compile stages (a method decorated here with the submodules it ``reads``,
called with the stage's bounds) and pass each stage's output through :func:`handoff`, which
starts it on the device while the host builds the next.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Sequence, TypeVar

import mlx.core as mx
import mlx.nn as nn

from ..device import backend, compile_enabled, kernels_enabled, tracing

Call = TypeVar("Call", bound=Callable[..., Any])
_CACHE = "_mlxnet_compiled_calls"  # an instance attribute, not a dict entry: not in the state


def compiled_for_inference(call: Call | None = None, *,
                           reads: Callable[..., Sequence[nn.Module]] | None = None) -> Any:
    """Decorate a module's ``__call__`` (or a stage method) so that its eval-mode forward runs
    compiled.

    The compiled function's inputs are the module's arrays, gathered at every call: for a whole
    model that is all of them (``self``). A stage reads only part of the model; with
    ``reads(self, *bounds)`` naming the submodules it reads, only their arrays are gathered, so
    the stage reaches the device sooner. The stage method is then called as ``method(x,
    *bounds)``, with hashable bounds (layer indices, say): each set of bounds is its own
    compiled function."""
    if call is None:
        return lambda c: compiled_for_inference(c, reads=reads)

    @functools.wraps(call)
    def run(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if self.training or not compile_enabled():
            return call(self, *args, **kwargs)
        bounds = tuple(args[1:]) if reads is not None else ()
        # Ops pick their face (kernel or definition) and device path while tracing.
        key = (call.__qualname__, kernels_enabled(), backend(), bounds)
        calls = self.__dict__.setdefault(_CACHE, {})
        if key not in calls:
            def traced(*a: Any, **k: Any) -> Any:  # runs only while mx.compile traces
                with tracing():
                    return call(self, *a, **k)
            inputs = [self] if reads is None else [list(reads(self, *bounds))]
            calls[key] = mx.compile(traced, inputs=inputs)
        return calls[key](*args, **kwargs)
    return run


def handoff(outputs: Any) -> Any:
    """Start computing ``outputs`` now (``mx.async_eval``) and return them unchanged, so that the
    host builds the next stage of a forward while the device runs this one. Inside a graph
    transformation (``mx.compile``, ``vmap``, ``grad``), where nothing may be evaluated, it
    leaves them lazy: the stages then join the enclosing graph as before."""
    return _unless_transforming(mx.async_eval, outputs)


def evaluated(outputs: Any) -> Any:
    """``outputs`` computed now (``mx.eval``) and returned, before the next stage is built: one
    stage's buffers are freed before the next one's are allocated, which :func:`handoff`'s
    overlap would hold together (for stages whose buffers are large). Lazy inside a graph
    transformation, as with :func:`handoff`."""
    return _unless_transforming(mx.eval, outputs)


def _unless_transforming(evaluate: Callable[[Any], Any], outputs: Any) -> Any:
    try:
        evaluate(outputs)
    except ValueError:  # MLX: "[eval] / [async_eval] ... not allowed inside a graph transformation"
        pass
    return outputs


def recompile(module: nn.Module) -> nn.Module:
    """Drop the compiled forwards of ``module`` and its submodules (they trace again on the next
    call): after a change to a Python attribute the forward reads."""
    for _, child in module.named_modules():
        child.__dict__.pop(_CACHE, None)
    return module
