"""What ultralytics users pass and mlxnet used to refuse (issue 39, point 9): image URLs as
sources (mlxnet/commands/remote.py, served here by a local http.server), and detect's
--classes, --save-txt/--save-conf and --save-crop (mlxnet/commands/detect_outputs.py).

Seeded YOLOv8n weights (no hub) give many detections of a few classes on bus.jpg.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest

from mlxnet import MlxnetError
from mlxnet.commands import remote
from mlxnet.commands.detect_outputs import crop, folder_name, resolve_classes
from mlxnet.commands.images import expand_inputs, is_pattern, names_one_file
from mlxnet.image import load_image, save_image

FIXTURES = Path(__file__).parent / "fixtures" / "yolo"
BUS = (FIXTURES / "bus.jpg").read_bytes()
ZIDANE = FIXTURES / "zidane.jpg"
SLOW_SECONDS = 3.0
DETECT = ["--imgsz", "320", "--conf", "0.9"]  # seeded weights: dogs, bears, cakes, clocks on bus.jpg


# --- A local web server ------------------------------------------------------------------------------

class Handler(BaseHTTPRequestHandler):
    """Routes by path (queries ignored): the fixture image, and each way a download goes wrong."""

    def log_message(self, *args) -> None:  # quiet test output
        pass

    def _send(self, body: bytes, length: int | None = None, code: int = 200, headers: dict | None = None) -> None:
        self.send_response(code)
        if length is not None:
            self.send_header("Content-Length", str(length))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        try:
            if path.endswith("/bus.jpg") or path.endswith("/bus"):
                self._send(BUS, len(BUS))
            elif path == "/big.jpg":  # honest length, over the limit
                self._send(b"\0" * 600_000, 600_000)
            elif path == "/liar.jpg":  # says small, sends more than the limit
                self._send(b"\0" * 600_000, 1000)
            elif path == "/chunked.jpg":  # no length, chunks beyond the limit
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for _ in range(10):
                    self.wfile.write(b"%x\r\n%s\r\n" % (60_000, b"\0" * 60_000))
                self.wfile.write(b"0\r\n\r\n")
            elif path == "/nolength.jpg":  # no length: the body ends when the connection closes
                self._send(b"\0" * 600_000)
            elif path == "/short.jpg":  # promises more than it sends
                self._send(BUS[:1000], len(BUS))
            elif path == "/page.jpg":  # a web page where an image was expected
                self._send(b"<html>moved</html>", 18)
            elif path == "/missing.jpg":
                self._send(b"not here", 8, code=404)
            elif path == "/slow.jpg":
                time.sleep(SLOW_SECONDS)
                self._send(BUS, len(BUS))
            elif path == "/trickle.jpg":  # each byte within the timeout, the whole far beyond it
                self.send_response(200)
                self.send_header("Content-Length", "100")
                self.end_headers()
                for _ in range(100):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.05)
            elif path == "/to-file":
                self._send(b"", 0, code=302, headers={"Location": "file:///etc/passwd"})
            elif path == "/to-ftp":
                self._send(b"", 0, code=307, headers={"Location": "ftp://127.0.0.1/bus.jpg"})
            elif path == "/to-bus":
                self._send(b"", 0, code=302, headers={"Location": "/img/bus.jpg"})
            else:
                self._send(b"", 0, code=404)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
            pass


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    """urllib honours proxy variables: the local server must be reached directly."""
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


# --- The command line --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> dict[str, Path]:
    from mlxnet.models import resnet, yolo
    from mlxnet.nn.init import scale_preserving_init

    d = tmp_path_factory.mktemp("weights")
    out = {"yolo": d / "yolov8n.safetensors", "resnet": d / "resnet18.safetensors"}
    yolo.seeded("n", 1234, 2.5, 5.0).save_weights(str(out["yolo"]))
    scale_preserving_init(resnet.resnet("resnet18", 3)).save_weights(str(out["resnet"]))
    return out


def cli(*args: object, tmp: Path | None = None, **env_extra: str) -> subprocess.CompletedProcess:
    """The real command line; ``tmp``: its temporary folder (where downloads go), to look into."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MLXNET_") and "proxy" not in k.lower() and k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    env.update(MLXNET_DEVICE="cpu", **env_extra)
    if tmp is not None:
        tmp.mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(tmp)
    return subprocess.run([sys.executable, "-m", "mlxnet", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300)


def jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- URLs: names and schemes -------------------------------------------------------------------------

@pytest.mark.parametrize("url, name", [
    ("https://example.com/images/bus.jpg", "bus.jpg"),
    ("https://example.com/images/bus.jpg?raw=true&x=1#top", "bus.jpg"),  # query and fragment dropped
    ("https://example.com/a%20photo.jpg", "a_photo.jpg"),
    ("https://example.com/..%2F..%2Fetc%2Fpasswd", "passwd"),  # an encoded separator: still one name
    ("https://example.com/x%5C..%5Cy.png", "y.png"),  # a backslash too
    ("https://example.com/%2E%2E", "image"),  # ".." is no name
    ("https://example.com/.hidden.jpg", "hidden.jpg"),  # no hidden output
    ("https://example.com/a%00b%0A.jpg", "a_b_.jpg"),  # no NUL or newline
    ("https://example.com/", "image"),
    ("https://example.com", "image"),
    ("https://example.com/" + "n" * 300 + ".jpg", "n" * 96 + ".jpg"),
])
def test_output_name_is_the_url_path_basename_made_safe(url, name):
    assert remote.output_name(url) == name


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/a.jpg", "data://x", "gopher://h/a.jpg"])
def test_only_http_and_https_are_downloaded(url, tmp_path, weights):
    with pytest.raises(MlxnetError, match=r"only http:// and https:// URLs are downloaded"):
        expand_inputs([url])
    out = cli("detect", url, "-w", weights["yolo"], "-o", tmp_path / "out")
    assert out.returncode == 1 and out.stderr.strip().splitlines() == [
        f"error: {url}: only http:// and https:// URLs are downloaded, not {urlsplit(url).scheme}://"]
    assert not (tmp_path / "out").exists()


def test_urls_expand_as_sources_not_as_patterns(tmp_path, monkeypatch):
    url = "https://example.com/photos/bus.jpg?w=2&[x]=1"  # '?' and '[' are glob characters
    assert not is_pattern(url) and names_one_file([url], "out.jpg")
    sources = expand_inputs([url, "https://example.org/bus.jpg", url, "https://example.com/"])
    assert [s.name for s in sources] == [url, "https://example.org/bus.jpg", "https://example.com/"]
    assert [str(s.rel) for s in sources] == ["bus.jpg", "bus_2.jpg", "image"]  # a URL named twice runs once
    folder = sources[0].download.parent
    assert len({s.download for s in sources}) == 3 and all(s.download.parent == folder for s in sources)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # private
    assert not any(s.download.exists() for s in sources)  # nothing downloaded before the run
    # a local file whose name looks like a URL is that file
    monkeypatch.chdir(tmp_path)
    (tmp_path / "http:").mkdir()
    save_image(np.zeros((8, 8, 3), np.uint8), tmp_path / "http:" / "x.png")
    assert [s.download for s in expand_inputs(["http://x.png"])] == [None]


# --- URLs: downloads ---------------------------------------------------------------------------------

def test_download_writes_the_body_privately(server, tmp_path):
    target = remote.download(f"{server}/img/bus.jpg?size=large", tmp_path / "bus.jpg", timeout=5)
    assert target.read_bytes() == BUS and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert remote.download(f"{server}/to-bus", tmp_path / "again.jpg", timeout=5).read_bytes() == BUS
    # a server that sends more than its Content-Length: no byte beyond it is read
    assert remote.download(f"{server}/liar.jpg", tmp_path / "liar.jpg", max_bytes=500_000).stat().st_size == 1000


@pytest.mark.parametrize("path, message", [
    ("/missing.jpg", r"HTTP 404 Not Found$"),
    ("/big.jpg", r"too large: Content-Length 600,000 bytes, over the 0.5 MB download limit"),
    ("/chunked.jpg", r"too large: more than 500,000 bytes sent, over the 0.5 MB download limit"),
    ("/nolength.jpg", r"too large: more than 500,000 bytes sent"),
    ("/short.jpg", r"connection closed after 1,000 of 137,419 bytes"),
    ("/slow.jpg", r"timed out after 0.5 s \(MLXNET_DOWNLOAD_TIMEOUT\)$"),
    ("/trickle.jpg", r"timed out after 1.5 s"),  # the whole download: ten timeouts
    ("/to-file", r"HTTP 302 redirect to a file:// URL refused"),
    ("/to-ftp", r"HTTP 307 redirect to a ftp:// URL refused"),
])
def test_a_failed_download_is_one_line_naming_the_url_and_leaves_no_file(server, tmp_path, path, message):
    url = f"{server}{path}"
    timeout = 0.15 if path == "/trickle.jpg" else 0.5
    started = time.monotonic()
    with pytest.raises(MlxnetError) as caught:
        remote.download(url, tmp_path / "x.jpg", max_bytes=500_000, timeout=timeout)
    text = str(caught.value)
    assert text.startswith(f"{url}: ") and "\n" not in text
    assert caught.match(message)
    assert time.monotonic() - started < SLOW_SECONDS and not (tmp_path / "x.jpg").exists()


def test_unreachable_host_is_one_line(tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(MlxnetError, match=rf"^http://127.0.0.1:{port}/a.jpg: download failed \(.*refused"):
        remote.download(f"http://127.0.0.1:{port}/a.jpg", tmp_path / "a.jpg", timeout=2)


def test_detect_urls_fail_alone_and_the_download_folder_goes(server, weights, tmp_path):
    tmp = tmp_path / "tmp"
    good = f"{server}/photos/bus.jpg?raw=1"
    urls = [good, f"{server}/missing.jpg", f"{server}/slow.jpg", f"{server}/big.jpg"]
    out = cli("detect", *urls, ZIDANE, "-w", weights["yolo"], "-o", tmp_path / "out", *DETECT, "--batch", "2",
              "--json", tmp=tmp, MLXNET_DOWNLOAD_TIMEOUT="0.5", MLXNET_DOWNLOAD_MAX_MB="0.5")
    assert out.returncode == 1, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {urls[1]}: HTTP 404 Not Found",
                      f"error: {urls[2]}: timed out after 0.5 s (MLXNET_DOWNLOAD_TIMEOUT)",
                      f"error: {urls[3]}: too large: Content-Length 600,000 bytes, over the 0.5 MB download "
                      "limit (MLXNET_DOWNLOAD_MAX_MB)"]
    assert out.stderr.splitlines()[-1] == "3 of 5 images failed"
    rows = jsonl(out.stdout)
    assert [r["image"] for r in rows] == [*urls, str(ZIDANE)]  # input order
    assert rows[0]["output"] == str(tmp_path / "out" / "bus.jpg") and rows[0]["detections"]
    assert (rows[0]["width"], rows[0]["height"]) == load_image(FIXTURES / "bus.jpg").shape[1::-1]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["bus.jpg", "zidane.jpg"]
    assert not list(tmp.glob("mlxnet-downloads-*"))  # the private download folder is removed at exit
    # the same detections as the local file
    local = cli("detect", FIXTURES / "bus.jpg", "-w", weights["yolo"], "-o", tmp_path / "local", *DETECT, "--json")
    assert jsonl(local.stdout)[0]["detections"] == rows[0]["detections"]


def test_one_url_with_a_file_output_and_classify_reads_urls_too(server, weights, tmp_path):
    out = cli("detect", f"{server}/bus", "-w", weights["yolo"], "-o", tmp_path / "one.png", *DETECT)
    assert out.returncode == 0, out.stderr
    assert load_image(tmp_path / "one.png").shape == load_image(FIXTURES / "bus.jpg").shape
    # a name without an extension: the labelled copy is a .png
    out = cli("detect", f"{server}/bus", "-w", weights["yolo"], "-o", tmp_path / "out", *DETECT)
    assert out.returncode == 0 and (tmp_path / "out" / "bus.png").is_file(), out.stderr
    out = cli("classify", f"{server}/img/bus.jpg", f"{server}/missing.jpg", f"{server}/page.jpg",
              "-w", weights["resnet"], "--json")
    assert out.returncode == 1
    ok, missing, page = jsonl(out.stdout)
    assert ok["image"] == f"{server}/img/bus.jpg" and ok["top"]
    assert missing == {"image": f"{server}/missing.jpg", "error": "HTTP 404 Not Found"}
    # an error about the downloaded file names the URL, not the temporary file
    assert page["error"].startswith("not a readable image") and "mlxnet-downloads" not in page["error"]


def test_download_limits_are_checked_before_any_work(weights, tmp_path):
    out = cli("detect", FIXTURES / "bus.jpg", "-w", weights["yolo"], "-o", tmp_path / "out",
              MLXNET_DOWNLOAD_TIMEOUT="soon")
    assert out.returncode == 1 and out.stderr.strip() == (
        "error: MLXNET_DOWNLOAD_TIMEOUT: download timeout in seconds must be a positive number, got 'soon'")
    assert not (tmp_path / "out").exists()


# --- --classes -----------------------------------------------------------------------------------------

NAMES = ("person", "bicycle", "car", "traffic light")


@pytest.mark.parametrize("specs, ids", [
    (["0,2"], [0, 2]), (["car", "person"], [2, 0]), (["Traffic Light, 1"], [3, 1]), (["0", "person,0"], [0]),
])
def test_classes_are_ids_or_names(specs, ids):
    assert resolve_classes(specs, NAMES) == ids


@pytest.mark.parametrize("specs, bad", [(["4"], "'4'"), (["pers"], "'pers'"), (["-1"], "'-1'"), ([","], None)])
def test_unknown_classes_are_one_line_listing_the_valid_ones(specs, bad):
    with pytest.raises(MlxnetError) as caught:
        resolve_classes(specs, NAMES)
    text = str(caught.value)
    assert "\n" not in text and text.endswith("valid: ids 0-3 or names person, bicycle, car, traffic light")
    assert (f"unknown class {bad}" in text) if bad else ("no class given" in text)


def test_classes_filter_before_nms(weights, tmp_path):
    """As ultralytics: anchors whose best class is not listed are dropped before NMS, so
    --max-det counts only the listed classes (filtering after NMS would leave fewer)."""
    def detections(*extra: str) -> list[dict]:
        out = cli("detect", FIXTURES / "bus.jpg", "-w", weights["yolo"], "-o", tmp_path / "out", *DETECT,
                  "--json", *extra)
        assert out.returncode == 0, out.stderr
        return jsonl(out.stdout)[0]["detections"]

    everything = detections("--max-det", "1000")
    assert {d["name"] for d in everything} > {"dog", "bear"}
    bears_and_dogs = [d for d in everything if d["name"] in ("bear", "dog")]
    top5 = detections("--max-det", "5")
    assert sum(d["name"] == "bear" for d in top5) < 5  # the dogs came first
    by_name = detections("--max-det", "5", "--classes", "bear", "--classes", "dog")
    assert by_name == detections("--max-det", "5", "--classes", "21,16") == bears_and_dogs[:5]
    bears = detections("--max-det", "5", "--classes", "bear")
    assert len(bears) == 5 and bears == [d for d in everything if d["name"] == "bear"][:5]


def test_unknown_class_stops_the_command_in_one_line(weights, tmp_path):
    out = cli("detect", FIXTURES / "bus.jpg", "-w", weights["yolo"], "-o", tmp_path / "out", *DETECT,
              "--classes", "0,unicorn")
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: --classes: unknown class 'unicorn'; valid: ids 0-79 or names person, bicycle")
    assert not (tmp_path / "out" / "bus.jpg").exists()


# --- --save-txt, --save-conf, --save-crop ----------------------------------------------------------------

def expected_label_lines(row: dict, with_conf: bool) -> list[list[float]]:
    w, h = row["width"], row["height"]
    lines = []
    for d in row["detections"]:
        x1, y1, x2, y2 = d["box"]
        line = [d["class"], (x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h]
        lines.append(line + [d["score"]] if with_conf else line)
    return lines


def read_labels(path: Path) -> list[list[float]]:
    return [[float(v) for v in line.split()] for line in path.read_text().splitlines()]


def test_save_txt_writes_yolo_labels_under_labels(weights, tmp_path):
    tree = tmp_path / "in"
    (tree / "sub").mkdir(parents=True)
    shutil.copy(FIXTURES / "bus.jpg", tree / "sub" / "bus.jpg")
    shutil.copy(ZIDANE, tree / "zidane.jpg")
    out = cli("detect", tree, "-w", weights["yolo"], "-o", tmp_path / "out", *DETECT, "--max-det", "20",
              "--save-txt", "--json")
    assert out.returncode == 0, out.stderr
    rows = {Path(r["image"]).name: r for r in jsonl(out.stdout)}
    for name, rel in (("bus.jpg", "sub/bus"), ("zidane.jpg", "zidane")):
        labels = tmp_path / "out" / "labels" / f"{rel}.txt"
        assert rows[name]["labels"] == str(labels)
        found = read_labels(labels)
        assert len(found) == len(rows[name]["detections"]) == 20
        assert all(line[0] == int(line[0]) and len(line) == 5 and all(0 <= v <= 1 for v in line[1:]) for line in found)
        np.testing.assert_allclose(found, expected_label_lines(rows[name], False), atol=2e-4)
    # --save-conf ends each line with the score; an image without detections gets an empty file
    out = cli("detect", tree, "-w", weights["yolo"], "-o", tmp_path / "out", *DETECT, "--max-det", "20",
              "--save-txt", "--save-conf", "--json")
    rows = {Path(r["image"]).name: r for r in jsonl(out.stdout)}
    np.testing.assert_allclose(read_labels(tmp_path / "out" / "labels" / "zidane.txt"),
                               expected_label_lines(rows["zidane.jpg"], True), atol=2e-4)
    out = cli("detect", tree, "-w", weights["yolo"], "-o", tmp_path / "out", *DETECT, "--classes", "person",
              "--save-txt")
    assert out.returncode == 0 and "nothing -> " in out.stdout, out.stderr
    assert (tmp_path / "out" / "labels" / "zidane.txt").read_text() == ""  # the earlier labels replaced
    # the one-file form: labels/ beside the named output
    out = cli("detect", ZIDANE, "-w", weights["yolo"], "-o", tmp_path / "single" / "z.png", *DETECT,
              "--max-det", "3", "--save-txt")
    assert out.returncode == 0 and out.stdout.strip().endswith(f"labels {tmp_path / 'single' / 'labels' / 'z.txt'}")
    assert len(read_labels(tmp_path / "single" / "labels" / "z.txt")) == 3


def test_save_conf_needs_save_txt_and_two_images_cannot_share_labels(weights, tmp_path):
    out = cli("detect", ZIDANE, "-w", weights["yolo"], "-o", tmp_path / "out", "--save-conf")
    assert out.returncode == 1 and "--save-conf adds scores to the --save-txt label files" in out.stderr
    tree = tmp_path / "in"
    tree.mkdir()
    shutil.copy(ZIDANE, tree / "a.jpg")
    save_image(load_image(ZIDANE), tree / "a.png")
    out = cli("detect", tree, "-w", weights["yolo"], "-o", tmp_path / "out", "--save-txt")
    assert out.returncode == 1 and out.stderr.strip() == (
        f"error: {tree / 'a.jpg'} and {tree / 'a.png'} would both write {tmp_path / 'out' / 'labels' / 'a.txt'}; "
        "rename one or run them separately")
    assert not (tmp_path / "out").exists()


def test_save_crop_writes_each_detection_by_class(weights, tmp_path):
    out = cli("detect", FIXTURES / "bus.jpg", "-w", weights["yolo"], "-o", tmp_path / "out", *DETECT,
              "--max-det", "8", "--classes", "bear,dog", "--save-crop", "--json")
    assert out.returncode == 0, out.stderr
    (row,) = jsonl(out.stdout)
    crops = tmp_path / "out" / "crops"
    names = [d["name"] for d in row["detections"]]
    expected = []
    for name in ("bear", "dog"):
        n = names.count(name)
        expected += [f"{name}/bus.jpg"] + [f"{name}/bus_{i}.jpg" for i in range(2, n + 1)] if n else []
    assert sorted(p.relative_to(crops).as_posix() for p in crops.rglob("*.jpg")) == sorted(expected)
    assert len(row["crops"]) == 8 and out.stderr == ""
    image = load_image(FIXTURES / "bus.jpg")
    for path, d in zip(row["crops"], row["detections"]):  # in detection order
        assert Path(path).parent.name == d["name"]
        want = crop(image, np.array(d["box"]))
        got = load_image(path)
        assert abs(got.shape[0] - want.shape[0]) <= 1 and abs(got.shape[1] - want.shape[1]) <= 1
        h, w = min(got.shape[0], want.shape[0]), min(got.shape[1], want.shape[1])
        assert np.abs(got[:h, :w].astype(int) - want[:h, :w]).mean() < 8  # JPEG's loss only


def test_crop_geometry_is_ultralytics_save_one_box():
    image = np.arange(100 * 200 * 3, dtype=np.uint32).reshape(100, 200, 3).astype(np.uint8)
    # a 50x20 box centred at (100, 50) grows to 61 x 30.4: edges 69.5, 34.8, 130.5, 65.2, truncated
    piece = crop(image, np.array([75.0, 40.0, 125.0, 60.0]))
    np.testing.assert_array_equal(piece, image[34:65, 69:130])
    assert crop(image, np.array([190.0, 90.0, 200.0, 100.0])).shape == (16, 16, 3)  # clipped at the edges
    assert crop(image, np.array([125.0, 60.0, 75.0, 40.0])).shape == (31, 61, 3)  # corners in any order
    assert folder_name("a/b\\..", 3) == "a_b_" and folder_name("..", 7) == "class7"


def test_a_crop_never_overwrites_an_input(weights, tmp_path):
    victim = tmp_path / "out" / "crops" / "dog" / "bus.jpg"
    victim.parent.mkdir(parents=True)
    shutil.copy(FIXTURES / "bus.jpg", victim)
    before = digest(victim)
    out = cli("detect", victim, "-w", weights["yolo"], "-o", tmp_path / "out", *DETECT, "--max-det", "3",
              "--classes", "dog", "--save-crop")
    assert out.returncode == 1
    assert out.stderr.strip() == (f"error: {victim}: its crop {victim} would overwrite the input {victim}; "
                                  "choose another output folder")
    assert digest(victim) == before


def test_a_label_file_never_replaces_an_input(weights, tmp_path):
    """Checked before any work: here the label path is another name (a hard link) for an input."""
    (tmp_path / "in").mkdir()
    shutil.copy(ZIDANE, tmp_path / "in" / "a.jpg")
    shutil.copy(ZIDANE, tmp_path / "in" / "b.jpg")
    link = tmp_path / "out" / "labels" / "b.txt"
    link.parent.mkdir(parents=True)
    os.link(tmp_path / "in" / "a.jpg", link)
    out = cli("detect", tmp_path / "in", "-w", weights["yolo"], "-o", tmp_path / "out", "--save-txt")
    assert out.returncode == 1 and out.stderr.strip() == (
        f"error: labels file {link} would overwrite the input {tmp_path / 'in' / 'a.jpg'}; choose another output folder")
    assert not (tmp_path / "out" / "a.jpg").exists()


def test_a_second_save_crop_run_replaces_the_first_runs_crops(weights, tmp_path):
    """Crops of an image from an earlier run into the same folder (another class, more of
    them) are replaced by this run's, not left beside them; other images' crops stay."""
    stale = [tmp_path / "out" / "crops" / "giraffe" / "bus.jpg", tmp_path / "out" / "crops" / "dog" / "bus_9.jpg"]
    other = tmp_path / "out" / "crops" / "dog" / "zidane.jpg"
    for path in [*stale, other]:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ZIDANE, path)
    out = cli("detect", FIXTURES / "bus.jpg", "-w", weights["yolo"], "-o", tmp_path / "out", *DETECT,
              "--max-det", "3", "--classes", "dog", "--save-crop", "--json")
    assert out.returncode == 0, out.stderr
    (row,) = jsonl(out.stdout)
    crops = tmp_path / "out" / "crops"
    assert sorted(p.relative_to(crops).as_posix() for p in crops.rglob("bus*.jpg")) == \
        sorted(Path(p).relative_to(crops).as_posix() for p in row["crops"])
    assert not any(p.exists() for p in stale) and other.exists()
