"""Live sources (``camera:N``, stream URLs, ``lavfi:GRAPH``) through `mlxnet detect` and `mlxnet
track`. No camera here: FFmpeg's synthetic ``lavfi`` source (``testsrc``) goes down the same path
(:class:`mlxnet.video.VideoReader` opening a named FFmpeg input format, endless, no frame count),
so the camera's own code is only its name-to-device mapping, checked below per platform."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

av = pytest.importorskip("av")
pytest.importorskip("scipy")

from test_video import MLXNET, RANDOM, probe, run  # noqa: E402

from mlxnet.errors import MlxnetError  # noqa: E402
from mlxnet.video import is_live, live_source  # noqa: E402

LAVFI = "lavfi:testsrc=size=160x120:rate=10"
pytestmark = pytest.mark.skipif("lavfi" not in av.formats_available, reason="this FFmpeg has no lavfi")


def test_live_source_names(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    assert live_source("camera:2").url == "/dev/video2"
    assert live_source("camera:2").format == "v4l2" and live_source("camera:2").stem == "camera2"
    monkeypatch.setattr(sys, "platform", "darwin")
    mac = live_source("camera:0")
    assert (mac.url, mac.format, mac.options) == ("0", "avfoundation", {"framerate": "30"})
    monkeypatch.setattr(sys, "platform", "win32")
    with pytest.raises(MlxnetError, match="camera:0: cameras are read on macOS"):
        live_source("camera:0")
    with pytest.raises(MlxnetError, match="camera:front: a camera is camera:N"):
        live_source("camera:front")
    rtsp = live_source("rtsp://cam.local:554/live/main")
    assert (rtsp.format, rtsp.options, rtsp.stem) == (None, {"rtsp_transport": "tcp"}, "main")
    assert live_source("https://example.com/v/clip.mp4?token=1").stem == "clip"
    assert live_source("https://example.com/hls/index.m3u8").stem == "index"
    assert live_source("https://example.com/bus.jpg") is None  # an image URL: downloaded as one
    assert live_source("clip.mp4") is None and live_source(Path("camera:0")) is None
    assert (live_source(LAVFI).url, live_source(LAVFI).format) == ("testsrc=size=160x120:rate=10", "lavfi")
    assert is_live("camera:x") and not is_live("photos/a.jpg")


def test_lavfi_source_with_max_frames_writes_that_many_frames(tmp_path):
    out = run("detect", "--source", LAVFI, "-o", str(tmp_path / "out"), *RANDOM, "--max-frames", "6", "--json",
              "--batch", "4")
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["frame"] for r in records] == list(range(6))
    assert [r["time"] for r in records] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    assert {r["video"] for r in records} == {LAVFI}
    written = tmp_path / "out" / "lavfi.mp4"
    assert records[0]["output"] == str(written)
    assert probe(written) == {"codec": "h264", "size": (160, 120), "fps": 10, "frames": 6}
    # Positional too, with the file named by -o, and tracked.
    target = tmp_path / "cam.mp4"
    out = run("track", LAVFI, "-o", str(target), *RANDOM, "--max-frames", "3", "--vid-stride", "2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{LAVFI}: 3 frames -> {target}"
    assert probe(target) == {"codec": "h264", "size": (160, 120), "fps": 5, "frames": 3}


def test_ctrl_c_finishes_a_live_sources_file(tmp_path):
    """An endless source is stopped by Ctrl+C: the frames written so far make a complete file
    under its final name, and the command ends normally."""
    target = tmp_path / "out" / "live.mp4"
    proc = subprocess.Popen(MLXNET + ["track", LAVFI, "-o", str(target), *RANDOM, "--json", "--batch", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    records = []
    for line in proc.stdout:  # waits for the frames, however slowly they come
        records.append(json.loads(line))
        if len(records) == 4:
            proc.send_signal(signal.SIGINT)
    code, err = proc.wait(), proc.stderr.read()  # type: ignore[union-attr]
    assert code == 0, err
    assert "Traceback" not in err
    assert len(records) >= 4 and [r["frame"] for r in records] == list(range(len(records)))
    assert probe(target)["frames"] == len(records)  # every frame reported is in the file
    assert os.listdir(target.parent) == ["live.mp4"]  # no temporary left


def test_a_live_source_that_cannot_open_is_one_line(tmp_path):
    out = run("detect", "lavfi:nosuchfilter", "-o", str(tmp_path / "out"), *RANDOM)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "error: lavfi:nosuchfilter: cannot open this live source (nosuchfilter, FFmpeg format lavfi): "
        "Filter not found"]
    if sys.platform.startswith("linux") and not os.path.exists("/dev/video97"):
        out = run("detect", "camera:97", "-o", str(tmp_path / "out"), *RANDOM)
        assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1
        assert out.stderr.startswith("error: camera:97: cannot open this live source (/dev/video97, FFmpeg format v4l2)")
    out = run("detect", "-o", str(tmp_path / "out"), *RANDOM)
    assert out.returncode == 1 and out.stderr.strip().startswith("error: no source:")


def test_show_without_a_gui_is_one_line(tmp_path):
    import cv2

    try:  # a GUI build with a display would open a window: this test is for the others
        cv2.namedWindow("probe")
        cv2.destroyWindow("probe")
        pytest.skip("this OpenCV can show windows")
    except cv2.error:
        pass
    for display in ({}, {"DISPLAY": ":99"}):  # no display at all; a display but a headless OpenCV
        env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
        out = subprocess.run(MLXNET + ["detect", LAVFI, "-o", str(tmp_path / "out"), *RANDOM, "--show",
                                       "--max-frames", "2"], capture_output=True, text=True, env={**env, **display})
        assert out.returncode == 1
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: --show: "), out.stderr
    assert not (tmp_path / "out" / "lavfi.mp4").exists()


def test_progress_of_a_live_source_counts_frames_without_an_eta(monkeypatch):
    from rich.console import Console

    from mlxnet import progress

    drawn = io.StringIO()
    monkeypatch.setattr(progress, "progress_console",
                        lambda: Console(file=drawn, force_terminal=True, width=120, color_system=None))
    with progress.progress_bar("track", None, unit="frame") as bar:
        for _ in range(7):
            bar.advance()
    text = drawn.getvalue()
    assert "track" in text and "7" in text and "frame/s" in text
    assert "ETA" not in text and "/?" not in text
