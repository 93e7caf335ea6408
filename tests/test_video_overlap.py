"""The video pipeline (mlxnet/commands/video.py) overlaps its stages as the image pipeline does:
frames are decoded (and letterboxed) ahead of the model on a thread, the model runs ``--batch``
frames at a time, and the annotated frames are drawn and encoded behind it on another thread.

No timed assertions: overlap is shown by one stage waiting for an event that only a concurrent
stage can set (the waits' timeouts only keep a broken pipeline from hanging the test run)."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("av")

from test_video import FakeDetections, make_video, probe  # noqa: E402

from mlxnet.commands import video  # noqa: E402
from mlxnet.commands.images import Job, Source  # noqa: E402

PATIENCE_S = 20.0  # a deadlock guard, not a measurement


def nothing(rgb: np.ndarray) -> FakeDetections:
    return FakeDetections(np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64))


def job_for(tmp_path: Path, frames: int) -> Job:
    source = make_video(tmp_path / "in.mp4", frames=frames, width=64, height=48)
    return Job(Source(str(source), Path("in.mp4")), (tmp_path / "out" / "in.mp4",))


def test_decoding_runs_ahead_while_the_model_runs(tmp_path, capsys):
    """The model's first batch waits until a frame after that batch has been decoded and
    letterboxed: a pipeline that decodes only between batches never gets there."""
    job = job_for(tmp_path, 12)
    later_frame_prepared = threading.Event()
    prepared = 0
    overlapped: list[bool] = []
    seen: list[int] = []

    def prepare(rgb: np.ndarray) -> np.ndarray:
        nonlocal prepared
        prepared += 1
        if prepared == 5:  # the batch after the first (of 3)
            later_frame_prepared.set()
        return rgb

    def predict(_, frames: list[np.ndarray]) -> list[FakeDetections]:
        if not seen:
            overlapped.append(later_frame_prepared.wait(PATIENCE_S))
        seen.append(len(frames))
        return [nothing(f) for f in frames]

    failed = video.run_videos([job], batch=3, what="t", as_json=True, model=lambda: None, prepare=prepare,
                              predict=predict)
    assert failed == 0 and overlapped == [True]
    assert seen == [3, 3, 3, 3]  # --batch frames per forward
    assert len(capsys.readouterr().out.splitlines()) == 12


def test_encoding_runs_behind_while_the_model_runs(tmp_path, capsys):
    """Drawing and encoding the first frame waits until the model has started its second batch:
    a pipeline that writes before running the next batch never starts it."""
    job = job_for(tmp_path, 6)
    second_batch_started = threading.Event()
    overlapped: list[bool] = []
    batches = 0

    class Waiting(FakeDetections):
        def render(self, image: np.ndarray) -> np.ndarray:  # on the writer thread
            if not overlapped:
                overlapped.append(second_batch_started.wait(PATIENCE_S))
            return image.copy()

    def predict(_, frames: list[np.ndarray]) -> list[FakeDetections]:
        nonlocal batches
        batches += 1
        if batches == 2:
            second_batch_started.set()
        return [Waiting(np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64)) for _ in frames]

    failed = video.run_videos([job], batch=2, what="t", as_json=True, model=lambda: None,
                              prepare=lambda rgb: rgb, predict=predict)
    assert failed == 0 and overlapped == [True]
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["frame"] for r in records] == list(range(6))
    assert probe(tmp_path / "out" / "in.mp4")["frames"] == 6


def test_the_last_short_batch_and_max_frames(tmp_path, capsys):
    job = job_for(tmp_path, 7)
    seen: list[int] = []

    def predict(_, frames):
        seen.append(len(frames))
        return [nothing(f) for f in frames]

    video.run_videos([job], batch=3, what="t", as_json=False, model=lambda: None, prepare=lambda rgb: rgb,
                     predict=predict)
    assert seen == [3, 3, 1]
    seen.clear()
    video.run_videos([job], batch=3, what="t", as_json=False, model=lambda: None, prepare=lambda rgb: rgb,
                     predict=predict, max_frames=4)
    assert seen == [3, 1]
    assert capsys.readouterr().out.splitlines()[-1] == f"{job.name}: 4 frames -> {job.outputs[0]}"
    assert probe(job.outputs[0])["frames"] == 4
