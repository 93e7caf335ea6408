"""The offline try-out: every command that takes ``random`` weights shows something with them
(boxes, a mask, a changed region), so a newcomer without a download sees the pipeline work."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from mlxnet.cli import app
from mlxnet.models.sam import SamPredictor

runner = CliRunner()


@pytest.fixture(scope="module")
def photo(tmp_path_factory) -> str:
    """A small picture with an object on a background (a lossless PNG, so changes are exact)."""
    rng = np.random.default_rng(0)
    img = np.full((120, 160, 3), 200, np.uint8) + rng.integers(0, 20, (120, 160, 3), dtype=np.uint8)
    img[30:90, 50:110] = (40, 90, 160)
    path = tmp_path_factory.mktemp("tryout") / "photo.png"
    Image.fromarray(img).save(path)
    return str(path)


def test_random_sam_weights_select_a_visible_mask(photo):
    """Seeded SAM weights give a mask that is neither empty nor the whole picture for at least
    one of the three candidates (they were all zero when the seeded init zeroed mlxnet's
    LayerNorm scales)."""
    predictor = SamPredictor.from_pretrained("random")
    predictor.set_image(np.array(Image.open(photo)))
    masks, scores, _ = predictor.predict(np.array([[80, 60]]), np.array([1]), multimask_output=True)
    areas = masks.reshape(len(masks), -1).mean(axis=1)
    assert np.isfinite(scores).all()
    assert any(0 < a < 1 for a in areas), areas


def test_segment_with_random_weights_writes_a_nonempty_mask(photo, tmp_path):
    out = tmp_path / "seg.png"
    result = runner.invoke(app, ["segment", photo, "-w", "random", "--point", "80,60", "-o", str(out)])
    assert result.exit_code == 0, result.output
    pixels = int(re.search(r"(\d+) px", result.output).group(1))
    assert pixels > 0, result.output
    mask = np.array(Image.open(tmp_path / "seg.mask.png"))
    assert mask.astype(bool).sum() == pixels


def test_erase_with_random_weights_changes_a_region(photo, tmp_path):
    out = tmp_path / "erased.png"
    result = runner.invoke(app, ["erase", photo, "--point", "80,60", "--sam-weights", "random",
                                 "--lama-weights", "random", "-o", str(out)])
    assert result.exit_code == 0, result.output
    before, after = np.array(Image.open(photo)), np.array(Image.open(out))
    assert before.shape == after.shape
    assert (before != after).any(axis=-1).sum() > 0


def test_detect_with_random_weights_draws_boxes(photo, tmp_path):
    out = tmp_path / "found.png"
    result = runner.invoke(app, ["detect", photo, "-w", "random", "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.output.splitlines()[0])
    assert record["detections"] and all(len(d["box"]) == 4 for d in record["detections"])
    assert (np.array(Image.open(out).convert("RGB")) != np.array(Image.open(photo).convert("RGB"))).any()


def test_segment_everything_with_random_weights_finds_a_mask(photo, tmp_path):
    """Everything mode keeps only stable masks (±1 logit): the seeded decoder's logits are
    scaled to a trained decoder's order so that some are (MaskDecoder.random_gains)."""
    out = tmp_path / "all.png"
    result = runner.invoke(app, ["segment", photo, "-w", "random", "--everything", "--points-per-side", "8",
                                 "-o", str(out)])
    assert result.exit_code == 0, result.output
    found = int(re.search(r"(\d+) masks", result.output).group(1))
    assert found >= 1, result.output
    labels = np.array(Image.open(tmp_path / "all.mask.png"))
    assert 0 < (labels > 0).sum(), result.output
