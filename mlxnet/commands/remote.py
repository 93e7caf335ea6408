"""Image URLs as sources: ``mlxnet detect https://ultralytics.com/images/bus.jpg -o out/``.

A source argument that starts with ``http://`` or ``https://`` (and names no local file) is an
image to download; any other ``scheme://`` argument is refused in one line before any work.

- When: with its batch, as the image would be read (:func:`download` is called by the image
  commands' runner), so a run whose outputs are refused downloads nothing.
- Where: a private temporary folder (``mlxnet-downloads-*``, mode 0700, under the system's
  temporary folder), removed when the command ends.
- Size: at most ``MLXNET_DOWNLOAD_MAX_MB`` megabytes (10^6 bytes; default 50). A larger
  ``Content-Length`` is refused before the body is read, and the bytes are counted as they
  arrive, since a server may omit the length or state less than it sends.
- Time: connecting, and each wait for more bytes, at most ``MLXNET_DOWNLOAD_TIMEOUT`` seconds
  (default 30); the whole download at most ten times that, so a server that trickles bytes
  cannot hold a run.
- Redirects are followed to http(s) URLs only.
- A failed download (an HTTP status, a timeout, too large, unreachable, cut short) fails that
  source alone, as an unreadable image does: ``error: URL: HTTP 404 Not Found``.

The output's name (below ``-o``) is the last segment of the URL's path (percent-decoded; query
and fragment dropped), made safe by :func:`output_name`.
"""
from __future__ import annotations

import atexit
import http.client
import os
import re
import shutil
import socket
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

from mlxnet import env
from mlxnet.errors import MlxnetError

SCHEMES = ("http", "https")
FALLBACK_NAME = "image"
MAX_NAME_CHARS = 100
WHOLE_DOWNLOAD_TIMEOUTS = 10  # the whole download may take this many timeouts
CHUNK_BYTES = 1 << 16

# "scheme://": at least two letters, so a Windows drive ("C://photos") is not taken for a URL.
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+)://")
_UNSAFE_CHARS = re.compile(r"[^\w.-]")  # \w: letters and digits of any script, and "_"

_downloads: list[Path] = []  # the run's download folder, once made


def has_scheme(arg: str) -> bool:
    """Whether a source argument is a URL (of any scheme): ``scheme://...`` naming no local path."""
    return bool(_SCHEME.match(arg)) and not os.path.lexists(arg)


def check_scheme(url: str) -> str:
    """``url`` if it is http(s), else a one-line MlxnetError: other schemes (file, ftp, data...)
    would read local files or speak protocols without the limits below."""
    scheme = urlsplit(url).scheme.lower()
    if scheme not in SCHEMES:
        raise MlxnetError(f"{url}: only http:// and https:// URLs are downloaded, not {scheme}://")
    if not urlsplit(url).hostname:
        raise MlxnetError(f"{url}: no host in this URL")
    return url


def output_name(url: str) -> str:
    """A safe file name for a URL's download: its path's last segment, percent-decoded, with
    each character other than letters, digits, ``_``, ``.`` and ``-`` replaced by ``_`` (so no
    separator, ``..`` or control character survives), no leading or trailing dots (no hidden
    file), at most 100 characters (the extension kept); ``image`` when nothing is left."""
    last = unquote(urlsplit(url).path).replace("\\", "/").rsplit("/", 1)[-1]
    name = _UNSAFE_CHARS.sub("_", last).strip(".")
    if len(name) > MAX_NAME_CHARS:
        stem, suffix = os.path.splitext(name)
        suffix = suffix if len(suffix) <= 10 else ""
        name = stem[:MAX_NAME_CHARS - len(suffix)] + suffix
    return name if name.strip("_") else FALLBACK_NAME


def unique_name(name: str, taken: set[str]) -> str:
    """``name``, or ``stem_2.ext``, ``stem_3.ext``... if it is taken (two URLs ending in the same
    name: the user cannot rename them)."""
    stem, suffix = os.path.splitext(name)
    candidate, n = name, 1
    while os.path.normcase(candidate) in taken:
        n += 1
        candidate = f"{stem}_{n}{suffix}"
    return candidate


def downloads_folder() -> Path:
    """This run's private download folder, made on first use and removed at exit."""
    if not _downloads:
        folder = Path(tempfile.mkdtemp(prefix="mlxnet-downloads-"))  # mode 0700: this user only
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _downloads.append(folder)
    return _downloads[0]


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects within http(s) only: one to ftp:// (which urllib would follow) or file://
    would step around the scheme check."""

    def http_error_302(self, req, fp, code, msg, headers):  # type: ignore[no-untyped-def]
        target = headers.get("location") or headers.get("uri")
        scheme = urlsplit(urljoin(req.full_url, target or "")).scheme.lower()
        if target and scheme not in SCHEMES:
            fp.close()
            raise MlxnetError(f"{req.full_url}: HTTP {code} redirect to a {scheme}:// URL refused")
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def _megabytes(n: int) -> str:
    return f"{n / 1e6:g} MB"


def _too_large(url: str, limit: int, how: str) -> MlxnetError:
    return MlxnetError(f"{url}: too large: {how}, over the {_megabytes(limit)} download limit "
                       "(MLXNET_DOWNLOAD_MAX_MB)")


def _timed_out(url: str, timeout: float) -> MlxnetError:
    return MlxnetError(f"{url}: timed out after {timeout:g} s (MLXNET_DOWNLOAD_TIMEOUT)")


def _declared_length(response: http.client.HTTPResponse) -> int | None:
    value = (response.headers.get("Content-Length") or "").strip()
    return int(value) if value.isdigit() else None


def _copy_body(url: str, response: http.client.HTTPResponse, out: int, max_bytes: int,
               timeout: float, deadline: float) -> None:
    declared = _declared_length(response)
    if declared is not None and declared > max_bytes:
        raise _too_large(url, max_bytes, f"Content-Length {declared:,} bytes")
    received = 0
    # read1: one socket read at a time, so the deadline is checked however slowly bytes come.
    while chunk := response.read1(CHUNK_BYTES):
        received += len(chunk)
        if received > max_bytes:
            raise _too_large(url, max_bytes, f"more than {max_bytes:,} bytes sent")
        if time.monotonic() > deadline:
            raise _timed_out(url, timeout * WHOLE_DOWNLOAD_TIMEOUTS)
        os.write(out, chunk)
    if declared is not None and received < declared:
        raise MlxnetError(f"{url}: connection closed after {received:,} of {declared:,} bytes")


def _is_timeout(error: BaseException) -> bool:
    return isinstance(error, (TimeoutError, socket.timeout)) or (
        isinstance(error, urllib.error.URLError) and isinstance(error.reason, (TimeoutError, socket.timeout)))


def download(url: str, target: Path, *, max_bytes: int | None = None, timeout: float | None = None) -> Path:
    """Download ``url`` (http or https) to the new file ``target`` (mode 0600) within the size
    and time limits (defaults: ``MLXNET_DOWNLOAD_MAX_MB``, ``MLXNET_DOWNLOAD_TIMEOUT``). Any
    failure is a one-line MlxnetError starting with the URL, and leaves no file."""
    check_scheme(url)
    if max_bytes is None:
        max_bytes = int(env.limit("MLXNET_DOWNLOAD_MAX_MB") * 1e6)
    if timeout is None:
        timeout = env.limit("MLXNET_DOWNLOAD_TIMEOUT")
    deadline = time.monotonic() + timeout * WHOLE_DOWNLOAD_TIMEOUTS
    from mlxnet import __version__

    request = urllib.request.Request(url, headers={"User-Agent": f"mlxnet/{__version__}"})
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            with urllib.request.build_opener(_HttpOnlyRedirects).open(request, timeout=timeout) as response:
                _copy_body(url, response, out, max_bytes, timeout, deadline)
        except urllib.error.HTTPError as e:
            e.close()
            raise MlxnetError(f"{url}: HTTP {e.code} {e.reason}") from None
        except MlxnetError:
            raise
        except Exception as e:  # noqa: BLE001 - every network failure is this source's one line
            if _is_timeout(e):
                raise _timed_out(url, timeout) from None
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            text = " ".join(str(reason).split()) or type(reason).__name__
            raise MlxnetError(f"{url}: download failed ({text})") from None
    except BaseException:
        os.close(out)
        target.unlink(missing_ok=True)
        raise
    os.close(out)
    return target
