"""Weights by model id (a Hugging Face Hub file, cached by huggingface_hub) or by local path.

How a model id becomes a file (written against huggingface_hub 2.4):

1. The cache, with no network at all (``try_to_load_from_cache``). A model id names fixed upstream
   weights, so a cached copy is used as is: no HEAD request on every run, and no wait when the
   network is slow or silently dropping packets. Delete the cache entry to fetch it again.
2. ``HF_HUB_OFFLINE=1`` stops there, with a one-line error when the file is not cached.
3. One metadata request (HEAD), without retries. ``hf_hub_download`` alone would, after a failed
   HEAD and a cache miss, try again through its backoff loop (5 retries, 1+2+4+8+8 s of sleep,
   60 s timeout each): that is what made an offline ``mlxnet inpaint`` wait about 24 s before
   failing. ``get_hf_file_metadata(retry_on_errors=False)`` sends exactly one request, so
   an unreachable Hub fails at once (or after ``HF_HUB_ETAG_TIMEOUT`` seconds at most, default 10;
   huggingface_hub's own once-a-day agent-registry request, 3 s at most, may come first unless
   ``HF_HUB_DISABLE_TELEMETRY=1``).
4. ``hf_hub_download`` for the real transfer, with a progress bar class chosen for this call.
   Once the Hub has answered, huggingface_hub still resumes a transfer cut mid-way (up to 5
   times, 1 s apart, each bounded by ``HF_HUB_DOWNLOAD_TIMEOUT``); that is kept on purpose.

Nothing here changes huggingface_hub's process-wide state (no ``disable_progress_bars()``, no
``set_client_factory``, no environment variables): other users of the library keep their settings.
"""
from __future__ import annotations

import re

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn, Sequence

from ..errors import MlxnetError
from .random_weights import RANDOM
from .spec import _SPECS, get_spec, list_specs

if TYPE_CHECKING:
    from tqdm.auto import tqdm

_WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".ckpt", ".bin")
# Every entry point that takes a model id takes a file path in its place (--weights, convert's
# SRC, the Python API), so the way out of a failed download is said without naming an option.
_LOCAL_ALTERNATIVE = "give the path of a local copy of the file instead of the id"


def _local_alternative(spec_id: str) -> str:
    return (f"{_LOCAL_ALTERNATIVE} {spec_id!r} (or 'random': seeded random weights, nothing to "
            "download)")


def looks_like_path(name: str) -> bool:
    """A name meant as a file: it has a folder in it or a weights file's extension."""
    return os.sep in name or "/" in name or name.endswith(_WEIGHT_SUFFIXES)


def accepted_sources(ids: Sequence[str]) -> str:
    """What a weights source may be, for messages about one that is none of these."""
    return (f"give a weights file (.safetensors, .pt, .pth, .ckpt), a model id ({', '.join(compact_ids(ids))}: "
            "downloaded once from the Hub) or 'random' (seeded random weights, nothing to download)")


_SIZED = re.compile(r"^(.*\d)([nsmlx])(-[a-z]+)?$")  # yolov8n, yolo11s-seg: a family, a size, a task


def compact_ids(ids: Sequence[str]) -> list[str]:
    """Model ids for a message, the sizes of one family and task in brackets: yolov8[nsmlx]-seg."""
    out: list[str] = []
    groups: dict[tuple[str, str], list[str]] = {}
    for model_id in ids:
        m = _SIZED.match(model_id)
        if m is None:
            out.append(model_id)
            continue
        key = (m.group(1), m.group(3) or "")
        if key not in groups:
            groups[key] = []
            out.append(key)  # type: ignore[arg-type]  # its place in the order; written below
        groups[key].append(m.group(2))
    return [f"{x[0]}[{''.join(groups[x])}]{x[1]}" if isinstance(x, tuple) and len(groups[x]) > 1
            else f"{x[0]}{groups[x][0]}{x[1]}" if isinstance(x, tuple) else x for x in out]


class UnknownSource(MlxnetError):
    """A weights source that is neither a file nor a model id (its message lists what is)."""


def check_model_id(name: str, ids: Sequence[str] | None = None) -> None:
    """One line unless ``name`` is a registered model id, and one of ``ids`` if given (the ids
    the caller's model takes): it names what ``name`` is and what is accepted instead."""
    known = list_specs()
    if name not in known:
        raise UnknownSource(f"{name!r} is neither a weights file nor a model id; {accepted_sources(ids or known)}")
    if ids is not None and name not in ids:
        raise MlxnetError(f"{name!r} names the weights of another model; {accepted_sources(ids)}")


def resolve_weights(id_or_path: str | os.PathLike, *, progress: bool | None = None,
                    ids: Sequence[str] | None = None) -> Path:
    """A local file path as is; a registered model id -> its hub file, downloaded once into the
    huggingface_hub cache (``HF_HOME``/``HF_HUB_CACHE``; ``HF_HUB_OFFLINE=1`` uses only the cache).

    ``progress``: show a download progress bar on stderr (True), never (False), or only when
    stderr is a terminal and huggingface_hub's bars are not disabled (None, the default).
    ``ids``: the model ids the caller takes (an error names them; another id is refused before
    any download).
    """
    path = Path(id_or_path).expanduser()
    if path.is_file():
        return path
    if path.exists():
        raise MlxnetError(f"{path} is a directory, not a weights file")
    name = str(id_or_path)
    if looks_like_path(name) and name not in _SPECS:
        raise MlxnetError(f"weights file not found: {path}")
    if name.lower() == RANDOM:  # built by the loaders (weights.random_weights), never a file
        raise MlxnetError("'random' weights are built for a model, not read from a file; "
                          "load them through the model (its family's predictor, or open_checkpoint with a spec)")
    check_model_id(name, ids)
    spec = get_spec(name)
    if not (spec.repo and spec.filename):
        raise MlxnetError(f"model {spec.id!r} names no hub file; give a local weights file, or 'random'")
    args = (spec.repo, spec.filename, spec.revision, spec.id)
    # `progress` goes by keyword and only when chosen, so that a stand-in with the historical
    # signature _download(repo, filename, revision, spec_id) still fits (tests substitute one).
    return Path(_download(*args) if progress is None else _download(*args, progress=progress))


def _download(repo: str, filename: str, revision: str | None, spec_id: str,
              progress: bool | None = None) -> str:
    """The cached path of ``repo``/``filename``, downloading it if needed (see the module doc)."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url, try_to_load_from_cache

    where = f"{repo}/{filename}" + (f"@{revision}" if revision else "")
    # try_to_load_from_cache only reads the disk; hf_hub_download(local_files_only=True) would also
    # build request headers, which can fetch huggingface_hub's agent registry from the endpoint.
    cached = try_to_load_from_cache(repo, filename, revision=revision)
    if isinstance(cached, str):  # else None, or a marker that the Hub once lacked the file: ask again
        return cached
    if constants.is_offline_mode():
        raise MlxnetError(f"weights for {spec_id!r} ({where}) are not in the cache {constants.HF_HUB_CACHE} and "
                          "HF_HUB_OFFLINE=1 forbids downloading; download them once online, "
                          f"or {_local_alternative(spec_id)}")
    try:
        # The one try: no backoff loop (retry_on_errors=False), bounded by the etag timeout.
        get_hf_file_metadata(hf_hub_url(repo, filename, revision=revision),
                             timeout=constants.HF_HUB_ETAG_TIMEOUT, retry_on_errors=False)
    except Exception as e:  # noqa: BLE001 - every failure becomes one MlxnetError line
        _raise_hub_error(e, where, spec_id, during="lookup")
    try:
        return hf_hub_download(repo, filename, revision=revision, tqdm_class=_bar_class(_show_progress(progress)))
    except Exception as e:  # noqa: BLE001
        _raise_hub_error(e, where, spec_id, during="download")


def _raise_hub_error(e: Exception, where: str, spec_id: str, during: Literal["lookup", "download"]) -> NoReturn:
    """One MlxnetError line for whatever huggingface_hub or the transport raised; other
    exception types (programming errors) propagate unchanged."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        OfflineModeIsEnabled, RepositoryNotFoundError, RevisionNotFoundError)

    endpoint, reason = constants.ENDPOINT, _first_line(e)
    if isinstance(e, GatedRepoError):
        raise MlxnetError(f"{where} is gated: accept its terms on huggingface.co and log in "
                          f"(`hf auth login`), or {_local_alternative(spec_id)}") from None
    if isinstance(e, (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError)) \
            and not isinstance(e, LocalEntryNotFoundError):
        raise MlxnetError(f"{where} was not found on the Hub at {endpoint} ({type(e).__name__}); "
                          f"{_local_alternative(spec_id)}") from None
    if isinstance(e, HfHubHTTPError):
        status = e.response.status_code if e.response is not None else "?"
        raise MlxnetError(f"the Hub at {endpoint} answered HTTP {status} for {where} (weights for {spec_id!r}); "
                          f"try again later, or {_local_alternative(spec_id)}") from None
    if during == "lookup" and isinstance(e, (httpx2.TransportError, OfflineModeIsEnabled)):
        raise MlxnetError(f"weights for {spec_id!r} ({where}) are not in the cache {constants.HF_HUB_CACHE} and "
                          f"the Hub at {endpoint} could not be reached ({reason}); download them once online, "
                          f"or {_local_alternative(spec_id)}") from None
    if isinstance(e, (httpx2.HTTPError, OSError)):  # transfer cut, disk full, size mismatch, odd endpoint
        raise MlxnetError(f"downloading {where} from {endpoint} failed ({reason}); try again, "
                          f"or {_local_alternative(spec_id)}") from None
    raise e


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def _show_progress(progress: bool | None) -> bool:
    """None -> bars only on a terminal, and not when the user disabled huggingface_hub's bars
    (``HF_HUB_DISABLE_PROGRESS_BARS=1`` or ``disable_progress_bars()``); we only read that state."""
    if progress is not None:
        return progress
    from huggingface_hub.utils import are_progress_bars_disabled

    stream: Any = sys.stderr
    is_tty = bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())
    return is_tty and not are_progress_bars_disabled()


def _bar_class(show: bool) -> type[tqdm]:
    """A tqdm class for this download only, forced on or off. huggingface_hub builds a class that
    is not its own tqdm subclass with plain keyword arguments (no group name, no TTY guess), so
    the ``disable`` set here is the last word and no global progress-bar switch is touched."""
    from tqdm.auto import tqdm

    class _DownloadBar(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = not show
            super().__init__(*args, **kwargs)

    return _DownloadBar
