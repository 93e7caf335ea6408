"""`mlxnet app`: the local web application (see :mod:`mlxnet.app.server`)."""
from __future__ import annotations

import importlib
import sys
from typing import Optional

import typer

from mlxnet.commands import grammar
from mlxnet.commands.quick_start import runtime_compiling_off
from mlxnet.errors import MlxnetError

from .models import DEFAULT_WEIGHTS

WEB_STACK = {"starlette": "starlette", "uvicorn": "uvicorn", "multipart": "python-multipart"}


def require_web_stack() -> None:
    """The ``app`` extra's packages, or one line saying how to install them."""
    missing = []
    for module, package in WEB_STACK.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(package)
    if missing:
        raise MlxnetError(f"mlxnet app needs the web extra ({', '.join(missing)} missing): "
                          "pip install 'mlxnet[app]'")


def _weights(flag: str, model: str) -> typer.Option:
    return typer.Option(DEFAULT_WEIGHTS[model], flag, metavar="ID|FILE|random",
                        help=f"{model} weights: a hub id, a local file, or 'random' (seeded, offline).")


def serve(app, host: str, port: int, ready=None):  # noqa: ANN001 - uvicorn's objects
    """Run ``app`` under uvicorn until interrupted; ``ready(url)`` is called once it listens."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started and ready is not None:
                bound = self.servers[0].sockets[0].getsockname()
                ready(f"http://{'[' + bound[0] + ']' if ':' in bound[0] else bound[0]}:{bound[1]}")

    server = Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                   lifespan="on", timeout_graceful_shutdown=5))
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn shut down cleanly, then passed Ctrl+C on: it is how one stops it
        pass
    return server


def app(
    host: str = typer.Option("127.0.0.1", "--host", metavar="ADDRESS",
                             help="Address to listen on; anything but 127.0.0.1 (or ::1) lets other machines in."),
    port: int = typer.Option(8000, "--port", metavar="N", min=0, max=65535, help="Port (0: any free one; the line printed says)."),
    sam_weights: str = _weights("--sam-weights", "sam"),
    lama_weights: str = _weights("--lama-weights", "lama"),
    yolo_weights: str = _weights("--yolo-weights", "yolo"),
    resnet_weights: str = _weights("--resnet-weights", "resnet"),
    max_upload_mb: float = typer.Option(50.0, "--max-upload-mb", metavar="MB", min=0.01, help="Largest request body (413 above)."),
    max_pixels: int = typer.Option(40_000_000, "--max-pixels", metavar="N", min=1, help="Largest image, width × height (400 above)."),
    cache: int = typer.Option(8, "--cache", metavar="N", min=1, help="Images kept with their SAM embeddings (least recent dropped)."),
    keep_cache_mb: float = typer.Option(256.0, "--keep-cache-mb", metavar="MB", min=0,
                                        help="MLX's buffer cache kept between requests (more is freed after each)."),
    dtype: str = grammar.dtype(),
    device: Optional[str] = grammar.device(),
) -> None:
    """Serve the interactive page and its JSON/HTTP API: click to select, brush, erase, detect, classify."""
    grammar.apply_device(device)
    grammar.check_dtype(dtype)
    require_web_stack()
    from .models import Models, Weights
    from .server import Limits, create_app

    models = Models(Weights(sam=sam_weights, lama=lama_weights, yolo=yolo_weights, resnet=resnet_weights,
                            dtype=dtype))
    limits = Limits(max_upload_mb=max_upload_mb, max_pixels=max_pixels, cache_images=cache,
                    keep_cache_mb=keep_cache_mb)
    web = create_app(models, limits)

    def ready(url: str) -> None:
        print(f"mlxnet app: serving on {url} (models load on first use; Ctrl+C stops)", flush=True)
        if host not in ("127.0.0.1", "::1", "localhost"):
            print(f"note: listening on {host}: other machines can reach this app, which has no login",
                  file=sys.stderr, flush=True)
    with runtime_compiling_off():  # on CUDA: the first click compiles no GPU code
        serve(web, host, port, ready)
    print("mlxnet app: stopped", file=sys.stderr, flush=True)
