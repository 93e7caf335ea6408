"""Video through `mlxnet detect` and `mlxnet track`: synthetic clips made here with PyAV (coloured
rectangles moving on a grey ground), seeded random YOLO weights (`--weights random`) with a low
threshold so that frames have detections. What is checked: the output's size, rate, frame count
and codec, one JSON line per frame, folders mixing images and videos, bad and truncated videos
(one line, no output, the others carry on), the pixel budget against the header's frame size,
and tracking's ids, end to end through the frame pipeline."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

av = pytest.importorskip("av")
pytest.importorskip("scipy")

MLXNET = [sys.executable, "-m", "mlxnet"]
RED, GREEN = (220, 30, 30), (30, 200, 40)


def rectangles(t: int, width: int, height: int) -> tuple[np.ndarray, list[tuple[int, list[int]]]]:
    """Frame ``t``: a red box moving right and a green box moving left (they cross), and their
    true boxes (object, xyxy)."""
    frame = np.full((height, width, 3), 90, np.uint8)
    bw, bh = width // 5, height // 3
    red = [2 + 4 * t, height // 5, 2 + 4 * t + bw, height // 5 + bh]
    green = [width - 2 - bw - 3 * t, height // 3, width - 2 - 3 * t, height // 3 + bh]
    frame[red[1]:red[3], max(red[0], 0):red[2]] = RED
    frame[green[1]:green[3], max(green[0], 0):green[2]] = GREEN
    return frame, [(0, red), (1, green)]


def make_video(path: Path, frames: int = 12, width: int = 128, height: int = 96, fps: int = 24,
               codec: str = "libx264", faststart: bool = False) -> Path:
    # faststart: the index (moov) before the frames, as streamed files have it; a cut file then
    # opens, and says how many frames it should have had.
    container = av.open(str(path), "w", options={"movflags": "faststart"} if faststart else {})
    stream = container.add_stream(codec, rate=Fraction(fps))
    stream.width, stream.height = width, height
    stream.pix_fmt = "yuv420p" if width % 2 == 0 and height % 2 == 0 else "yuv444p"
    for t in range(frames):
        for packet in stream.encode(av.VideoFrame.from_ndarray(rectangles(t, width, height)[0], format="rgb24")):
            container.mux(packet)
    for packet in stream.encode(None):
        container.mux(packet)
    container.close()
    return path


def probe(path: Path) -> dict:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        decoded = sum(1 for _ in container.decode(stream))
        return {"codec": stream.codec_context.name, "size": (stream.width, stream.height),
                "fps": stream.average_rate, "frames": decoded}


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(MLXNET + list(args), capture_output=True, text=True, env={**os.environ, **(env or {})})


RANDOM = ["--weights", "random", "--conf", "0.01", "--imgsz", "128", "--max-det", "20"]


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return make_video(tmp_path_factory.mktemp("in") / "clip.mp4")


def test_detect_writes_every_frame_at_the_same_size_rate_and_count(clip, tmp_path):
    out = run("detect", str(clip), "-o", str(tmp_path / "out"), *RANDOM, "--batch", "4", "--json")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["frame"] for r in lines] == list(range(12))
    assert lines[3]["time"] == pytest.approx(3 / 24, abs=1e-3)
    assert {r["video"] for r in lines} == {str(clip)} and any(r["detections"] for r in lines)
    assert all("id" not in d for r in lines for d in r["detections"])
    written = tmp_path / "out" / "clip.mp4"
    assert lines[0]["output"] == str(written)
    assert probe(written) == {"codec": "h264", "size": (128, 96), "fps": 24, "frames": 12}
    assert oct(written.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["clip.mp4"]  # no temporary left


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_odd_size_one_file_output_and_text_line(tmp_path):
    source = make_video(tmp_path / "odd.mkv", frames=5, width=95, height=63, fps=10)
    target = tmp_path / "res" / "odd_out.mp4"
    out = run("detect", str(source), "-o", str(target), *RANDOM)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{source}: 5 frames -> {target}"
    assert probe(target) == {"codec": "h264", "size": (95, 63), "fps": 10, "frames": 5}


def test_folder_mixes_images_and_videos_and_bad_videos_fail_alone(tmp_path):
    from PIL import Image

    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    make_video(folder / "sub" / "a.mp4", frames=6)
    make_video(folder / "b.avi", frames=4, codec="mpeg4")
    Image.fromarray(rectangles(0, 64, 64)[0]).save(folder / "still.png")
    (folder / "broken.mp4").write_bytes(b"not a video at all\n" * 10)
    whole = make_video(tmp_path / "whole.mp4", frames=20, faststart=True)
    data = whole.read_bytes()
    (folder / "cut.mp4").write_bytes(data[:len(data) * 2 // 3])  # a download stopped part way
    out = run("detect", str(folder), "-o", str(tmp_path / "out"), *RANDOM, "--json")
    assert out.returncode == 1
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and all(len(e) < 300 for e in errors), out.stderr
    assert "Traceback" not in out.stderr
    assert any(str(folder / "broken.mp4") in e for e in errors)
    assert any(str(folder / "cut.mp4") in e and "truncated:" in e and "of the 20 frames" in e for e in errors)
    assert "2 of 4 videos failed" in out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert sum(1 for r in records if r.get("image") == str(folder / "still.png")) == 1
    assert sum(1 for r in records if r.get("video") == str(folder / "sub" / "a.mp4") and "frame" in r) == 6
    assert {r["video"] for r in records if "error" in r and "video" in r} == {str(folder / "broken.mp4"),
                                                                              str(folder / "cut.mp4")}
    written = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*"))
    assert written == ["b.avi", "still.png", "sub", "sub/a.mp4"]  # nothing for the failed videos
    assert probe(tmp_path / "out" / "b.avi")["frames"] == 4


def test_frame_size_over_the_pixel_budget_is_refused_before_decoding(clip, tmp_path):
    out = run("detect", str(clip), "-o", str(tmp_path / "out"), *RANDOM, env={"MLXNET_MAX_PIXELS": "5000"})
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"error: {clip}: frames of 128x96 are over the 5,000-pixel budget (MLXNET_MAX_PIXELS); not decoded"]
    assert not (tmp_path / "out" / "clip.mp4").exists()


def test_missing_video_and_output_over_input(clip, tmp_path):
    out = run("detect", str(tmp_path / "nope.mp4"), "-o", str(tmp_path / "out"), *RANDOM)
    assert out.returncode == 1 and out.stderr.strip() == f"error: {tmp_path / 'nope.mp4'}: no such video file"
    out = run("detect", str(clip), "-o", str(clip.parent), *RANDOM)
    assert out.returncode == 1 and "overwrite the input" in out.stderr and len(out.stderr.splitlines()) == 1


def test_track_cli_writes_ids(clip, tmp_path):
    out = run("track", str(clip), "-o", str(tmp_path / "out"), *RANDOM, "--json")
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(records) == 12
    ids = [d["id"] for r in records for d in r["detections"]]
    assert ids and all(isinstance(i, int) and i >= 1 for i in ids)
    assert probe(tmp_path / "out" / "clip.mp4")["frames"] == 12
    refused = run("track", str(Path(__file__).parent / "fixtures" / "yolo" / "bus.jpg"), "-o", str(tmp_path), *RANDOM)
    assert refused.returncode == 1 and "no video file" in refused.stderr


# --- End to end with a detector that sees the rectangles: the ids must follow the objects -------

@dataclass
class FakeDetections:
    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray
    names: tuple[str, ...] = ("red", "green")

    def to_list(self) -> list[dict]:
        return [{"box": [float(v) for v in b], "score": float(s), "class": int(c), "name": self.names[c]}
                for b, s, c in zip(self.boxes, self.scores, self.classes)]

    def render(self, image: np.ndarray) -> np.ndarray:
        return image.copy()


def colour_boxes(rgb: np.ndarray) -> FakeDetections:
    """Where the red and green pixels are: the one box of each colour, if seen."""
    boxes, classes = [], []
    for c, colour in enumerate((RED, GREEN)):
        hit = np.all(np.abs(rgb.astype(int) - colour) < 40, axis=2)
        ys, xs = np.nonzero(hit)
        if len(xs) > 20:
            boxes.append([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
            classes.append(c)
    return FakeDetections(np.array(boxes, np.float64).reshape(-1, 4), np.full(len(boxes), 0.9),
                          np.array(classes, np.int64))


def test_tracking_end_to_end_keeps_one_id_per_object(tmp_path, capsys):
    from mlxnet.commands import video
    from mlxnet.commands.images import Job, Source

    source = make_video(tmp_path / "cross.mp4", frames=24, width=160, height=96)
    job = Job(Source(str(source), Path("cross.mp4")), (tmp_path / "out" / "cross.mp4",))
    failed = video.run_videos([job], batch=5, what="track", as_json=True, model=lambda: None,
                              prepare=lambda rgb: rgb,
                              predict=lambda _, frames: [colour_boxes(f) for f in frames], track=True)
    assert failed == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["frame"] for r in records] == list(range(24))
    by_class: dict[int, set[int]] = {0: set(), 1: set()}
    for r in records:
        for d in r["detections"]:
            by_class[d["class"]].add(d["id"])
    assert len(by_class[0]) == 1 and len(by_class[1]) == 1 and by_class[0] != by_class[1]
    assert probe(tmp_path / "out" / "cross.mp4") == {"codec": "h264", "size": (160, 96), "fps": 24, "frames": 24}


def test_vid_stride_keeps_every_nth_frame_and_the_duration(clip, tmp_path):
    out = run("detect", str(clip), "-o", str(tmp_path / "out"), *RANDOM, "--vid-stride", "3", "--json")
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["frame"] for r in records] == [0, 3, 6, 9]  # the input's frame numbers and times
    assert records[1]["time"] == pytest.approx(3 / 24, abs=1e-3)
    assert probe(tmp_path / "out" / "clip.mp4") == {"codec": "h264", "size": (128, 96), "fps": 8, "frames": 4}


def test_weights_that_do_not_load_end_the_command_once(clip, tmp_path):
    other = make_video(tmp_path / "other.mp4", frames=3)
    out = run("detect", str(clip), str(other), "-o", str(tmp_path / "out"), "--weights", str(tmp_path / "none.pt"))
    assert out.returncode == 1
    assert len(out.stderr.strip().splitlines()) == 1 and "none.pt" in out.stderr, out.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_one_video_to_an_image_name_is_refused(clip, tmp_path):
    out = run("detect", str(clip), "-o", str(tmp_path / "frame.png"), *RANDOM)
    assert out.returncode == 1 and out.stderr.strip().startswith(f"error: {tmp_path / 'frame.png'}: a video's output")
    assert not (tmp_path / "frame.png").exists()
