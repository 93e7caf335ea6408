"""Timing and counting one forward: synchronised calls, alternation between libraries, peak
memory of one call, and the primitives (about one kernel launch each) a forward runs."""
from __future__ import annotations

import contextlib
import gc
import re
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Iterator

import mlx.core as mx
from mlx.utils import tree_flatten

import mlxnet

# Primitives that only describe a view of memory: no kernel runs for them.
VIEWS = {"Reshape", "Broadcast", "Slice", "Transpose", "AsStrided", "Squeeze", "ExpandDims",
         "Depends", "StopGradient", "Flatten", "Unflatten", "Split"}


def primitives(outputs: Any) -> int:
    """Primitives in the graph of ``outputs`` (unevaluated), views excluded: MLX launches about
    one kernel for each (a compiled, fused chain is one)."""
    leaves = [a for _, a in tree_flatten(outputs) if isinstance(a, mx.array)]
    with tempfile.NamedTemporaryFile("r", suffix=".dot") as f:
        mx.export_to_dot(f.name, *leaves)
        labels = re.findall(r'label ="([A-Za-z0-9_]+)"', f.read())
    return sum(label not in VIEWS for label in labels)


@contextlib.contextmanager
def whole_graph() -> Iterator[None]:
    """Forwards built without evaluating anything: staged models hand their first stages to the
    device (mlxnet.nn.handoff, through mx.async_eval), which would leave only the last stage's
    graph to count."""
    real = mx.async_eval
    mx.async_eval = lambda *arrays: None
    try:
        yield
    finally:
        mx.async_eval = real


def launches(forward: Callable[[], Any], compiled: bool) -> int:
    with mlxnet.use_compile(compiled), whole_graph():
        return primitives(forward())


def mlx_runner(forward: Callable[[], Any], compiled: bool | None = None) -> Callable[[], None]:
    """One timed call: build ``forward()``'s outputs and evaluate them to the end, compiled or
    not (None: the library's default)."""
    def run() -> None:
        with contextlib.nullcontext() if compiled is None else mlxnet.use_compile(compiled):
            mx.eval(forward())
        mx.synchronize()
    return run


def torch_device(device: str) -> Any:
    """PyTorch's device for mlxnet's ``device``: CUDA or MPS for the GPU, else the CPU."""
    import torch

    if device == "gpu":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
    return torch.device("cpu")


def torch_runner(module: Any, inputs: tuple, device: str) -> Callable[[], None]:
    """One timed PyTorch call, synchronised with the device."""
    import torch

    dev = torch_device(device)

    def run() -> None:
        with torch.no_grad():
            module(*inputs)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        elif dev.type == "mps":
            torch.mps.synchronize()
    return run


def time_alternating(runs: dict[str, Callable[[], None]], warmup: int, reps: int,
                     pause: float = 0.0) -> dict[str, list[float]]:
    """Wall ms of each timed call of each run, alternating rep by rep (a noisy machine slows all
    alike). The pause (CPU only) lets the other library's worker threads stop spinning (OpenMP
    spins ~200 ms after a parallel region), which would otherwise steal the cores."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for rep in range(warmup + reps):
        for name, run in runs.items():
            time.sleep(pause)
            t = time.perf_counter()
            run()
            if rep >= warmup:
                times[name].append((time.perf_counter() - t) * 1e3)
    return times


def summary(samples: list[float]) -> tuple[float, float]:
    """Median and spread (half the distance between the quartiles) of timed calls, in ms."""
    if len(samples) < 4:
        return statistics.median(samples), (max(samples) - min(samples)) / 2
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return statistics.median(samples), (q3 - q1) / 2


def peak_bytes(run: Callable[[], None]) -> int:
    """MLX's peak memory over one call, weights and inputs included: cached buffers are
    released and the peak reset first, so earlier rows and calls do not count."""
    free()
    mx.reset_peak_memory()
    run()
    return int(mx.get_peak_memory())


def free() -> None:
    """Drop what earlier work left (MLX's and PyTorch's caches hold memory)."""
    gc.collect()
    mx.clear_cache()
    torch = sys.modules.get("torch")  # only where a comparison loaded it
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
