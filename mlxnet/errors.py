"""The one exception type mlxnet raises for bad input or setup: its message is one clear line.

Readers of files keep that promise with :func:`reading`, the error boundary every weights reader
runs inside: whatever goes wrong while a file's content is parsed or checked (a value of the
wrong type deep in a pickle, a list where a dict was expected) comes out as one line naming the
file, and :func:`summary` folds a list of problems into that line.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterator, Sequence


class MlxnetError(Exception):
    """A user-facing error; the CLI prints its message alone, without a traceback."""


def one_line(text: Any, limit: int = 300) -> str:
    """``text`` on one line, cut short past ``limit`` characters (a message may quote data
    from the file, which can be long or hold newlines)."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def summary(head: str, problems: Sequence[str], shown: int = 3, counted: bool = False) -> str:
    """``head: N problem(s): first; second; third; ... and K more`` on one line (``counted``:
    the head says the count itself): a long list (every key of a checkpoint of another model)
    stays readable, and its count is exact."""
    items = "; ".join(one_line(p, 160) for p in problems[:shown])
    more = f"; ... and {len(problems) - shown} more" if len(problems) > shown else ""
    return f"{head}: {'' if counted else f'{len(problems)} problem(s): '}{items}{more}"


# What parsing a file's content can raise when the content is not what the code expects; the
# reader's own checks raise MlxnetError, these are the ones no check anticipated (RuntimeError:
# what MLX raises for what it cannot take).
_CONTENT_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, LookupError, ArithmeticError,
                   RecursionError, UnicodeError, NotImplementedError, AssertionError, RuntimeError)


@contextmanager
def reading(source: str | os.PathLike, what: str = "file") -> Iterator[None]:
    """The error boundary of a reader of ``source``: inside it, every failure leaves as one
    MlxnetError line that names ``source`` (added in front where the message lacks it); an
    unexpected exception is reported with its type as a corrupt ``what``; running out of
    memory is said as such (every size a file declares is checked before allocation, so this
    is the last line of defence, not the bound)."""
    name = str(source)
    try:
        yield
    except MlxnetError as e:
        text = one_line(e, 600)
        if name not in text:
            text = f"{name}: {text}"
        if text == str(e):
            raise
        raise MlxnetError(text) from None
    except MemoryError:
        raise MlxnetError(f"{name}: out of memory reading the {what}") from None
    except _CONTENT_ERRORS as e:
        raise MlxnetError(f"{name}: corrupt or unexpected {what} content "
                          f"({type(e).__name__}: {one_line(e, 200)})") from None
