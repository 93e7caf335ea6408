"""mlxnet's per-user cache of built artefacts: where it lives, and publishing and checking an
artefact so a damaged or half-written one is never loaded."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_dir(name: str) -> Path:
    """mlxnet's per-user cache folder ``name`` (XDG_CACHE_HOME or ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mlxnet" / name


def file_digest(path: Path) -> str:
    """``size:sha256`` of a file: what a cached artefact must still be before it is loaded."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return f"{path.stat().st_size}:{h.hexdigest()}"


def publish(built: Path, target: Path) -> None:
    """Move a finished artefact into place atomically, its digest recorded beside it."""
    record = target.with_name(target.name + ".digest")
    tmp = record.with_name(f".{record.name}.{os.getpid()}")
    tmp.write_text(file_digest(built))
    os.replace(built, target)
    os.replace(tmp, record)


def is_intact(target: Path) -> bool:
    """Whether a cached artefact exists and still has the digest recorded when it was built."""
    record = target.with_name(target.name + ".digest")
    try:
        return target.is_file() and record.read_text() == file_digest(target)
    except OSError:
        return False
