"""JPEG outputs keep the input's JPEG quality (its quantisation tables and subsampling), a
non-JPEG input's JPEG output is written at quality 95, and an erase that changes nothing writes
the input's own bytes."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, JpegImagePlugin
from typer.testing import CliRunner

from mlxnet.cli import app
from mlxnet.image import save_image

runner = CliRunner()


def _photo(path, quality: int, subsampling: int = 2) -> str:
    rng = np.random.default_rng(1)
    img = (np.linspace(0, 255, 96 * 128 * 3).reshape(96, 128, 3) + rng.integers(0, 30, (96, 128, 3))).astype(np.uint8)
    Image.fromarray(img).save(path, quality=quality, subsampling=subsampling)
    return str(path)


def _tables(path) -> tuple:
    with Image.open(path) as im:
        return im.quantization, JpegImagePlugin.get_sampling(im)


@pytest.mark.parametrize("quality,subsampling", [(92, 0), (60, 2)])
def test_save_image_keeps_a_jpeg_sources_quality(tmp_path, quality, subsampling):
    src = _photo(tmp_path / "in.jpg", quality, subsampling)
    pixels = np.array(Image.open(src))
    out = save_image(pixels, tmp_path / "out.jpg", source=src)
    assert _tables(out) == _tables(src)


def test_save_image_writes_quality_95_for_other_sources(tmp_path):
    png = tmp_path / "in.png"
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(png)
    out = save_image(np.full((8, 8, 3), 90, np.uint8), tmp_path / "out.jpg", source=png)
    Image.fromarray(np.full((8, 8, 3), 90, np.uint8)).save(tmp_path / "ref.jpg", quality=95)
    assert _tables(out) == _tables(tmp_path / "ref.jpg")


def test_unchanged_output_is_the_sources_bytes_only_in_its_format(tmp_path):
    src = _photo(tmp_path / "in.jpg", 80)
    pixels = np.array(Image.open(src))
    same = save_image(pixels, tmp_path / "same.jpg", source=src, unchanged=True)
    assert same.read_bytes() == open(src, "rb").read()
    png = save_image(pixels, tmp_path / "other.png", source=src, unchanged=True)
    assert np.array_equal(np.array(Image.open(png)), pixels)


def test_erase_with_an_empty_mask_writes_the_input_unchanged(tmp_path):
    src = _photo(tmp_path / "in.jpg", 88)
    mask = tmp_path / "mask.png"
    Image.fromarray(np.zeros((96, 128), np.uint8)).save(mask)
    out = tmp_path / "out.jpg"
    result = runner.invoke(app, ["erase", src, "--mask", str(mask), "--lama-weights", "random", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "unchanged" in result.output
    assert out.read_bytes() == open(src, "rb").read()


def test_detect_writes_its_jpeg_at_the_inputs_quality(tmp_path):
    src = _photo(tmp_path / "in.jpg", 93, 0)
    out = tmp_path / "found.jpg"
    result = runner.invoke(app, ["detect", src, "-w", "random", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert _tables(out) == _tables(src)


@pytest.mark.parametrize("mode", ["L", "CMYK"])
def test_a_colour_output_from_a_grey_or_cmyk_jpeg_is_written(tmp_path, mode):
    """The source's tables are for its own channels; the annotated output is RGB either way."""
    src = tmp_path / f"in-{mode}.jpg"
    shape = (40, 56) if mode == "L" else (40, 56, 4)
    Image.fromarray(np.random.default_rng(2).integers(0, 255, shape, dtype=np.uint8), mode).save(src, quality=85)
    pixels = np.linspace(0, 255, 40 * 56 * 3).reshape(40, 56, 3).astype(np.uint8)  # smooth: JPEG keeps it
    out = save_image(pixels, tmp_path / "out.jpg", source=src)
    with Image.open(out) as written:
        assert written.mode == "RGB" and written.size == (56, 40)
        assert np.abs(np.asarray(written).astype(int) - pixels).mean() < 8  # a JPEG of these pixels
