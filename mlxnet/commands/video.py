"""Videos through `mlxnet detect` and `mlxnet track`: which sources are videos, where their outputs
go, and the frame pipeline.

Sources: a file argument with a video extension (:data:`mlxnet.video.VIDEO_EXTENSIONS`) is a video,
and so is a live source (``camera:N``, a stream URL, ``lavfi:GRAPH``: :func:`mlxnet.video.live_source`,
written as ``NAME.mp4`` after its source); folders and patterns yield their videos as well as their images (same rules as images: sorted,
hidden names and the output folder skipped). The images go on through the image pipeline
(:mod:`mlxnet.commands.pipeline`), the videos through :func:`run_videos`.

The frame pipeline overlaps three stages, as the image pipeline does, one video at a time:
a reader thread decodes frames and letterboxes them (a video's frames share one size, so one
letterbox shape: the model traces one input shape per video), up to a window of frames ahead;
the calling thread runs the model on batches of ``--batch`` frames (and the tracker, which needs
frames in order); a writer thread draws the boxes, encodes the annotated video into a temporary
file in the output folder and reports each frame. The file is renamed to its name when the last
frame is encoded; a video that fails (unreadable, truncated, an encoder error) leaves no output,
prints ``error: VIDEO: REASON`` and the other sources carry on.
"""
from __future__ import annotations

import os
import queue
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from mlxnet.commands.images import Job, Source, _pattern_base, expand_inputs, is_pattern, json_line
from mlxnet.errors import MlxnetError
from mlxnet.progress import ProgressBar, progress_bar
from mlxnet.commands.show import Viewer
from mlxnet.commands.quick_start import runtime_compiling_off
from mlxnet.video import FrameResult, is_live, is_video_name, live_source, output_name, put_unless_stopped

_END = object()  # end of a video's frames


class _LoadFailed(Exception):
    """The model could not be loaded: the command's error, not one video's (as for images)."""


class _ReportFailed(Exception):
    """Printing a record failed (stdout closed): not the output file's fault, so kept out of the
    atomic write's "cannot write FILE" wrapping."""


# --- Sources and outputs ---------------------------------------------------------------------------

def _videos_in_folder(folder: str, skip: Path | None) -> list[Source]:
    skip_real = os.path.realpath(skip) if skip is not None else None
    found = []
    for root, dirs, files in os.walk(folder):  # no followlinks: a link to a parent cannot loop
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")
                         and (skip_real is None or os.path.realpath(os.path.join(root, d)) != skip_real))
        for name in sorted(files):
            if not name.startswith(".") and is_video_name(name):
                full = os.path.join(root, name)
                found.append(Source(full, Path(os.path.relpath(full, folder))))
    return found


def _videos_of_pattern(pattern: str, skip: Path | None) -> list[Source]:
    import glob

    base = _pattern_base(pattern)
    skip_real = os.path.realpath(skip) if skip is not None else None
    found = []
    for match in sorted(glob.glob(pattern, recursive=True)):  # hidden names are not matched
        inside = skip_real is not None and os.path.realpath(match).startswith(skip_real.rstrip(os.sep) + os.sep)
        if os.path.isfile(match) and is_video_name(match) and not inside:
            found.append(Source(match, Path(os.path.relpath(match, base))))
    return found


def split_sources(args: Sequence[str], skip: Path | None) -> tuple[list[str], list[Source]]:
    """The arguments that hold images (for :func:`mlxnet.commands.images.expand_inputs`) and
    every video source, each once, in argument order. A folder or pattern with neither is the
    image expansion's error."""
    from mlxnet.commands import remote

    image_args: list[str] = []
    videos: list[Source] = []
    seen: set[str] = set()
    for arg in args:
        live = live_source(arg) if is_live(arg) and not os.path.lexists(arg) else None
        if live is not None:  # camera:N, lavfi:GRAPH, a stream URL: one video, named after its source
            if arg not in seen:
                seen.add(arg)
                videos.append(Source(arg, Path(f"{live.stem}.mp4")))
            continue
        if remote.has_scheme(arg):
            image_args.append(arg)
            continue
        if os.path.isdir(arg):
            found = _videos_in_folder(arg, skip)
        elif is_pattern(arg):
            found = _videos_of_pattern(arg, skip)
        elif is_video_name(arg):
            found = [Source(arg, Path(Path(arg).name))]  # missing or unreadable: fails on its own, later
        else:
            image_args.append(arg)
            continue
        for source in found:
            key = os.path.normcase(os.path.abspath(source.name))
            if key not in seen:
                seen.add(key)
                videos.append(source)
        if os.path.isdir(arg) or is_pattern(arg):
            try:  # the folder's images too; one of only videos is no error
                expand_inputs([arg], skip=skip)
            except MlxnetError:
                if not found:
                    raise
            else:
                image_args.append(arg)
    return image_args, videos


def names_one_video(args: Sequence[str], output: str) -> bool:
    """Whether ``-o`` names the output video itself: one video file argument and an output with
    a video extension that is not a folder. An image extension there is an error: a video cannot
    be written as one image (nor made into a folder of that name)."""
    from mlxnet.image import readable_extensions

    one = len(args) == 1 and (is_video_name(args[0]) or is_live(args[0]))
    if one and not os.path.isdir(output) and os.path.splitext(output)[1].lower() in readable_extensions():
        raise MlxnetError(f"{output}: a video's output is a video (.mp4, .mov, .mkv, .avi) or a folder, "
                          "not an image file")
    return (one and not os.path.isdir(args[0]) and not is_pattern(args[0])
            and not os.path.isdir(output) and not output.endswith(("/", os.sep)) and is_video_name(output))


def video_jobs(sources: Sequence[Source], output: str, one_file: bool) -> list[Job]:
    if one_file:
        return [Job(sources[0], (output_name(Path(output)),))]
    return [Job(source, (output_name(Path(output) / source.rel),)) for source in sources]


def check_video_outputs(jobs: Sequence[Job], others: Sequence[Job] = ()) -> None:
    """Before any work: no two sources write one file, no output is any input, every output's
    folder can be made and written."""
    from mlxnet.commands.images import file_id
    from mlxnet.image import check_output_path

    writer: dict[str, Job] = {}
    for job in [*others, *jobs]:
        for out in job.outputs:
            first = writer.setdefault(os.path.normcase(os.path.realpath(out)), job)
            if first is not job:
                raise MlxnetError(f"{first.name} and {job.name} would both write {out}; "
                                  "rename one or run them separately")
    inputs = {file_id(p): p for job in [*others, *jobs] for p in job.reads if file_id(p) is not None}
    for job in jobs:
        for out in job.outputs:
            clash = inputs.get(file_id(out))  # type: ignore[arg-type]
            check_output_path(out, [*job.reads, *([clash] if clash is not None else [])], kind="file")


# --- Running ---------------------------------------------------------------------------------------

def reader_source(job: Job) -> str | Path:
    """What :class:`mlxnet.video.VideoReader` opens for a job: a live source as given (a URL keeps
    its ``//``), a file by its path."""
    return job.source.name if is_live(job.source.name) else job.source.path


def frame_record(job: Job, result: FrameResult) -> dict:
    time = result.frame.time
    return {"video": job.name, "frame": result.frame.index, "time": None if time is None else round(time, 4),
            "output": str(job.outputs[0]), "detections": result.to_list()}


def make_tracker(fps: float) -> Callable[[Any, Any], FrameResult]:
    """A fresh ByteTrack tracker for one video: a frame and its detections in, the tracked ones
    with their ids out."""
    from mlxnet.tracking import ByteTracker

    tracker = ByteTracker(frame_rate=fps)

    def track(frame: Any, det: Any) -> FrameResult:
        return FrameResult(frame, *tracker.update_detections(det))
    return track


def _run_one(job: Job, *, batch: int, as_json: bool, display: ProgressBar, model: Callable[[], Any],
             prepare: Callable[[np.ndarray], Any], predict: Callable[[Any, list[Any]], Sequence[Any]],
             track: bool, stride: int = 1, max_frames: int | None = None, viewer: Viewer | None = None
             ) -> tuple[int, bool]:
    """One video through the three stages; returns its frame count and whether it was stopped
    (a live source ended by Ctrl+C or the window's q: its file is finished all the same); raises
    its one failure."""
    from mlxnet.image import atomic_write
    from mlxnet.video import VideoReader, VideoWriter, container_format

    target = job.outputs[0]
    reader = VideoReader(reader_source(job))
    window = max(4 * batch, 8)
    decoded: queue.Queue = queue.Queue(maxsize=window)
    to_write: queue.Queue = queue.Queue(maxsize=window)
    stop = threading.Event()
    failure: list[BaseException] = []
    info = reader.info

    def decode() -> None:
        try:
            kept = 0
            for frame in reader.frames():
                if frame.index % stride:
                    display.advance()  # decoded (the bar counts the input's frames), not run
                    continue
                # The letterbox runs here, with the decoding: host work the model need not wait for.
                if not put_unless_stopped(decoded, (frame, prepare(frame.rgb)), stop):
                    return
                kept += 1
                if max_frames is not None and kept >= max_frames:
                    break  # a live source never ends: this is its end
            put_unless_stopped(decoded, _END, stop)
        except BaseException as e:  # noqa: BLE001 - the video's failure, raised on the calling thread
            put_unless_stopped(decoded, e, stop)

    def encode(tmp: Path) -> None:
        # Every stride-th frame is kept: the rate drops by the stride, so the video lasts as long.
        writer = VideoWriter(tmp, info.width, info.height, info.fps / stride, container_format(target))
        finished = False
        try:
            while True:
                item = to_write.get()
                if item is _END:
                    break
                if isinstance(item, BaseException):
                    raise item
                annotated = item.render()
                writer.write(annotated)
                if viewer is not None:
                    viewer.offer(annotated)
                try:
                    if as_json:
                        display.out(json_line(frame_record(job, item)))
                    display.advance()
                except Exception as e:  # noqa: BLE001 - unwrapped below
                    raise _ReportFailed() from e
            writer.close()
            finished = True
        finally:
            if not finished:
                writer.abort()

    def write() -> None:
        try:
            atomic_write(target, encode)
        except BaseException as e:  # noqa: BLE001 - handed to the calling thread
            failure.append(e.__cause__ if isinstance(e, _ReportFailed) and e.__cause__ else e)
            stop.set()
            while to_write.get() is not _END:  # drain, so the calling thread never blocks
                pass

    reading = threading.Thread(target=decode, name="mlxnet-video-reader", daemon=True)
    writing = threading.Thread(target=write, name="mlxnet-video-writer", daemon=True)
    tracker = make_tracker(float(info.fps / stride)) if track else None
    frames = 0
    stopped = False
    reading.start()
    writing.start()
    try:
        try:
            runner = model()
        except Exception as e:  # noqa: BLE001 - unwrapped by run_videos
            raise _LoadFailed() from e
        done = False
        try:
            while not done and not stop.is_set():
                members: list[tuple[Any, Any]] = []
                while len(members) < batch:
                    item = decoded.get()
                    if item is _END:
                        done = True
                        break
                    if isinstance(item, BaseException):
                        raise item
                    members.append(item)
                if not members:
                    break
                results = predict(runner, [boxed for _, boxed in members])
                for (frame, _), det in zip(members, results):
                    to_write.put(tracker(frame, det) if tracker is not None else FrameResult(frame, det))
                frames += len(members)
                if viewer is not None and not viewer.show():
                    stopped = True  # the window's q, or the window closed: as Ctrl+C
                    break
        except KeyboardInterrupt:
            if not reader.live:
                raise  # a file is abandoned: nothing under its name
            stopped = True  # Ctrl+C is how a live source ends: its file is finished below
        if stopped:
            stop.set()  # the reader stops; frames already handed to the writer are written
        if failure:
            raise failure[0]
        to_write.put(_END)
        writing.join()
        if failure:
            raise failure[0]
        return frames, stopped
    except BaseException as e:
        stop.set()
        if writing.is_alive():
            # The error ends the encoding (its temporary file removed); the end mark ends a
            # writer that failed first and is draining.
            to_write.put(e if isinstance(e, Exception) else MlxnetError("interrupted"))
            to_write.put(_END)
            writing.join()
        raise
    finally:
        stop.set()
        # A live source's reader may wait on the device or the network (FFmpeg's own timeout
        # ends that wait); the container is closed only once the reader has let go of it.
        reading.join(timeout=10 if reader.live else None)
        if not reading.is_alive():
            reader.close()


def _declared_frames(jobs: Sequence[Job]) -> int | None:
    """Frames the headers declare, for the progress bar only; None where one states none."""
    from mlxnet.video import VideoReader

    total = 0
    for job in jobs:
        if is_live(job.source.name):
            return None  # no count; and a camera is opened once, when its turn comes
        try:
            with VideoReader(job.source.path) as reader:
                if not reader.info.frames:
                    return None
                total += reader.info.frames
        except MlxnetError:
            continue  # reported when its turn comes
    return total


def run_videos(jobs: Sequence[Job], *, batch: int, what: str, as_json: bool, model: Callable[[], Any],
               prepare: Callable[[np.ndarray], Any], predict: Callable[[Any, list[Any]], Sequence[Any]],
               track: bool = False, stride: int = 1, max_frames: int | None = None, show: bool = False) -> int:
    """Every video job, one after another; returns how many failed (each reported in one line,
    ``{"video": ..., "error": ...}`` under ``--json``). ``model()`` loads the weights once (its
    error ends the command); ``prepare(rgb)`` is the family's letterbox; ``predict(model, items)``
    runs a batch. ``stride``: run and write every stride-th frame (ultralytics' ``vid_stride``),
    the output's rate divided by it; ``max_frames``: at most this many frames of each source are
    run and written; ``show``: the annotated frames in a window as they are written.

    A live source is stopped by Ctrl+C (or the window's q): its output is finished and reported
    (``... (stopped)``) and the command ends there, without running the sources after it."""
    viewer = Viewer.open() if show else None
    failed = 0
    try:
        total = _declared_frames(jobs)
        with runtime_compiling_off(), progress_bar(what, total, quiet=as_json, unit="frame") as display:
            for job in jobs:
                try:
                    frames, stopped = _run_one(job, batch=batch, as_json=as_json, display=display, model=model,
                                               prepare=prepare, predict=predict, track=track, stride=stride,
                                               max_frames=max_frames, viewer=viewer)
                except (KeyboardInterrupt, SystemExit):
                    raise
                except _LoadFailed as e:
                    raise e.__cause__ from None  # type: ignore[misc]
                except Exception as e:  # noqa: BLE001 - this video fails, the others go on
                    failed += 1
                    prefix = f"{reader_source(job)}: "
                    if isinstance(e, MlxnetError) and str(e).startswith(prefix):
                        e = MlxnetError(str(e)[len(prefix):])
                    display.err(f"error: {job.name}: {_reason(e)}")
                    if as_json:
                        display.out(json_line({"video": job.name, "error": _reason(e)}))
                    continue
                if not as_json:
                    display.out(f"{job.name}: {frames} frames -> {job.outputs[0]}{' (stopped)' if stopped else ''}")
                if stopped:
                    break
    finally:
        if viewer is not None:
            viewer.close()
    return failed


def _reason(error: BaseException) -> str:
    text = " ".join(str(error).split())
    if not isinstance(error, MlxnetError):
        text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text or type(error).__name__
