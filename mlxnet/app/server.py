"""The web application behind ``mlxnet app``: one static page and a JSON/HTTP API (Starlette).

Every request is multipart/form-data: the picture in a file field ``image`` (or ``image_id``,
the id an earlier answer gave, while the server still holds that image), an optional mask in
``mask``, and JSON-valued fields ``points`` (``[[x, y, 1 or 0], ...]``, 1 = foreground) and
``box`` (``[x0, y0, x1, y1]``). Errors are JSON ``{"error": "..."}`` with a 4xx status for
anything wrong with the request (413: body above the upload limit; 400: image above the pixel
limit, unreadable, or a malformed field; 404: an unknown ``image_id`` or path).

All model work runs on one worker thread, in arrival order: MLX's default stream and the
models' weights are then touched by one thread, and each request's pixels, prompts and results
are its own (nothing is shared between requests but the models and the image cache). The
cache keeps the last ``cache_images`` images with their SAM embeddings (least recently used
goes first), so a click on a known image runs only SAM's prompt encoder and mask decoder.
Nothing is written to disk.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import math
import sys
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PIL import Image
from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from mlxnet.errors import MlxnetError
from mlxnet.image import decode_bytes

from . import erasing, regions
from .models import ModelUnavailable, Models

STATIC = Path(__file__).parent / "static"


@dataclass(frozen=True)
class Limits:
    max_upload_mb: float = 50.0  # a request's whole body
    max_pixels: int = 40_000_000  # width × height of an image or mask (a 12 MP photo is 12e6)
    cache_images: int = 8  # images (with their SAM embeddings) kept for later clicks
    max_grid: int = 64  # segment-everything's points per side
    # MLX's buffer cache kept between requests: a click or a detection reuses less than this,
    # while an erase or segment-everything of a large photo leaves gigabytes, freed at its end.
    keep_cache_mb: float = 256.0


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


# --- request body limit -------------------------------------------------------------------------

class _TooLarge(Exception):
    pass


def too_large(limit: int) -> str:
    return f"upload too large: the limit is {limit / 2**20:g} MB (mlxnet app --max-upload-mb)"


class BodyLimit:
    """ASGI middleware: a body above ``limit`` bytes gets 413 with a JSON error, whether its
    Content-Length says so up front or a chunked body grows past it while it is read."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    def _message(self) -> str:
        return too_large(self.limit)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            # Read the body and drop it (nothing is kept): a client still sending gets the
            # answer rather than a reset connection.
            message = {"more_body": True}
            while message.get("more_body") and message.get("type", "http.request") == "http.request":
                message = await receive()
            await error(413, self._message())(scope, receive, send)
            return
        seen, started = 0, False

        async def counted_receive() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    # Read the rest and drop it, so that the client gets the 413 rather than a
                    # connection reset while it is still sending.
                    while message.get("more_body") and message["type"] == "http.request":
                        message = await receive()
                    raise _TooLarge()
            return message

        async def watched_send(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except _TooLarge:
            if not started:
                await error(413, self._message())(scope, receive, send)


# --- the image cache ----------------------------------------------------------------------------

@dataclass
class Entry:
    pixels: np.ndarray
    predictor: Any = None  # a SamPredictor holding this image's embedding, once computed


class ImageCache:
    """The last ``limit`` images by id (a hash of their bytes), least recently used dropped first.
    Used from the worker thread only."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._entries: OrderedDict[str, Entry] = OrderedDict()

    def get(self, key: str) -> Entry | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: str, pixels: np.ndarray) -> Entry:
        entry = self._entries.get(key) or Entry(pixels)
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.limit:
            self._entries.popitem(last=False)
        return entry

    def __len__(self) -> int:
        return len(self._entries)


# --- decoding requests --------------------------------------------------------------------------

def decode_image(data: bytes, field: str, max_pixels: int) -> Image.Image:
    """A decoded PIL image from uploaded bytes, by the rules files are read with
    (:func:`mlxnet.image.decode_bytes`: sizes checked from the header before any pixel is
    decoded); any problem is the client's file, a 400 naming the field."""
    if not data:
        raise ApiError(400, f"{field}: empty file")
    try:
        return decode_bytes(data, field, max_pixels)
    except MlxnetError as e:
        raise ApiError(400, str(e)) from None


def decoded(decode: Callable[[], np.ndarray], field: str) -> np.ndarray:
    """The pixels ``decode()`` reads from an opened upload; a file that opened but does not
    decode (truncated, corrupt) is the client's, a 400."""
    try:
        return decode()
    except MlxnetError as e:
        raise ApiError(400, str(e)) from None
    except Exception as e:  # noqa: BLE001 - Pillow's errors for a damaged file vary by format
        raise ApiError(400, f"{field}: not a readable image ({type(e).__name__})") from None


def json_field(form: Any, name: str) -> Any:
    value = form.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ApiError(400, f"{name}: expected a JSON text field, got a file")
    try:
        return json.loads(value)
    except ValueError:
        raise ApiError(400, f"{name}: not valid JSON: {value[:80]!r}") from None


def _finite_numbers(value: Any, n: int) -> bool:
    return (isinstance(value, list) and len(value) == n
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value))


def parse_points(value: Any) -> tuple[np.ndarray | None, np.ndarray | None]:
    if value is None:
        return None, None
    if not isinstance(value, list) or not all(_finite_numbers(p, 3) and p[2] in (0, 1) for p in value):
        raise ApiError(400, "points: expected [[x, y, 1 or 0], ...] (1 = foreground)")
    if not value:
        return None, None
    array = np.array(value, np.float64)
    return array[:, :2], array[:, 2].astype(np.int32)


def parse_box(value: Any) -> list[float] | None:
    if value is None:
        return None
    if not _finite_numbers(value, 4):
        raise ApiError(400, "box: expected [x0, y0, x1, y1]")
    return [float(v) for v in value]


def number_field(form: Any, name: str, default: float, low: float, high: float, integer: bool = False) -> float:
    value = form.get(name)
    if value is None or value == "":
        return default
    try:
        number = int(value) if integer else float(value)
    except (TypeError, ValueError):
        number = None
    if number is None or not (low <= number <= high):
        kind = "an integer" if integer else "a number"
        raise ApiError(400, f"{name}: expected {kind} from {low:g} to {high:g}, got {str(value)[:40]!r}")
    return number


def png_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG", compress_level=1)  # speed over size: it is local
    return buf.getvalue()


# --- the application ----------------------------------------------------------------------------

class Service:
    """The models, the cache and the worker thread, and what each endpoint computes."""

    def __init__(self, models: Models, limits: Limits) -> None:
        import mlx.core as mx

        self.models, self.limits = models, limits
        self.cache = ImageCache(limits.cache_images)
        device = mx.default_device()
        # One thread runs every model call, on the device chosen when the app was made.
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="mlxnet-models",
                                         initializer=lambda: mx.set_default_device(device))

    async def run(self, work: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.worker, self._then_trim, work)

    def _then_trim(self, work: Callable[[], Any]) -> Any:
        """``work()``, then MLX's buffer cache trimmed to the limit (worker thread)."""
        from mlxnet.device import trim_cache

        try:
            return work()
        finally:
            trim_cache(int(self.limits.keep_cache_mb * 2**20))

    # -- images (worker thread) --
    def image(self, upload: bytes | None, image_id: str | None) -> tuple[str, Entry]:
        from mlxnet.image import as_rgb

        if upload is not None:
            key = hashlib.sha256(upload).hexdigest()[:32]
            entry = self.cache.get(key)
            if entry is None:
                im = decode_image(upload, "image", self.limits.max_pixels)
                entry = self.cache.put(key, decoded(lambda: as_rgb(im, "image"), "image"))
            return key, entry
        if image_id:
            entry = self.cache.get(image_id)
            if entry is None:
                raise ApiError(404, f"image_id {image_id[:40]!r} is not (or no longer) held; send the image again")
            return image_id, entry
        raise ApiError(400, "image: send the picture in a file field 'image' (or an 'image_id' from an earlier answer)")

    def mask(self, upload: bytes | None, size: tuple[int, int]) -> np.ndarray | None:
        from mlxnet.image import as_mask

        if upload is None:
            return None
        im = decode_image(upload, "mask", self.limits.max_pixels)
        mask = decoded(lambda: as_mask(im, "mask"), "mask")
        if mask.shape != size:
            raise ApiError(400, f"mask: {mask.shape[1]}x{mask.shape[0]} but the image is {size[1]}x{size[0]}")
        return mask

    def embedded(self, entry: Entry) -> tuple[Any, float]:
        """The entry's SAM predictor, embedding the image the first time (and its seconds)."""
        if entry.predictor is not None:
            return entry.predictor, 0.0
        start = time.perf_counter()
        predictor = self.models.sam().fresh()  # its own embedding, the shared weights
        predictor.set_image(entry.pixels)
        entry.predictor = predictor
        return predictor, time.perf_counter() - start

    def class_mask(self, entry: Entry, classes: list[int], conf: float) -> np.ndarray:
        """Every instance of these classes: a segment checkpoint's own masks, else SAM's mask of
        each detection's box (on the entry's embedded predictor)."""
        detector = self.models.yolo()
        if max(classes) >= len(detector.names):
            raise ApiError(400, f"classes: {max(classes)} is out of range (the detector has {len(detector.names)})")
        found = detector.predict(entry.pixels, conf=conf, classes=classes)
        if found.masks is not None:
            return found.masks.union()
        region = np.zeros(entry.pixels.shape[:2], bool)
        predictor, _ = self.embedded(entry)
        for b in found.boxes:
            region |= predictor.predict_best(None, None, np.asarray(b, np.float64))[0]
        return region

    def prompt_mask(self, entry: Entry, points, labels, box) -> tuple[np.ndarray, float, float, float]:
        size = entry.pixels.shape[:2]
        try:
            regions.check_points(points, size, "points: point")
            if box is not None:
                regions.check_box(box, size, "box")
        except MlxnetError as e:
            raise ApiError(400, str(e)) from None
        if box is None and (labels is None or not (labels == 1).any()):
            raise ApiError(400, "points: give at least one foreground point (label 1) or a box")
        predictor, embed_s = self.embedded(entry)
        start = time.perf_counter()
        mask, score = predictor.predict_best(points, labels, box)
        return mask, score, embed_s, time.perf_counter() - start


async def read_form(request: Request) -> tuple[Any, dict[str, bytes]]:
    """The form's fields and its files' bytes."""
    kind = request.headers.get("content-type", "")
    if not kind.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        raise ApiError(400, "send multipart/form-data with the picture in a file field 'image'")
    try:
        form = await request.form(max_files=2, max_fields=16, max_part_size=1 << 20)
    except HTTPException as e:  # the multipart parser's complaints
        raise ApiError(400, f"malformed form: {e.detail}") from None
    image_id = form.get("image_id")
    if image_id is not None and not isinstance(image_id, str):
        raise ApiError(400, "image_id: expected a text field")
    files: dict[str, bytes] = {}
    for name in ("image", "mask"):
        value = form.get(name)
        if isinstance(value, UploadFile):
            files[name] = await value.read()
        elif value not in (None, ""):
            raise ApiError(400, f"{name}: expected a file field")
    return form, files


def endpoint(handler: Callable[[Request, "Service"], Any], service: "Service") -> Callable:
    """A route's function: its own errors as JSON; an unexpected fault as a JSON 500 and one
    line on the server's stderr, never a traceback in the page."""
    async def route(request: Request) -> Response:
        try:
            return await handler(request, service)
        except ApiError as e:
            return error(e.status, e.message)
        except ModelUnavailable as e:  # the server's configured weights, not the request
            return error(503, str(e))
        except MlxnetError as e:
            return error(400, str(e))
        except _TooLarge:  # raised while the form was read: the body passed the limit
            return error(413, too_large(int(service.limits.max_upload_mb * 2**20)))
        except Exception as e:  # noqa: BLE001 - see above
            print(f"mlxnet app: {request.url.path}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return error(500, f"internal error: {type(e).__name__}")
    return route


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


async def health(request: Request, service: Service) -> Response:
    import mlx.core as mx

    import mlxnet

    return JSONResponse({"status": "ok", "backend": mlxnet.backend(), "loaded": service.models.loaded(),
                         "weights": service.models.weights.to_dict(),
                         "limits": {"max_upload_mb": service.limits.max_upload_mb,
                                    "max_pixels": service.limits.max_pixels,
                                    "cache_images": service.limits.cache_images,
                                    "keep_cache_mb": service.limits.keep_cache_mb},
                         "cached_images": len(service.cache),
                         "mlx_cache_mb": round(mx.get_cache_memory() / 2**20, 1)})


async def post_image(request: Request, service: Service) -> Response:
    form, files = await read_form(request)

    def work() -> dict:
        key, entry = service.image(files.get("image"), form.get("image_id"))
        h, w = entry.pixels.shape[:2]
        return {"image_id": key, "width": w, "height": h}
    return JSONResponse(await service.run(work))


async def segment(request: Request, service: Service) -> Response:
    form, files = await read_form(request)
    points, labels = parse_points(json_field(form, "points"))
    box = parse_box(json_field(form, "box"))
    raw = form.get("format") == "png"

    def work() -> tuple[str, np.ndarray, float, float, float]:
        key, entry = service.image(files.get("image"), form.get("image_id"))
        return (key, *service.prompt_mask(entry, points, labels, box))

    key, mask, score, embed_s, mask_s = await service.run(work)
    png = png_bytes(mask)
    if raw:
        return Response(png, media_type="image/png", headers={"X-Score": f"{score:.6f}", "X-Image-Id": key})
    h, w = mask.shape
    return JSONResponse({"image_id": key, "width": w, "height": h, "score": round(score, 6),
                         "area": int(mask.sum()), "mask": base64.b64encode(png).decode(),
                         "ms": {"embed": _ms(embed_s), "mask": _ms(mask_s)}})


def parse_classes(value: Any) -> list[int] | None:
    """The 'classes' field: a JSON list of class ids (at most 1000)."""
    if value is None:
        return None
    if (not isinstance(value, list) or not value or len(value) > 1000
            or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in value)):
        raise ApiError(400, "classes: expected a non-empty JSON list of class ids (integers >= 0)")
    return value


async def erase(request: Request, service: Service) -> Response:
    form, files = await read_form(request)
    points, labels = parse_points(json_field(form, "points"))
    box = parse_box(json_field(form, "box"))
    classes = parse_classes(json_field(form, "classes"))
    conf = number_field(form, "conf", 0.25, 0.0, 1.0)
    dilate = int(number_field(form, "dilate", regions.DILATE_PX, 0, 500, integer=True))

    def work() -> tuple[bytes, str, erasing.Erased, float]:
        start = time.perf_counter()
        key, entry = service.image(files.get("image"), form.get("image_id"))
        size = entry.pixels.shape[:2]
        mask = service.mask(files.get("mask"), size)
        if mask is None and points is None and box is None and classes is None:
            raise ApiError(400, "erase: send a 'mask' file, 'points', a 'box' or 'classes'")
        region = np.zeros(size, bool) if mask is None else mask
        if points is not None or box is not None:
            region = region | service.prompt_mask(entry, points, labels, box)[0]
        if classes is not None:
            region = region | service.class_mask(entry, classes, conf)
        done = erasing.erase(service.models.lama(), entry.pixels, region, dilate_px=dilate)
        png = png_bytes(done.image)
        result_key = hashlib.sha256(png).hexdigest()[:32]
        service.cache.put(result_key, done.image)  # the page goes on clicking on the result
        return png, result_key, done, time.perf_counter() - start

    png, result_key, done, seconds = await service.run(work)
    crop = ",".join(map(str, done.crop)) if done.crop else ""
    return Response(png, media_type="image/png", headers={
        "X-Image-Id": result_key, "X-Filled-Pixels": str(int(done.mask.sum())), "X-Crop": crop,
        "X-Ms": str(_ms(seconds))})


async def detect(request: Request, service: Service) -> Response:
    form, files = await read_form(request)
    conf = number_field(form, "conf", 0.25, 0.0, 1.0)

    def work() -> dict:
        start = time.perf_counter()
        key, entry = service.image(files.get("image"), form.get("image_id"))
        found = service.models.yolo().predict(entry.pixels, conf=conf)
        h, w = entry.pixels.shape[:2]
        return {"image_id": key, "width": w, "height": h, "detections": found.to_list(),
                "ms": _ms(time.perf_counter() - start)}
    return JSONResponse(await service.run(work))


async def classify(request: Request, service: Service) -> Response:
    form, files = await read_form(request)
    k = int(number_field(form, "k", 5, 1, 100, integer=True))

    def work() -> dict:
        start = time.perf_counter()
        key, entry = service.image(files.get("image"), form.get("image_id"))
        found = service.models.classifier().predict(entry.pixels, k=k)
        return {"image_id": key, **found.to_dict(), "ms": _ms(time.perf_counter() - start)}
    return JSONResponse(await service.run(work))


async def everything(request: Request, service: Service) -> Response:
    form, files = await read_form(request)
    grid = int(number_field(form, "points_per_side", 16, 1, service.limits.max_grid, integer=True))
    iou = number_field(form, "pred_iou_thresh", 0.88, 0.0, 1.0)
    stability = number_field(form, "stability_thresh", 0.95, 0.0, 1.0)

    def work() -> dict:
        from mlxnet import families

        start = time.perf_counter()
        key, entry = service.image(files.get("image"), form.get("image_id"))
        predictor, _ = service.embedded(entry)
        generator = families.family_of("sam-tiny").mask_generator(
            predictor, points_per_side=grid, pred_iou_thresh=iou, stability_score_thresh=stability)
        records = generator.generate()  # no image: the cached embedding
        records = sorted(records, key=lambda r: -r["predicted_iou"])[:255]  # one byte a label
        labels = np.zeros(entry.pixels.shape[:2], np.uint8)
        for i in sorted(range(len(records)), key=lambda i: -records[i]["area"]):  # small ones on top
            labels[records[i]["segmentation"]] = i + 1
        return {"image_id": key, "count": len(records), "labels": base64.b64encode(png_bytes(labels)).decode(),
                "masks": [{"label": i + 1, "score": round(float(r["predicted_iou"]), 4), "area": int(r["area"])}
                          for i, r in enumerate(records)],
                "ms": _ms(time.perf_counter() - start)}
    return JSONResponse(await service.run(work))


def create_app(models: Models | None = None, limits: Limits | None = None) -> Any:
    """The ASGI application: the page at ``/`` and the API under ``/api/``."""
    limits = limits or Limits()
    service = Service(models or Models(), limits)

    @asynccontextmanager
    async def lifespan(app: Starlette):
        yield
        service.worker.shutdown(wait=True, cancel_futures=True)

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    async def script(request: Request) -> Response:
        return FileResponse(STATIC / "app.js", media_type="text/javascript", headers={"Cache-Control": "no-store"})

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        return error(status, "no such page or API route" if status == 404 else str(getattr(exc, "detail", exc)))

    routes = [Route("/", page), Route("/app.js", script),
              Route("/api/health", endpoint(health, service), methods=["GET"])]
    for path, handler in (("image", post_image), ("segment", segment), ("erase", erase), ("detect", detect),
                          ("classify", classify), ("everything", everything)):
        routes.append(Route(f"/api/{path}", endpoint(handler, service), methods=["POST"]))
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: not_found})
    app.state.service = service
    return BodyLimit(app, int(limits.max_upload_mb * 2**20))
