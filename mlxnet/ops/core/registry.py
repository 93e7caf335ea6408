"""The one registry of ops, and the dispatcher that picks one of an op's three faces per call.

Every op has three named faces:

- the **definition** (required): a plain MLX composition, the op's specification. It runs
  anywhere, MLX differentiates it, and every other face is tested against it;
- a **CPU fast path** (optional, ``cpu``): what runs on the CPU instead, where MLX's own CPU
  ops are slow (GEMM formulations, an arithmetic-only exp, mlxnet's C++ primitives);
- a **GPU kernel** (optional, ``kernel``): a portable custom kernel from ``custom_kernels/``
  (listed in ``sources``), run wrapped in ``mx.custom_function`` so gradients flow (through the
  op's backward kernel when it has one, else through MLX autodiff of the definition); or, where
  measured faster, MLX's own fused op or the definition compiled (``FUSED``), run as they are.

Before any face runs, the dispatcher gives the call to the op's ``check`` (argument
validation and canonical spelling, in one place, so every face refuses exactly what the
definition refuses), adds the batch axis to an unbatched sample (``batched``), and sends
calls with an empty input to the definition under a guard (``_empty_safe``) so no empty
array reaches a fast face or MLX's gradients of empty arrays. Then it reads the live back
end and picks the fast face for it, if the op has one. ``MLXNET_KERNELS=0`` or
``with mlxnet.use_kernels(False)`` turns every fast face off: each op runs its definition
(what ``mlxnet check`` compares against).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import mlx.core as mx

from ...device import backend, kernels_enabled
from ...errors import MlxnetError
from .kernel_source import PortableKernel

OpFn = Callable[..., Any]


@dataclass
class Op:
    name: str
    definition: OpFn
    cpu: OpFn | None = None
    kernel: OpFn | None = None
    # vjp(primals, cotangents, outputs, **params) -> tuple of input cotangents; runs on GPU.
    kernel_vjp: OpFn | None = None
    sources: tuple[PortableKernel, ...] = ()
    # Returns (args, kwargs) of a small call; used by tests and `mlxnet ops` checks.
    example: Callable[[], tuple[tuple, dict]] | None = None
    # Calls at the sizes that change a kernel's generated signature or launch: every input
    # under 8 elements, 0-d where the op takes it, empty (must not launch).
    edge_examples: Callable[[], list[tuple[tuple, dict]]] | None = None
    # check(*args, **params) -> (args, params) or (args, params, finish): validates a call and
    # rewrites it to the one spelling the faces take; ``finish`` maps the faces' output back.
    check: OpFn | None = None
    # Rank of the first (batched) input; where it has one axis less it is one sample, as
    # PyTorch's unbatched inputs: the first ``per_sample`` array inputs get a batch axis of 1.
    batched: int | None = None
    per_sample: int = 1
    dispatch: OpFn = field(init=False, repr=False)

    @property
    def has_kernel(self) -> bool:
        return self.kernel is not None

    def uses_kernel(self) -> bool:
        return self.kernel is not None and kernels_enabled() and backend() != "cpu"

    def face(self) -> str:
        """Which face a call made now runs: 'kernel', 'cpu' or 'definition'."""
        if self.uses_kernel():
            return "kernel"
        if self.cpu is not None and kernels_enabled() and backend() == "cpu":
            return "cpu"
        return "definition"


REGISTRY: dict[str, Op] = {}

# ``kernel_vjp=DEFINITION_VJP``: the kernel's forward with the gradient of the definition (for a
# built-in whose own gradient is wrong on some back end).
DEFINITION_VJP: OpFn = object()  # type: ignore[assignment]

# ``kernel=FUSED``: the GPU face is the definition under ``mx.compile``, one fused kernel for an
# elementwise definition, which a compiled model forward fuses further with its neighbours.
FUSED: OpFn = object()  # type: ignore[assignment]


def _as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _split(args: tuple) -> tuple[list[int], list[mx.array]]:
    positions = [i for i, a in enumerate(args) if isinstance(a, mx.array)]
    return positions, [args[i] for i in positions]


def _custom_call(args: tuple, forward: Callable[[list], Any],
                 backward: Callable[[list, Any, Any], tuple]) -> Any:
    """``forward(full_args)`` under mx.custom_function over the array positional arguments, with
    ``backward(full_primals, cotangents, outputs)`` as its VJP."""
    positions, arrays = _split(args)

    def rebuild(xs: tuple) -> list:
        full = list(args)
        for i, x in zip(positions, xs):
            full[i] = x
        return full

    @mx.custom_function
    def call(*xs: mx.array) -> Any:
        return forward(rebuild(xs))

    @call.vjp
    def vjp(primals: tuple, cotangents: Any, outputs: Any) -> tuple:
        # MLX passes a lone input bare, not as a 1-tuple
        return backward(rebuild(_as_tuple(primals)), cotangents, outputs)

    return call(*arrays)


def _definition_vjp(op: Op, full: list, cotangents: Any, params: dict) -> tuple:
    positions, primals = _split(tuple(full))

    def f(*xs: mx.array) -> list:
        args = list(full)
        for i, x in zip(positions, xs):
            args[i] = x
        return list(_as_tuple(op.definition(*args, **params)))
    return tuple(mx.vjp(f, primals, list(_as_tuple(cotangents)))[1])


def _differentiable_kernel_call(op: Op, args: tuple, params: dict) -> Any:
    """Run op.kernel under mx.custom_function: gradients through the op's backward kernel, else
    through autodiff of the definition."""
    def backward(full: list, cotangents: Any, outputs: Any) -> tuple:
        if op.kernel_vjp is not None and op.kernel_vjp is not DEFINITION_VJP:
            return _as_tuple(op.kernel_vjp(full, cotangents, outputs, **params))
        return _definition_vjp(op, full, cotangents, params)

    return _custom_call(args, lambda full: op.kernel(*full, **params), backward)


def _is_empty(args: tuple) -> bool:
    return any(isinstance(a, mx.array) and a.size == 0 for a in args)


def _empty_safe(op: Op, args: tuple, params: dict) -> Any:
    """The definition, for a call with an empty input. Where every output is empty too, the
    gradient of every input is zero (MLX's own VJPs of some ops on empty arrays crash or hang:
    docs/performance-notes.md, "Known MLX defects"); otherwise autodiff of the definition."""
    def forward(full: list) -> Any:
        out = op.definition(*full, **params)
        # An empty output is made, not computed: its graph is built for the shape only and
        # never evaluated (MLX's CUDA back end crashes on some ops of empty arrays).
        if isinstance(out, (tuple, list)):
            return type(out)(mx.zeros(o.shape, o.dtype) if o.size == 0 else o for o in out)
        return mx.zeros(out.shape, out.dtype) if out.size == 0 else out

    def backward(full: list, cotangents: Any, outputs: Any) -> tuple:
        if all(o.size == 0 for o in _as_tuple(outputs)):
            return tuple(mx.zeros_like(a) for a in full if isinstance(a, mx.array))
        return _definition_vjp(op, full, cotangents, params)

    return _custom_call(args, forward, backward)


def _one_sample(op: Op, args: tuple, params: dict) -> Any:
    """An unbatched call: a batch of one through the op, the batch axis removed again."""
    batched = list(args)
    seen = 0
    for i, a in enumerate(args):
        if isinstance(a, mx.array) and seen < op.per_sample:
            batched[i], seen = a[None], seen + 1
    out = op.dispatch(*batched, **params)
    return tuple(o[0] for o in out) if isinstance(out, (tuple, list)) else out[0]


def _call(op: Op, args: tuple, params: dict) -> Any:
    finish = None
    if op.check is not None:
        args, params, *rest = op.check(*args, **params)
        finish = rest[0] if rest else None
    if _is_empty(args):
        out = _empty_safe(op, args, params)
    else:
        out = _run_face(op, args, params)
    return out if finish is None else finish(out)


def _run_face(op: Op, args: tuple, params: dict) -> Any:
    face = op.face()
    if face == "kernel":
        if not op.sources and op.kernel_vjp is None:
            # MLX's own ops differentiate as they are; a custom_function around them
            # would also end every fusion at the op's boundary.
            return op.kernel(*args, **params)  # type: ignore[misc]
        return _differentiable_kernel_call(op, args, params)
    if face == "cpu":
        return op.cpu(*args, **params)  # type: ignore[misc]
    return op.definition(*args, **params)


def register(
    name: str,
    *,
    cpu: OpFn | None = None,
    kernel: OpFn | None = None,
    kernel_vjp: OpFn | None = None,
    sources: tuple[PortableKernel, ...] = (),
    example: Callable[[], tuple[tuple, dict]] | None = None,
    edge_examples: Callable[[], list[tuple[tuple, dict]]] | None = None,
    check: OpFn | None = None,
    batched: int | None = None,
    per_sample: int = 1,
) -> Callable[[OpFn], OpFn]:
    """Decorate an op's definition; returns the public, dispatching function.

    Positional arguments that are arrays are differentiable inputs; everything else
    (keyword parameters, None, ints) is static.
    """

    def decorate(definition: OpFn) -> OpFn:
        if name in REGISTRY:
            raise MlxnetError(f"op {name!r} is registered twice")
        gpu = mx.compile(definition) if kernel is FUSED else kernel
        op = Op(name, definition, cpu, gpu, kernel_vjp, sources, example, edge_examples,
                check, batched, per_sample)

        @functools.wraps(definition)
        def dispatch(*args: Any, **params: Any) -> Any:
            first = next((a for a in args if isinstance(a, mx.array)), None)
            if op.batched is not None and first is not None and first.ndim == op.batched - 1:
                return _one_sample(op, args, params)
            return _call(op, args, params)

        dispatch.op = op  # type: ignore[attr-defined]
        op.dispatch = dispatch
        REGISTRY[name] = op
        return dispatch

    return decorate


def get(name: str) -> Op:
    try:
        return REGISTRY[name]
    except KeyError:
        raise MlxnetError(f"unknown op {name!r}; registered: {', '.join(sorted(REGISTRY))}") from None
