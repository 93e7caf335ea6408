"""Video files in and out, through PyAV (FFmpeg's libraries; its wheels bundle them, so nothing
else is installed): frames are decoded to RGB arrays and annotated frames encoded back.

Reading trusts what decoding delivers, not what the header declares: the frame count is only a
progress estimate, nothing is allocated from it, and the frame size is checked against the image
pixel budget (:func:`mlxnet.image.pixel_budget`) before the first frame is decoded. A file FFmpeg
cannot open, without a video stream, that fails mid-stream, or that ends before the frames its
container indexes (a truncated MP4) is a one-line :class:`MlxnetError` naming the file.

Writing: H.264 (``libx264``, 4:2:0; 4:4:4 for an odd width or height, which 4:2:0 cannot hold) where
FFmpeg has the encoder, else MPEG-4 Part 2 (``mpeg4``, which every FFmpeg build has). Each frame
gets the next time stamp at the input's frame rate, so the output has the input's size, rate and
frame count. Audio is not copied.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

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


def is_video_name(name: str | os.PathLike) -> bool:
    """Whether a file name has a video extension (:data:`VIDEO_EXTENSIONS`)."""
    return Path(name).suffix.lower() in VIDEO_EXTENSIONS


def output_name(path: Path) -> Path:
    """The annotated video's path for an input path: the same name where the container can hold
    what is written here, else ``.mp4``."""
    return path if path.suffix.lower() in _KEPT_CONTAINERS else path.with_suffix(".mp4")


def _av():
    try:
        import av
    except ImportError as e:  # the dependency is declared; a broken install still says what is missing
        raise MlxnetError("video needs PyAV: pip install av") from e
    return av


def _one_line(path: os.PathLike | str, error: BaseException) -> MlxnetError:
    """FFmpeg's error as one line naming the file, never FFmpeg's own temporary names."""
    text = " ".join(str(getattr(error, "strerror", None) or error).split()) or type(error).__name__
    text = text.replace(f"'{path}'", "").replace(str(path), "").strip(" :;") or type(error).__name__
    return MlxnetError(f"{path}: cannot read as a video: {text}")


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
    """One decoded frame: its index from 0, its time in seconds, its RGB pixels (H, W, 3) uint8."""

    index: int
    time: float
    rgb: np.ndarray


class VideoReader:
    """A video file's frames in order (:meth:`frames`); open it with ``with``. Opening reads the
    header (:attr:`info`); an unreadable file raises a one-line :class:`MlxnetError`."""

    def __init__(self, path: os.PathLike | str, max_pixels: int | None = None) -> None:
        from mlxnet.image import pixel_budget

        av = _av()
        self.path = Path(path)
        if not self.path.exists():
            raise MlxnetError(f"{path}: no such video file")
        if self.path.is_dir():
            raise MlxnetError(f"{path} is a folder, not a video file")
        try:
            self._container: "av.container.InputContainer" = av.open(str(self.path), mode="r")
        except Exception as e:  # noqa: BLE001 - any FFmpeg failure to open is "not a video"
            raise _one_line(path, e) from None
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
            self.info = VideoInfo(width, height, Fraction(rate), max(0, int(stream.frames or 0)))
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
        try:
            for frame in self._container.decode(self._stream):
                if frame.width != info.width or frame.height != info.height:
                    # The writer and the letterbox shape are fixed by the first frame's size.
                    raise MlxnetError(f"{self.path}: frame {index} is {frame.width}x{frame.height}, "
                                      f"the stream's is {info.width}x{info.height}; size changes are not supported")
                seconds = float(frame.time) if frame.time is not None else float(index / info.fps)
                yield Frame(index, seconds, frame.to_ndarray(format="rgb24"))
                index += 1
        except MlxnetError:
            raise
        except Exception as e:  # noqa: BLE001 - FFmpeg's error, about this file
            raise MlxnetError(f"{self.path}: cannot decode frame {index}: "
                              f"{' '.join(str(e).split()) or type(e).__name__}") from None
        if index == 0:
            raise MlxnetError(f"{self.path}: no frame could be decoded")
        # An MP4/MOV indexes its frames, so fewer is a truncated file; other containers state none.
        if info.frames and index < info.frames and self.path.suffix.lower() in {".mp4", ".m4v", ".mov"}:
            raise MlxnetError(f"{self.path}: truncated: {index} of the {info.frames} frames it indexes decoded")


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
