"""Writing a run's files beside its training: an epoch's checkpoints go to disk on one
background thread while the next epoch trains, in the order they were submitted."""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable


class BackgroundWriter:
    """Runs write jobs in submission order on one thread. :meth:`wait` blocks until every job
    submitted so far is done and re-raises the first failure (a full disk, say), so a caller
    that waits before submitting an epoch's files has at most one epoch in flight. The jobs
    write atomically, so a process killed mid-write leaves the previous files whole.

    Hand the jobs evaluated arrays only: the thread reads them while the caller builds and
    evaluates the next graphs."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlxnet-writer")
        self._jobs: list[Future] = []

    def submit(self, job: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self._jobs.append(self._pool.submit(job, *args, **kwargs))

    def wait(self) -> None:
        jobs, self._jobs = self._jobs, []
        for job in jobs:
            job.result()

    def close(self, *, raise_errors: bool = True) -> None:
        """Wait for every job, then stop the thread; ``raise_errors=False`` (on the way out of
        another failure) still waits, so nothing is left half done, but keeps quiet."""
        try:
            if raise_errors:
                self.wait()
            else:
                for job in self._jobs:
                    job.exception()
        finally:
            self._pool.shutdown(wait=True)
