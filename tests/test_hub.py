"""Hub downloads (mlxnet.weights.hub): the real huggingface_hub code path against a local imitation
of the Hub, offline mode, one-try failures, progress bars, and the hand-made cache of hubcache.py.

huggingface_hub reads HF_ENDPOINT / HF_HUB_CACHE / HF_HUB_OFFLINE when it is imported, so every
resolve that depends on them runs in a fresh interpreter (``run_resolve``).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import select
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from hubcache import file_sha256, prepare_hub_cache, repo_folder
from mlxnet.weights import get_spec

YOLO_REPO = "Ultralytics/YOLOv8"
BAR = re.compile(r"100%\|")  # a finished tqdm bar
# How every hub failure ends: true wherever a model id is taken (--weights, convert's SRC, the API).
LOCAL = ("give the path of a local copy of the file instead of the id '{}' "
         "(or 'random': seeded random weights, nothing to download)")

# Resolves each (model id, progress) of argv[1] in order; one JSON line per id on stdout, and an
# "@@id" marker on stderr before each, so that a progress bar can be told apart per download.
DRIVER = r"""
import json, os, sys
from huggingface_hub.utils import are_progress_bars_disabled
from mlxnet.errors import MlxnetError
from mlxnet.weights import resolve_weights

def state():
    return {"env": sorted(k for k in os.environ if k.startswith(("HF_", "HUGGINGFACE_"))),
            "bars_disabled": are_progress_bars_disabled()}

before = state()
for spec_id, progress in json.loads(sys.argv[1]):
    print(f"@@{spec_id}", file=sys.stderr, flush=True)
    try:
        print(json.dumps({"id": spec_id, "path": str(resolve_weights(spec_id, progress=progress))}), flush=True)
    except MlxnetError as e:
        print(json.dumps({"id": spec_id, "error": str(e)}), flush=True)
print("@@end", file=sys.stderr, flush=True)
print(json.dumps({"id": "@state", "same": state() == before}), flush=True)
"""


# --- a local imitation of the Hub ------------------------------------------------------------------

@dataclass
class FakeHub:
    """What hf_hub_download 2.4 asks of the Hub, for LFS files (weights always are):

    HEAD/GET {hub}/{repo}/resolve/{revision}/{file} -> 302 to the CDN, with X-Repo-Commit,
        X-Linked-Etag (the sha256) and X-Linked-Size; ETag is the git pointer's, which must lose.
    HEAD/GET {cdn}/blobs/{sha256} -> 200 and the bytes (Content-Length, Content-Disposition).
    Unknown file -> 404 X-Error-Code: EntryNotFound; unknown repo -> 404 RepoNotFound; a file
    in ``broken`` -> 503. The CDN listens on another port, i.e. another origin, as on the Hub.
    """

    files: dict[tuple[str, str], bytes]
    broken: set[str] = field(default_factory=set)
    requests: Counter = field(default_factory=Counter)  # (method, path) -> count

    def commit(self, repo: str) -> str:
        return hashlib.sha1(repo.encode()).hexdigest()

    def start(self) -> None:
        self.servers = [ThreadingHTTPServer(("127.0.0.1", 0), self._handler(role)) for role in ("hub", "cdn")]
        for server in self.servers:
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()
        self.url, self.cdn = (f"http://127.0.0.1:{s.server_address[1]}" for s in self.servers)

    def stop(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()

    def _handler(self, role: str) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                self._answer(body=True)

            def log_message(self, *args: object) -> None:  # keep the test output clean
                pass

            def _send(self, status: int, headers: dict[str, str], data: bytes = b"", body: bool = False) -> None:
                self.send_response(status)
                for k, v in {**headers, "Content-Length": str(len(data))}.items():
                    self.send_header(k, v)
                self.end_headers()
                if body and data:
                    for i in range(0, len(data), 64 << 10):  # several chunks, as a real transfer
                        self.wfile.write(data[i:i + (64 << 10)])

            def _answer(self, body: bool) -> None:
                path = unquote(urlsplit(self.path).path)
                hub.requests[(self.command, f"{role}:{path}")] += 1
                if role == "cdn":
                    blobs = {hashlib.sha256(d).hexdigest(): (f, d) for (_, f), d in hub.files.items()}
                    if path.removeprefix("/blobs/") not in blobs:
                        return self._send(404, {})
                    name, data = blobs[path.removeprefix("/blobs/")]
                    # the Hub's CDN names the file: huggingface_hub shows that name on the bar
                    return self._send(200, {"Content-Type": "application/octet-stream", "ETag": '"x"',
                                            "Content-Disposition": f'inline; filename="{name}";'}, data, body)
                m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
                repos = {r for r, _ in hub.files}
                if m is None or m[1] not in repos:
                    return self._send(404, {"X-Error-Code": "RepoNotFound"}, b"Repository not found", body)
                repo, filename = m[1], m[3]
                commit = {"X-Repo-Commit": hub.commit(repo)}
                if filename in hub.broken:
                    return self._send(503, commit, b"Service Unavailable", body)
                data = hub.files.get((repo, filename))
                if data is None:
                    return self._send(404, {**commit, "X-Error-Code": "EntryNotFound"}, b"Entry not found", body)
                sha = hashlib.sha256(data).hexdigest()
                self._send(302, {**commit, "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)),
                                 "ETag": '"git-pointer-etag"', "Location": f"{hub.cdn}/blobs/{sha}"})

        return Handler


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hub_env(tmp: Path, endpoint: str, **extra: str) -> dict[str, str]:
    """The test's own huggingface_hub setting: nothing inherited (no token, cache or endpoint)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "MLXNET_", "TQDM_"))}
    env.update(HF_HOME=str(tmp / "hf"), HF_HUB_CACHE=str(tmp / "hf" / "hub"), HF_ENDPOINT=endpoint, **extra)
    return env


@dataclass
class Resolved:
    results: dict[str, dict]  # model id -> {"path": ...} or {"error": ...}
    stderr: dict[str, str]  # model id -> what it wrote to stderr (its progress bar)
    seconds: float


def _parse(stdout: str, stderr: str, seconds: float) -> Resolved:
    results = {r["id"]: r for r in map(json.loads, stdout.splitlines())}
    assert results.pop("@state")["same"], "resolve_weights changed huggingface_hub's process-wide state"
    sections = dict(re.findall(r"@@(\S+)\r?\n(.*?)(?=@@)", stderr, flags=re.S))
    return Resolved(results, sections, seconds)


def run_resolve(steps: list[tuple[str, bool | None]], env: dict[str, str]) -> Resolved:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(steps)], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return _parse(out.stdout, out.stderr, time.perf_counter() - start)


def run_resolve_on_a_terminal(steps: list[tuple[str, bool | None]], env: dict[str, str]) -> Resolved:
    """As run_resolve, with stderr a pseudo-terminal (isatty() is true there)."""
    import fcntl
    import pty
    import struct
    import termios

    start = time.perf_counter()
    master, slave = pty.openpty()
    # a real terminal's size: tqdm fits its bar to the width, and a new pty's is 0 columns
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(steps)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            if not select.select([master], [], [], 1)[0]:
                continue
            try:
                data = os.read(master, 1 << 16)
            except OSError:  # EIO: the child has closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
    stdout = proc.stdout.read().decode()
    assert proc.wait(timeout=10) == 0, b"".join(chunks).decode(errors="replace")
    return _parse(stdout, b"".join(chunks).decode(errors="replace"), time.perf_counter() - start)


# --- downloading from the imitation ----------------------------------------------------------------

@pytest.fixture(scope="module")
def fake_hub():
    rng = random.Random(0)
    files = {(YOLO_REPO, f"yolov8{s}.pt"): rng.randbytes(300_000 + i) for i, s in enumerate("nsx")}
    files.update({(get_spec(m).repo, get_spec(m).filename): rng.randbytes(200_000) for m in ("resnet18", "resnet34")})
    hub = FakeHub(files, broken={"yolov8l.pt"})  # yolov8m.pt: not on this hub at all
    hub.start()
    yield hub
    hub.stop()


@pytest.fixture(scope="module")
def downloaded(fake_hub, tmp_path_factory):
    """One interpreter, stderr a pipe: auto progress, forced progress, a cache hit, a 404, a 503."""
    tmp = tmp_path_factory.mktemp("download")
    steps = [("yolov8n", None), ("yolov8s", True), ("yolov8n", None), ("yolov8m", None), ("yolov8l", None)]
    before = fake_hub.requests.copy()
    run = run_resolve(steps, hub_env(tmp, fake_hub.url))
    return tmp / "hf" / "hub", run, fake_hub.requests - before


def test_download_lands_in_the_cache(downloaded, fake_hub):
    cache, run, _ = downloaded
    data = fake_hub.files[(YOLO_REPO, "yolov8n.pt")]
    base = repo_folder(cache, YOLO_REPO)
    commit = fake_hub.commit(YOLO_REPO)
    path = Path(run.results["yolov8n"]["path"])
    assert path == base / "snapshots" / commit / "yolov8n.pt"
    assert path.read_bytes() == data
    assert path.resolve() == base / "blobs" / hashlib.sha256(data).hexdigest()  # X-Linked-Etag, not ETag
    assert (base / "refs" / "main").read_text() == commit


def test_a_cached_file_is_used_without_the_network(downloaded, fake_hub):
    _, run, requests = downloaded
    sha = hashlib.sha256(fake_hub.files[(YOLO_REPO, "yolov8n.pt")]).hexdigest()
    # yolov8n was resolved twice: our one-try lookup + hf_hub_download's own HEAD, one GET, then nothing
    assert requests[("HEAD", f"hub:/{YOLO_REPO}/resolve/main/yolov8n.pt")] == 2
    assert requests[("GET", f"cdn:/blobs/{sha}")] == 1  # the second resolve answered from the cache
    assert run.results["yolov8n"]["path"]


def test_hub_errors_are_one_line_after_one_try(downloaded, fake_hub):
    _, run, requests = downloaded
    missing, broken = run.results["yolov8m"]["error"], run.results["yolov8l"]["error"]
    assert missing == (f"{YOLO_REPO}/yolov8m.pt was not found on the Hub at {fake_hub.url} "
                       "(RemoteEntryNotFoundError); " + LOCAL.format("yolov8m"))
    assert broken == (f"the Hub at {fake_hub.url} answered HTTP 503 for {YOLO_REPO}/yolov8l.pt (weights for "
                      "'yolov8l'); try again later, or " + LOCAL.format("yolov8l"))
    assert requests[("HEAD", f"hub:/{YOLO_REPO}/resolve/main/yolov8l.pt")] == 1  # no backoff loop on a 503
    assert "Retrying" not in "".join(run.stderr.values())


def test_progress_bar_only_when_asked_or_on_a_terminal(downloaded, fake_hub, tmp_path):
    _, run, _ = downloaded
    assert not BAR.search(run.stderr["yolov8n"])  # auto, stderr a pipe: quiet
    assert BAR.search(run.stderr["yolov8s"]) and "yolov8s.pt" in run.stderr["yolov8s"]  # progress=True
    term = run_resolve_on_a_terminal([("resnet18", None), ("resnet34", False)], hub_env(tmp_path, fake_hub.url))
    assert "path" in term.results["resnet18"] and "path" in term.results["resnet34"]
    assert BAR.search(term.stderr["resnet18"])  # auto on a terminal: a bar
    assert not BAR.search(term.stderr["resnet34"])  # progress=False: quiet even there


def test_downloaded_file_loads_offline(downloaded, fake_hub):
    cache, run, _ = downloaded
    before = fake_hub.requests.copy()
    # a new process with the file cached: not one request, online (not even huggingface_hub's
    # agent-registry fetch) or with HF_HUB_OFFLINE=1, the endpoint still set in both
    online = run_resolve([("yolov8n", None)], hub_env(cache.parent.parent, fake_hub.url))
    assert online.results["yolov8n"]["path"] == run.results["yolov8n"]["path"]
    assert fake_hub.requests == before
    offline = run_resolve([("yolov8n", None), ("yolov8x", None)],
                          hub_env(cache.parent.parent, fake_hub.url, HF_HUB_OFFLINE="1"))
    assert offline.results["yolov8n"]["path"] == run.results["yolov8n"]["path"]
    assert Path(offline.results["yolov8n"]["path"]).read_bytes() == fake_hub.files[(YOLO_REPO, "yolov8n.pt")]
    assert offline.results["yolov8x"]["error"] == (
        f"weights for 'yolov8x' ({YOLO_REPO}/yolov8x.pt) are not in the cache {cache} and HF_HUB_OFFLINE=1 forbids "
        "downloading; download them once online, or " + LOCAL.format("yolov8x"))
    assert fake_hub.requests == before


def test_prepared_cache_has_the_layout_of_a_real_download(downloaded, fake_hub, tmp_path):
    cache, run, _ = downloaded
    src = tmp_path / "yolov8n.pt"
    src.write_bytes(fake_hub.files[(YOLO_REPO, "yolov8n.pt")])
    mine = prepare_hub_cache(tmp_path / "hub", YOLO_REPO, "yolov8n.pt", src, commit=fake_hub.commit(YOLO_REPO))
    theirs = Path(run.results["yolov8n"]["path"])
    assert mine.relative_to(tmp_path / "hub") == theirs.relative_to(cache)
    assert os.readlink(mine) == os.readlink(theirs)  # same relative link to the same blob name
    assert (repo_folder(tmp_path / "hub", YOLO_REPO) / "refs" / "main").read_text() == \
        (repo_folder(cache, YOLO_REPO) / "refs" / "main").read_text()
    assert (tmp_path / "hub" / "CACHEDIR.TAG").read_text() == (cache / "CACHEDIR.TAG").read_text()


# --- no Hub at all ---------------------------------------------------------------------------------

def test_unreachable_hub_fails_at_once_with_one_line(tmp_path):
    """`mlxnet inpaint` with nothing cached and nothing listening: one line, in seconds, no retries."""
    from PIL import Image

    Image.new("RGB", (16, 16)).save(tmp_path / "img.png")
    Image.new("L", (16, 16), 255).save(tmp_path / "mask.png")
    endpoint = f"http://127.0.0.1:{closed_port()}"
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "mlxnet", "inpaint", str(tmp_path / "img.png"),
                          str(tmp_path / "mask.png"), "-o", str(tmp_path / "out.png")],
                         capture_output=True, text=True, env=hub_env(tmp_path, endpoint), timeout=60)
    seconds = time.perf_counter() - start
    spec = get_spec("lama")
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        f"error: weights for 'lama' ({spec.repo}/{spec.filename}) are not in the cache {tmp_path / 'hf' / 'hub'} "
        f"and the Hub at {endpoint} could not be reached (ConnectError: [Errno 111] Connection refused); "
        "download them once online, or " + LOCAL.format("lama")]
    assert seconds < 10, f"took {seconds:.1f} s: retried?"  # was about 24 s (5 retries with backoff)


def test_silent_hub_fails_after_one_timeout(tmp_path):
    """A host that takes the connection and never answers: one HF_HUB_ETAG_TIMEOUT, not six."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections queue in the kernel; nobody ever answers them
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        run = run_resolve([("yolov8n", None)], hub_env(tmp_path, endpoint, HF_HUB_ETAG_TIMEOUT="1"))
    error = run.results["yolov8n"]["error"]
    assert f"the Hub at {endpoint} could not be reached (ReadTimeout" in error and "\n" not in error
    # 1 s lookup + up to 3 s of huggingface_hub's agent-registry fetch + start-up; retries took minutes
    assert run.seconds < 8, f"took {run.seconds:.1f} s: retried?"


# --- the prepared cache ----------------------------------------------------------------------------

def test_offline_resolve_finds_a_prepared_cache(tmp_path):
    spec = get_spec("yolov8n")
    src = tmp_path / "weights.pt"
    src.write_bytes(b"not really a checkpoint")
    cache = tmp_path / "hf" / "hub"
    prepared = prepare_hub_cache(cache, spec.repo, spec.filename, src)
    env = hub_env(tmp_path, f"http://127.0.0.1:{closed_port()}", HF_HUB_OFFLINE="1")
    run = run_resolve([("yolov8n", None), ("resnet50", None)], env)
    assert Path(run.results["yolov8n"]["path"]) == prepared
    resnet = get_spec("resnet50")
    assert run.results["resnet50"]["error"] == (
        f"weights for 'resnet50' ({resnet.repo}/{resnet.filename}) are not in the cache {cache} and "
        "HF_HUB_OFFLINE=1 forbids downloading; download them once online, or " + LOCAL.format("resnet50"))


def test_prepare_hub_cache_is_read_by_huggingface_hub(tmp_path):
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache

    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"A" * 100)
    b.write_bytes(b"B" * 10)
    cache = tmp_path / "hub"
    pa = prepare_hub_cache(cache, "org/name", "a.bin", a)
    pb = prepare_hub_cache(cache, "org/name", "sub/b.bin", b)  # same revision: same snapshot
    assert pa.parent == pb.parent.parent and pb.read_bytes() == b"B" * 10
    assert try_to_load_from_cache("org/name", "a.bin", cache_dir=cache) == str(pa)
    assert try_to_load_from_cache("org/name", "sub/b.bin", cache_dir=cache) == str(pb)
    assert Path(pa).resolve().name == file_sha256(a)

    pinned = "0123456789abcdef0123456789abcdef01234567"
    pc = prepare_hub_cache(cache, "org/name", "a.bin", a, revision=pinned)  # a commit: no ref written
    assert try_to_load_from_cache("org/name", "a.bin", cache_dir=cache, revision=pinned) == str(pc)
    assert sorted(p.name for p in (repo_folder(cache, "org/name") / "refs").iterdir()) == ["main"]

    info = scan_cache_dir(cache)  # raises on a malformed cache; warnings list what it skipped
    assert not info.warnings
    (repo,) = info.repos
    assert repo.repo_id == "org/name" and repo.nb_files == 2  # two distinct blobs
    assert {r.commit_hash: set(r.refs) for r in repo.revisions} == {pa.parent.name: {"main"}, pinned: set()}
