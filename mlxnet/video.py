"""Video files in and out, through PyAV (FFmpeg's libraries; its wheels bundle them, so nothing
else is installed): frames are decoded to RGB arrays and annotated frames encoded back.

Reading trusts what decoding delivers, not what the header declares: the frame count is only a
progress estimate, nothing is allocated from it, and the frame size is checked against the image
pixel budget (:func:`mlxnet.image.pixel_budget`) before the first frame is decoded. A file FFmpeg
cannot open, without a video stream, that fails mid-stream, or that ends before the frames its
container indexes (a truncated MP4) is a one-line :class:`MlxnetError` naming the file.

Live sources go through the same reader: ``camera:N`` (the N-th camera: AVFoundation on macOS,
V4L2's ``/dev/videoN`` on Linux), stream URLs (``rtsp://``, ``rtmp://``, and ``http(s)://`` ones
naming a video or an HLS/DASH playlist) and ``lavfi:GRAPH`` (FFmpeg's synthetic sources, such as
``lavfi:testsrc=size=640x480:rate=30``: a live source without a camera, which is how the camera
path is tested). A live source states no frame count, has no end of its own (the caller stops it)
and its times count from its first frame.

Writing: H.264 (``libx264``, 4:2:0; 4:4:4 for an odd width or height, which 4:2:0 cannot hold) where
FFmpeg has the encoder, else MPEG-4 Part 2 (``mpeg4``, which every FFmpeg build has). Each frame
gets the next time stamp at the input's frame rate, so the output has the input's size, rate and
frame count. Audio is not copied.
"""
from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, TypeVar
from urllib.parse import urlsplit

import numpy as np

from mlxnet.errors import MlxnetError

if TYPE_CHECKING:
    import av.container

# ultralytics' VID_FORMATS, less GIF (Pillow reads it: an image to the image commands).
VIDEO_EXTENSIONS = frozenset({".asf", ".avi", ".m4v", ".mkv", ".mov", ".mp4", ".mpeg", ".mpg", ".ts",
                              ".wmv", ".webm"})
# Containers that hold H.264 or MPEG-4 video as written here; any other input writes an .mp4.
_KEPT_CONTAINERS = frozenset({".mp4", ".m4v", ".mov", ".mkv", ".avi"})
_FALLBACK_RATE = Fraction(30)  # a stream that states no rate (rare): ultralytics assumes 30 too
# URL schemes that are streams whatever the path says; http(s) URLs are streams when they name a
# video or a playlist (else they are images, downloaded by the image commands).
_STREAM_SCHEMES = frozenset({"rtsp", "rtsps", "rtmp", "rtmps", "srt", "udp", "tcp"})
_PLAYLISTS = frozenset({".m3u8", ".mpd"})
# Seconds FFmpeg may wait to open a stream and then for each read: a dead camera or server ends
# the source with an error instead of hanging the command.
STREAM_TIMEOUT_S = 30.0
T = TypeVar("T")


def is_video_name(name: str | os.PathLike) -> bool:
    """Whether a file name has a video extension (:data:`VIDEO_EXTENSIONS`)."""
    return Path(name).suffix.lower() in VIDEO_EXTENSIONS


def output_name(path: Path) -> Path:
    """The annotated video's path for an input path: the same name where the container can hold
    what is written here, else ``.mp4``."""
    return path if path.suffix.lower() in _KEPT_CONTAINERS else path.with_suffix(".mp4")


@dataclass(frozen=True)
class LiveSource:
    """How FFmpeg opens a live source: the ``url`` (a device, a filter graph, a URL), the input
    ``format`` (None: guessed from the URL), its options, and the name its output takes."""

    url: str
    format: str | None
    options: dict[str, str]
    stem: str


def live_source(source: str | os.PathLike) -> LiveSource | None:
    """The live source that ``source`` names (``camera:N``, ``lavfi:GRAPH``, a stream URL), or
    None for anything else (a file). A ``camera:`` or ``lavfi:`` spec that cannot be one is a
    one-line :class:`MlxnetError`."""
    import sys

    if not isinstance(source, str):
        return None
    head, sep, rest = source.partition(":")
    if sep and head.lower() == "camera":
        if not rest.isdigit():
            raise MlxnetError(f"{source}: a camera is camera:N, N its number (camera:0: the first)")
        if sys.platform == "darwin":
            # AVFoundation's devices by index; FFmpeg's default 29.97 frames/s is refused by most
            # Mac cameras, so ask for 30 (the reader retries without it for one that refuses 30).
            return LiveSource(rest, "avfoundation", {"framerate": "30"}, f"camera{rest}")
        if sys.platform.startswith("linux"):
            return LiveSource(f"/dev/video{rest}", "v4l2", {}, f"camera{rest}")
        raise MlxnetError(f"{source}: cameras are read on macOS (AVFoundation) and Linux (V4L2) only")
    if sep and head.lower() == "lavfi":
        if not rest:
            raise MlxnetError(f"{source}: lavfi:GRAPH needs FFmpeg's filter graph "
                              "(lavfi:testsrc=size=640x480:rate=30)")
        return LiveSource(rest, "lavfi", {}, "lavfi")
    parts = urlsplit(source)
    scheme = parts.scheme.lower()
    if not (parts.netloc and (scheme in _STREAM_SCHEMES or scheme in ("http", "https"))):
        return None
    suffix = Path(parts.path).suffix.lower()
    if scheme in ("http", "https") and not (suffix in VIDEO_EXTENSIONS or suffix in _PLAYLISTS):
        return None  # an image URL (or a page): the image commands' download
    # TCP for RTSP: over UDP (FFmpeg's first try) a lost packet is a torn frame.
    options = {"rtsp_transport": "tcp"} if scheme.startswith("rtsp") else {}
    stem = Path(parts.path).stem or parts.hostname or "stream"
    return LiveSource(source, None, options, "".join(c if c.isalnum() or c in "-_." else "_" for c in stem))


def is_live(source: object) -> bool:
    """Whether ``source`` names a live source (:func:`live_source`); a malformed ``camera:`` /
    ``lavfi:`` spec counts, so that it fails as one, with its own message."""
    try:
        return live_source(source) is not None  # type: ignore[arg-type]
    except MlxnetError:
        return True


def _av():
    try:
        import av
    except ImportError as e:  # the dependency is declared; a broken install still says what is missing
        raise MlxnetError("video needs PyAV: pip install av") from e
    return av


def _one_line(path: os.PathLike | str, error: BaseException, live: LiveSource | None = None) -> MlxnetError:
    """FFmpeg's error as one line naming the file, never FFmpeg's own temporary names."""
    text = " ".join(str(getattr(error, "strerror", None) or error).split()) or type(error).__name__
    for name in ([live.url] if live is not None else []) + [str(path)]:
        text = text.replace(f"'{name}'", "").replace(name, "")
    text = text.strip(" :;") or type(error).__name__
    if live is not None:
        return MlxnetError(f"{path}: cannot open this live source ({live.url}, FFmpeg format "
                           f"{live.format or 'from the URL'}): {text}")
    return MlxnetError(f"{path}: cannot read as a video: {text}")


def _open(av, path: os.PathLike | str, live: LiveSource | None) -> "av.container.InputContainer":
    if live is None:
        return av.open(str(path), mode="r")
    if live.format is not None and live.format not in _input_formats(av):
        raise MlxnetError(f"this FFmpeg (PyAV's) cannot read {live.format} sources")
    try:
        return av.open(live.url, mode="r", format=live.format, options=live.options, timeout=STREAM_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - a camera that refuses the asked rate: once more with its own
        if not live.options.get("framerate"):
            raise
        return av.open(live.url, mode="r", format=live.format, timeout=STREAM_TIMEOUT_S)


def _input_formats(av) -> set[str]:
    # FFmpeg lists a demuxer under all its names at once ("video4linux2,v4l2").
    return {name for entry in av.formats_available for name in entry.split(",")}


@dataclass(frozen=True)
class VideoInfo:
    """What a video's header says: size, frame rate and frame count (0: not stated). The count
    is an estimate for progress bars only."""

    width: int
    height: int
    fps: Fraction
    frames: int


@dataclass(frozen=True)
class Frame:
    """One decoded frame: its index from 0, its time in seconds (None for frames given as arrays,
    which carry no clock), its RGB pixels (H, W, 3) uint8."""

    index: int
    time: float | None
    rgb: np.ndarray


@dataclass
class FrameResult:
    """One frame's result (``YOLO.predict`` / ``YOLO.track`` on a video, the video commands): the
    frame, its detections (boxes, scores, classes, names) and, when tracked, each detection's
    track id (``ids``, in the detections' order; the detections are then the tracked ones)."""

    frame: Frame
    detections: Any
    ids: np.ndarray | None = None

    @property
    def index(self) -> int:
        return self.frame.index

    @property
    def time(self) -> float | None:
        return self.frame.time

    @property
    def image(self) -> np.ndarray:
        return self.frame.rgb

    def to_list(self) -> list[dict]:
        """JSON-ready rows: the detections' rows, each with its ``id`` first when tracked."""
        rows = self.detections.to_list()
        if self.ids is None:
            return rows
        return [{"id": int(i), **row} for i, row in zip(self.ids, rows)]

    def render(self) -> np.ndarray:
        """The frame with its boxes drawn, as the image commands draw them; tracked, each box is
        labelled ``id:N name score`` in its track's colour (one colour per object over time)."""
        det = self.detections
        if self.ids is None:
            return det.render(self.frame.rgb)
        from mlxnet.image import draw_boxes

        labels = [f"id:{i} {det.names[c]} {s:.2f}" for i, c, s in zip(self.ids, det.classes, det.scores)]
        return draw_boxes(self.frame.rgb, det.boxes, labels, colour_ids=[int(i) for i in self.ids])


def is_video_source(source: object) -> bool:
    """Whether a model's ``predict`` input is a video rather than images: a path with a video
    extension, a live source (:func:`live_source`), or an iterator of frames (a generator; a list
    stays a list of images)."""
    from collections.abc import Iterator as AnIterator

    if isinstance(source, (str, os.PathLike)):
        return is_video_name(source) or is_live(source)
    return isinstance(source, AnIterator)


def open_frames(source: str | os.PathLike | Iterable[Any], what: str = "video"
                ) -> tuple[VideoInfo | None, Iterator[Frame]]:
    """The frames of a video file or live source (opened now, so that a bad one fails here, in
    one line naming it; decoded one at a time as the iterator is advanced, and closed when it
    ends or is closed), or of an iterable of images (each checked by
    :func:`mlxnet.image.as_rgb`; ``info`` is then None). Nothing is read ahead: memory holds one
    frame however long the video."""
    if isinstance(source, (str, os.PathLike)):
        reader = VideoReader(source)

        def decoded() -> Iterator[Frame]:
            with reader:
                yield from reader.frames()
        return reader.info, decoded()

    from mlxnet.image import as_rgb

    def given() -> Iterator[Frame]:
        for i, image in enumerate(source):
            yield Frame(i, None, as_rgb(image, f"{what}, frame {i}"))
    return None, given()


_AHEAD_END = object()


def put_unless_stopped(q: queue.Queue, item: object, stop: threading.Event) -> bool:
    """Put ``item`` on a bounded queue unless ``stop`` is set first (the consumer may no longer
    read, so a plain blocking put could wait for ever): whether it was put."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def read_ahead(items: Iterable[T], depth: int) -> Iterator[T]:
    """``items`` produced on a thread, up to ``depth`` ahead of the consumer: decoding (and
    whatever the iterable does per item, the letterbox) overlaps the consumer's work. An error
    of the producer is raised at its place in the order. Closing the iterator (a ``break`` out
    of a ``for`` loop, garbage collection) stops the thread and closes ``items``."""
    q: queue.Queue = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def put(item: object) -> bool:
        return put_unless_stopped(q, item, stop)

    def produce() -> None:
        it = iter(items)
        try:
            for item in it:
                if not put(item):
                    return
            put(_AHEAD_END)
        except BaseException as e:  # noqa: BLE001 - raised on the consumer's side
            put(e)
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()  # the file or stream behind it, on the thread that used it

    def consume() -> Iterator[T]:
        thread = threading.Thread(target=produce, name="mlxnet-read-ahead", daemon=True)
        thread.start()
        try:
            while True:
                item = q.get()
                if item is _AHEAD_END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            thread.join()
    return consume()


class VideoReader:
    """A video file's frames in order (:meth:`frames`); open it with ``with``. Opening reads the
    header (:attr:`info`); an unreadable file raises a one-line :class:`MlxnetError`."""

    def __init__(self, path: os.PathLike | str, max_pixels: int | None = None) -> None:
        from mlxnet.image import pixel_budget

        av = _av()
        live = live_source(path)
        self.live = live is not None
        self.path = Path(path)  # a file's
        self.name = str(path)  # what messages name: the source as given (a URL keeps its //)
        if live is None:
            if not self.path.exists():
                raise MlxnetError(f"{path}: no such video file")
            if self.path.is_dir():
                raise MlxnetError(f"{path} is a folder, not a video file")
        try:
            self._container: "av.container.InputContainer" = _open(av, path, live)
        except Exception as e:  # noqa: BLE001 - any FFmpeg failure to open is "not a video"
            raise _one_line(path, e, live) from None
        try:
            if not self._container.streams.video:
                raise MlxnetError(f"{path}: no video stream in this file")
            stream = self._container.streams.video[0]
            if stream.codec_context is None:  # FFmpeg found the stream but not how it is coded
                raise MlxnetError(f"{path}: the video stream has no codec parameters (a damaged or cut file)")
            stream.thread_type = "AUTO"  # FFmpeg's frame threads: decoding keeps up with a batch
            width, height = int(stream.codec_context.width or 0), int(stream.codec_context.height or 0)
            if width <= 0 or height <= 0:
                raise MlxnetError(f"{path}: the video stream states no frame size")
            budget = pixel_budget(max_pixels)
            if width * height > budget:
                raise MlxnetError(f"{path}: frames of {width}x{height} are over the {budget:,}-pixel budget "
                                  "(MLXNET_MAX_PIXELS); not decoded")
            rate = stream.average_rate or stream.guessed_rate or _FALLBACK_RATE
            if not rate or rate <= 0 or rate > 1000:  # a nonsense rate: write a playable file anyway
                rate = _FALLBACK_RATE
            self.info = VideoInfo(width, height, Fraction(rate), 0 if live else max(0, int(stream.frames or 0)))
            self._stream = stream
        except MlxnetError:
            self._container.close()
            raise
        except Exception as e:  # noqa: BLE001 - a damaged header (no codec context, odd values) is the file's
            self._container.close()
            raise _one_line(path, e) from None
        except BaseException:
            self._container.close()
            raise

    def __enter__(self) -> "VideoReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._container.close()

    def frames(self) -> Iterator[Frame]:
        """Each decoded frame in presentation order. A decoding error, a frame whose size is not
        the header's, or an end before the container's indexed frame count raises a one-line
        :class:`MlxnetError` naming the file and the frame."""
        index = 0
        info = self.info
        start: float | None = None
        try:
            for frame in self._container.decode(self._stream):
                if frame.width != info.width or frame.height != info.height:
                    # The writer and the letterbox shape are fixed by the first frame's size.
                    raise MlxnetError(f"{self.name}: frame {index} is {frame.width}x{frame.height}, "
                                      f"the stream's is {info.width}x{info.height}; size changes are not supported")
                seconds = float(frame.time) if frame.time is not None else float(index / info.fps)
                if self.live:  # a camera's clock starts anywhere (boot, epoch): count from its first frame
                    start = seconds if start is None else start
                    seconds -= start
                yield Frame(index, seconds, frame.to_ndarray(format="rgb24"))
                index += 1
        except MlxnetError:
            raise
        except Exception as e:  # noqa: BLE001 - FFmpeg's error, about this file
            raise MlxnetError(f"{self.name}: cannot decode frame {index}: "
                              f"{' '.join(str(e).split()) or type(e).__name__}") from None
        if index == 0:
            raise MlxnetError(f"{self.name}: no frame could be decoded")
        # An MP4/MOV indexes its frames, so fewer is a truncated file; other containers state none.
        if (not self.live and info.frames and index < info.frames
                and self.path.suffix.lower() in {".mp4", ".m4v", ".mov"}):
            raise MlxnetError(f"{self.name}: truncated: {index} of the {info.frames} frames it indexes decoded")


def _encoder(av, width: int, height: int) -> tuple[str, str]:
    """(codec, pixel format): H.264 where this FFmpeg has libx264, else MPEG-4 Part 2."""
    odd = width % 2 or height % 2
    try:
        av.codec.Codec("libx264", "w")
    except Exception:  # noqa: BLE001 - not in this build
        if odd:
            raise MlxnetError(f"{width}x{height}: an odd frame size needs the H.264 encoder (libx264), "
                              "which this FFmpeg lacks") from None
        return "mpeg4", "yuv420p"
    # 4:2:0 halves both chroma axes, so it cannot hold an odd width or height: 4:4:4 keeps the size.
    return "libx264", "yuv444p" if odd else "yuv420p"


class VideoWriter:
    """Encode RGB frames to ``path`` at ``fps`` (:func:`_encoder`'s codec); used through
    :func:`mlxnet.image.atomic_write`, which gives it a temporary file and renames it when
    :meth:`close` has finished the file."""

    def __init__(self, path: os.PathLike | str, width: int, height: int, fps: Fraction,
                 container_format: str | None = None) -> None:
        av = _av()
        self.codec, pix_fmt = _encoder(av, width, height)
        self._container = av.open(str(path), mode="w", format=container_format)
        try:
            self._stream = self._container.add_stream(self.codec, rate=fps)
            self._stream.width, self._stream.height, self._stream.pix_fmt = width, height, pix_fmt
            # Time stamps count frames: one tick a frame, so every frame is kept, none duplicated.
            self._stream.codec_context.time_base = Fraction(1) / fps
            if self.codec == "libx264":
                self._stream.options = {"crf": "20", "preset": "veryfast"}  # near-lossless, fast
            else:
                self._stream.codec_context.bit_rate = max(1_000_000, width * height * 8)
        except BaseException:
            self._container.close()
            raise
        self._av = av
        self._count = 0

    def write(self, rgb: np.ndarray) -> None:
        frame = self._av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
        frame.pts = self._count
        self._count += 1
        for packet in self._stream.encode(frame):
            self._container.mux(packet)

    def close(self) -> None:
        """Flush the encoder and finish the file."""
        try:
            for packet in self._stream.encode(None):
                self._container.mux(packet)
        finally:
            self._container.close()

    def abort(self) -> None:
        try:
            self._container.close()
        except Exception:  # noqa: BLE001 - the file is being discarded anyway
            pass


def container_format(path: Path) -> str:
    """FFmpeg's muxer name for an output path's extension (the temporary name does not end in it)."""
    return {".mp4": "mp4", ".m4v": "mp4", ".mov": "mov", ".mkv": "matroska", ".avi": "avi"}.get(
        path.suffix.lower(), "mp4")
