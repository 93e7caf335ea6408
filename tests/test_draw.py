"""draw_boxes draws each box on its own region (or, for many or large boxes, on the whole image at
once): the pixels must equal drawing every box on the whole image."""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from mlxnet.image import PALETTE, box_on_image, draw_boxes


def whole_image(image: np.ndarray, boxes: np.ndarray, labels: list[str], colour_ids: list[int],
                width: int = 3) -> np.ndarray:
    """The definition: every box drawn through PIL on the whole image, in order."""
    pil = Image.fromarray(image.copy())
    draw = ImageDraw.Draw(pil)
    for box, label, cid in zip(np.asarray(boxes, dtype=np.float64).reshape(-1, 4), labels, colour_ids):
        colour = tuple(int(c) for c in PALETTE[cid % len(PALETTE)])
        drawable = box_on_image(box, pil.width, pil.height)
        if drawable is None:
            continue
        x1, y1, x2, y2 = drawable
        tx0, ty0, tx1, ty1 = draw.textbbox((x1, y1), label)
        top = y1 - (ty1 - ty0) - 4 if y1 - (ty1 - ty0) - 4 >= 0 else y1
        draw.rectangle([x1, y1, x2, y2], outline=colour, width=width)
        draw.rectangle([x1, top, x1 + (tx1 - tx0) + 4, top + (ty1 - ty0) + 4], fill=colour)
        draw.text((x1 + 2, top + 1), label, fill=(255, 255, 255))
    return np.asarray(pil)


def test_region_drawing_equals_whole_image_drawing() -> None:
    rng = np.random.default_rng(0)
    for case in range(600):
        h, w = (int(v) for v in rng.integers(8, 260, 2))
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        n = int(rng.integers(0, 9))
        # Overlapping boxes, boxes past every edge, labels wider than their box, whole and
        # fractional coordinates, inverted corners.
        boxes = rng.uniform(-40, max(h, w) + 40, (n, 4))
        if case % 3 == 0:  # small boxes: regions that together cover less than the image (drawn one by one)
            boxes[:, 2:] = boxes[:, :2] + rng.uniform(-3, max(h, w) / 8, (n, 2))
        if case % 2:
            boxes = np.round(boxes)
        labels = [f"class{int(rng.integers(0, 80))} {rng.uniform():.2f}" * int(rng.integers(1, 3)) for _ in range(n)]
        colours = [int(c) for c in rng.integers(0, 40, n)]
        width = int(rng.integers(1, 10))
        drawn = draw_boxes(image, boxes, labels, colours, width=width)
        assert np.array_equal(drawn, whole_image(image, boxes, labels, colours, width=width)), case


def test_the_input_is_left_alone_and_the_copy_is_writable() -> None:
    image = np.zeros((50, 80, 3), np.uint8)
    image.setflags(write=False)
    drawn = draw_boxes(image, np.array([[5, 20, 40, 45]]), ["person 0.9"])
    assert not image.any() and drawn.any()
    drawn[0, 0] = 1  # a writable array of its own
    assert np.array_equal(draw_boxes(image, np.zeros((0, 4)), []), image)
