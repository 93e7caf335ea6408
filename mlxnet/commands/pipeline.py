"""Running the image commands' jobs: read ahead, run in batches of one shape, write behind.

Three stages overlap, so that the device does not wait for the host nor the host for the device:

- reading (``prepare``: a URL's download, decoding, the checks against the options, the model's
  host-side preprocessing) runs on a few worker threads, up to a window of images ahead;
- the model runs on the calling thread, a batch at a time. Where the command gives a ``group``
  key (YOLO: the letterboxed shape), a batch holds only images whose keys agree: the others wait
  in the window for company, and when the window is full the group waiting longest goes as it is.
  A folder of photos of a few shapes runs in full batches, and each shape's forward is traced once;
- writing (``finish``: drawing, encoding, saving, the report line) runs on one writer thread, in
  input order whatever the grouping.

Memory holds the window (:func:`window_for`: a few batches of prepared images) and the results
waiting to be written. Reports keep their order: the same lines in the same order for any batch
size, any grouping, any number of reader threads.

A file that fails (unreadable, a prompt outside it, a write error) prints ``error: FILE: REASON``
on stderr and the others go on; the command then ends with exit code 1 and, for several inputs,
``N of M images failed``. ``load()`` is called once, on the calling thread, when the first image
is ready (a run whose images all fail never loads the weights); its error ends the command.
``--json`` prints JSON Lines: one object per image on stdout, a failure as ``{"image": ...,
"error": ...}``. On a terminal a progress bar (count, rate, ETA) is drawn on stderr; never under
``--json`` or when stderr is not a terminal.

Under ``mlx.launch -n N`` each rank runs every N-th image (:func:`mlxnet.distributed.shard`) and
writes its outputs, which together are the single-process outputs. Each rank prints its own lines
(in no fixed order across ranks); the failure count is summed over the ranks, rank 0 reports it
and every rank exits with the job's code; only rank 0 draws a progress bar.
"""
from __future__ import annotations

import heapq
import os
import queue
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Generic, Hashable, Sequence, TypeVar

import typer

from mlxnet import distributed, env
from mlxnet.commands.images import Job, fetched_first, json_line, missing_input, report_failure
from mlxnet.commands.quick_start import runtime_compiling_off
from mlxnet.evaluation.speed import Speed
from mlxnet.progress import ProgressBar, progress_bar

Model = TypeVar("Model")
Prepared = TypeVar("Prepared")
Result = TypeVar("Result")

# Decoding and resizing release the GIL (Pillow, OpenCV), so a few threads keep a device fed;
# more would only compete with the model for the cores on a CPU back end.
MAX_READERS = 4
_DONE = object()  # the writer's end-of-work mark


def readers() -> int:
    return max(1, min(MAX_READERS, os.cpu_count() or 1))


def window_for(batch: int) -> int:
    """Images read ahead of the model: four batches, so that a folder of several shapes still
    forms full batches, and at least four, so that a batch of one overlaps its next reads."""
    return max(4 * batch, 4)


class StageTimes(Speed):
    """Seconds spent in each stage, summed over its threads (reading may add up to more than
    the wall time: it runs on several), and the wall time to the first written result."""

    def __init__(self) -> None:
        super().__init__(("read", "model", "write"))
        self.first_result: float | None = None
        self.images = 0

    def written(self) -> None:
        with self._lock:
            self.images += 1
            if self.first_result is None:
                self.first_result = time.perf_counter() - self.start

    def timings(self) -> str:
        """The ``timings:`` line the image commands print with ``MLXNET_TIMINGS``."""
        wall = self.wall
        rate = self.images / wall if wall > 0 else 0.0
        first = "-" if self.first_result is None else f"{self.first_result:.2f} s"
        r, m, w = (self.seconds[k] for k in ("read", "model", "write"))
        return (f"timings: {self.images} images in {wall:.2f} s ({rate:.1f} img/s), first result after {first}; "
                f"read {r:.2f} s on {readers()} threads, model {m:.2f} s, write {w:.2f} s")


def _prepare(job: Job, prepare: Callable[[Job], Prepared], times: StageTimes) -> Prepared | Exception:
    """``prepare(job)``, or the error that fails this image."""
    missing = missing_input(job)
    if missing is not None:
        return missing
    since = time.perf_counter()
    try:
        return prepare(job)
    except Exception as e:  # noqa: BLE001 - any error of one image fails that image alone
        return e
    finally:
        times.add_since("read", since)


def _predict_batch(model: Model, prepared: list[Prepared],
                   predict: Callable[[Model, list[Prepared]], Sequence[Result]]) -> list[Result | Exception]:
    """One call for the batch; if it fails, one call per image, so the error names its own file
    and the batch's other images still get their results."""
    try:
        results = list(predict(model, prepared))
        if len(results) == len(prepared):
            return results
        raise ValueError(f"{len(results)} results for {len(prepared)} images")
    except Exception as e:  # noqa: BLE001 - which image failed is found below
        if len(prepared) == 1:
            return [e]
    out: list[Result | Exception] = []
    for item in prepared:
        try:
            out.append(predict(model, [item])[0])
        except Exception as e:  # noqa: BLE001
            out.append(e)
    return out


class _Writer(Generic[Prepared, Result]):
    """The writer thread: ``finish`` for each image, its line reported in input order.

    Results arrive in any order (grouping runs later images first); each is finished once every
    earlier one has been taken up. With ``writers`` > 1, ``finish`` runs on that many threads
    (encoding and drawing release the GIL) while this thread reports the results in order. The
    queues are short, so a slow disk holds the model back instead of results piling up in memory."""

    def __init__(self, finish: Callable[[Job, Prepared, Result], tuple[dict, str | None]], display: ProgressBar,
                 as_json: bool, depth: int, times: StageTimes, writers: int = 1) -> None:
        self._finish, self._display, self._as_json, self.times = finish, display, as_json, times
        self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._waiting: list[tuple[int, Job, object, object]] = []
        self._next = 0
        self._pool = ThreadPoolExecutor(writers, thread_name_prefix="mlxnet-writer") if writers > 1 else None
        self._in_flight: deque[tuple[Job, Future]] = deque()
        self._most_in_flight = 2 * writers
        self.failed = 0
        self._fault: BaseException | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="mlxnet-writer", daemon=True)
        self._thread.start()

    def put(self, index: int, job: Job, item: object, result: object) -> None:
        """Hand over image ``index``: ``item`` is its prepared input or the error that failed it."""
        self._raise_fault()
        self._queue.put((index, job, item, result))

    def close(self, completed: bool) -> None:
        """Wait until every image handed over is written (``completed``), or stop after the
        images being written (the command is ending on an error or an interrupt)."""
        if not completed:
            self._stopped = True
        self._queue.put(_DONE)
        self._thread.join()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._raise_fault()

    def _raise_fault(self) -> None:
        if self._fault is not None:
            raise self._fault

    def _run(self) -> None:
        try:
            while True:
                entry = self._queue.get()
                if entry is _DONE or self._stopped:
                    while self._in_flight and not self._stopped:
                        self._report_first()
                    return
                heapq.heappush(self._waiting, entry)
                while self._waiting and self._waiting[0][0] == self._next and not self._stopped:
                    _, job, item, result = heapq.heappop(self._waiting)
                    if self._pool is None:
                        self._report(job, self._finished(job, item, result))
                    else:
                        self._in_flight.append((job, self._pool.submit(self._finished, job, item, result)))
                        while self._in_flight and (self._in_flight[0][1].done()
                                                   or len(self._in_flight) > self._most_in_flight):
                            self._report_first()
                    self._next += 1
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            self._fault = e
            while True:  # keep draining, so the main thread never blocks on a full queue
                if self._queue.get() is _DONE:
                    return

    def _finished(self, job: Job, item: object, result: object) -> tuple[object, float]:
        """``finish``'s (record, line), or the exception that failed the image; and its seconds."""
        since = time.perf_counter()
        try:
            if isinstance(item, Exception):
                raise item
            if isinstance(result, Exception):
                raise result
            outcome: object = self._finish(job, item, result)  # type: ignore[arg-type]
        except Exception as e:  # noqa: BLE001 - any error of one image fails that image alone
            outcome = e
        return outcome, time.perf_counter() - since

    def _report_first(self) -> None:
        job, future = self._in_flight.popleft()
        self._report(job, future.result())

    def _report(self, job: Job, finished: tuple[object, float]) -> None:
        outcome, seconds = finished
        if isinstance(outcome, Exception):
            self.failed += 1
            report_failure(self._display, job, outcome, self._as_json)
        else:
            record, line = outcome  # type: ignore[misc]
            if self._as_json:
                self._display.out(json_line({"image": job.name, **record}))
            elif line is not None:  # None: the command reports at the end (val's table), not per image
                self._display.out(line)
        self.times.add("write", seconds)
        self.times.written()
        self._display.advance()


def _run_all(jobs: Sequence[Job], batch: int, model: Callable[[], Model],
             prepare: Callable[[Job], Prepared], predict: Callable[[Model, list[Prepared]], Sequence[Result]],
             group: Callable[[Prepared], Hashable] | None, writer: _Writer) -> None:
    """Read ahead on the pool, run the first image at once, then each full group (or the
    longest-waiting one when the window is full, and every group at the end), and hand each
    image to the writer."""
    window = window_for(batch)
    reading: list[tuple[int, Job, Future]] = []  # in input order
    groups: dict[Hashable, list[tuple[int, Job, Prepared]]] = {}  # oldest first
    held = 0  # prepared images waiting in groups
    upcoming = iter(enumerate(jobs))
    exhausted = False
    started = False

    def run(members: list[tuple[int, Job, Prepared]]) -> None:
        nonlocal held, started
        held -= len(members)
        started = True
        runner = model()  # loading the weights is not the model stage's time
        since = time.perf_counter()
        results = _predict_batch(runner, [item for _, _, item in members], predict)
        writer.times.add_since("model", since)
        for (index, job, item), result in zip(members, results):
            writer.put(index, job, item, result)

    with ThreadPoolExecutor(readers(), thread_name_prefix="mlxnet-reader") as pool:
        try:
            while True:
                while not exhausted and len(reading) + held < window:
                    nxt = next(upcoming, None)
                    if nxt is None:
                        exhausted = True
                    else:
                        reading.append((nxt[0], nxt[1], pool.submit(_prepare, nxt[1], prepare, writer.times)))
                if reading:
                    index, job, future = reading.pop(0)
                    item = future.result()
                    if isinstance(item, Exception):
                        writer.put(index, job, item, None)
                        continue
                    key = group(item) if group is not None else None
                    members = groups.setdefault(key, [])
                    members.append((index, job, item))
                    held += 1
                    # The first image goes at once: the first result (and the model's start-up,
                    # which the first forward pays) does not wait for the first full batch.
                    if len(members) >= batch or not started:
                        run(groups.pop(key))
                    elif held >= window:  # no room to read on: the longest-waiting group goes
                        run(groups.pop(next(iter(groups))))
                elif groups:  # everything is read: the groups go, oldest first
                    run(groups.pop(next(iter(groups))))
                else:
                    return
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def run_jobs(jobs: Sequence[Job], batch: int, *, what: str, as_json: bool,
             load: Callable[[], Model],
             prepare: Callable[[Job], Prepared],
             predict: Callable[[Model, list[Prepared]], Sequence[Result]],
             finish: Callable[[Job, Prepared, Result], tuple[dict, str | None]],
             group: Callable[[Prepared], Hashable] | None = None, writers: int = 1) -> None:
    """Run every job, ``batch`` images at a time, and end with exit code 1 if any failed.

    ``prepare(job)`` (on a reader thread) reads the job's image and what else it needs, checks
    it against the options and does the model's host preprocessing; ``predict(model, items)``
    (on the calling thread) runs a batch; ``finish(job, item, result)`` (on the writer thread)
    writes the outputs and returns the JSON record and the text line (None: no line). ``prepare`` and
    ``finish`` work on host data only (NumPy, Pillow, files): MLX work belongs in ``predict``.
    ``group(item)``, if given, is a key that the items of one batch share. ``writers`` > 1:
    ``finish`` may run on that many threads at once (it must be safe to: each call writes its own
    files), the reports still in input order. An error in any of them fails that image only;
    ``load()``'s error ends the command."""
    loaded: list[Model] = []

    def model() -> Model:
        if not loaded:
            loaded.append(load())
        return loaded[0]

    mine = distributed.shard(jobs)  # all of them, unless started by mlx.launch
    with runtime_compiling_off(), \
            progress_bar(what, len(mine), quiet=as_json or not distributed.is_main(), unit="img") as display:
        writer: _Writer = _Writer(finish, display, as_json, depth=window_for(batch), times=StageTimes(), writers=writers)
        completed = False
        try:
            _run_all(mine, batch, model, fetched_first(prepare), predict, group, writer)
            completed = True
        finally:
            writer.close(completed)
    if env.switch("MLXNET_TIMINGS") == "on":
        print(writer.times.timings(), file=sys.stderr, flush=True)
    failed = int(distributed.total(writer.failed))  # every rank ends with the job's exit code
    if failed and len(jobs) > 1 and distributed.is_main():
        print(f"{failed} of {len(jobs)} images failed", file=sys.stderr, flush=True)
    distributed.barrier()
    if failed:
        raise typer.Exit(1)
