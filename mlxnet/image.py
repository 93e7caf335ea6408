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
import stat
import struct
import time
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Callable, Literal, Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageOps, UnidentifiedImageError

from .errors import MlxnetError

PathLike = str | os.PathLike

# What Pillow raises for a file it cannot decode (truncated data, a broken header or EXIF block).
_UNREADABLE = (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError, struct.error,
               IndexError, KeyError, ZeroDivisionError)
# Integer modes Pillow would clip to 8 bits: 16-bit, and 32-bit "I" (what some readers give 16-bit data as).
_WIDE_INTEGER = ("I;16", "I;16B", "I;16L", "I;16N", "I")


def _decode(path: PathLike) -> Image.Image:
    """The decoded first frame of an image file, upright (EXIF orientation applied: Pillow
    leaves it to the caller), with every failure a one-line MlxnetError naming the file.

    Pillow's decompression-bomb guard is kept at its global limit (``Image.MAX_IMAGE_PIXELS``,
    not changed here); both its warning (over the limit) and its error (over twice the limit)
    refuse the file, so an oversized image is never decoded."""
    p = Path(path)
    if not p.is_file():
        raise MlxnetError(f"{p}: no such image file")
    try:
        with warnings.catch_warnings():  # only this block sees the warning as an error
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(p) as im:
                return ImageOps.exif_transpose(im)  # a loaded copy: the file can close
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as e:
        found = re.search(r"\((\d+) pixels\)", str(e))
        pixels = f"{int(found.group(1)):,} pixels" if found else "too many pixels"
        raise MlxnetError(f"{p}: image has {pixels}, over the {Image.MAX_IMAGE_PIXELS:,}-pixel limit "
                          "(PIL.Image.MAX_IMAGE_PIXELS) that guards against decompression bombs; "
                          "not decoded") from None
    except _UNREADABLE as e:
        reason = " ".join(str(e).split()) or type(e).__name__  # one line, whatever Pillow said
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


def load_image(path: PathLike, mode: str = "RGB") -> np.ndarray:
    """Read an image file as uint8 HWC RGB (``mode="L"``: HW grey), upright.

    16-bit and float images are scaled to 8 bits (see :func:`_to_8bit`); alpha is dropped;
    palette, LA and CMYK images are converted by Pillow. An image over Pillow's
    decompression-bomb limit is refused with a one-line MlxnetError."""
    im = _decode(path)
    try:
        return np.asarray(_to_8bit(im).convert(mode)).copy()  # writable, owning its memory
    except _UNREADABLE as e:
        raise MlxnetError(f"{path}: cannot convert a {im.mode} image to {mode} ({e})") from None


def load_images(images: PathLike | np.ndarray | Sequence[PathLike | np.ndarray]) -> tuple[list[np.ndarray], bool]:
    """The pixels of one image or of a sequence of them (paths are read by :func:`load_image`,
    arrays taken as they are), and whether it was one image (a predictor then returns one
    result, not a list)."""
    single = isinstance(images, (str, os.PathLike, np.ndarray))
    return [im if isinstance(im, np.ndarray) else load_image(im) for im in ([images] if single else images)], single


def load_mask(path: PathLike) -> np.ndarray:
    """Read an inpainting mask as HW uint8: 255 where the pixel is filled, 0 elsewhere.

    The rule: every non-black pixel is filled, whatever its brightness. A pixel is black when
    all its colour channels are 0 at the file's own precision (an RGB (0, 0, 2) is filled; it
    would be 0 after a grey conversion, which weights blue by 0.114 and rounds). Alpha is
    ignored (as a grey reading of the file would ignore it); palette images are read through
    their palette, CMYK through Pillow's RGB conversion."""
    im = _decode(path)
    try:
        if im.mode in _WIDE_INTEGER or im.mode == "F":
            filled = np.nan_to_num(np.asarray(im, dtype=np.float64)) != 0
        else:
            filled = np.asarray(im.convert("RGB")).any(axis=-1)
    except _UNREADABLE as e:
        raise MlxnetError(f"{path}: cannot read a {im.mode} image as a mask ({e})") from None
    return np.where(filled, 255, 0).astype(np.uint8)


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


def save_image(image: np.ndarray, path: PathLike) -> Path:
    """Save uint8 HWC/HW (or uint16 HW) to ``path`` atomically; the format follows the suffix."""
    p = Path(path)
    fmt = image_format(p)
    buf = io.BytesIO()
    array = np.ascontiguousarray(image)
    try:
        Image.fromarray(array).save(buf, format=fmt)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise MlxnetError(f"{p}: cannot write a {array.dtype} {'×'.join(map(str, array.shape))} "
                          f"image as {fmt} ({e})") from None
    return atomic_write_bytes(p, buf.getvalue())


def resize_pil(image: np.ndarray, size: tuple[int, int], resample: str = "bilinear") -> np.ndarray:
    """Resize to (width, height) with PIL (antialiased, as torchvision does for PIL images)."""
    filters = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST}
    return np.asarray(Image.fromarray(image).resize(size, filters[resample]))


def resize_bilinear(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize to (width, height) like OpenCV's INTER_LINEAR: half-pixel centres, no antialiasing.

    Computed in float32 and rounded to uint8 for uint8 input.
    """
    h, w = image.shape[:2]
    out_w, out_h = size
    if (out_w, out_h) == (w, h):
        return image.copy()

    def axis(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        src = (np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5
        src = np.clip(src, 0, n_in - 1)
        lo = np.floor(src).astype(np.int64)
        hi = np.minimum(lo + 1, n_in - 1)
        return lo, hi, (src - lo).astype(np.float32)

    y0, y1, fy = axis(h, out_h)
    x0, x1, fx = axis(w, out_w)
    img = image.astype(np.float32)
    fx = fx[None, :, None] if img.ndim == 3 else fx[None, :]
    top = img[y0][:, x0] * (1 - fx) + img[y0][:, x1] * fx
    bottom = img[y1][:, x0] * (1 - fx) + img[y1][:, x1] * fx
    fy = fy[:, None, None] if img.ndim == 3 else fy[:, None]
    out = top * (1 - fy) + bottom * fy
    if image.dtype == np.uint8:
        return np.clip(np.rint(out), 0, 255).astype(np.uint8)
    return out.astype(image.dtype)


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


def overlay_masks(image: np.ndarray, masks: Sequence[np.ndarray], alpha: float = 0.5) -> np.ndarray:
    """Blend each boolean HW mask onto a copy of the image in its palette colour."""
    out = image.astype(np.float32).copy()
    for i, m in enumerate(masks):
        colour = PALETTE[i % len(PALETTE)].astype(np.float32)
        m = m.astype(bool)
        out[m] = out[m] * (1 - alpha) + colour * alpha
    return np.clip(out, 0, 255).astype(np.uint8)


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


def draw_boxes(image: np.ndarray, boxes: np.ndarray, labels: Sequence[str],
               colour_ids: Sequence[int] | None = None, width: int = 3) -> np.ndarray:
    """Draw labelled xyxy boxes on a copy of the image; a degenerate box (zero or negative
    width, NaN, outside the image) is drawn as :func:`box_on_image` makes it, or left out."""
    pil = Image.fromarray(image.copy())
    draw = ImageDraw.Draw(pil)
    for i, (box, label) in enumerate(zip(np.asarray(boxes, dtype=np.float64).reshape(-1, 4), labels)):
        colour = tuple(int(c) for c in PALETTE[(colour_ids[i] if colour_ids is not None else i) % len(PALETTE)])
        drawable = box_on_image(box, pil.width, pil.height)
        if drawable is None:
            continue
        x1, y1, x2, y2 = drawable
        draw.rectangle([x1, y1, x2, y2], outline=colour, width=width)
        tx0, ty0, tx1, ty1 = draw.textbbox((x1, y1), label)
        top = y1 - (ty1 - ty0) - 4 if y1 - (ty1 - ty0) - 4 >= 0 else y1
        draw.rectangle([x1, top, x1 + (tx1 - tx0) + 4, top + (ty1 - ty0) + 4], fill=colour)
        draw.text((x1 + 2, top + 1), label, fill=(255, 255, 255))
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
