"""The image commands' pipeline (mlxnet/commands/pipeline.py): reading overlaps the model, the
model overlaps writing, a batch never mixes shapes, and reports keep the input order.

No timed assertions: overlap is shown by one stage waiting for an event that only a concurrent
stage can set (the waits' timeouts only keep a broken pipeline from hanging the test run)."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest
import typer

from mlxnet.commands.images import Job, Source
from mlxnet.commands.pipeline import run_jobs, window_for

PATIENCE_S = 20.0  # a deadlock guard, not a measurement


def make_jobs(tmp_path: Path, n: int) -> list[Job]:
    jobs = []
    for i in range(n):
        path = tmp_path / f"{i:03d}.png"
        path.write_bytes(b"")  # exists: the pipeline's missing-input check passes
        jobs.append(Job(Source(str(path), Path(path.name))))
    return jobs


def index(job: Job) -> int:
    return int(Path(job.name).stem)


def test_reading_runs_while_the_model_runs(tmp_path, capsys):
    """The model's first batch waits until the next image's reading has started: a pipeline that
    reads only between batches never starts it, and the first batch reports the timeout."""
    jobs = make_jobs(tmp_path, 6)
    second_read_started = threading.Event()
    overlapped: list[bool] = []

    def prepare(job: Job) -> int:
        if index(job) == 1:
            second_read_started.set()
        return index(job)

    def predict(model, items: list[int]) -> list[int]:
        if items == [0]:
            overlapped.append(second_read_started.wait(PATIENCE_S))
        return items

    run_jobs(jobs, 1, what="t", as_json=False, load=lambda: "m", prepare=prepare, predict=predict,
             finish=lambda job, item, result: ({}, str(result)))
    assert overlapped == [True]
    assert capsys.readouterr().out.split() == [str(i) for i in range(6)]


def test_writing_runs_while_the_model_runs(tmp_path, capsys):
    """Writing the first image waits until the model has started the second batch: a pipeline
    that writes before running the next batch never starts it."""
    jobs = make_jobs(tmp_path, 4)
    second_batch_started = threading.Event()
    overlapped: list[bool] = []

    def predict(model, items: list[int]) -> list[int]:
        if items == [1]:
            second_batch_started.set()
        return items

    def finish(job: Job, item: int, result: int) -> tuple[dict, str]:
        if result == 0:
            overlapped.append(second_batch_started.wait(PATIENCE_S))
        return {}, str(result)

    run_jobs(jobs, 1, what="t", as_json=False, load=lambda: "m", prepare=index, predict=predict, finish=finish)
    assert overlapped == [True]
    assert capsys.readouterr().out.split() == ["0", "1", "2", "3"]


@pytest.mark.parametrize("batch", [1, 2, 3, 8])
def test_batches_hold_one_shape_and_reports_keep_input_order(tmp_path, capsys, batch):
    """Images of three shapes, interleaved: every batch holds one shape, batches are full except
    a shape's last, and the JSON lines come in input order."""
    shapes = ["640x480", "480x640", "640x640"]
    jobs = make_jobs(tmp_path, 23)
    shape_of = {i: shapes[(i * 7 + i // 3) % 3] for i in range(len(jobs))}
    batches: list[list[int]] = []

    def predict(model, items: list[int]) -> list[str]:
        batches.append(list(items))
        return [shape_of[i] for i in items]

    run_jobs(jobs, batch, what="t", as_json=True, load=lambda: "m", prepare=index, predict=predict,
             finish=lambda job, item, result: ({"shape": result, "i": item}, ""), group=lambda i: shape_of[i])
    assert all(len({shape_of[i] for i in b}) == 1 for b in batches)
    assert sorted(i for b in batches for i in b) == list(range(len(jobs)))
    assert max(len(b) for b in batches) <= batch
    # With a window of several batches, a shape's images wait for company: at most one short
    # batch per shape per window's worth of images.
    short = [b for b in batches if len(b) < batch]
    assert len(short) <= len(shapes) * (len(jobs) // window_for(batch) + 1)
    lines = capsys.readouterr().out.splitlines()
    assert [int(line.split('"i": ')[1].rstrip("}")) for line in lines] == list(range(len(jobs)))


def test_the_first_image_does_not_wait_for_a_full_batch(tmp_path, capsys):
    """The first result comes after one image's forward, whatever the batch size; then batches
    are full again."""
    jobs = make_jobs(tmp_path, 9)
    batches: list[list[int]] = []

    def predict(model, items: list[int]) -> list[int]:
        batches.append(list(items))
        return items

    run_jobs(jobs, 4, what="t", as_json=False, load=lambda: "m", prepare=index, predict=predict,
             finish=lambda job, item, result: ({}, str(item)))
    assert batches == [[0], [1, 2, 3, 4], [5, 6, 7, 8]]


def test_memory_holds_the_window(tmp_path, capsys):
    """Never more than the window's images read and not yet written, however fast the reading."""
    jobs = make_jobs(tmp_path, 40)
    live, most = set(), [0]
    lock = threading.Lock()

    def prepare(job: Job) -> int:
        with lock:
            live.add(index(job))
            most[0] = max(most[0], len(live))
        return index(job)

    def finish(job: Job, item: int, result: int) -> tuple[dict, str]:
        with lock:
            live.discard(item)
        return {}, str(item)

    run_jobs(jobs, 2, what="t", as_json=False, load=lambda: "m", prepare=prepare,
             predict=lambda m, items: items, finish=finish, group=lambda i: i % 5)
    # read ahead: the window; waiting to be written: at most the writer's queue and one batch.
    assert 2 < most[0] <= 3 * window_for(2)
    assert capsys.readouterr().out.split() == [str(i) for i in range(40)]


def test_a_failed_load_ends_the_command_and_stops_the_threads(tmp_path):
    jobs = make_jobs(tmp_path, 10)
    before = threading.active_count()

    def load():
        raise RuntimeError("no weights")

    with pytest.raises(RuntimeError, match="no weights"):
        run_jobs(jobs, 2, what="t", as_json=False, load=load, prepare=index, predict=lambda m, items: items,
                 finish=lambda job, item, result: ({}, ""))
    assert threading.active_count() == before


def test_a_failing_reader_fails_its_image_only(tmp_path, capsys):
    jobs = make_jobs(tmp_path, 5)

    def prepare(job: Job) -> int:
        if index(job) == 2:
            raise OSError("disk read error")
        return index(job)

    with pytest.raises(typer.Exit):
        run_jobs(jobs, 2, what="t", as_json=False, load=lambda: "m", prepare=prepare,
                 predict=lambda m, items: items, finish=lambda job, item, result: ({}, str(item)))
    out, err = capsys.readouterr()
    assert out.split() == ["0", "1", "3", "4"]
    assert f"error: {jobs[2].name}: OSError: disk read error" in err


def test_writers_side_by_side_report_in_input_order(tmp_path, capsys):
    """With 3 writers: image 0's finish waits until image 1's has started (one writer alone never
    starts it); the lines keep the input order, and a failing finish fails its image only, reported
    in its place."""
    jobs = make_jobs(tmp_path, 12)
    second_started = threading.Event()
    overlapped: list[bool] = []

    def finish(job, item, result):
        if result == 1:
            second_started.set()
        if result == 0:
            overlapped.append(second_started.wait(PATIENCE_S))
        if result == 7:
            raise ValueError("seven")
        return {}, str(result)

    with pytest.raises(typer.Exit):
        run_jobs(jobs, 2, what="t", as_json=False, load=lambda: "m", prepare=index,
                 predict=lambda model, items: items, finish=finish, writers=3)
    assert overlapped == [True]
    captured = capsys.readouterr()
    assert captured.out.split() == [str(i) for i in range(12) if i != 7]
    assert "007.png" in captured.err and "seven" in captured.err and "1 of 12 images failed" in captured.err


@pytest.mark.gpu
def test_a_folder_of_many_letterbox_shapes_runs_to_the_end_on_the_gpu(tmp_path):
    """Fourteen letterbox shapes at two batch sizes build far more cuDNN convolution plans than
    MLX keeps by default (its lifetime count would stop the process): the command's GPU tuning
    keeps the run going, every image reported, in input order."""
    import json
    import os
    import subprocess
    import sys

    import numpy as np

    from mlxnet.image import save_image

    rng = np.random.default_rng(0)
    folder = tmp_path / "photos"
    sizes = [(640, 640 - 32 * k) for k in range(7)] + [(640 - 32 * k, 640) for k in range(1, 8)]
    names = []
    for i, (h, w) in enumerate(sizes * 3):
        names.append(str(folder / f"{i:02d}.png"))
        save_image(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), names[-1])
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLX_CUDA_CONV_CACHE_SIZE", "MLX_ENABLE_CACHE_THRASHING_CHECK")}
    out = subprocess.run([sys.executable, "-m", "mlxnet", "detect", str(folder), "-o", str(tmp_path / "out"),
                          "--weights", "random", "--model", "yolov8n", "--batch", "2", "--json", "--device", "gpu"],
                         capture_output=True, text=True, env=env, timeout=500)
    assert out.returncode == 0, out.stderr[-2000:]
    assert [json.loads(line)["image"] for line in out.stdout.splitlines()] == names


def _spied_switches(monkeypatch) -> list[tuple[str, bool]]:
    """The list that every later use_kernels / use_compile switch is appended to."""
    import mlxnet

    switched: list[tuple[str, bool]] = []
    for name in ("use_kernels", "use_compile"):
        def spy(enabled: bool, _name=name, _real=getattr(mlxnet, name)):
            switched.append((_name, enabled))
            return _real(enabled)
        monkeypatch.setattr(mlxnet, name, spy)
    return switched


def _switches(monkeypatch, tmp_path, *device: str) -> list[tuple[str, bool]]:
    """The use_kernels / use_compile switches `mlxnet detect` makes on one small image."""
    import numpy as np
    from typer.testing import CliRunner

    from mlxnet.cli import app
    from mlxnet.image import save_image

    tmp_path.mkdir(parents=True, exist_ok=True)
    save_image(np.zeros((64, 96, 3), np.uint8), tmp_path / "a.png")
    switched = _spied_switches(monkeypatch)
    result = CliRunner().invoke(app, ["detect", str(tmp_path / "a.png"), "-o", str(tmp_path / "out"), "--weights",
                                      "random", "--imgsz", "64", *device])
    assert result.exit_code == 0, result.output
    return switched


def test_detect_keeps_mlxnets_kernels_off_cuda(monkeypatch, tmp_path):
    monkeypatch.delenv("MLXNET_KERNELS", raising=False)
    monkeypatch.delenv("MLXNET_COMPILE", raising=False)
    assert _switches(monkeypatch, tmp_path, "--device", "cpu") == []


@pytest.mark.gpu
def test_detect_on_cuda_compiles_no_gpu_code_unless_told(monkeypatch, tmp_path):
    """On CUDA, MLX compiles fused kernels once per machine and mlxnet's own kernels in every
    process, seconds before the first result: the command runs MLX's built-in ops eagerly there,
    unless MLXNET_KERNELS / MLXNET_COMPILE say otherwise."""
    import mlx.core as mx

    if not mx.cuda.is_available():
        pytest.skip("a CUDA build's choice")
    monkeypatch.delenv("MLXNET_KERNELS", raising=False)
    monkeypatch.delenv("MLXNET_COMPILE", raising=False)
    assert _switches(monkeypatch, tmp_path, "--device", "gpu") == [("use_kernels", False), ("use_compile", False)]
    monkeypatch.setenv("MLXNET_KERNELS", "1")
    assert _switches(monkeypatch, tmp_path / "again", "--device", "gpu") == [("use_compile", False)]
    monkeypatch.setenv("MLXNET_COMPILE", "1")
    assert _switches(monkeypatch, tmp_path / "third", "--device", "gpu") == []


# segment's case runs SAM's definitions twice (11 s on 2 cores): with the slow tests.
@pytest.mark.parametrize("command", ["classify", pytest.param("segment", marks=pytest.mark.slow), "inpaint"])
def test_every_image_command_compiles_no_gpu_code_on_cuda(monkeypatch, tmp_path, command):
    """The choice lives in the shared pipeline: each image command makes it where the back end is
    CUDA (stood in for here), and none where it is not."""
    import numpy as np
    from typer.testing import CliRunner

    import mlxnet
    from mlxnet.cli import app
    from mlxnet.image import save_image

    monkeypatch.delenv("MLXNET_KERNELS", raising=False)
    monkeypatch.delenv("MLXNET_COMPILE", raising=False)
    save_image(np.zeros((64, 96, 3), np.uint8), tmp_path / "a.png")
    save_image(np.full((64, 96), 255, np.uint8), tmp_path / "m.png")
    argv = {"classify": ["classify", str(tmp_path / "a.png")],
            "segment": ["segment", str(tmp_path / "a.png"), "-o", str(tmp_path / "out"), "-p", "10,10"],
            "inpaint": ["inpaint", str(tmp_path / "a.png"), str(tmp_path / "m.png"), "-o", str(tmp_path / "o.png")]}
    switched = _spied_switches(monkeypatch)
    for backend, expected in (("cpu", []), ("cuda", [("use_kernels", False), ("use_compile", False)])):
        switched.clear()
        monkeypatch.setattr(mlxnet, "backend", lambda b=backend: b)
        result = CliRunner().invoke(app, [*argv[command], "--weights", "random", "--device", "cpu"])
        assert result.exit_code == 0, result.output
        assert switched == expected, backend
