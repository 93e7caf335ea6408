"""Back-end and precision parity, layer by layer, down to the first diverging layer.

``compare(model, inputs, against=..., dtype=...)`` runs one ``mlx.nn.Module`` twice on the
same inputs — a *baseline* configuration (every op's definition, on the CPU or on this
device, in float32) and the configuration under test (this device with its fast faces: CPU
fast paths or GPU kernels, optionally in float16/bfloat16) — capturing every submodule's
output by module path. Each layer gets the
max abs error, max relative error (to the baseline's largest magnitude), cosine similarity
and flags for all-zero, constant, NaN or Inf output; the report names the FIRST layer, in
execution order, beyond tolerance: where a bug is born, not where it shows.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Literal, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from .device import backend, compile_enabled, use_compile, use_device, use_kernels
from .dtypes import FLOAT_DTYPES
from .errors import MlxnetError

Against = Literal["cpu", "definitions"]
DTYPES = FLOAT_DTYPES
# Max relative error (to the baseline's largest magnitude) and min cosine similarity per dtype.
TOLERANCE = {"float32": (1e-3, 0.9999), "float16": (3e-2, 0.999), "bfloat16": (1e-1, 0.99),
             # MLX's CUDA back end runs float32 GEMMs and convolutions as TF32 (float16's mantissa).
             "tf32": (3e-2, 0.999)}


@dataclass
class LayerReport:
    path: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float
    cosine: float
    flags: list[str] = field(default_factory=list)
    ok: bool = True


@dataclass
class CheckReport:
    baseline: str
    tested: str
    dtype: str
    layers: list[LayerReport]
    first_failure: str | None

    @property
    def passed(self) -> bool:
        return self.first_failure is None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["passed"] = self.passed
        return d


@contextmanager
def capture(model: nn.Module) -> Iterator[list[tuple[str, mx.array]]]:
    """Record (module path, output) for every submodule call, in completion order.

    Python looks ``__call__`` up on the type, so each module's class is swapped for a
    recording subclass for the duration, then restored.
    """
    records: list[tuple[str, mx.array]] = []
    swapped: list[tuple[nn.Module, type]] = []
    for path, module in model.named_modules():
        cls = type(module)

        def recorder(self, *args, __cls=cls, __path=path or "<output>", **kwargs):
            out = __cls.__call__(self, *args, **kwargs)
            for suffix, leaf in tree_flatten(out):
                if isinstance(leaf, mx.array):
                    records.append((__path + (f"[{suffix}]" if suffix else ""), leaf))
            return out

        module.__class__ = type(cls.__name__, (cls,), {"__call__": recorder})
        swapped.append((module, cls))
    try:
        yield records
    finally:
        for module, cls in swapped:
            module.__class__ = cls


def calibrate(model: nn.Module, inputs: Sequence[Any]) -> nn.Module:
    """Set every BatchNorm's running statistics to those of its input on ``inputs``, as training
    would have: each normalisation then gives zero-mean, unit-variance channels, so random
    weights keep activations at their scale through any depth (residual sums included) and a
    layer-by-layer check in float16 compares real values. One forward pass in training mode
    with the statistics' momentum at one; the model is left in eval mode."""
    norms = [m for _, m in model.named_modules() if isinstance(m, nn.BatchNorm)]
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.momentum = 1.0
    model.train()
    try:
        mx.eval(model(*inputs))
    finally:
        model.eval()
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
    mx.eval(model.parameters())
    return model


def _cast_inputs(inputs: Sequence[Any], dtype: mx.Dtype) -> list[Any]:
    return [x.astype(dtype) if isinstance(x, mx.array) and mx.issubdtype(x.dtype, mx.floating) else x
            for x in inputs]


_COMPILED = "<compiled output>"


def _run(model: nn.Module, inputs: Sequence[Any], dtype: mx.Dtype, compiled: bool = False) -> dict[str, np.ndarray]:
    """Every layer's output, run eagerly (compiled, intermediate values do not exist); with
    ``compiled`` also the whole forward as users run it by default, as ``<compiled output>``."""
    saved = tree_flatten(model.parameters())
    try:
        if dtype != mx.float32:
            model.set_dtype(dtype)
        with use_compile(False), capture(model) as records:
            model(*_cast_inputs(inputs, dtype))
            mx.eval([r for _, r in records])
        if compiled:
            with use_compile(True):
                out = model(*_cast_inputs(inputs, dtype))
            records += [(_COMPILED + (f"[{k}]" if k else ""), v) for k, v in tree_flatten(out)
                        if isinstance(v, mx.array)]
    finally:
        model.update(tree_unflatten(saved))
    out: dict[str, np.ndarray] = {}
    for path, value in records:
        key, n = path, 1
        while key in out:  # a module called more than once
            n += 1
            key = f"{path}#{n}"
        out[key] = np.array(value.astype(mx.float32)) if mx.issubdtype(value.dtype, mx.floating) \
            else np.array(value)
    return out


def _flags(y: np.ndarray) -> list[str]:
    flags = []
    if np.isnan(y).any():
        flags.append("NaN")
    if np.isinf(y).any():
        flags.append("Inf")
    finite = y[np.isfinite(y)]
    if y.size and finite.size == y.size:
        if not finite.any():
            flags.append("all-zero")
        elif y.size > 1 and finite.max() == finite.min():
            flags.append("constant")
    return flags


def compare_outputs(base: dict[str, np.ndarray], test: dict[str, np.ndarray], dtype: str) -> list[LayerReport]:
    """Per-layer errors; ``dtype`` names the tolerance row (a dtype, or "tf32")."""
    max_rel_tol, min_cos = TOLERANCE[dtype]
    reports = []
    for path, ref in base.items():
        if path not in test:
            reports.append(LayerReport(path, ref.shape, float("inf"), float("inf"), 0.0, ["missing"], False))
            continue
        y = test[path]
        if y.shape != ref.shape:
            reports.append(LayerReport(path, ref.shape, float("inf"), float("inf"), 0.0,
                                       [f"shape {y.shape} != {ref.shape}"], False))
            continue
        if not np.issubdtype(ref.dtype, np.floating):
            same = bool(np.array_equal(ref, y))
            reports.append(LayerReport(path, ref.shape, 0.0 if same else float("inf"),
                                       0.0 if same else float("inf"), 1.0 if same else 0.0, [], same))
            continue
        r, t = ref.astype(np.float64).ravel(), y.astype(np.float64).ravel()
        with np.errstate(invalid="ignore", over="ignore"):
            max_abs = float(np.max(np.abs(r - t))) if r.size else 0.0
            scale = float(np.max(np.abs(r))) if r.size else 0.0
            max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
            denom = np.linalg.norm(r) * np.linalg.norm(t)
            cosine = float(r @ t / denom) if denom > 0 else (1.0 if max_abs == 0 else 0.0)
        flags = _flags(y)
        # Flags only fail a layer where the baseline itself is healthy (ReLU can be all-zero).
        bad_flags = [f for f in flags if f not in _flags(ref)]
        ok = (np.isfinite(max_rel) and max_rel <= max_rel_tol and (cosine >= min_cos or max_rel <= max_rel_tol / 10)
              and not bad_flags)
        reports.append(LayerReport(path, ref.shape, max_abs, max_rel, cosine, flags, bool(ok)))
    return reports


def compare(model: nn.Module, inputs: Sequence[Any], against: Against = "cpu",
            dtype: str = "float32") -> CheckReport:
    """Baseline = float32 definitions (on the CPU, or on this device); tested = this device,
    its fast paths and kernels on, in ``dtype``. The model is left as it was."""
    if dtype not in DTYPES:
        raise MlxnetError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    if against not in ("cpu", "definitions"):
        raise MlxnetError(f"unknown baseline {against!r}; expected 'cpu' or 'definitions'")
    device = backend()
    with ExitStack() as stack:
        if against == "cpu":
            stack.enter_context(use_device("cpu"))
        stack.enter_context(use_kernels(False))
        base = _run(model, inputs, mx.float32)
    with use_kernels(True):
        compiled = compile_enabled()  # the default path on this device: check it too
        test = _run(model, inputs, DTYPES[dtype], compiled)
    if compiled:  # the compiled forward must give what the eager baseline gives
        base.update({key.replace("<output>", _COMPILED, 1): v for key, v in base.items() if key.startswith("<output>")})
    layers = compare_outputs(base, test, "tf32" if dtype == "float32" and device == "cuda" else dtype)
    first = next((l.path for l in layers if not l.ok), None)
    baseline = "cpu definitions" if against == "cpu" else f"{device} definitions"
    tested = f"{device} {'kernels' if device != 'cpu' else 'fast paths'}, {dtype}"
    return CheckReport(baseline + ", float32", tested, dtype, layers, first)
