"""The one image I/O module: reading, writing (atomically), resizing and drawing; and the one
place outputs are checked and written (:func:`check_output_path`, :func:`atomic_write`).

Arrays are numpy uint8 HWC RGB (or HW for masks) until a model's preprocessing turns them
into float NHWC ``mx.array`` batches.
"""
from __future__ import annotations

import io
import os
import re
import secrets
import shutil
import stat
import struct
import threading
import time
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Callable, Literal, Sequence

import mlx.core as mx
import numpy as np
from PIL import Image, ImageDraw, ImageFont, ImageOps, UnidentifiedImageError

from .errors import MlxnetError

PathLike = str | os.PathLike

# What Pillow raises for a file it cannot decode (truncated data, a broken header or EXIF block).
_UNREADABLE = (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError, struct.error,
               IndexError, KeyError, ZeroDivisionError)
# Integer modes Pillow would clip to 8 bits: 16-bit, and 32-bit "I" (what some readers give 16-bit data as).
_WIDE_INTEGER = ("I;16", "I;16B", "I;16L", "I;16N", "I")


# Reads of an image file are served this many bytes at a time at most (see _ChunkedReader).
_READ_CHUNK = 1 << 20


class _ChunkedReader(io.BufferedReader):
    """An image file whose reads take memory only for the bytes that arrive: ``read(n)`` of a
    plain file reserves n bytes before reading, and Pillow reads what a chunk header declares
    (the rest of a PNG IDAT chunk claiming 4 GB is skipped with one read)."""

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0 or size <= _READ_CHUNK:  # read() to the end: the file's own size
            return super().read(size)
        parts = []
        while size > 0:
            part = super().read(min(size, _READ_CHUNK))
            if not part:
                break
            parts.append(part)
            size -= len(part)
        return b"".join(parts)


# The most pixels one byte of a file can stand for, where a format's coding bounds it: PNG's
# deflate inflates at most 1032:1, of pixels that take at least 1 bit (8256); Huffman-coded JPEG
# spends at least a bit on each 8x8 block (512; arithmetic coding less: the same loose figure
# covers it); GIF's LZW codes of 9 bits or more stand for at most 4096 pixels each (3641), and a
# screen larger than the frames in it is no data. A header claiming more is refused unread.
_PIXELS_PER_BYTE = {"PNG": 8256, "JPEG": 8256, "MPO": 8256, "GIF": 8256}


def pixel_budget(max_pixels: int | None = None) -> int:
    """The most pixels (width x height) an image file may decode to: ``max_pixels`` where a
    call gives it, else ``MLXNET_MAX_PIXELS``, else 50,000,000 (a 48 MP photo fits). It may not
    exceed Pillow's decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``, 89,478,485 unless
    changed), which stays the second guard."""
    from .env import limit

    value = limit("MLXNET_MAX_PIXELS") if max_pixels is None else max_pixels
    where = "max_pixels" if max_pixels is not None else "MLXNET_MAX_PIXELS"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1:
        raise MlxnetError(f"{where}: the image pixel budget must be a positive number, got {value!r}")
    ceiling = Image.MAX_IMAGE_PIXELS
    if ceiling is not None and value > ceiling:
        raise MlxnetError(f"{where}: the image pixel budget {int(value):,} is over Pillow's decompression-bomb "
                          f"limit of {ceiling:,} pixels (PIL.Image.MAX_IMAGE_PIXELS)")
    return int(value)


def _not_a_file(path: PathLike) -> str:
    """Why ``path`` cannot be read as an image, said as what the user typed: a folder, or a name
    meant as one (a trailing slash, no image extension), is not "no such image file"."""
    name = os.fspath(path)
    if os.path.isdir(name):
        return f"{name} is a folder, not an image file"
    if name.endswith(("/", os.sep)) or not is_image_name(os.path.basename(name)):
        return f"{name}: no such file or folder"
    return f"{name}: no such image file"


def _decode(path: PathLike, max_pixels: int | None = None) -> Image.Image:
    """The decoded first frame of an image file, upright (EXIF orientation applied: Pillow
    leaves it to the caller), with every failure a one-line MlxnetError naming the file.

    Its size is read from the header and checked, before any pixel is decoded, against what
    the file's bytes can hold (PNG, JPEG, GIF: ``_PIXELS_PER_BYTE``) and the pixel budget
    (:func:`pixel_budget`): decoding holds about 4 bytes a pixel,
    and a whole load 10 to 11 at its peak. Pillow's decompression-bomb guard is kept at its
    global limit (``Image.MAX_IMAGE_PIXELS``, not changed here); both its warning (over the
    limit) and its error (over twice the limit) refuse the file. Reads grow with the bytes
    that arrive (:class:`_ChunkedReader`), and whatever Pillow raises for a malformed file
    (any exception type: its plugins are not written against hostile input) is one line."""
    p = Path(path)
    if not p.is_file():
        raise MlxnetError(_not_a_file(path))
    return _decode_stream(lambda: _ChunkedReader(io.FileIO(p, "rb")), p.stat().st_size, p, max_pixels)


def decode_bytes(data: bytes, name: str, max_pixels: int | None = None) -> Image.Image:
    """An image received as bytes (an upload), decoded by the rules of :func:`_decode`: the same
    size checks before any pixel is decoded, every failure one line naming ``name``."""
    return _decode_stream(lambda: io.BytesIO(data), len(data), name, max_pixels)


def _decode_stream(open_stream: Callable[[], io.IOBase], size: int, p: object,
                   max_pixels: int | None) -> Image.Image:
    """:func:`_decode`'s work on a stream of ``size`` bytes; messages name ``p``."""
    budget = pixel_budget(max_pixels)
    try:
        with warnings.catch_warnings():  # only this block sees the warning as an error
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with open_stream() as f, Image.open(f) as im:
                width, height = im.size
                per_byte = _PIXELS_PER_BYTE.get(im.format)
                if per_byte is not None and width * height > per_byte * size:
                    raise MlxnetError(f"{p}: a {size:,}-byte {im.format} file cannot hold {width}x{height} pixels "
                                      f"(at most {per_byte:,} a byte); its header is corrupt; not decoded")
                if width * height > budget:
                    raise MlxnetError(f"{p}: image has {width * height:,} pixels ({width}x{height}), over the "
                                      f"{budget:,}-pixel budget (max_pixels, MLXNET_MAX_PIXELS); not decoded")
                im.load()
                ImageOps.exif_transpose(im, in_place=True)  # no copy: the decoded frame is turned
                return im
    except MlxnetError:
        raise
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as e:
        found = re.search(r"\((\d+) pixels\)", str(e))
        pixels = f"{int(found.group(1)):,} pixels" if found else "too many pixels"
        raise MlxnetError(f"{p}: image has {pixels}, over the {Image.MAX_IMAGE_PIXELS:,}-pixel limit "
                          "(PIL.Image.MAX_IMAGE_PIXELS) that guards against decompression bombs; "
                          "not decoded") from None
    except MemoryError:
        raise MlxnetError(f"{p}: out of memory decoding the image") from None
    except Exception as e:  # noqa: BLE001  (Pillow's plugins raise any type for a malformed file)
        reason = " ".join(str(e).split()) or type(e).__name__  # one line, whatever Pillow said
        if isinstance(e, UnidentifiedImageError):  # Pillow names the file object; say its path
            reason = f"cannot identify image file {str(p)!r}"
        elif not isinstance(e, _UNREADABLE):
            reason = f"{type(e).__name__}: {reason}"
        raise MlxnetError(f"{p}: not a readable image ({reason})") from None


def _to_8bit(im: Image.Image) -> Image.Image:
    """An image whose modes Pillow converts correctly to L/RGB: 16-bit and float scaled to 8 bits.

    Pillow's own conversion of these modes clips instead of scaling (a 16-bit mid-grey would
    come out white). The rules: 16-bit (``I;16*``, and ``I``, clipped to [0, 65535] first) is
    divided by 257 and rounded (65535 -> 255, 32768 -> 128); float (``F``) is taken as [0, 1]
    intensities, times 255, rounded and clipped to [0, 255] (NaN -> 0). 16-bit RGB(A) PNGs
    never reach here: Pillow decodes them to 8 bits itself, keeping each sample's high byte
    (v >> 8: scaled, not clipped, within one level of v / 257 rounded). Other modes (1, P, PA, LA, CMYK, YCbCr,
    ...) go through Pillow's own conversion."""
    if im.mode in _WIDE_INTEGER:
        a = np.clip(np.asarray(im).astype(np.int64), 0, 65535)
        # v/257 is never exactly half-way for an integer v, so this floor is round(v / 257).
        return Image.fromarray(((a + 128) // 257).astype(np.uint8), "L")
    if im.mode == "F":
        a = np.nan_to_num(np.asarray(im, dtype=np.float32), nan=0.0, posinf=1.0, neginf=0.0)
        return Image.fromarray(np.clip(np.rint(a * 255.0), 0, 255).astype(np.uint8), "L")
    return im


@lru_cache(maxsize=1)
def readable_extensions() -> frozenset[str]:
    """Extensions (lower case, with the dot) that Pillow here registers a reader for."""
    from PIL import Image

    return frozenset(ext for ext, fmt in Image.registered_extensions().items() if fmt in Image.OPEN)


def is_image_name(name: str) -> bool:
    """A file name an image folder scan takes: not hidden, with an extension Pillow reads."""
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in readable_extensions()


def _pil_rgb(im: Image.Image, name: object) -> np.ndarray:
    """A decoded PIL image as uint8 HWC RGB, by the rules a file is read with (:func:`_to_8bit`;
    alpha dropped; palette, LA and CMYK converted by Pillow)."""
    try:
        return np.asarray(_to_8bit(im).convert("RGB")).copy()  # writable, owning its memory
    except _UNREADABLE as e:
        raise MlxnetError(f"{name}: cannot convert a {im.mode} image to RGB ({e})") from None


def load_image(path: PathLike, mode: str = "RGB", *, max_pixels: int | None = None) -> np.ndarray:
    """Read an image file as uint8 HWC RGB (``mode="L"``: HW grey), upright.

    16-bit and float images are scaled to 8 bits (see :func:`_to_8bit`); alpha is dropped;
    palette, LA and CMYK images are converted by Pillow. An image over the pixel budget
    (``max_pixels``, else :func:`pixel_budget`'s default) is refused from its header with a
    one-line MlxnetError, and so is one over Pillow's decompression-bomb limit."""
    im = _decode(path, max_pixels)
    if mode == "RGB" and im.mode == "RGB":  # the common case, without convert()'s copy
        pixels = np.asarray(im)  # read-only, over a bytes copy of the frame
        del im  # the frame (4 bytes a pixel) goes before the writable copy: ~7 bytes a pixel at the peak
        return pixels.copy()
    if mode == "RGB":
        return _pil_rgb(im, path)
    try:
        return np.asarray(_to_8bit(im).convert(mode)).copy()
    except _UNREADABLE as e:
        raise MlxnetError(f"{path}: cannot convert a {im.mode} image to {mode} ({e})") from None


def _pil_filled(im: Image.Image, name: object) -> np.ndarray:
    """HW bool: the pixels of a decoded PIL image that a mask fills (see :func:`load_mask`)."""
    try:
        if im.mode in _WIDE_INTEGER or im.mode == "F":
            return np.nan_to_num(np.asarray(im, dtype=np.float64)) != 0
        return np.asarray(im.convert("RGB")).any(axis=-1)
    except _UNREADABLE as e:
        raise MlxnetError(f"{name}: cannot read a {im.mode} image as a mask ({e})") from None


def load_mask(path: PathLike, *, max_pixels: int | None = None) -> np.ndarray:
    """Read an inpainting mask as HW uint8: 255 where the pixel is filled, 0 elsewhere.

    The rule: every non-black pixel is filled, whatever its brightness. A pixel is black when
    all its colour channels are 0 at the file's own precision (an RGB (0, 0, 2) is filled; it
    would be 0 after a grey conversion, which weights blue by 0.114 and rounds). Alpha is
    ignored (as a grey reading of the file would ignore it); palette images are read through
    their palette, CMYK through Pillow's RGB conversion. ``max_pixels``: as for :func:`load_image`."""
    im = _decode(path, max_pixels)
    filled = np.asarray(im).any(axis=-1) if im.mode == "RGB" else _pil_filled(im, path)
    del im
    return filled.view(np.uint8) * np.uint8(255)  # one byte a pixel throughout (np.where made int64)


# --- Inputs of the models' Python entry points ---------------------------------------------
#
# The Python API takes what the CLI takes: a path is read as the CLI reads it, a PIL image is
# converted by the same rules, and an array's pixels follow the rules a file's pixels follow
# (16-bit divided by 257, float as 0-1 intensities, alpha dropped). Every model entry point goes
# through as_rgb / as_mask, so they all accept the same things and refuse them in the same words.

ImageInput = str | os.PathLike | Image.Image | np.ndarray | mx.array
_PIXELS = "an (H, W, 3) RGB image (uint8, or float in [0, 1])"


def _as_numpy(x: np.ndarray | mx.array) -> np.ndarray:
    if isinstance(x, mx.array):
        # NumPy has no bfloat16: widen it first (exact); every other MLX dtype converts as is.
        return np.array(x.astype(mx.float32) if x.dtype == mx.bfloat16 else x)
    return x


def _array_kind(a: np.ndarray | mx.array) -> str:
    library = "an MLX" if isinstance(a, mx.array) else "a NumPy"
    dtype = str(a.dtype).removeprefix("mlx.core.")
    return f"{library} {dtype} array of shape {tuple(a.shape)}"


def _rgb_channels(a: np.ndarray, what: str, described: str) -> np.ndarray:
    """(H, W, 3) from (H, W, 3) or (H, W, 4) (alpha dropped, as a file's); any other shape is an
    error that says what was expected, with a hint for the usual mix-ups."""
    if a.ndim == 3 and a.shape[2] in (3, 4):
        if min(a.shape[:2]) < 1:
            raise MlxnetError(f"{what}: empty image ({described})")
        return a[..., :3]
    if a.ndim == 3 and a.shape[0] in (1, 3, 4):
        hint = "; channels first? transpose it to (H, W, C)"
    elif a.ndim == 4:
        hint = "; one image at a time (a list of images where a batch is taken)"
    elif a.ndim == 2 or (a.ndim == 3 and a.shape[2] == 1):
        hint = "; a grey image? repeat it to 3 channels, or pass a PIL 'L' image or the file"
    else:
        hint = ""
    raise MlxnetError(f"{what}: expected {_PIXELS}, got {described}{hint}")


def _rgb_values(a: np.ndarray, what: str, described: str, dtype: str) -> np.ndarray:
    """The pixels as uint8 (or float32 in [0, 1]) by a file's rules; values a file could not
    hold (float outside [0, 1], NaN, integers past 255) are refused, not clipped: they are a
    caller's mistake (0..255 floats, logits), which clipping would hide."""
    if a.dtype == np.bool_:
        a = a.astype(np.uint8) * 255
    elif a.dtype == np.uint16:
        a = ((a.astype(np.int64) + 128) // 257).astype(np.uint8)  # round(v / 257), as 16-bit files
    elif np.issubdtype(a.dtype, np.integer) and a.dtype != np.uint8:
        low, high = int(a.min()), int(a.max())
        if low < 0 or high > 255:
            raise MlxnetError(f"{what}: integer pixels must be in 0..255, got {low}..{high} ({described})")
        a = a.astype(np.uint8)
    elif np.issubdtype(a.dtype, np.floating):
        if not np.isfinite(a).all():
            raise MlxnetError(f"{what}: float pixels must be finite, got NaN or infinity ({described})")
        low, high = float(a.min()), float(a.max())
        if low < 0 or high > 1:
            raise MlxnetError(f"{what}: float pixels must be in [0, 1], got {low:.4g}..{high:.4g} "
                              f"({described}); for 0..255 values pass uint8")
        if dtype == "float32":
            return a.astype(np.float32)
        a = np.rint(a.astype(np.float64) * 255).astype(np.uint8)
    elif a.dtype != np.uint8:
        raise MlxnetError(f"{what}: expected {_PIXELS}, got {described}")
    return a.astype(np.float32) / 255 if dtype == "float32" else np.ascontiguousarray(a)


def as_rgb(image: ImageInput, what: str = "image", *,
           dtype: Literal["uint8", "float32"] = "uint8") -> np.ndarray:
    """One image as the models take it: (H, W, 3) RGB, uint8 (``dtype="float32"``: float32 in
    [0, 1], a float input kept exactly), from any of

    - a path (str or PathLike), read as the CLI reads it (:func:`load_image`: upright, 16-bit
      and float files scaled, alpha dropped);
    - a PIL image of any mode, converted by the same rules (EXIF orientation applied);
    - a NumPy or MLX array (H, W, 3) or (H, W, 4) (alpha dropped): uint8; bool; uint16
      (divided by 257); other integers in 0..255; float in [0, 1].

    Anything else is a one-line MlxnetError starting with ``what`` (the caller's name for the
    argument) that says what was expected and what came; a file's errors name the file."""
    if isinstance(image, (str, os.PathLike)):
        pixels = load_image(image)
    elif isinstance(image, Image.Image):
        pixels = _pil_rgb(_upright(image, what), what)
    elif isinstance(image, (np.ndarray, mx.array)):
        described = _array_kind(image)
        a = _rgb_channels(_as_numpy(image), what, described)
        return _rgb_values(a, what, described, dtype)
    else:
        raise MlxnetError(f"{what}: expected a path, a PIL image, or a NumPy or MLX array "
                          f"holding {_PIXELS}; got {type(image).__name__}")
    return pixels.astype(np.float32) / 255 if dtype == "float32" else pixels


def as_rgb_images(images: ImageInput | Sequence[ImageInput],
                  what: str = "image") -> tuple[list[np.ndarray], bool]:
    """The uint8 (H, W, 3) pixels of one image or of a sequence of them (each by
    :func:`as_rgb`), and whether it was one image (a predictor then returns one result, not a
    list). An array is always one image: a batch is a list."""
    if isinstance(images, Sequence) and not isinstance(images, (str, bytes)):
        return [as_rgb(im, f"{what}, image {i}") for i, im in enumerate(images)], False
    return [as_rgb(images, what)], True


def _upright(im: Image.Image, what: str) -> Image.Image:
    """A PIL image as a file is read: EXIF orientation applied (a no-op without EXIF)."""
    try:
        return ImageOps.exif_transpose(im)
    except _UNREADABLE as e:
        raise MlxnetError(f"{what}: cannot read the {im.mode} image ({e})") from None


def as_mask(mask: ImageInput, what: str = "mask") -> np.ndarray:
    """A mask as the models take it: (H, W) bool, True where a pixel is filled, by the CLI's
    rule (every non-black pixel), from any of

    - a path, read by :func:`load_mask`; a PIL image of any mode ('L', '1', RGB, ...) by the
      same rule (any colour channel non-zero, alpha ignored);
    - a NumPy or MLX array (H, W), (H, W, 1), (H, W, 3) or (H, W, 4) (alpha ignored): bool, or
      numbers where every non-zero value fills. Negative values and NaN are refused: they are
      logits or scores, which the non-zero rule would read as "fill everything".

    Anything else is a one-line MlxnetError starting with ``what``."""
    if isinstance(mask, (str, os.PathLike)):
        return load_mask(mask) > 0
    if isinstance(mask, Image.Image):
        return _pil_filled(_upright(mask, what), what)
    expected = "an (H, W) mask (bool, or numbers: non-zero fills)"
    if not isinstance(mask, (np.ndarray, mx.array)):
        raise MlxnetError(f"{what}: expected a path, a PIL image, or a NumPy or MLX array holding "
                          f"{expected}; got {type(mask).__name__}")
    described, a = _array_kind(mask), _as_numpy(mask)
    if a.ndim == 3 and a.shape[2] in (1, 3, 4):
        a = a[..., :3]
    elif a.ndim != 2:
        raise MlxnetError(f"{what}: expected {expected}, got {described}")
    if not (a.dtype == np.bool_ or np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise MlxnetError(f"{what}: expected {expected}, got {described}")
    if a.dtype != np.bool_:
        if np.issubdtype(a.dtype, np.floating) and np.isnan(a).any():
            raise MlxnetError(f"{what}: mask values must not be NaN ({described})")
        if a.size and a.min() < 0:
            raise MlxnetError(f"{what}: mask values must be >= 0 (non-zero fills), got a minimum of "
                              f"{a.min():.4g} ({described}); threshold logits first, e.g. mask > 0")
    filled = a != 0
    return filled.any(axis=-1) if filled.ndim == 3 else filled


# --- Outputs -------------------------------------------------------------------------------
#
# Every file mlxnet writes goes through atomic_write: a temporary sibling named by our one
# scheme, ".<name>.mlxnet-tmp-<pid>-<8 hex>[.<ext>]", then os.replace, so no reader sees a partial
# file. The temporary file is created by open(2) with mode 0o666, so the kernel applies the
# umask (and a folder's default ACL) itself: no os.umask() round trip, which would change the
# process-wide umask for a moment under other threads. A write killed before its os.replace
# leaves its temporary file; the next write into that folder removes it once it is stale.

_TMP_MARK = ".mlxnet-tmp-"
_TMP_NAME = re.compile(r"\..*\.mlxnet-tmp-(\d+)-[0-9a-f]{8}(\.[A-Za-z0-9]+)?", re.DOTALL)
STALE_TMP_SECONDS = 3600  # any temporary file untouched this long is from a dead write
_DEAD_WRITER_GRACE_SECONDS = 60  # a pid not alive here may be a live writer on another host
_swept: set[str] = set()  # folders already cleaned by this process (once each: cheap for many outputs)


class OutputError(MlxnetError, OSError):
    """Writing an output failed. It names the output, never the temporary file; it is an
    OSError too, so callers that catch OSError around a write still do."""


def temporary_path(target: Path, suffix: str = "") -> Path:
    """A fresh temporary sibling of ``target`` in mlxnet's one naming scheme; ``suffix`` for a
    writer that insists on an extension (MLX appends ".safetensors" to a name without it)."""
    return target.with_name(f".{target.name[:120]}{_TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}{suffix}")


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True


def clean_stale_temporaries(folder: Path) -> list[Path]:
    """Remove this scheme's temporary files in ``folder`` left by killed writes: the writer's
    pid is not alive and the file is over a minute old, or it is over an hour old. Returns
    what was removed; errors (a file another user owns) leave the file."""
    removed = []
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        found = _TMP_NAME.fullmatch(entry.name)
        if not found:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            age = now - info.st_mtime
            if stat.S_ISREG(info.st_mode) and (
                    age > STALE_TMP_SECONDS
                    or (age > _DEAD_WRITER_GRACE_SECONDS and not _alive(int(found.group(1))))):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            pass
    return removed


def _write_error(target: Path, error: BaseException, tmp: Path | None = None) -> OutputError:
    """``error`` restated about ``target``: the temporary file's name never reaches the user."""
    reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
    if tmp is not None:
        reason = reason.replace(str(tmp), str(target))
    wrapped = OutputError(f"{target}: cannot write: {' '.join(reason.split())}")
    wrapped.errno = getattr(error, "errno", None)
    return wrapped


def atomic_write(path: PathLike, write: Callable[[Path], None], suffix: str = "") -> Path:
    """Create or replace ``path`` atomically: ``write(tmp)`` fills a temporary sibling (which
    exists, empty, mode 0666 minus the umask), then it is flushed to disk and renamed over
    ``path``. On any failure the temporary file is removed and ``path`` is untouched; an
    OSError or RuntimeError (MLX's I/O errors) becomes an :class:`OutputError` naming ``path``.
    ``suffix`` ends the temporary name (see :func:`temporary_path`)."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _write_error(p, e) from e
    folder = str(p.parent.resolve())
    if folder not in _swept:
        clean_stale_temporaries(p.parent)
        _swept.add(folder)
    tmp = temporary_path(p, suffix)
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError as e:
        raise _write_error(p, e, tmp) from e
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)  # the data reaches the disk before the name does
        finally:
            os.close(fd)
        os.replace(tmp, p)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, (OSError, RuntimeError)) and not isinstance(e, MlxnetError):
            raise _write_error(p, e, tmp) from e
        raise
    return p


def atomic_write_bytes(path: PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (:func:`atomic_write`)."""
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


@lru_cache(maxsize=None)
def _can_encode(fmt: str) -> bool:
    """Whether Pillow here really writes ``fmt``: registered savers include stubs (BUFR,
    GRIB, HDF5, WMF) that fail without an external handler, so encode one pixel to see."""
    try:
        Image.new("RGB", (1, 1)).save(io.BytesIO(), format=fmt)
    except Exception:  # noqa: BLE001 - any failure means "not writable here"
        return False
    return True


def image_format(path: PathLike) -> str:
    """The Pillow format an output path's extension asks for, if Pillow can write it here;
    else a one-line MlxnetError naming the path."""
    p = Path(path)
    fmt = Image.registered_extensions().get(p.suffix.lower())
    if fmt is None or fmt not in Image.SAVE or not _can_encode(fmt):
        common = [e for e in (".png", ".jpg", ".webp", ".bmp", ".tif")
                  if Image.registered_extensions().get(e) in Image.SAVE]
        what = f"{p.suffix!r} is not an image format Pillow can write" if p.suffix else "no file extension"
        raise MlxnetError(f"{p}: {what}; use {', '.join(common)} or another format Pillow writes")
    return fmt


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)  # links, bind mounts and case-insensitive names included
    except OSError:
        return False


def check_output_path(output: PathLike, inputs: Sequence[PathLike] = (), force: bool = True,
                      kind: Literal["image", "file"] = "image") -> Path:
    """Check an output path before any work, so a bad one fails in a second, not after inference.

    Refuses: writing over an input (the same file by any name), an existing file unless
    ``force``, a path that is a folder, a folder that cannot be created or written (the nearest
    existing ancestor must be a writable folder), and for ``kind="image"`` an extension that is
    not a format Pillow can write here. Creates nothing."""
    out = Path(output)
    if kind == "image":
        image_format(out)
    for i in inputs:
        if _same_file(out, Path(i)):
            raise MlxnetError(f"{out}: output would overwrite the input {i}; choose another path")
    if out.is_dir():
        raise MlxnetError(f"{out}: is a folder; give a file name")
    if out.exists() and not force:
        raise MlxnetError(f"{out}: exists; pass --force to overwrite")
    folder = out.absolute().parent
    while not folder.exists() and not folder.is_symlink() and folder != folder.parent:
        folder = folder.parent  # the nearest existing ancestor: the write creates the rest
    if not folder.is_dir():
        raise MlxnetError(f"{out}: cannot create its folder: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise MlxnetError(f"{out}: folder {folder} is not writable")
    return out


JPEG_QUALITY = 95  # a JPEG output whose source is no JPEG (OpenCV's and ultralytics' default)


def _jpeg_settings(source: PathLike | None) -> dict:
    """Pillow's save options that keep ``source``'s JPEG quality: its quantisation tables and
    chroma subsampling; for another source (or none) quality :data:`JPEG_QUALITY`. (Pillow's
    own default, 75, visibly degrades a photo written back.)"""
    if source is not None:
        try:
            with Image.open(source) as src:
                if src.format == "JPEG" and src.quantization:
                    from PIL import JpegImagePlugin

                    return {"qtables": src.quantization, "subsampling": JpegImagePlugin.get_sampling(src)}
        except (OSError, ValueError):
            pass
    return {"quality": JPEG_QUALITY}


def save_image(image: np.ndarray, path: PathLike, source: PathLike | None = None,
               unchanged: bool = False) -> Path:
    """Save uint8 HWC/HW (or uint16 HW) to ``path`` atomically; the format follows the suffix.

    ``source``: the input the image was made from. A JPEG output keeps its JPEG quality, and
    with ``unchanged`` (the caller knows the pixels are the source's) an output of the source's
    format is a copy of its bytes, not a re-encoding."""
    p = Path(path)
    fmt = image_format(p)
    if unchanged and source is not None:
        try:
            with Image.open(source) as src:
                same = src.format == fmt
        except (OSError, ValueError):
            same = False
        if same:
            return atomic_write(p, lambda tmp: shutil.copyfile(source, tmp))
    buf = io.BytesIO()
    array = np.ascontiguousarray(image)
    options = _jpeg_settings(source) if fmt == "JPEG" else {}
    try:
        Image.fromarray(array).save(buf, format=fmt, **options)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise MlxnetError(f"{p}: cannot write a {array.dtype} {'×'.join(map(str, array.shape))} "
                          f"image as {fmt} ({e})") from None
    return atomic_write_bytes(p, buf.getvalue())


def resize_pil(image: np.ndarray, size: tuple[int, int], resample: str = "bilinear") -> np.ndarray:
    """Resize to (width, height) with PIL (antialiased, as torchvision does for PIL images)."""
    filters = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST}
    return np.asarray(Image.fromarray(image).resize(size, filters[resample]))


def resize_bilinear(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize to (width, height) with OpenCV's INTER_LINEAR: half-pixel centres, no
    antialiasing, uint8 in OpenCV's 11-bit fixed point. This is the resize of ultralytics'
    letterbox, so the network sees the pixels it would see there, computed in OpenCV's C++."""
    import cv2  # imported here: only the commands that resize pay for loading OpenCV

    h, w = image.shape[:2]
    if tuple(size) == (w, h):
        return image.copy()
    out = cv2.resize(np.ascontiguousarray(image), (int(size[0]), int(size[1])), interpolation=cv2.INTER_LINEAR)
    return out.reshape(out.shape[:2] + image.shape[2:])  # OpenCV drops a last axis of 1


def center_crop(image: np.ndarray, size: int) -> np.ndarray:
    """Crop the central size×size square (torchvision's rounding)."""
    h, w = image.shape[:2]
    top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    if top < 0 or left < 0:
        raise MlxnetError(f"center_crop: image {w}x{h} is smaller than the crop {size}")
    return image[top:top + size, left:left + size]


# A fixed, distinguishable palette for boxes and masks.
PALETTE = np.array([
    (255, 56, 56), (255, 157, 151), (255, 112, 31), (255, 178, 29), (207, 210, 49), (72, 249, 10),
    (146, 204, 23), (61, 219, 134), (26, 147, 52), (0, 212, 187), (44, 153, 168), (0, 194, 255),
    (52, 69, 147), (100, 115, 255), (0, 24, 236), (132, 56, 255), (82, 0, 133), (203, 56, 255),
    (255, 149, 200), (255, 55, 199)], dtype=np.uint8)


def overlay_masks(image: np.ndarray, masks: Sequence[np.ndarray], alpha: float = 0.5,
                  colour_ids: Sequence[int] | None = None) -> np.ndarray:
    """Blend each boolean HW mask onto a copy of the image in its palette colour (the i-th mask's,
    or ``colour_ids[i]``'s: a detector colours by class), one after another, in 8 bits."""
    out = np.array(image, dtype=np.uint8, copy=True, order="C")
    for i, m in enumerate(masks):
        colour = PALETTE[(colour_ids[i] if colour_ids is not None else i) % len(PALETTE)]
        m = np.asarray(m, bool)
        rows, cols = np.flatnonzero(m.any(axis=1)), np.flatnonzero(m.any(axis=0))
        if rows.size == 0:
            continue
        # Only the mask's bounding box is touched: an instance mask covers a part of a photo.
        window = (slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1))
        part = np.ascontiguousarray(out[window])
        blend_colour(part, m[window], colour, alpha)
        out[window] = part
    return out


def blend_colour(part: np.ndarray, mask: np.ndarray, colour: Sequence[float], alpha: float) -> None:
    """Cover the ``mask`` pixels of a C-contiguous (h, w, 3) uint8 window by ``alpha`` of
    ``colour``, in place, in OpenCV's 8-bit arithmetic: round(pixel × (1 - alpha)) +
    round(colour × alpha), saturated."""
    import cv2  # OpenCV's blend: several times NumPy's float arithmetic on a photo's worth of masks

    blended = cv2.add(cv2.addWeighted(part, 1 - alpha, part, 0, 0), tuple(float(v) * alpha for v in colour) + (0.0,))
    cv2.copyTo(blended, np.ascontiguousarray(mask).view(np.uint8), part)


def box_on_image(box: Sequence[float], width: int, height: int) -> tuple[float, float, float, float] | None:
    """An xyxy box as it can be drawn on a ``width`` x ``height`` image: corners in order (a box
    may come with x2 < x1 from untrained weights; PIL refuses to draw it) and clipped to the
    image; None for a box with a NaN or infinite coordinate, or one wholly outside the image."""
    x1, y1, x2, y2 = (float(v) for v in box)
    if not all(np.isfinite((x1, y1, x2, y2))):
        return None
    x1, x2 = sorted((x1, x2))
    y1, y2 = sorted((y1, y2))
    right, bottom = width - 1, height - 1
    if x2 < 0 or y2 < 0 or x1 > right or y1 > bottom:
        return None
    return max(x1, 0.0), max(y1, 0.0), min(x2, right), min(y2, bottom)


_FONTS = threading.local()


def label_font() -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """PIL's default font, loaded once per thread: a drawing without a font loads it again for
    each ``ImageDraw.Draw`` (decoding the font each time, a box's label at a time), and one
    FreeType face is not shared between threads drawing at once."""
    font = getattr(_FONTS, "font", None)
    if font is None:
        font = _FONTS.font = ImageFont.load_default()
    return font


def draw_boxes(image: np.ndarray, boxes: np.ndarray, labels: Sequence[str],
               colour_ids: Sequence[int] | None = None, width: int = 3) -> np.ndarray:
    """Draw labelled xyxy boxes on a copy of the image; a degenerate box (zero or negative
    width, NaN, outside the image) is drawn as :func:`box_on_image` makes it, or left out.

    Each box is drawn through PIL on the region it covers only, in order, so a later box still
    covers an earlier one where they overlap: the pixels equal drawing on the whole image, without
    taking a whole 1080p frame into PIL and back for every frame of a video (about 3 ms). Where
    the regions together cover more than the image (many or large boxes), the whole image goes
    through PIL once instead."""
    out = np.array(image, dtype=np.uint8, copy=True, order="C")
    height, width_px = out.shape[:2]
    font = label_font()
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    marks = []  # (colour, box, label tag, text origin, region) per drawable box, in order
    for i, (box, label) in enumerate(zip(np.asarray(boxes, dtype=np.float64).reshape(-1, 4), labels)):
        colour = tuple(int(c) for c in PALETTE[(colour_ids[i] if colour_ids is not None else i) % len(PALETTE)])
        drawable = box_on_image(box, width_px, height)
        if drawable is None:
            continue
        x1, y1, x2, y2 = drawable
        tx0, ty0, tx1, ty1 = measure.textbbox((x1, y1), label, font=font)
        top = y1 - (ty1 - ty0) - 4 if y1 - (ty1 - ty0) - 4 >= 0 else y1
        tag = (x1, top, x1 + (tx1 - tx0) + 4, top + (ty1 - ty0) + 4)
        ink = measure.textbbox((x1 + 2, top + 1), label, font=font)
        # The region: the outline (a box narrower than twice the line width is drawn past its
        # other side), the label's box and the text's ink, with pixels to spare for PIL's
        # rounding, clipped to the image as drawing on the whole image clips.
        spare = width + 2
        left = max(0, int(np.floor(min(x1, tag[0], ink[0]))) - spare)
        upper = max(0, int(np.floor(min(y1, tag[1], ink[1]))) - spare)
        right = min(width_px, int(np.ceil(max(x2, tag[2], ink[2]))) + spare + 1)
        lower = min(height, int(np.ceil(max(y2, tag[3], ink[3]))) + spare + 1)
        marks.append((colour, drawable, tag, (x1 + 2, top + 1), label, (left, upper, right, lower)))
    whole = sum((r[2] - r[0]) * (r[3] - r[1]) for *_, r in marks) > height * width_px
    canvas = Image.fromarray(out) if whole else None
    for colour, (x1, y1, x2, y2), tag, (tx, ty), label, (left, upper, right, lower) in marks:
        if whole:
            region, left, upper = canvas, 0, 0
        else:
            region = Image.fromarray(out[upper:lower, left:right])
        draw = ImageDraw.Draw(region)
        draw.rectangle([x1 - left, y1 - upper, x2 - left, y2 - upper], outline=colour, width=width)
        draw.rectangle([tag[0] - left, tag[1] - upper, tag[2] - left, tag[3] - upper], fill=colour)
        draw.text((tx - left, ty - upper), label, fill=(255, 255, 255), font=font)
        if not whole:
            out[upper:lower, left:right] = np.asarray(region)
    return np.asarray(canvas).copy() if whole else out


def draw_keypoints(image: np.ndarray, keypoints: np.ndarray, skeleton: Sequence[tuple[int, int]] = (),
                   threshold: float = 0.25) -> np.ndarray:
    """Draw each detection's keypoints (K, P, 2 or 3: x, y and visibility) on a copy of the image:
    a dot per keypoint whose visibility reaches ``threshold`` (all where there is none) and a
    line per ``skeleton`` pair of such keypoints, in a colour per keypoint."""
    pil = Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8))
    draw = ImageDraw.Draw(pil)
    r = max(2, round(max(image.shape[:2]) / 200))
    height, width = image.shape[:2]
    for person in np.asarray(keypoints, dtype=np.float64):
        seen = person[:, 2] >= threshold if person.shape[1] > 2 else np.ones(len(person), bool)
        seen &= np.isfinite(person[:, :2]).all(axis=1) & (person[:, 0] > 0) & (person[:, 1] > 0)
        seen &= (person[:, 0] < width) & (person[:, 1] < height)
        for a, b in skeleton:
            if a < len(person) and b < len(person) and seen[a] and seen[b]:
                draw.line([tuple(person[a, :2]), tuple(person[b, :2])],
                          fill=tuple(int(c) for c in PALETTE[a % len(PALETTE)]), width=max(1, r // 2 + 1))
        for j, (x, y) in enumerate(person[:, :2]):
            if seen[j]:
                draw.ellipse([x - r, y - r, x + r, y + r], fill=tuple(int(c) for c in PALETTE[j % len(PALETTE)]))
    return np.asarray(pil)


def draw_prompts(image: np.ndarray, points: np.ndarray | None, labels: np.ndarray | None,
                 box: np.ndarray | None) -> np.ndarray:
    """Mark prompt points (green: foreground, red: background) and an xyxy box on a copy."""
    pil = Image.fromarray(image.copy())
    draw = ImageDraw.Draw(pil)
    r = max(3, round(max(image.shape[:2]) / 150))
    if box is not None:
        draw.rectangle(np.asarray(box, dtype=np.float64).tolist(), outline=(0, 255, 0), width=max(2, r // 2))
    for (x, y), lab in zip(points if points is not None else [], labels if labels is not None else []):
        draw.ellipse([x - r, y - r, x + r, y + r], fill=(0, 200, 0) if lab == 1 else (230, 0, 0),
                     outline=(255, 255, 255))
    return np.asarray(pil)
