"""Progress bars of the long-running commands (the image commands' batches, training's epochs):
one look, and one rule for when a bar is drawn.

A bar is drawn on stderr, so that stdout stays the results, and only where someone watches it:
when stderr is a terminal (rich's test: a TTY, or FORCE_COLOR / TTY_COMPATIBLE=1 say to act as
one) and the caller is not quiet (``--json`` output, a rank other than 0). Otherwise nothing is
drawn and a command's lines are printed as they come.

A bar opened while another is drawn (segment-everything's points within the images' bar) is
drawn under it, on the same console, and goes when done: two consoles would draw over each other.

While a bar is drawn, a command's own lines go through it (:meth:`ProgressBar.out`,
:meth:`ProgressBar.err`): its console prints them above the bar, where printed past it they
would be drawn over. Stray output (a library's warning) is redirected above the bar too; stdout
only when it is a terminal, as results piped to a file must stay in the file.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID


# The consoles of the bars being drawn, innermost last: a nested bar draws on the outermost's.
_drawing: list["Console"] = []


def progress_console() -> "Console":
    """The console bars draw on: stderr (tests put a console forced to be a terminal here)."""
    from rich.console import Console

    return Console(stderr=True)


class ProgressBar:
    """What a running command reports through: :meth:`advance` after each unit of work, and
    :meth:`out` / :meth:`err` for its result and error lines. Without a bar (quiet, or not on a
    terminal) the lines are printed plainly and :meth:`advance` does nothing."""

    def __init__(self, progress: "Progress | None" = None, task: "TaskID | None" = None) -> None:
        self._progress, self._task = progress, task

    @property
    def drawn(self) -> bool:
        return self._progress is not None

    def advance(self, status: str | None = None, count: int = 1) -> None:
        """``count`` more units done (one update, so the rate stays true when work comes in
        batches); ``status`` replaces the text shown after the count (a loss, a rate)."""
        if self._progress is not None:
            fields = {} if status is None else {"status": status}
            self._progress.update(self._task, advance=count, **fields)  # type: ignore[arg-type]

    def out(self, text: str) -> None:
        """A result line for stdout: above the bar when stdout is the terminal it is drawn on."""
        if self._progress is not None and sys.stdout.isatty():
            self._above_bar(text)
        else:
            print(text, flush=True)  # flushed: a reader downstream sees each line at once

    def err(self, text: str) -> None:
        """An error line for stderr, where the bar is."""
        if self._progress is not None:
            self._above_bar(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def _above_bar(self, text: str) -> None:
        from rich.text import Text

        # Text, not a str: a file name like "[red].png" is not rich markup; soft_wrap: one line
        # stays one line, however wide.
        self._progress.console.print(Text(text), soft_wrap=True, highlight=False)  # type: ignore[union-attr]


@contextmanager
def progress_bar(what: str, total: int | None, *, quiet: bool = False, unit: str | None = None,
                 status: bool = False, transient: bool = False) -> Iterator[ProgressBar]:
    """A :class:`ProgressBar` for ``total`` units of work: ``what``, the bar, the count, the rate
    in ``unit``/s (if given), the latest ``advance`` status (if ``status``), the time elapsed and
    the ETA (``total`` None: work of unknown size, a live video; the count, the rate and the time
    elapsed, without a bar or an ETA). ``transient``: the bar is erased when done (training draws one per epoch, then logs
    the epoch's line in its place; a nested bar always is). The bar is stopped however the
    block ends."""
    console = _drawing[0] if _drawing else progress_console()
    if quiet or not console.is_terminal:
        yield ProgressBar()
        return
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task: Task) -> Text:
            speed = task.finished_speed or task.speed
            return Text(f"{speed:.2f} {unit}/s" if speed else f"– {unit}/s", style="progress.data.speed")

    columns: list[ProgressColumn | str] = [TextColumn("{task.description}")]
    columns += [BarColumn(), MofNCompleteColumn()] if total is not None else [TextColumn("{task.completed}")]
    if unit:
        columns.append(RateColumn())
    if status:
        columns.append(TextColumn("{task.fields[status]}"))
    columns.append(TimeElapsedColumn())
    if total is not None:
        columns += [TextColumn("ETA"), TimeRemainingColumn()]
    with Progress(*columns, console=console, transient=transient or bool(_drawing),
                  redirect_stdout=sys.stdout.isatty(), redirect_stderr=True) as bar:
        _drawing.append(console)
        try:
            yield ProgressBar(bar, bar.add_task(what, total=total, status=""))
        finally:
            _drawing.pop()
