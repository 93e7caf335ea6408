"""Erase a masked region with LaMa, at any photo size.

The rule (IOPaint's "crop" strategy, with its "resize" strategy inside the crop):

1. The mask is dilated by ``dilate`` pixels (:func:`mlxnet.app.regions.dilate`).
2. LaMa sees a crop: the dilated mask's bounding box grown by ``margin`` pixels on every side
   (default 128: the context LaMa fills from), clipped to the image. The whole photo is never
   fed to LaMa unless the mask spans it.
3. A crop whose long side is above ``max_side`` (default 1024) is resized (PIL bilinear,
   antialiased) so that its long side is ``max_side``, and so is its mask (a pixel partly
   covered by the mask is a hole); LaMa fills it and its result is resized back to the crop.
4. Only the pixels inside the dilated mask take LaMa's values: every other pixel of the output
   is the input's, byte for byte.

So memory and time follow the mask's extent, capped by ``max_side`` (LaMa at 1024² peaks at
about 1.6 GiB on a CPU), not the photo's 12 megapixels.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlxnet.errors import MlxnetError
from mlxnet.image import resize_pil

from .regions import DILATE_PX, bounding_box, dilate

MARGIN_PX = 128
MAX_SIDE = 1024


def crop_box(mask: np.ndarray, margin: int = MARGIN_PX) -> tuple[int, int, int, int] | None:
    """(x0, y0, x1, y1), ends exclusive: the mask's bounding box grown by ``margin``, clipped."""
    box = bounding_box(mask)
    if box is None:
        return None
    h, w = mask.shape
    x0, y0, x1, y1 = box
    return max(0, x0 - margin), max(0, y0 - margin), min(w, x1 + margin), min(h, y1 + margin)


def lama_size(width: int, height: int, max_side: int = MAX_SIDE) -> tuple[int, int]:
    """(width, height) LaMa runs at for a crop: the crop's own, or its long side scaled to
    ``max_side`` (rounded, at least 1)."""
    if max(width, height) <= max_side:
        return width, height
    scale = max_side / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


@dataclass
class Erased:
    """An erased image: ``image`` (H, W, 3) uint8, the dilated ``mask`` that was filled, the
    ``crop`` LaMa saw (x0, y0, x1, y1; None when the mask was empty) and the size it ran at."""

    image: np.ndarray
    mask: np.ndarray
    crop: tuple[int, int, int, int] | None
    size: tuple[int, int] | None

    def to_dict(self) -> dict:
        filled = int(self.mask.sum())
        return {"width": int(self.image.shape[1]), "height": int(self.image.shape[0]), "filled_pixels": filled,
                "filled_fraction": round(filled / self.mask.size, 6),
                "crop": list(self.crop) if self.crop else None, "lama_size": list(self.size) if self.size else None}

    def summary(self) -> str:
        d = self.to_dict()
        if self.crop is None:
            return "nothing to erase (empty mask): written unchanged"
        x0, y0, x1, y1 = self.crop
        how = "" if tuple(self.size) == (x1 - x0, y1 - y0) else f", resized to {self.size[0]}×{self.size[1]}"
        return (f"erased {d['filled_pixels']} pixels ({d['filled_fraction']:.1%}); LaMa on the crop "
                f"{x1 - x0}×{y1 - y0} at ({x0},{y0}){how}")


def erase(lama, image: np.ndarray, mask: np.ndarray, *, dilate_px: int = DILATE_PX, margin: int = MARGIN_PX,
          max_side: int = MAX_SIDE) -> Erased:
    """Fill ``mask`` (H, W) in ``image`` (H, W, 3) uint8 with ``lama`` (:class:`mlxnet.models.lama.LaMa`)
    by the module's rule. An empty mask returns a copy of the image."""
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise MlxnetError(f"erase: expected an (H, W, 3) uint8 image, got {image.dtype} {image.shape}")
    if mask.shape != image.shape[:2]:
        raise MlxnetError(f"erase: mask is {mask.shape[1]}x{mask.shape[0]} but the image is "
                          f"{image.shape[1]}x{image.shape[0]}")
    if margin < 0 or max_side < 16:
        raise MlxnetError(f"erase: margin must be >= 0 and max_side >= 16, got {margin} and {max_side}")
    grown = dilate(mask, dilate_px)
    box = crop_box(grown, margin)
    out = image.copy()
    if box is None:
        return Erased(out, grown, None, None)
    x0, y0, x1, y1 = box
    crop, hole = image[y0:y1, x0:x1], grown[y0:y1, x0:x1]
    size = lama_size(x1 - x0, y1 - y0, max_side)
    if size == (x1 - x0, y1 - y0):
        filled = lama.inpaint(crop, hole)
    else:
        small_hole = resize_pil(hole.astype(np.uint8) * 255, size, "bilinear") > 0
        filled = resize_pil(lama.inpaint(resize_pil(crop, size, "bilinear"), small_hole), (x1 - x0, y1 - y0),
                            "bilinear")
    window = out[y0:y1, x0:x1]
    window[hole] = filled[hole]
    return Erased(out, grown, box, size)
