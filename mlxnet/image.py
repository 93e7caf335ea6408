"""The one image I/O module: reading, writing (atomically), resizing and drawing.

Arrays are numpy uint8 HWC RGB (or HW for masks) until a model's preprocessing turns them
into float NHWC ``mx.array`` batches.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image, ImageDraw, UnidentifiedImageError

from .errors import MlxnetError

PathLike = str | os.PathLike


def load_image(path: PathLike, mode: str = "RGB") -> np.ndarray:
    """Read an image file as uint8 HWC RGB (``mode="L"``: HW grey)."""
    p = Path(path)
    if not p.is_file():
        raise MlxnetError(f"{p}: no such image file")
    try:
        with Image.open(p) as im:
            return np.asarray(im.convert(mode)).copy()
    except (UnidentifiedImageError, OSError) as e:
        raise MlxnetError(f"{p}: not a readable image ({e})") from None


def check_output_path(output: PathLike, inputs: Sequence[PathLike] = (), force: bool = True) -> Path:
    """Refuse to write over an input file (or an existing file unless ``force``)."""
    out = Path(output)
    for i in inputs:
        if Path(i).exists() and out.exists() and out.resolve() == Path(i).resolve():
            raise MlxnetError(f"{out}: output would overwrite the input; choose another path")
    if out.exists() and not force:
        raise MlxnetError(f"{out}: exists; pass --force to overwrite")
    return out


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Write a file via a temporary sibling and os.replace: readers never see a partial file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_image(image: np.ndarray, path: PathLike) -> Path:
    """Save uint8 HWC/HW to ``path`` atomically; the format follows the suffix."""
    import io

    p = Path(path)
    fmt = Image.registered_extensions().get(p.suffix.lower())
    if fmt is None:
        raise MlxnetError(f"{p}: unknown image format {p.suffix!r} (use .png or .jpg)")
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buf, format=fmt)
    atomic_write_bytes(p, buf.getvalue())
    return p


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


def draw_boxes(image: np.ndarray, boxes: np.ndarray, labels: Sequence[str],
               colour_ids: Sequence[int] | None = None, width: int = 3) -> np.ndarray:
    """Draw labelled xyxy boxes on a copy of the image."""
    pil = Image.fromarray(image.copy())
    draw = ImageDraw.Draw(pil)
    for i, (box, label) in enumerate(zip(np.asarray(boxes, dtype=np.float64), labels)):
        colour = tuple(int(c) for c in PALETTE[(colour_ids[i] if colour_ids is not None else i) % len(PALETTE)])
        x1, y1, x2, y2 = box.tolist()
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
