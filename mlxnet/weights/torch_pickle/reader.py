"""The entry point: which container a file is (or what else it is), and every failure as one line
naming the file."""
from __future__ import annotations

import pickle
import struct
import tarfile
import zipfile
import zlib
from pathlib import Path
from typing import Any

from ...errors import MlxnetError, one_line
from ..file_kinds import HEAD_BYTES, foreign_format, may_be_pickle, unrecognised
from .errors import Corrupt, NotACheckpoint, Refused, Truncated
from .legacy import read_legacy
from .zip_archive import read_zip


def read_torch_checkpoint(path: str | Path) -> Any:
    """The object ``torch.save`` stored, rebuilt from data only.

    Tensors come back as numpy arrays (bfloat16 as ``mx.array``), dicts/lists/tuples as such, and
    objects of other classes as :class:`Record`. Raises MlxnetError (naming the file) for a missing,
    truncated or corrupt file, for any pickled call outside the allow-list, and for sizes that
    the file declares but does not hold (see the package docstring, :mod:`mlxnet.weights.torch_pickle`).
    """
    path = Path(path)
    if not path.is_file():
        raise MlxnetError(f"checkpoint file not found: {path}")
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
        if head[:4] == b"PK\x03\x04":  # zipfile.is_zipfile would miss a truncated archive
            return read_zip(path)
        # Named before any parsing: a pickle parser fed a JPEG fails on some byte of it, and
        # "corrupt checkpoint (KeyError: 255)" would not say that it was never a checkpoint.
        foreign = foreign_format(head)
        if foreign is not None:
            raise NotACheckpoint(foreign)
        if tarfile.is_tarfile(path):
            raise MlxnetError(f"{path}: the pre-1.0 tar checkpoint format is not supported; re-save it with torch.save")
        if not may_be_pickle(head):
            raise NotACheckpoint(unrecognised(head))
        return read_legacy(path)
    except NotACheckpoint as e:
        noun, hint = "a PyTorch checkpoint" if e.kind.checkpoint else "a checkpoint", e.kind.hint
        raise MlxnetError(f"{path}: not {noun} ({e.kind.what})" + (f"; {hint}" if hint else "")) from None
    except Refused as e:
        raise MlxnetError(f"{path}: refusing to call {e.name} from the pickle ({one_line(e.why)}); "
                          "only tensors and plain data are loaded") from None
    except Truncated as e:
        raise MlxnetError(f"{path}: truncated or corrupt PyTorch checkpoint ({one_line(e)})") from None
    except Corrupt as e:
        raise MlxnetError(f"{path}: corrupt PyTorch checkpoint: {one_line(e)}") from None
    except MemoryError:
        raise MlxnetError(f"{path}: out of memory reading the checkpoint") from None
    except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, zlib.error, struct.error, ValueError, TypeError,
            IndexError, KeyError, AttributeError, UnicodeDecodeError, OverflowError, RecursionError,
            NotImplementedError) as e:
        raise MlxnetError(f"{path}: truncated or corrupt PyTorch checkpoint ({type(e).__name__}: {one_line(e)})") from None
    except OSError as e:
        raise MlxnetError(f"{path}: cannot read the checkpoint ({one_line(e)})") from None
