"""Segment Anything with MobileSAM's TinyViT encoder ("sam-tiny"), and SAM's predictor.

    predictor = SamPredictor.from_pretrained("sam-tiny")      # or a .pt / .safetensors path
    predictor.set_image(image)                               # HWC uint8 RGB, embedded once
    masks, scores, logits = predictor.predict(point_coords=np.array([[x, y]]), point_labels=np.array([1]))

Pre/post-processing follows segment-anything: resize the longest side to 1024 (PIL bilinear),
normalise with SAM's pixel mean/std, zero-pad to 1024×1024; low-res mask logits (256×256) are
upsampled bilinearly to 1024, cropped to the resized image and resized to the original size.

Segment-everything (:mod:`.sam_amg`) builds on the predictor, and the CLI's family
(:mod:`.sam_family`) on both; neither is imported here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxnet.errors import MlxnetError
from mlxnet.image import ImageInput, as_rgb, draw_prompts, overlay_masks, resize_pil
from mlxnet.nn.resize import BilinearResize
from mlxnet.weights import WeightSpec, load_pretrained, register_spec

from .sam_decoder import ImageSide, MaskDecoder, PromptEncoder
from .sam_encoder import TinyViT

PIXEL_MEAN = (123.675, 116.28, 103.53)
PIXEL_STD = (58.395, 57.12, 57.375)


class Sam(nn.Module):
    """Image encoder + prompt encoder + mask decoder (parameter names as in ``mobile_sam.pt``)."""

    mask_threshold: float = 0.0

    def __init__(self, image_encoder: TinyViT, prompt_encoder: PromptEncoder, mask_decoder: MaskDecoder) -> None:
        super().__init__()
        self.image_encoder = image_encoder
        self.prompt_encoder = prompt_encoder
        self.mask_decoder = mask_decoder

    @property
    def img_size(self) -> int:
        return self.image_encoder.img_size

    @property
    def dtype(self) -> mx.Dtype:
        return self.mask_decoder.iou_token.weight.dtype

    def preprocess(self, image: mx.array) -> mx.array:
        """(B, h, w, 3) pixels in [0, 255] (long side = img_size) → normalised, zero-padded square."""
        x = (image.astype(mx.float32) - mx.array(PIXEL_MEAN)) / mx.array(PIXEL_STD)
        h, w = x.shape[1:3]
        x = mx.pad(x, [(0, 0), (0, self.img_size - h), (0, self.img_size - w), (0, 0)])
        return x.astype(self.dtype)

    def postprocess_masks(self, masks: mx.array, input_size: tuple[int, int],
                          original_size: tuple[int, int]) -> mx.array:
        """(B, C, 256, 256) logits → (B, C, H, W) at the original image size (float32): upsampled
        to the padded input size, cropped to the resized image, resized to the original size."""
        upscale = mask_upscaling(tuple(masks.shape[-2:]), self.img_size, input_size, original_size)
        return upscale(masks.astype(mx.float32))


@lru_cache(maxsize=8)
def mask_upscaling(low_res: tuple[int, int], img_size: int, input_size: tuple[int, int],
                   original_size: tuple[int, int]) -> BilinearResize:
    """SAM's three mask resizing steps (bilinear, as F.interpolate) as one, for an image's sizes."""
    return BilinearResize(low_res).resize((img_size, img_size)).crop(input_size).resize(original_size)


def sam_tiny() -> Sam:
    """MobileSAM (``build_sam_vit_t``): TinyViT-5M encoder, SAM's prompt encoder and mask decoder."""
    model = Sam(TinyViT(img_size=1024), PromptEncoder(256, (64, 64), (1024, 1024), 16), MaskDecoder(256))
    model.eval()  # BatchNorm uses its running statistics
    return model


# Checkpoint keys equal mlxnet's; the TinyViT classifier head (norm_head, head) is built by
# MobileSAM but never used by SAM, so its tensors are dropped on purpose.
_CONV = (r"image_encoder\..*\.c\.weight|image_encoder\.neck\.[02]\.weight"
         r"|prompt_encoder\.mask_downscaling\.[036]\.weight")
SPEC = register_spec(WeightSpec(
    id="sam-tiny",
    repo="dhkim2810/MobileSAM",
    filename="mobile_sam.pt",
    keys=[(r"(?:module\.)?((image_encoder|prompt_encoder|mask_decoder)\..*)", r"\1")],  # DDP saves "module."
    drop=[r".*\.num_batches_tracked", r"image_encoder\.(norm_head|head)\.(weight|bias)"],
    layouts=[(_CONV, "conv2d"), (r"mask_decoder\.output_upscaling\.[03]\.weight", "conv_transpose2d")],
    build=lambda fold_bn=False: sam_tiny(),
), replace=True)


def from_pretrained(weights: str | os.PathLike = "sam-tiny", *, dtype: str | mx.Dtype | None = None,
                    fuse: bool = True) -> Sam:
    """Build sam-tiny and load ``weights``: the model id (hub file), a ``mobile_sam.pt`` state dict,
    or a safetensors file (PyTorch keys, or converted by ``mlxnet convert``). ``fuse`` folds the
    encoder's BatchNorms into its convs once loaded (inference; ``fuse=False`` to fine-tune)."""
    model = sam_tiny()
    load_pretrained(model, SPEC, weights, dtype=dtype)
    if fuse:
        model.image_encoder.fuse()
    return model


# --- ResizeLongestSide -------------------------------------------------------------------------

def preprocess_shape(h: int, w: int, long_side: int) -> tuple[int, int]:
    """(new_h, new_w) with the longer side scaled to ``long_side``, rounded half up (as SAM)."""
    scale = long_side * 1.0 / max(h, w)
    return int(h * scale + 0.5), int(w * scale + 0.5)


def apply_coords(coords: np.ndarray, original_size: tuple[int, int], long_side: int) -> np.ndarray:
    """(..., 2) xy pixel coordinates of the original image → the resized image's frame."""
    old_h, old_w = original_size
    new_h, new_w = preprocess_shape(old_h, old_w, long_side)
    coords = np.array(coords, dtype=np.float64)
    coords[..., 0] *= new_w / old_w
    coords[..., 1] *= new_h / old_h
    return coords


def apply_boxes(boxes: np.ndarray, original_size: tuple[int, int], long_side: int) -> np.ndarray:
    return apply_coords(np.asarray(boxes).reshape(-1, 2, 2), original_size, long_side).reshape(-1, 4)


class SamPredictor:
    """Embed an image once (:meth:`set_image`), then predict masks for many prompts."""

    def __init__(self, model: Sam) -> None:
        self.model = model
        self.reset_image()

    @classmethod
    def from_pretrained(cls, weights: str | os.PathLike = "sam-tiny", *,
                        dtype: str | mx.Dtype | None = None) -> "SamPredictor":
        return cls(from_pretrained(weights, dtype=dtype))

    def fresh(self) -> "SamPredictor":
        """Another predictor on the same model, with no image: one per image lets several images
        keep their embeddings (the app's cache) while sharing one copy of the weights."""
        return type(self)(self.model)

    def reset_image(self) -> None:
        self.features: mx.array | None = None
        self._grid_pe: mx.array | None = None
        self._image_side: ImageSide | None = None
        self.original_size: tuple[int, int] | None = None
        self.input_size: tuple[int, int] | None = None

    @property
    def is_image_set(self) -> bool:
        return self.features is not None

    def set_image(self, image: ImageInput, image_format: str = "RGB") -> None:
        """Resize (longest side 1024, PIL bilinear), normalise, pad and embed an image: a path, a
        PIL image, or an (H, W, 3) NumPy / MLX array (:func:`mlxnet.image.as_rgb`).
        ``image_format="BGR"`` says an array's channels are in OpenCV's order; files and PIL
        images are read as RGB whatever it says."""
        if image_format not in ("RGB", "BGR"):
            raise MlxnetError(f"set_image: image_format must be 'RGB' or 'BGR', got {image_format!r}")
        pixels = as_rgb(image, "set_image")
        if image_format == "BGR" and isinstance(image, (np.ndarray, mx.array)):
            pixels = pixels[..., ::-1]
        image = pixels
        h, w = image.shape[:2]
        new_h, new_w = preprocess_shape(h, w, self.model.img_size)
        resized = resize_pil(np.ascontiguousarray(image), (new_w, new_h))
        self.set_resized_image(mx.array(resized)[None], (h, w))

    def set_resized_image(self, resized: mx.array, original_size: tuple[int, int]) -> None:
        """Embed a (1, h, w, 3) image already resized so that max(h, w) == img_size."""
        if resized.ndim != 4 or resized.shape[0] != 1 or max(resized.shape[1:3]) != self.model.img_size:
            raise MlxnetError(f"set_resized_image: expected (1, h, w, 3) with long side {self.model.img_size}, "
                              f"got {tuple(resized.shape)}")
        self.reset_image()
        features = self.model.image_encoder(self.model.preprocess(resized))
        mx.eval(features)
        self.features = features
        self.original_size = tuple(int(s) for s in original_size)  # type: ignore[assignment]
        self.input_size = (int(resized.shape[1]), int(resized.shape[2]))

    def get_image_embedding(self) -> mx.array:
        """(1, 64, 64, 256) embedding of the current image."""
        self._require_image("get_image_embedding")
        return self.features  # type: ignore[return-value]

    def _require_image(self, what: str) -> None:
        if not self.is_image_set:
            raise MlxnetError(f"{what}: no image set; call set_image(image) first")

    def predict(self, point_coords: np.ndarray | None = None, point_labels: np.ndarray | None = None,
                box: np.ndarray | None = None, mask_input: np.ndarray | None = None,
                multimask_output: bool = True, return_logits: bool = False
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Masks for one prompt, in original-image pixels.

        point_coords (N, 2) xy with point_labels (N,) (1 foreground, 0 background); box (4,) xyxy;
        mask_input (1, 256, 256) low-res logits from an earlier call. Returns masks (C, H, W)
        (bool, or float logits with ``return_logits``), scores (C,), low-res logits (C, 256, 256);
        C is 3 with ``multimask_output`` else 1.
        """
        coords, labels, boxes, masks = self._prompts("predict", point_coords, point_labels, box, mask_input)
        out_masks, scores, low_res = self.predict_batch(coords, labels, boxes, masks, multimask_output,
                                                        return_logits)
        return np.array(out_masks[0]), np.array(scores[0].astype(mx.float32)), np.array(low_res[0].astype(mx.float32))

    def _prompts(self, what: str, point_coords: np.ndarray | None, point_labels: np.ndarray | None,
                 box: np.ndarray | None, mask_input: np.ndarray | None = None
                 ) -> tuple[mx.array | None, mx.array | None, mx.array | None, mx.array | None]:
        """One prompt in original-image pixels, checked, as :meth:`predict_batch` takes it (the
        resized frame, a batch of one)."""
        self._require_image(what)
        coords = labels = boxes = masks = None
        long_side = self.model.img_size
        if point_coords is not None:
            if point_labels is None:
                raise MlxnetError(f"{what}: point_labels must be given with point_coords")
            pc, pl = np.asarray(point_coords, dtype=np.float64), np.asarray(point_labels)
            if pc.ndim != 2 or pc.shape[1] != 2 or pl.shape != (pc.shape[0],):
                raise MlxnetError(f"{what}: expected point_coords (N, 2) and point_labels (N,), "
                                  f"got {pc.shape} and {pl.shape}")
            coords = mx.array(apply_coords(pc, self.original_size, long_side).astype(np.float32))[None]
            labels = mx.array(pl.astype(np.int32))[None]
        elif point_labels is not None:
            raise MlxnetError(f"{what}: point_labels given without point_coords")
        if box is not None:
            b = np.asarray(box, dtype=np.float64)
            if b.size != 4:
                raise MlxnetError(f"{what}: expected a box of 4 numbers (x1, y1, x2, y2), got shape {b.shape}")
            boxes = mx.array(apply_boxes(b.reshape(4), self.original_size, long_side).astype(np.float32))
        if mask_input is not None:
            m = np.asarray(mask_input, dtype=np.float32)
            want = (1, *self.model.prompt_encoder.mask_input_size)
            if m.shape != want:
                raise MlxnetError(f"{what}: expected mask_input of shape {want} (low-res logits), got {m.shape}")
            masks = mx.array(m)[None]
        return coords, labels, boxes, masks

    def predict_best(self, point_coords: np.ndarray | None = None, point_labels: np.ndarray | None = None,
                     box: np.ndarray | None = None) -> tuple[np.ndarray, float]:
        """The one mask a click asks for: (H, W) bool in original-image pixels, and its predicted IoU.

        As SAM advises, a lone point (ambiguous: part or whole?) asks the decoder for three
        candidates, more points or a box for one; the candidate with the best predicted IoU is
        :meth:`predict`'s best. Only that one is upsampled to the image: upsampling all three is
        most of a click's time on a CPU (``mlxnet app``, ``mlxnet erase``)."""
        if point_coords is None and box is None:
            raise MlxnetError("predict_best: give points or a box")
        coords, labels, boxes, _ = self._prompts("predict_best", point_coords, point_labels, box)
        multi = box is None and len(point_coords) == 1
        low_res, scores = self.predict_low_res(coords, labels, boxes, None, multi)
        scores = scores[0].astype(mx.float32)
        best = int(mx.argmax(scores).item())
        mask = self.upscale_masks(low_res[:, best:best + 1]) > self.model.mask_threshold
        return np.array(mask[0, 0]), float(scores[best].item())

    def predict_batch(self, point_coords: mx.array | None, point_labels: mx.array | None,
                      boxes: mx.array | None = None, mask_input: mx.array | None = None,
                      multimask_output: bool = True, return_logits: bool = False
                      ) -> tuple[mx.array, mx.array, mx.array]:
        """Batched prompts already in the resized (1024) frame, like SAM's ``predict_torch``:
        point_coords (B, N, 2), point_labels (B, N), boxes (B, 4), mask_input (B, 1, 256, 256).
        Returns masks (B, C, H, W), scores (B, C), low-res logits (B, C, 256, 256)."""
        self._require_image("predict_batch")
        low_res, scores = self.predict_low_res(point_coords, point_labels, boxes, mask_input, multimask_output)
        masks = self.upscale_masks(low_res)
        if not return_logits:
            masks = masks > self.model.mask_threshold
        mx.eval(masks, scores, low_res)
        return masks, scores, low_res

    def predict_low_res(self, point_coords: mx.array | None, point_labels: mx.array | None,
                        boxes: mx.array | None = None, mask_input: mx.array | None = None,
                        multimask_output: bool = True) -> tuple[mx.array, mx.array]:
        """:meth:`predict_batch` up to the mask decoder: low-res logits (B, C, 256, 256) and scores
        (B, C), not evaluated. Segment-everything filters by score before it upscales."""
        self._require_image("predict_low_res")
        points = (point_coords, point_labels) if point_coords is not None else None
        dense_in = None if mask_input is None else mask_input.transpose(0, 2, 3, 1).astype(self.model.dtype)
        sparse, dense = self.model.prompt_encoder(points, boxes, dense_in)
        decoder = self.model.mask_decoder
        if mask_input is not None:
            return decoder(self.features, self._dense_pe(), sparse, dense, multimask_output)
        # Every prompt's dense embedding is the no-mask one: passed once, and the decoder's first
        # projections of the image tokens, the same for every such prompt, made once per image.
        dense = dense[:1]
        if self._image_side is None:
            self._image_side = decoder.image_side(self.features, self._dense_pe(), dense)
            mx.eval(self._image_side)
        return decoder(self.features, self._dense_pe(), sparse, dense, multimask_output, self._image_side)

    def _dense_pe(self) -> mx.array:
        """The image grid's positional encoding: computed once per image, not per prompt batch."""
        if self._grid_pe is None:
            self._grid_pe = self.model.prompt_encoder.get_dense_pe()
            mx.eval(self._grid_pe)
        return self._grid_pe

    def upscale_masks(self, low_res: mx.array) -> mx.array:
        """(..., 256, 256) low-res logits → (..., H, W) float32 logits at the image's original size."""
        self._require_image("upscale_masks")
        return self.model.postprocess_masks(low_res, self.input_size, self.original_size)


@dataclass
class Segmentation:
    """Masks of one image: from prompts (several candidates, ``best`` chosen by score) or
    segment-everything (``records`` of the automatic mask generator, any number of masks)."""

    size: tuple[int, int]  # (H, W) of the image
    masks: list[np.ndarray]
    scores: list[float]
    best: int | None = None
    records: list[dict] | None = None
    prompts: tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None] = (None, None, None)

    def render(self, image: np.ndarray) -> np.ndarray:
        """The image with the chosen mask (or every mask, small ones on top) and the prompts."""
        if self.best is not None:
            return draw_prompts(overlay_masks(image, [self.masks[self.best]]), *self.prompts)
        return overlay_masks(image, [self.masks[i] for i in self._by_area()])

    def mask_image(self) -> np.ndarray:
        """The chosen binary mask as 0/255, or a label map (0: no mask, i: mask i) for everything."""
        if self.best is not None:
            return self.masks[self.best].astype(np.uint8) * 255
        labels = np.zeros(self.size, np.uint16 if len(self.masks) > 255 else np.uint8)
        for i in self._by_area():
            labels[self.masks[i]] = i + 1
        return labels

    def _by_area(self) -> list[int]:
        return sorted(range(len(self.masks)), key=lambda i: -int(self.masks[i].sum()))

    def to_dict(self) -> dict:
        if self.best is not None:
            return {"mode": "prompt", "best": self.best,
                    "masks": [{"score": s, "area": int(m.sum())} for s, m in zip(self.scores, self.masks)]}
        keys = ("bbox", "area", "predicted_iou", "stability_score", "point_coords")
        return {"mode": "everything", "masks": [{k: r[k] for k in keys} for r in self.records or []]}

    def summary(self) -> str:
        if self.best is None:
            return f"{len(self.masks)} masks"
        return f"mask score {self.scores[self.best]:.3f}, {int(self.masks[self.best].sum())} px"
