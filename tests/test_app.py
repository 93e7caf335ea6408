"""`mlxnet app`'s JSON/HTTP API, through a real server on 127.0.0.1: results against the
library's own calls, concurrent clients against single-client results, the size and pixel
limits, malformed requests (always a 4xx with a JSON error), the bounded image cache, the
127.0.0.1 default and a clean temp folder after shutdown. Seeded random weights."""
from __future__ import annotations

import base64
import http.client
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("starlette", reason="the app extra (pip install -e '.[app]')")
pytest.importorskip("uvicorn", reason="the app extra (pip install -e '.[app]')")

from mlxnet.app import erasing, regions  # noqa: E402
from mlxnet.app.models import Models, Weights  # noqa: E402
from mlxnet.image import as_mask, load_image  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BUS = ROOT / "tests/fixtures/yolo/bus.jpg"
ZIDANE = ROOT / "tests/fixtures/yolo/zidane.jpg"

def seeded_models(tmp_path_factory) -> Models:
    """SAM's seeded weights of tests/test_erase.py (its masks cover part of an image); the
    others' ``random``."""
    from test_erase import seeded_sam

    sam = seeded_sam(tmp_path_factory.mktemp("sam") / "sam_seeded.safetensors")
    return Models(Weights(sam=str(sam), lama="random", yolo="random", resnet="random"))

UPLOAD_MB, MAX_PIXELS, CACHE = 2.0, 1_000_000, 4  # 4: the concurrent test's images all fit


# --- a server and a client ----------------------------------------------------------------------------

class Server:
    """create_app's application under uvicorn on 127.0.0.1, on a thread of this process."""

    def __init__(self, models: Models, **limits) -> None:
        import uvicorn

        from mlxnet.app.server import Limits, create_app

        self.server = uvicorn.Server(uvicorn.Config(create_app(models, Limits(**limits)), host="127.0.0.1", port=0,
                                                    log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.05)
        self.host, self.port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def multipart(fields: dict) -> tuple[bytes, str]:
    """A multipart/form-data body: bytes values as files, others as text (JSON unless str)."""
    boundary = uuid.uuid4().hex
    parts = []
    for name, value in fields.items():
        if isinstance(value, bytes):
            head = f'Content-Disposition: form-data; name="{name}"; filename="{name}.bin"\r\n' \
                   "Content-Type: application/octet-stream\r\n\r\n"
            parts.append(f"--{boundary}\r\n".encode() + head.encode() + value + b"\r\n")
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{text}\r\n'.encode())
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def call(server: Server, path: str, fields: dict | None = None, *, method: str = "POST",
         body: bytes | None = None, content_type: str | None = None, headers: dict | None = None):
    """(status, headers, body); JSON bodies decoded."""
    if fields is not None:
        body, content_type = multipart(fields)
    conn = http.client.HTTPConnection(server.host, server.port, timeout=300)
    try:
        conn.request(method, path, body=body, headers={**({"Content-Type": content_type} if content_type else {}),
                                                       **(headers or {})})
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    kind = response.getheader("Content-Type", "")
    return response.status, response, json.loads(data) if kind.startswith("application/json") else data


def png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def decode(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)))


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Models:
    return seeded_models(tmp_path_factory)


@pytest.fixture(scope="module")
def server(models):
    running = Server(models, max_upload_mb=UPLOAD_MB, max_pixels=MAX_PIXELS, cache_images=CACHE)
    yield running
    running.stop()


def library_mask(models: Models, image: np.ndarray, points=None, labels=None, box=None) -> tuple[np.ndarray, float]:
    from mlxnet.models.sam import SamPredictor

    predictor = SamPredictor(models.sam().model)  # the library's own predictor on the app's weights
    predictor.set_image(image)
    multi = box is None and len(points) == 1
    masks, scores, _ = predictor.predict(None if points is None else np.array(points, float),
                                         None if labels is None else np.array(labels),
                                         None if box is None else np.array(box, float), multimask_output=multi)
    best = int(np.argmax(scores))
    return masks[best], float(scores[best])


# --- answers ----------------------------------------------------------------------------------------

def test_health(server):
    status, _, body = call(server, "/api/health", method="GET")
    assert status == 200 and body["status"] == "ok" and body["backend"] in ("cpu", "metal", "cuda")
    assert body["limits"] == {"max_upload_mb": UPLOAD_MB, "max_pixels": MAX_PIXELS, "cache_images": CACHE,
                              "keep_cache_mb": 256.0}
    assert body["mlx_cache_mb"] >= 0
    assert body["weights"]["lama"] == "random" and body["weights"]["sam"].endswith("sam_seeded.safetensors")


def test_segment_is_sams_best_mask_and_clicks_reuse_the_embedding(server, models):
    status, _, first = call(server, "/api/segment", {"image": BUS.read_bytes(), "points": [[420, 310, 1]]})
    assert status == 200, first
    expected, score = library_mask(models, load_image(BUS), [[420, 310]], [1])
    mask = decode(base64.b64decode(first["mask"])) > 0
    assert mask.shape == (1080, 810) and np.mean(mask != expected) < 1e-4 and mask.sum() == first["area"] > 0
    assert abs(first["score"] - score) < 1e-3
    again_fields = {"image_id": first["image_id"], "points": [[420, 310, 1]], "format": "png"}
    status, response, raw = call(server, "/api/segment", again_fields)
    assert status == 200 and response.getheader("Content-Type") == "image/png"
    assert np.array_equal(decode(raw) > 0, mask) and abs(float(response.getheader("X-Score")) - first["score"]) < 1e-6
    status, _, third = call(server, "/api/segment", {"image_id": first["image_id"], "points": [[420, 310, 1]]})
    assert third["ms"]["embed"] == 0.0  # the cached embedding: only the prompt encoder and decoder ran


def test_erase_fills_inside_the_dilated_mask_only(server, models):
    image = load_image(BUS)
    drawn = np.zeros(image.shape[:2], np.uint8)
    drawn[600:700, 300:420] = 255
    status, response, body = call(server, "/api/erase", {"image": BUS.read_bytes(), "mask": png(drawn), "dilate": "8"})
    assert status == 200 and response.getheader("Content-Type") == "image/png", body
    result = decode(body)
    grown = regions.dilate(drawn > 0, 8)
    np.testing.assert_array_equal(result[~grown], image[~grown])
    expected = erasing.erase(models.lama(), image, drawn > 0, dilate_px=8).image
    np.testing.assert_array_equal(result, expected)  # what the library gives, on the same weights
    assert int(response.getheader("X-Filled-Pixels")) == int(grown.sum())
    # the result is held: a click on it needs no upload
    status, _, seg = call(server, "/api/segment", {"image_id": response.getheader("X-Image-Id"), "box": [300, 600, 420, 700]})
    assert status == 200, seg


def test_erase_with_prompts(server, models):
    image = np.asarray(Image.fromarray(load_image(BUS)).resize((405, 540)))  # half size: LaMa's crop is smaller
    status, response, body = call(server, "/api/erase", {"image": png(image), "points": [[75, 325, 1]]})
    assert status == 200, body
    expected, _ = library_mask(models, image, [[75, 325]], [1])
    grown = regions.dilate(expected, regions.DILATE_PX)
    assert abs(int(response.getheader("X-Filled-Pixels")) - int(grown.sum())) <= 0.001 * grown.size
    result = decode(body)
    np.testing.assert_array_equal(result[~grown], image[~grown])


def test_detect_and_classify_are_the_libraries_answers(server, models):
    image = load_image(BUS)
    status, _, found = call(server, "/api/detect", {"image": BUS.read_bytes()})
    assert status == 200 and found["detections"] == models.yolo().predict(image).to_list()
    assert found["detections"], "seeded YOLOv8n finds boxes"
    status, _, top = call(server, "/api/classify", {"image": BUS.read_bytes(), "k": "3"})
    assert status == 200 and top["top"] == models.classifier().predict(image, k=3).to_dict()["top"]


def test_everything_gives_a_label_map(server):
    status, _, body = call(server, "/api/everything", {"image": ZIDANE.read_bytes(), "points_per_side": "4",
                                                     "pred_iou_thresh": "0", "stability_thresh": "0"})
    assert status == 200, body
    labels = decode(base64.b64decode(body["labels"]))
    assert labels.shape == (720, 1280) and body["count"] == len(body["masks"]) >= 1
    assert set(np.unique(labels)) <= set(range(body["count"] + 1))


# --- several clients at once ---------------------------------------------------------------------------

def test_concurrent_clients_get_their_own_results(server):
    """4 clients × 3 requests each, on different images and prompts, at once: each answer equals
    the one a single client got for the same request."""
    flipped = png(load_image(BUS)[:, ::-1].copy())
    crop = png(load_image(ZIDANE)[100:600, 200:900].copy())
    requests = [("/api/segment", {"image": BUS.read_bytes(), "points": [[420, 310, 1]]}),
                ("/api/segment", {"image": flipped, "points": [[300, 500, 1], [100, 100, 0]]}),
                ("/api/segment", {"image": crop, "box": [100, 50, 500, 450]}),
                ("/api/detect", {"image": ZIDANE.read_bytes()})]

    def answer(i: int) -> object:
        path, fields = requests[i % len(requests)]
        status, _, body = call(server, path, fields)
        assert status == 200, body
        return body.get("mask") or body["detections"], body.get("score")

    alone = [answer(i) for i in range(len(requests))]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(answer, [i for _ in range(3) for i in range(len(requests))]))
    assert together == [alone[i] for _ in range(3) for i in range(len(requests))]
    assert len({a[0] if isinstance(a[0], str) else json.dumps(a[0]) for a in alone}) == len(requests)


# --- limits and malformed requests ---------------------------------------------------------------------

def assert_json_error(status: int, body, expected_status: int, words: str) -> None:
    assert status == expected_status, (status, body)
    assert isinstance(body, dict) and set(body) == {"error"} and words in body["error"], body
    assert "Traceback" not in body["error"] and "\n" not in body["error"]


def test_uploads_above_the_limit_get_413(server):
    big = os.urandom(int(UPLOAD_MB * 2**20) + 1000)
    status, _, body = call(server, "/api/segment", {"image": big, "points": [[1, 1, 1]]})
    assert_json_error(status, body, 413, "upload too large: the limit is 2 MB")

    # without a Content-Length (chunked): counted as it comes
    form, kind = multipart({"image": big})
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    conn.request("POST", "/api/detect", body=(form[i:i + 65536] for i in range(0, len(form), 65536)),
                 headers={"Content-Type": kind, "Transfer-Encoding": "chunked"}, encode_chunked=True)
    response = conn.getresponse()
    assert_json_error(response.status, json.loads(response.read()), 413, "upload too large")
    conn.close()


def test_images_above_the_pixel_limit_get_400(server):
    wide = png(np.zeros((1001, 1000, 3), np.uint8))  # 1.001 MP, a small file
    status, _, body = call(server, "/api/detect", {"image": wide})
    assert_json_error(status, body, 400, "image: image has 1,001,000 pixels (1000x1001), over the 1,000,000-pixel budget")
    status, _, body = call(server, "/api/erase", {"image": BUS.read_bytes(), "mask": wide})
    assert_json_error(status, body, 400, "mask: image has 1,001,000 pixels (1000x1001)")


@pytest.mark.parametrize("fields, status, words", [
    ({"points": [[1, 1, 1]]}, 400, "image: send the picture in a file field 'image'"),
    ({"image": b"not an image", "points": [[1, 1, 1]]}, 400, "image: not a readable image"),
    ({"image": b"", "points": [[1, 1, 1]]}, 400, "image: empty file"),
    ({"image": BUS.read_bytes()[:4000], "points": [[1, 1, 1]]}, 400, "image: "),  # truncated
    ({"image": "text, not a file", "points": [[1, 1, 1]]}, 400, "image: expected a file field"),
    ({"image": BUS.read_bytes(), "points": "[[1, 1, 1]"}, 400, "points: not valid JSON"),
    ({"image": BUS.read_bytes(), "points": [[1, 1]]}, 400, "points: expected [[x, y, 1 or 0], ...]"),
    ({"image": BUS.read_bytes(), "points": [[1, 1, 2]]}, 400, "points: expected"),
    ({"image": BUS.read_bytes(), "points": [[1, "a", 1]]}, 400, "points: expected"),
    ({"image": BUS.read_bytes(), "points": [[5000, 1, 1]]}, 400, "lies outside the 810x1080 image"),
    ({"image": BUS.read_bytes(), "points": [[5, 5, 0]]}, 400, "at least one foreground point"),
    ({"image": BUS.read_bytes()}, 400, "at least one foreground point"),
    ({"image": BUS.read_bytes(), "box": [10, 10, 5, 5]}, 400, "box: need X0 < X1"),
    ({"image": BUS.read_bytes(), "box": [1, 2, 3]}, 400, "box: expected [x0, y0, x1, y1]"),
    ({"image_id": "f" * 32, "points": [[1, 1, 1]]}, 404, "is not (or no longer) held"),
])
def test_malformed_segment_requests_get_a_json_4xx(server, fields, status, words):
    got, _, body = call(server, "/api/segment", fields)
    assert_json_error(got, body, status, words)


def test_other_malformed_requests_get_a_json_4xx(server):
    status, _, body = call(server, "/api/segment", body=b'{"image": 1}', content_type="application/json")
    assert_json_error(status, body, 400, "send multipart/form-data")
    status, _, body = call(server, "/api/segment", body=b"--x\r\nbroken", content_type="multipart/form-data; boundary=x")
    assert 400 <= status < 500 and "error" in body, body
    status, _, body = call(server, "/api/erase", {"image": BUS.read_bytes()})
    assert_json_error(status, body, 400, "erase: send a 'mask' file, 'points', a 'box' or 'classes'")
    small = png(np.zeros((10, 10), np.uint8))
    status, _, body = call(server, "/api/erase", {"image": BUS.read_bytes(), "mask": small})
    assert_json_error(status, body, 400, "mask: 10x10 but the image is 810x1080")
    status, _, body = call(server, "/api/classify", {"image": BUS.read_bytes(), "k": "0"})
    assert_json_error(status, body, 400, "k: expected an integer from 1 to 100")
    status, _, body = call(server, "/api/detect", {"image": BUS.read_bytes(), "conf": "nan"})
    assert_json_error(status, body, 400, "conf: expected a number from 0 to 1")
    status, _, body = call(server, "/api/nothing", method="GET")
    assert_json_error(status, body, 404, "no such page or API route")
    status, _, body = call(server, "/api/segment", method="GET")
    assert status == 405 and "error" in body


def test_the_image_cache_is_bounded(server):
    ids = []
    for shift in range(CACHE + 1):
        image = np.roll(load_image(ZIDANE)[::4, ::4], shift, axis=1).copy()
        status, _, body = call(server, "/api/image", {"image": png(image)})
        assert status == 200
        ids.append(body["image_id"])
    status, _, body = call(server, "/api/health", method="GET")
    assert body["cached_images"] == CACHE
    status, _, body = call(server, "/api/detect", {"image_id": ids[0]})
    assert status == 404  # the least recently used went first
    status, _, body = call(server, "/api/detect", {"image_id": ids[-1]})
    assert status == 200


def test_mlx_buffer_cache_above_the_limit_is_freed_after_each_request(server, models):
    """A request leaves buffers in MLX's cache (a server that keeps everything shows them); after
    each request the cache holds at most --keep-cache-mb: the default 256, or 0 (all freed)."""
    fields = {"image": png(load_image(ZIDANE)[::2, ::2]), "points": [[300, 180, 1]]}

    def cache_after_segment(running: Server) -> float:
        status, _, body = call(running, "/api/segment", fields)
        assert status == 200, body
        status, _, health = call(running, "/api/health", method="GET")
        return health["mlx_cache_mb"]

    assert cache_after_segment(server) <= 256
    for keep, check in ((1e6, lambda mb: mb > 0), (0.0, lambda mb: mb == 0)):
        running = Server(models, keep_cache_mb=keep)
        try:
            assert check(cache_after_segment(running)), f"keep_cache_mb={keep}"
        finally:
            running.stop()


# --- the command ------------------------------------------------------------------------------------

def test_the_command_serves_on_127_0_0_1_and_leaves_no_temporary_files(tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    process = subprocess.Popen([sys.executable, "-m", "mlxnet", "app", "--port", "0", "--sam-weights", "random",
                                "--lama-weights", "random", "--yolo-weights", "random", "--resnet-weights", "random"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        line = process.stdout.readline()
        assert line.startswith("mlxnet app: serving on http://127.0.0.1:"), (line, process.stderr.read())
        port = int(line.split("http://127.0.0.1:")[1].split()[0])
        running = Server.__new__(Server)
        running.host, running.port = "127.0.0.1", port
        status, _, body = call(running, "/api/health", method="GET")
        assert status == 200 and body["loaded"] == []  # models load on first use
        # 1.5 MB of pixels: the multipart parser spools a file this size to disk
        noise = png(np.random.default_rng(0).integers(0, 256, (700, 700, 3), dtype=np.uint8))
        assert len(noise) > 2**20
        status, _, body = call(running, "/api/image", {"image": noise})
        assert status == 200 and (body["width"], body["height"]) == (700, 700)
        status, _, page = call(running, "/", method="GET")
        assert status == 200 and b"<canvas" in page
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "Traceback" not in err
    left = [p.name for p in temp.iterdir()]
    assert left == [], left


def test_the_app_without_its_extra_says_how_to_install_it():
    code = ("import sys; sys.modules['starlette'] = None; sys.argv = ['mlxnet', 'app']; "
            "from mlxnet.cli import run; run()")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert run.stderr.strip() == "error: mlxnet app needs the web extra (starlette missing): pip install 'mlxnet[app]'"


def test_importing_mlxnet_and_its_help_load_no_web_stack():
    code = ("import sys; import mlxnet, mlxnet.cli; from typer.testing import CliRunner; "
            "r = CliRunner().invoke(mlxnet.cli.app, ['--help']); "
            "print(r.exit_code, sorted(m for m in sys.modules if m.split('.')[0] in ('starlette', 'uvicorn', 'multipart', 'python_multipart')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split(None, 1) == ["0", "[]\n"], out.stdout


def test_missing_configured_weights_are_a_503_naming_the_option(tmp_path):
    """The server's own weights failing to load is no fault of the request: 503, and the
    message names the option that chose them."""
    missing = tmp_path / "no-such-sam.safetensors"
    running = Server(Models(Weights(sam=str(missing), lama="random", yolo="random", resnet="random")),
                     max_upload_mb=UPLOAD_MB, max_pixels=MAX_PIXELS, cache_images=CACHE)
    try:
        status, _, body = call(running, "/api/segment", {"image": png(np.zeros((32, 48, 3), np.uint8)),
                                                         "points": [[10, 10, 1]]})
    finally:
        running.stop()
    assert status == 503, body
    assert body["error"].startswith(f"--sam-weights {missing}:"), body
