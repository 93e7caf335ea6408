"""The fuzzer's child process: loads one file per request, under an address-space limit, and
says how the load ended and how much its peak memory grew.

Run as ``python tests/fuzz_worker.py``; it reads JSON lines ``{"loader": NAME, "path": PATH}``
on stdin and answers each with ``{"outcome": "loaded" | "error" | <exception type>, "message":
..., "growth_mb": ...}``. One process serves many cases (importing MLX and the models once
costs more than most loads): before each load its address space is limited to what it holds
then plus ``FUZZ_AS_LIMIT_MB`` (default 1024), and its peak RSS is reset (``/proc/self/clear_refs``),
so every case is bounded and measured on its own. A case that kills the process (a crash, the
limit hit outside Python) is seen by the parent as the pipe closing.

``LOADERS`` is the table of surfaces, each a function of the file's path: the weights and
image loaders, and ``mlxnet app``'s HTTP API (a file holding a request); a new surface (a video
reader) is one entry.
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


def _load_video(path: str) -> None:
    """Every frame of a video, as mlxnet detect and track read it."""
    from mlxnet.video import VideoReader

    with VideoReader(path) as reader:
        for _ in reader.frames():
            pass


_APP: list = []  # the web app, made on first use (its models load only when a request needs them)


def _app_request(path: str) -> None:
    """A file holding an HTTP request (request line, headers, body) sent to ``mlxnet app``'s
    ASGI application in process. A 2xx is a load; a 4xx with a JSON ``error`` becomes an
    MlxnetError naming the file; anything else (a 500, a body that is no JSON) is raised as is.
    The request line and headers are parsed as the HTTP server would before the app sees them
    (one it could not parse is refused there); Content-Length is the body's true length."""
    import asyncio

    if not _APP:
        from mlxnet.app.models import Models, Weights
        from mlxnet.app.server import Limits, create_app

        _APP.append(create_app(Models(Weights(sam="random", lama="random", yolo="random", resnet="random")),
                               Limits(max_upload_mb=1, max_pixels=4_000_000)))
    head, _, body = Path(path).read_bytes().partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[1].startswith(b"/") or not parts[0].isalpha():
        raise MlxnetError(f"{path}: the server refuses the request line {lines[0][:60]!r}")
    target, _, query = parts[1].partition(b"?")
    headers = [(k.strip().lower(), v.strip()) for k, _, v in (line.partition(b":") for line in lines[1:])
               if k.strip() and k.strip().isascii() and b" " not in k.strip()]
    headers = [h for h in headers if h[0] != b"content-length"] + [(b"content-length", str(len(body)).encode())]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": parts[0].decode(),
             "scheme": "http", "path": target.decode("latin-1"), "raw_path": target, "query_string": query,
             "root_path": "", "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(_APP[0](scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    if 200 <= status < 300:
        return
    answer = json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))
    if 400 <= status < 500 and isinstance(answer.get("error"), str):
        raise MlxnetError(f"{path}: HTTP {status}: {answer['error']}")
    raise RuntimeError(f"HTTP {status}: {answer}")


LOADERS: dict[str, Callable[[str], None]] = {
    "open_checkpoint": _open_checkpoint,
    "load_model:tinynet": _load_model("tinynet"),
    "load_model:yolov8n": _load_model("yolov8n"),
    "load_image": _load_image,
    "load_mask": _load_mask,
    "app_request": _app_request,
    "load_video": _load_video,
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
