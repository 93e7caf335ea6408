"""A huggingface_hub cache laid out by hand, as ``hf_hub_download`` (huggingface_hub 2.4) leaves it.

With ``HF_HUB_CACHE=<dir>`` and ``HF_HUB_OFFLINE=1``, the real download code path
(``resolve_weights`` -> ``hf_hub_download``) then finds the file without any network::

    <cache_dir>/CACHEDIR.TAG
    <cache_dir>/models--Org--Name/blobs/<sha256 of the file>
    <cache_dir>/models--Org--Name/refs/<revision>                     (holds <commit>)
    <cache_dir>/models--Org--Name/snapshots/<commit>/<filename> -> ../../blobs/<sha256>

The blob is named by the file's sha256 because that is the ETag the Hub gives LFS files (weights
are always LFS); a git-stored small file would be named by its git blob sha1 instead.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

_COMMIT = re.compile(r"[0-9a-f]{40}")
# huggingface_hub writes this tag (Cache Directory Tagging Standard) into every cache it fills.
_CACHEDIR_TAG = ("Signature: 8a477f597d28d172789f06886806bc55\n"
                 "# This file is a cache directory tag created by huggingface_hub.\n"
                 "# For information about cache directory tags, see:\n"
                 "#\thttps://bford.info/cachedir/\n")


def repo_folder(cache_dir: str | os.PathLike, repo: str) -> Path:
    """``models--Org--Name``: huggingface_hub's folder for a model repo."""
    return Path(cache_dir) / "--".join(["models", *repo.split("/")])


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def prepare_hub_cache(cache_dir: str | os.PathLike, repo: str, filename: str, src_path: str | os.PathLike,
                      revision: str = "main", *, commit: str | None = None) -> Path:
    """Put ``src_path`` into the cache as ``repo``'s ``filename`` at ``revision``; returns the
    snapshot path that ``hf_hub_download(repo, filename, revision=revision)`` will return.

    ``revision`` may be a branch/tag (a ref file maps it to the commit) or a 40-hex commit (no ref,
    as huggingface_hub does). ``commit`` fixes the snapshot's commit id (e.g. to match a server);
    by default a ref already present is reused, so several files of one revision share a snapshot,
    else a stable id is derived from repo and revision.
    """
    base = repo_folder(cache_dir, repo)
    ref = base / "refs" / revision
    if _COMMIT.fullmatch(revision):
        commit = commit or revision
        if commit != revision:
            raise ValueError(f"revision {revision} is a commit; commit={commit} contradicts it")
    elif commit is None:
        commit = ref.read_text() if ref.is_file() else hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()
    if not _COMMIT.fullmatch(commit):
        raise ValueError(f"commit must be 40 lowercase hex digits, got {commit!r}")

    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    tag = Path(cache_dir) / "CACHEDIR.TAG"
    if not tag.exists():
        tag.write_text(_CACHEDIR_TAG)

    blob = base / "blobs" / file_sha256(src_path)
    blob.parent.mkdir(parents=True, exist_ok=True)
    if not blob.exists():  # content-addressed: an existing blob already holds these bytes
        tmp = blob.with_name(blob.name + ".incomplete")
        shutil.copyfile(src_path, tmp)
        os.replace(tmp, blob)

    if revision != commit:
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)  # no trailing newline: huggingface_hub reads the file as is

    pointer = base / "snapshots" / commit / Path(*filename.split("/"))
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.is_symlink() or pointer.exists():
        pointer.unlink()
    try:
        # relative, like huggingface_hub's own links: the cache stays valid when moved
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    except OSError:  # no symlinks here (e.g. Windows without developer mode): huggingface_hub copies too
        shutil.copyfile(blob, pointer)
    return pointer
