"""What a file is, from its first bytes: so that a file given as weights that is no checkpoint
is refused as what it is ("a JPEG image", "a Git LFS pointer") rather than as a corrupt one.

:func:`read_torch_checkpoint` asks here before parsing: a PyTorch checkpoint starts with a zip
signature or a pickle (and safetensors, tried first, with a header length and ``{``), and
everything else is named by its signature, or said to be unrecognised with its first bytes.
Only signatures that no checkpoint can start with are listed (a legacy torch.save pickle starts
with ``0x80`` and its protocol).
"""
from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

HEAD_BYTES = 512  # enough for every signature below, and for a line of text
_OTHER_MODEL = "mlxnet reads PyTorch checkpoints and safetensors files"


@dataclass(frozen=True)
class Kind:
    """What a file is (``what``: "a JPEG image") and, where there is one, what to do (``hint``);
    ``checkpoint``: a checkpoint of another format (safetensors), only not a PyTorch one."""

    what: str
    hint: str = ""
    checkpoint: bool = False


# (prefix, what a file starting with it is)
_PREFIXES: tuple[tuple[bytes, Kind], ...] = (
    (b"\xff\xd8\xff", Kind("a JPEG image")),
    (b"\x89PNG\r\n\x1a\n", Kind("a PNG image")),
    (b"GIF87a", Kind("a GIF image")),
    (b"GIF89a", Kind("a GIF image")),
    (b"II*\x00", Kind("a TIFF image")),
    (b"MM\x00*", Kind("a TIFF image")),
    (b"GGUF", Kind("a GGUF model file", _OTHER_MODEL)),
    (b"\x89HDF\r\n\x1a\n", Kind("an HDF5 file, e.g. a Keras .h5 model", _OTHER_MODEL)),
    (b"\x93NUMPY", Kind("a NumPy .npy array")),
    (b"%PDF", Kind("a PDF document")),
    (b"\x1f\x8b", Kind("a gzip-compressed file", "decompress it first")),
    (b"BZh", Kind("a bzip2-compressed file", "decompress it first")),
    (b"\xfd7zXZ\x00", Kind("an xz-compressed file", "decompress it first")),
    (b"\x28\xb5\x2f\xfd", Kind("a zstd-compressed file", "decompress it first")),
    (b"7z\xbc\xaf\x27\x1c", Kind("a 7-Zip archive", "extract it first")),
    (b"Rar!\x1a\x07", Kind("a RAR archive", "extract it first")),
    (b"\x7fELF", Kind("an ELF executable")),
    (b"version https://git-lfs.github.com/spec/",
     Kind("a Git LFS pointer, not the file itself", "fetch the file with `git lfs pull`")),
)


def _riff_or_iso(head: bytes) -> Kind | None:
    """Signatures not at byte 0 or not alone: RIFF (WebP, WAV, AVI), ISO media (MP4, HEIC),
    TensorFlow Lite, BMP (whose two-byte "BM" is checked with its reserved zero bytes)."""
    if head[:4] == b"RIFF":
        form = head[8:12]
        return Kind("a WebP image") if form == b"WEBP" else Kind(f"a RIFF file ({form.decode('latin-1').strip()})")
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand in (b"heic", b"heix", b"mif1", b"msf1"):
            return Kind("a HEIF image")
        if brand in (b"avif", b"avis"):
            return Kind("an AVIF image")
        return Kind("an MP4/QuickTime media file")
    if head[4:8] == b"TFL3":
        return Kind("a TensorFlow Lite model", _OTHER_MODEL)
    if head[:2] == b"BM" and len(head) >= 14 and head[6:10] == b"\x00\x00\x00\x00":
        return Kind("a BMP image")
    return None


def _onnx(head: bytes) -> bool:
    """An ONNX ModelProto: field 1 (ir_version, a small varint) first, then another field."""
    return len(head) >= 3 and head[0] == 0x08 and 1 <= head[1] <= 15 and head[2] in (0x12, 0x1A, 0x22, 0x2A, 0x3A, 0x42)


def _text(head: bytes) -> Kind | None:
    """What a text file is (HTML, JSON, ...), or None for binary data."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:  # a multi-byte character cut at the end of the head is fine
        if e.start < len(head) - 3:
            return None
        text = head[:e.start].decode("utf-8")
    if any(ord(c) < 32 and c not in "\t\n\r\f" for c in text):
        return None
    start = text.lstrip().lower()
    if start.startswith(("<!doctype html", "<html")):
        return Kind("an HTML page", "a web page was saved in place of the file; download the file itself "
                    "(on the Hub: its /resolve/ URL, not its /blob/ page)")
    if start.startswith("<?xml"):
        return Kind("an XML file")
    if start.startswith(("{", "[")):
        return Kind("a JSON file")
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return Kind(f"a text file beginning {line[:40]!r}" if line else "a text file of blank lines")


def foreign_format(head: bytes) -> Kind | None:
    """What a file starting with ``head`` is, if that is something no checkpoint starts with;
    None for what may be a checkpoint (a zip archive, a pickle) or an unknown signature."""
    if not head:
        return Kind("an empty file")
    if head[8:9] == b"{":  # safetensors: an 8-byte header length, then its JSON header
        return Kind("a safetensors file", "read it with load_safetensors or open_checkpoint", checkpoint=True)
    for prefix, kind in _PREFIXES:
        if head.startswith(prefix):
            return kind
    found = _riff_or_iso(head)
    if found is not None:
        return found
    if _onnx(head):
        return Kind("an ONNX model", _OTHER_MODEL)
    if head[:1] == b"\x80" or _legacy_text_pickle(head):
        return None
    return _text(head)


def _legacy_text_pickle(head: bytes) -> bool:
    """torch.save's legacy format written with pickle protocol 0 or 1 starts with its magic
    number as a text LONG opcode (``L<digits>L``); every other protocol starts with ``0x80``."""
    return re.match(rb"L\d+L?\n", head) is not None


def may_be_pickle(head: bytes) -> bool:
    """Whether ``head`` can start a pickle that torch.save wrote (protocol 2 to 5, or 0/1)."""
    return (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5) or _legacy_text_pickle(head)


def unrecognised(head: bytes) -> Kind:
    """A file no signature names: its first bytes, for whoever knows the format."""
    return Kind(f"a file of unknown format, beginning {head[:8].hex(' ')}")


def zip_contents(path: Path) -> Kind:
    """What a zip archive without ``<name>/data.pkl`` holds instead (it is no torch.save file)."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return Kind("a zip archive without <name>/data.pkl")
    if names and all(n.endswith(".npy") for n in names):
        return Kind("a NumPy .npz archive")
    if "[Content_Types].xml" in names:
        return Kind("an Office document")
    if "model.weights.h5" in names:
        return Kind("a Keras .keras archive", _OTHER_MODEL)
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return Kind(f"a zip archive of {len(names)} file(s) without <name>/data.pkl: {shown or 'empty'}")
