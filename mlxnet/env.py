"""The one place mlxnet reads its ``MLXNET_*`` environment switches (and numeric limits).

Every switch has a fixed set of accepted spellings (case and surrounding blanks ignored); an
unset or empty variable means its default. Anything else is a :class:`MlxnetError` whose one
line names the variable, the value and every accepted spelling, e.g.
``MLXNET_BLAS: unknown BLAS choice 'fast': expected 'openblas', '1', 'on', 'reference', '0' or 'off'``.

Switches read while ``import mlxnet`` runs (``MLXNET_DEVICE``, ``MLXNET_BLAS``) never make the
import fail: a traceback from inside an import is what a user cannot act on, and the ``mlxnet``
command could not turn it into its one-line error (its own module is only reached after the
package imports). Their problems are kept (:func:`defer`) and raised, as MlxnetError, by the
first call that depends on the settings (``mlxnet.backend()``, ``current_device()``,
``kernels_enabled()``: every op asks one of them). An explicit ``mlxnet.use_device(...)``
replaces the ``MLXNET_DEVICE`` default, and with it that default's problem. The command checks
every switch before any work (:func:`check_all`, then :func:`raise_deferred`). Switches read
later (``MLXNET_KERNELS`` at every op, ``MLXNET_NATIVE`` at the first CPU op) raise where they
are read.

This module only reads ``os.environ``. The one write in mlxnet is the opt-in
:func:`mlxnet.tune_gpu` (MLX's own ``MLX_USE_CUDA_GRAPHS``, and ``MLX_MAX_OPS_PER_BUFFER`` when
asked for low memory; each left alone where the user set it).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from .errors import MlxnetError

# The one on/off vocabulary of the boolean switches.
ON = ("1", "on", "true", "yes")
OFF = ("0", "off", "false", "no")


@dataclass(frozen=True)
class Switch:
    """One environment switch: what it chooses, its accepted spellings -> meaning, its default."""
    what: str
    accepted: Mapping[str, str]
    default: str


def _spellings(**meanings: tuple[str, ...]) -> dict[str, str]:
    return {spelling: meaning for meaning, spellings in meanings.items() for spelling in spellings}


SWITCHES: dict[str, Switch] = {
    # "auto": the best device MLX has (Metal or CUDA GPU, else the CPU).
    "MLXNET_DEVICE": Switch("device", _spellings(cpu=("cpu",), gpu=("gpu",)), "auto"),
    # reference/off/0 were the opt-out spellings before this table; 1/on name the default.
    "MLXNET_BLAS": Switch("BLAS choice", _spellings(openblas=("openblas",) + ON[:2],
                                                    reference=("reference",) + OFF[:2]), "openblas"),
    "MLXNET_KERNELS": Switch("kernels setting", _spellings(on=ON, off=OFF), "on"),
    # auto: whole forwards compiled on GPU back ends (mlxnet.device.compile_enabled).
    "MLXNET_COMPILE": Switch("compile setting", _spellings(auto=("auto",), on=ON, off=OFF), "auto"),
    "MLXNET_NATIVE": Switch("CPU primitives setting", _spellings(on=ON, off=OFF), "on"),
    "MLXNET_MALLOC": Switch("allocator setting", _spellings(tuned=("tuned",), system=("system",)), "tuned"),
    # low: the command asks MLX's CUDA back end for one kernel per command buffer; min: that and
    # MLX waiting for each kernel before it queues the next (mlxnet.tune_gpu).
    "MLXNET_GPU_MEMORY": Switch("GPU memory setting",
                                _spellings(default=("default",), low=("low",), min=("min",)), "default"),
    # on: the image commands end with one stderr line of where their time went (pipeline stages).
    "MLXNET_TIMINGS": Switch("timings setting", _spellings(on=ON, off=OFF), "off"),
}


def expected(choices: list[str]) -> str:
    """``'a' or 'b'`` / ``'a', 'b' or 'c'``: the tail of every "unknown X" message."""
    quoted = [repr(c) for c in choices]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def switch(variable: str) -> str:
    """The meaning of ``variable``'s current value (read now, never cached), else MlxnetError."""
    spec = SWITCHES[variable]
    raw = os.environ.get(variable, "")
    value = raw.strip().lower()
    if not value:
        return spec.default
    try:
        return spec.accepted[value]
    except KeyError:
        # repr keeps a value with a newline or control characters on the one line.
        raise MlxnetError(f"{variable}: unknown {spec.what} {raw.strip()!r}: "
                          f"expected {expected(list(spec.accepted))}") from None


@dataclass(frozen=True)
class Limit:
    """One numeric setting: what it measures (with its unit) and its default."""
    what: str
    default: float


LIMITS: dict[str, Limit] = {
    # Image URLs given as sources (mlxnet.commands.remote): the most one download may hold, and
    # how long connecting or waiting for the next bytes may take.
    "MLXNET_DOWNLOAD_MAX_MB": Limit("download size limit in MB", 50.0),
    "MLXNET_DOWNLOAD_TIMEOUT": Limit("download timeout in seconds", 30.0),
    # The most pixels (width x height, from the header) an image file may decode to
    # (mlxnet.image.pixel_budget; a call's max_pixels= overrides it).
    "MLXNET_MAX_PIXELS": Limit("image pixel budget", 50_000_000.0),
}


def limit(variable: str) -> float:
    """The positive number ``variable`` holds (read now), its default when unset or empty,
    else MlxnetError."""
    spec = LIMITS[variable]
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return spec.default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):  # NaN fails this too
        raise MlxnetError(f"{variable}: {spec.what} must be a positive number, got {raw!r}")
    return value


def check_all() -> None:
    """Validate every MLXNET_* switch and limit now (the command does, before any work)."""
    for variable in SWITCHES:
        switch(variable)
    for variable in LIMITS:
        limit(variable)


# Problems found while mlxnet was imported: variable -> message (strings, not exception
# objects, so each raise starts a fresh, short traceback).
_deferred: dict[str, str] = {}


def defer(variable: str, message: str | None) -> None:
    """Keep a problem with ``variable`` found during import for the first use to raise
    (``None``: the variable no longer matters, e.g. an explicit device replaced its default)."""
    if message is None:
        _deferred.pop(variable, None)
    else:
        _deferred[variable] = message


def deferred(variable: str) -> str | None:
    """The problem kept for ``variable``, if any."""
    return _deferred.get(variable)


def raise_deferred() -> None:
    """Raise the first problem deferred at import, if any (cheap when there is none)."""
    if _deferred:
        raise MlxnetError(next(iter(_deferred.values())))
