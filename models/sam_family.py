"""SAM as the commands see it: the ``sam`` model family (``mlxnet segment``, ``check``, ``bench``).

It sits above both the predictor (:mod:`.sam`) and segment-everything (:mod:`.sam_amg`), which
builds on the predictor: the family is the one place that needs both.
"""
from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxnet import families
from mlxnet.image import resize_pil
from mlxnet.weights import random_init

from .sam import Sam, SamPredictor, Segmentation, from_pretrained, preprocess_shape, sam_tiny
from .sam_amg import SamAutomaticMaskGenerator


class SamPointPrompt(nn.Module):
    """SAM end to end on one image and one centre point: encoder, prompt encoder, decoder."""

    def __init__(self, sam: Sam) -> None:
        super().__init__()
        self.sam = sam

    def __call__(self, pixels: mx.array) -> mx.array:
        embedding = self.sam.image_encoder(self.sam.preprocess(pixels))
        points = (mx.array([[[512.0, 512.0]]]), mx.array([[1]]))
        sparse, dense = self.sam.prompt_encoder(points, None, None)
        low_res, _ = self.sam.mask_decoder(embedding, self.sam.prompt_encoder.get_dense_pe(),
                                           sparse, dense, True)
        return low_res


class SamFamily(families.ModelFamily):
    name = "sam"
    variants = ("sam-tiny",)
    default_size = 1024

    def build(self, variant: str) -> Sam:
        return random_init(sam_tiny())

    def from_pretrained(self, source: str, variant: str | None = None, dtype: str | None = None) -> Sam:
        return from_pretrained(source, dtype=dtype)

    def example_inputs(self, variant: str, size: int) -> list[mx.array]:
        return [mx.random.uniform(0, 255, (1, 1024, 1024, 3), key=mx.random.key(0))]

    def image_inputs(self, variant: str, image: np.ndarray, size: int) -> list[mx.array]:
        h, w = preprocess_shape(*image.shape[:2], 1024)
        return [mx.array(resize_pil(image, (w, h))[None]).astype(mx.float32)]

    def checked(self, model: nn.Module) -> nn.Module:
        return SamPointPrompt(model)  # type: ignore[arg-type]

    task = "segment"

    def predictor(self, weights: str | None, variant: str, dtype: str | None = None) -> SamPredictor:
        return SamPredictor.from_pretrained(weights or variant, dtype=dtype)

    def segment(self, predictor: SamPredictor, image: np.ndarray, points: np.ndarray | None,
                labels: np.ndarray | None, box: np.ndarray | None,
                multimask: bool | None = None) -> Segmentation:
        """Masks for point/box prompts; by default several candidates for a lone point (it is
        ambiguous), one otherwise, as SAM's authors advise."""
        predictor.set_image(image)
        multi = multimask if multimask is not None else (box is None and points is not None and len(points) == 1)
        masks, scores, _ = predictor.predict(points, labels, box, multimask_output=multi)
        return Segmentation(image.shape[:2], list(masks), [float(s) for s in scores],
                            int(np.argmax(scores)), prompts=(points, labels, box))

    def segment_everything(self, predictor: SamPredictor, image: np.ndarray, **options: Any) -> Segmentation:
        """Every object (SAM's automatic mask generator; ``options`` are its thresholds)."""
        records = self.mask_generator(predictor, **options).generate(image)
        return Segmentation(image.shape[:2], [r["segmentation"] for r in records],
                            [r["predicted_iou"] for r in records], records=records)

    def mask_generator(self, predictor: SamPredictor, **options: Any) -> SamAutomaticMaskGenerator:
        """Segment-everything on ``predictor``: its ``generate()`` with no image reuses the image
        already embedded (the app's cached embedding), which :meth:`segment_everything` cannot."""
        return SamAutomaticMaskGenerator(predictor, **options)


families.register(SamFamily())
