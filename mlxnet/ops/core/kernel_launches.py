"""Every kernel launch the ops can ask for, recorded without running: what the compile
checks render (Metal, by MLX's own code generator) and run (CUDA, Metal) to prove that every
kernel, dtype and input-size class compiles on every back end."""
from __future__ import annotations

from typing import Any, Iterable

import mlx.core as mx

from ... import dtypes
from .kernel_source import Launch, record_launches
from .registry import REGISTRY, Op

FLOAT_DTYPES = tuple(dtypes.FLOAT_DTYPES.values())


def _as_dtype(args: tuple, dtype: mx.Dtype) -> tuple:
    return tuple(a.astype(dtype) if isinstance(a, mx.array) and mx.issubdtype(a.dtype, mx.floating)
                 else a for a in args)


def _as_list(out: Any) -> list[mx.array]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def op_cases(op: Op) -> list[tuple[tuple, dict]]:
    """The op's example call and its edge-size calls."""
    cases = [op.example()] if op.example is not None else []
    return cases + (op.edge_examples() if op.edge_examples is not None else [])


def op_launches(op: Op, args: tuple, kwargs: dict) -> list[Launch]:
    """The launches of one call's GPU path, forward and (where the op has one) backward."""
    with record_launches() as launches:
        outputs = _as_list(op.kernel(*args, **kwargs))
        if op.kernel_vjp is not None:
            op.kernel_vjp(list(args), [mx.ones_like(o) for o in outputs], outputs, **kwargs)
    return launches


def every_launch(dtypes: Iterable[mx.Dtype] = FLOAT_DTYPES) -> list[tuple[str, Launch]]:
    """(op name, launch) for every op with a kernel, every case and every float dtype."""
    found = []
    for name, op in sorted(REGISTRY.items()):
        if not op.sources:
            continue
        for dtype in dtypes:
            for args, kwargs in op_cases(op):
                found += [(name, launch) for launch in op_launches(op, _as_dtype(args, dtype), kwargs)]
    return found
