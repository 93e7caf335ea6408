"""The fuzzer's child process: loads one file per request, under an address-space limit, and
says how the load ended and how much its peak memory grew.

Run as ``python tests/fuzz_worker.py``; it reads JSON lines ``{"loader": NAME, "path": PATH}``
on stdin and answers each with ``{"outcome": "loaded" | "error" | <exception type>, "message":
..., "growth_mb": ...}``. One process serves many cases (importing MLX and the models once
costs more than most loads): before each load its address space is limited to what it holds
then plus ``FUZZ_AS_LIMIT_MB`` (default 1024), and its peak RSS is reset (``/proc/self/clear_refs``),
so every case is bounded and measured on its own. A case that kills the process (a crash, the
limit hit outside Python) is seen by the parent as the pipe closing.

``LOADERS`` is the table of surfaces: a new one (a video reader, a web request handler) is one
entry, a function of the file's path.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import traceback
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))  # fixtures.*: the tiny model's spec

import mlxnet  # noqa: E402,F401  (gives MLX OpenBLAS on Linux, before mlx.core)
from mlxnet.errors import MlxnetError  # noqa: E402


def _open_checkpoint(path: str) -> None:
    from mlxnet.weights import open_checkpoint

    open_checkpoint(path)


def _load_model(spec: str) -> Callable[[str], None]:
    def load(path: str) -> None:
        import fixtures.weights_models  # noqa: F401  (registers "tinynet")
        from mlxnet.weights import load_model

        load_model(path, spec)
    return load


def _load_image(path: str) -> None:
    from mlxnet.image import load_image

    load_image(path)


def _load_mask(path: str) -> None:
    from mlxnet.image import load_mask

    load_mask(path)


LOADERS: dict[str, Callable[[str], None]] = {
    "open_checkpoint": _open_checkpoint,
    "load_model:tinynet": _load_model("tinynet"),
    "load_model:yolov8n": _load_model("yolov8n"),
    "load_image": _load_image,
    "load_mask": _load_mask,
    # not a surface: shows the address-space limit works (this must end in MemoryError)
    "allocate_2GiB": lambda path: bytearray(2 << 30),
}


def status(key: str) -> int:
    """A /proc/self/status size (VmSize, VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def reset_peak() -> bool:
    """Linux: writing 5 resets VmHWM (the peak RSS) to the current RSS; False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def run_one(loader: str, path: str, limit: int) -> dict:
    reset = reset_peak()  # without it, growth is counted from an earlier peak (the test refuses that)
    before = status("VmRSS") if reset else status("VmHWM")
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (status("VmSize") + limit, hard))
    try:
        LOADERS[loader](path)
        outcome, message = "loaded", ""
    except MlxnetError as e:
        outcome, message = "error", str(e)
    except BaseException as e:  # noqa: BLE001  (the contract's breaches are what we record)
        outcome = type(e).__name__
        message = f"{e}"[:500] + " | " + "".join(traceback.format_tb(e.__traceback__)[-3:])[-1500:]
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    return {"outcome": outcome, "message": message, "growth_mb": (status("VmHWM") - before) / 2**20,
            "peak_reset": reset}


def main() -> None:
    limit = int(os.environ.get("FUZZ_AS_LIMIT_MB", "1024")) << 20
    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps(run_one(request["loader"], request["path"], limit)), flush=True)


if __name__ == "__main__":
    main()
