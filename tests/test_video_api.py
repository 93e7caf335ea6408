"""The Python API on video: ``YOLO.predict`` on a video path, a live source or an iterator of frames
yields one :class:`mlxnet.video.FrameResult` per frame, lazily (a long video is never held in
memory), each frame's detections those of the frame run as an image; ``YOLO.track`` yields the
same frames with ByteTrack's ids. Seeded YOLOv8n weights at a small size: fast, with boxes."""
from __future__ import annotations

import itertools
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("av")
pytest.importorskip("scipy")

from test_video import make_video  # noqa: E402

from mlxnet.errors import MlxnetError  # noqa: E402
from mlxnet.models import yolo  # noqa: E402
from mlxnet.tracking import ByteTracker  # noqa: E402
from mlxnet.video import FrameResult, VideoReader  # noqa: E402

OPTIONS = {"imgsz": 128, "conf": 0.25}


@pytest.fixture(scope="module")
def det() -> yolo.YOLO:
    return yolo.YOLO(yolo.seeded("n"))


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return make_video(tmp_path_factory.mktemp("api") / "clip.mp4", frames=10)


def decoded(path: Path) -> list[np.ndarray]:
    with VideoReader(path) as reader:
        return [f.rgb for f in reader.frames()]


def same(a, b) -> None:
    np.testing.assert_allclose(a.boxes, b.boxes, atol=1e-3)
    np.testing.assert_allclose(a.scores, b.scores, atol=1e-5)
    np.testing.assert_array_equal(a.classes, b.classes)


@pytest.mark.parametrize("batch", [1, 4])
def test_predict_on_a_video_path_yields_each_frame_as_an_image_gets_it(det, clip, batch):
    results = det.predict(str(clip), batch=batch, **OPTIONS)
    assert iter(results) is results  # a generator, not a list
    results = list(results)
    frames = decoded(clip)
    assert [r.index for r in results] == list(range(10))
    assert results[3].time == pytest.approx(3 / 24, abs=1e-3)
    assert all(isinstance(r, FrameResult) and r.ids is None for r in results)
    # Each batch of frames as the same list of images (a list runs as one batch: the same sums;
    # a different batch may round differently, which reorders the near-ties of random weights).
    for start in range(0, 10, batch):
        chunk = frames[start:start + batch]
        for r, rgb, image in zip(results[start:start + batch], chunk, det.predict(chunk, **OPTIONS)):
            np.testing.assert_array_equal(r.image, rgb)
            same(r.detections, image)
    assert any(len(r.detections) for r in results)
    assert results[0].render().shape == frames[0].shape


def test_predict_on_a_frame_iterator_pulls_frames_only_as_results_are_taken(det):
    pulled: list[int] = []

    def frames():
        for i in range(1000):  # long: must never be read whole
            pulled.append(i)
            yield np.full((96, 128, 3), (i * 7) % 255, np.uint8)

    results = det.predict(frames(), batch=3, **OPTIONS)
    assert pulled == []  # nothing read before the first result is asked for
    first = next(results)
    assert first.index == 0 and first.time is None and len(pulled) == 3  # one batch
    rest = list(itertools.islice(results, 4))
    assert [r.index for r in rest] == [1, 2, 3, 4] and len(pulled) == 6
    batch = [np.full((96, 128, 3), (i * 7) % 255, np.uint8) for i in (3, 4, 5)]
    same(rest[3].detections, det.predict(batch, **OPTIONS)[1])  # frame 4, in the batch of frames 3-5
    # A list is still a list of images, with a list of results.
    assert isinstance(det.predict([np.zeros((64, 64, 3), np.uint8)] * 2, **OPTIONS), list)


def test_a_long_video_is_read_only_a_few_frames_ahead(det, tmp_path, monkeypatch):
    long = make_video(tmp_path / "long.mp4", frames=60, width=64, height=48)
    read: list[int] = []
    frames = VideoReader.frames

    def counting(self):
        for frame in frames(self):
            read.append(frame.index)
            yield frame
    monkeypatch.setattr(VideoReader, "frames", counting)
    results = det.predict(str(long), batch=2, **OPTIONS)
    assert next(results).index == 0
    # The read-ahead window (2 x batch, at least 4) plus the batch being run and the one in hand:
    # whatever the threads' timing, never the whole video.
    assert len(read) <= 4 + 2 + 2
    results.close()  # a `break` out of the loop: the reader thread stops and the file is closed
    assert not [t for t in threading.enumerate() if t.name == "mlxnet-read-ahead"]


def test_track_yields_the_ids_bytetrack_gives_the_predictions(det, clip):
    tracked = list(det.track(str(clip), batch=3, **OPTIONS))
    tracker = ByteTracker(frame_rate=24)  # the clip's rate: the lost-track buffer scales with it
    expected = [tracker.update_detections(r.detections) for r in det.predict(str(clip), batch=3, **OPTIONS)]
    assert [r.index for r in tracked] == list(range(10))
    for r, (sub, ids) in zip(tracked, expected):
        np.testing.assert_array_equal(r.ids, ids)
        same(r.detections, sub)
    assert any(len(r.ids) for r in tracked)
    rows = tracked[-1].to_list()
    assert all(list(row)[0] == "id" for row in rows)
    # Frames given as a list or an iterator track too (at 30 frames/s).
    frames = decoded(clip)
    for source in (frames, iter(frames)):
        again = list(det.track(source, batch=3, **OPTIONS))
        assert [r.ids.tolist() for r in again] == [r.ids.tolist() for r in tracked]


def test_a_live_source_through_the_api(det):
    results = det.predict("lavfi:testsrc=size=160x120:rate=10", **OPTIONS)
    first = list(itertools.islice(results, 3))
    results.close()
    assert [r.index for r in first] == [0, 1, 2]
    assert [r.time for r in first] == pytest.approx([0.0, 0.1, 0.2])
    assert first[0].image.shape == (120, 160, 3)


def test_bad_sources_are_one_line_errors_naming_them(det, tmp_path):
    with pytest.raises(MlxnetError, match=r"^.*nope\.mp4: no such video file$"):
        det.predict(str(tmp_path / "nope.mp4"))  # at the call, not at the first frame
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video\n" * 20)
    with pytest.raises(MlxnetError, match="broken.mp4: cannot read as a video"):
        det.track(broken)
    frames = iter([np.zeros((32, 32, 3), np.uint8), np.zeros((32, 32), np.uint8)])
    results = det.predict(frames, **OPTIONS)
    assert next(results).index == 0
    with pytest.raises(MlxnetError, match=r"^YOLO.predict, frame 1: "):
        next(results)
    with pytest.raises(MlxnetError, match="^YOLO.track: expected a video path"):
        det.track(42)
    with pytest.raises(MlxnetError, match="batch must be at least 1"):
        det.predict(iter([]), batch=0)
