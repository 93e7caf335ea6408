"""Small helpers shared by tests."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

TOLERANCE = {mx.float32: 1e-5, mx.float16: 2e-3, mx.bfloat16: 2e-2}


def to_numpy(x: mx.array) -> np.ndarray:
    return np.array(x.astype(mx.float32))


def assert_close(actual: mx.array, expected, dtype=mx.float32, scale: float = 1.0) -> None:
    """Relative-to-magnitude closeness; tolerance by dtype (fp32 tight, fp16/bf16 looser)."""
    a = to_numpy(actual)
    e = expected if isinstance(expected, np.ndarray) else to_numpy(expected)
    assert a.shape == e.shape, f"shape {a.shape} != {e.shape}"
    tol = TOLERANCE[dtype] * scale
    np.testing.assert_allclose(a, e, rtol=tol, atol=tol * max(1.0, float(np.abs(e).max(initial=0))))


def assert_agree(actual: Any, expected: Any, tol: float, what: str) -> None:
    """Same shape, NaN in the same places, the same infinities, finite values within ``tol``
    of the larger of 1 and the expected output's finite magnitude."""
    a = np.asarray(np.array(actual.astype(mx.float32)) if isinstance(actual, mx.array) else actual,
                   dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    nan = np.isnan(a) != np.isnan(e)
    assert not nan.any(), f"{what}: NaN differs at {np.argwhere(nan)[:4].tolist()}"
    inf = np.isinf(a) | np.isinf(e)
    assert (a[inf] == e[inf]).all(), f"{what}: infinities differ: {a[inf][:4]} vs {e[inf][:4]}"
    finite = np.isfinite(a) & np.isfinite(e)
    scale = max(1.0, float(np.abs(e[finite]).max(initial=0)))
    err = np.abs(a[finite] - e[finite])
    assert (err <= tol * scale).all(), f"{what}: max error {err.max():.3g} > {tol * scale:.3g}"


def save_ultralytics_pt(path: Path, state: dict[str, np.ndarray], *, yaml: dict | None = None,
                        names: dict[int, str] | None = None, extras: dict | None = None) -> Path:
    """A checkpoint laid out as ``yolo train`` leaves one: {"model": <the DetectionModel object,
    float16>, "ema": None, ...}, the model a pickled module tree whose class is
    ``ultralytics.nn.tasks.DetectionModel`` and which carries ``yaml`` and ``names``."""
    import sys
    import types

    import torch

    class DetectionModel(torch.nn.Module):
        pass

    DetectionModel.__module__, DetectionModel.__qualname__ = "ultralytics.nn.tasks", "DetectionModel"
    root = DetectionModel()
    for key, value in state.items():
        *parents, leaf = key.split(".")
        module = root
        for name in parents:
            if name not in module._modules:
                module.add_module(name, torch.nn.Module())
            module = module._modules[name]
        tensor = torch.from_numpy(value)
        if leaf.startswith("running_"):
            module.register_buffer(leaf, tensor)
        else:
            module.register_parameter(leaf, torch.nn.Parameter(tensor, requires_grad=False))
        if leaf == "running_var":
            module.register_buffer("num_batches_tracked", torch.tensor(0))
    if yaml is not None:
        root.yaml = yaml
    if names is not None:
        root.names = names
    # pickle finds a class through its module: stand-ins while saving, removed after
    fakes = {name: types.ModuleType(name) for name in ("ultralytics", "ultralytics.nn", "ultralytics.nn.tasks")
             if name not in sys.modules}
    if "ultralytics.nn.tasks" in fakes:
        fakes["ultralytics.nn.tasks"].DetectionModel = DetectionModel
    sys.modules.update(fakes)
    try:
        torch.save({"epoch": -1, "best_fitness": None, "model": root.half(), "ema": None, "updates": None,
                    "optimizer": None, "train_args": {"imgsz": 640}, **(extras or {})}, path)
    finally:
        for name in fakes:
            del sys.modules[name]
    return path


def golden_script(name: str):
    """scripts/goldens/NAME.py as a module (the scripts are files, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "scripts" / "goldens" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def overlapping_masks(rng: np.random.Generator, k: int, h: int, w: int, *, least: int, most: tuple[int, int],
                      fill: float) -> np.ndarray:
    """(k, h, w) bool: rectangles (at least ``least`` pixels a side, up to ``most`` (rows,
    columns) more) at random places, each with random holes (``fill`` of its pixels kept)."""
    dense = np.zeros((k, h, w), bool)
    for m in dense:
        y, x = rng.integers(0, [h - least, w - least])
        m[y:y + rng.integers(least, most[0]), x:x + rng.integers(least, most[1])] = True
        m &= rng.random((h, w)) < fill
    return dense
