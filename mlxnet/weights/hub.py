"""Weights by model id (a Hugging Face Hub file, cached by huggingface_hub) or by local path."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import MlxnetError
from .spec import _SPECS, get_spec

_WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".ckpt", ".bin")


def resolve_weights(id_or_path: str | os.PathLike) -> Path:
    """A local file path as is; a registered model id -> its hub file, downloaded once into the
    huggingface_hub cache (``HF_HOME``/``HF_HUB_CACHE``; ``HF_HUB_OFFLINE=1`` uses only the cache)."""
    path = Path(id_or_path).expanduser()
    if path.is_file():
        return path
    if path.exists():
        raise MlxnetError(f"{path} is a directory, not a weights file")
    name = str(id_or_path)
    looks_like_path = os.sep in name or name.endswith(_WEIGHT_SUFFIXES)
    if looks_like_path and name not in _SPECS:
        raise MlxnetError(f"weights file not found: {path}")
    spec = get_spec(name)
    if not (spec.repo and spec.filename):
        raise MlxnetError(f"model {spec.id!r} names no hub file; pass a local weights file instead")
    return Path(_download(spec.repo, spec.filename, spec.revision, spec.id))


def _download(repo: str, filename: str, revision: str | None, spec_id: str) -> str:
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HfHubHTTPError,
                                        LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    where = f"{repo}/{filename}" + (f"@{revision}" if revision else "")
    try:
        return hf_hub_download(repo, filename, revision=revision)
    except LocalEntryNotFoundError:
        why = ("HF_HUB_OFFLINE=1 forbids downloading" if constants.is_offline_mode()
               else "the Hugging Face Hub could not be reached")
        raise MlxnetError(f"weights for {spec_id!r} ({where}) are not in the cache {constants.HF_HUB_CACHE} and "
                          f"{why}; download them once online, or pass a local file path") from None
    except GatedRepoError:
        raise MlxnetError(f"{where} is gated: accept its terms on huggingface.co and log in "
                          "(`hf auth login`), or pass a local file path") from None
    except (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError) as e:
        raise MlxnetError(f"{where} was not found on the Hub ({type(e).__name__})") from None
    except HfHubHTTPError as e:
        raise MlxnetError(f"downloading {where} failed: {str(e).splitlines()[0]}") from None
