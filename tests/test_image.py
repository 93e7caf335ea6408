"""The image I/O module."""
from __future__ import annotations

import numpy as np
import pytest

import mlxnet
from mlxnet import image


def test_roundtrip_png_and_atomic_write(tmp_path):
    img = (np.arange(5 * 7 * 3) % 251).astype(np.uint8).reshape(5, 7, 3)
    p = image.save_image(img, tmp_path / "a.png")
    np.testing.assert_array_equal(image.load_image(p), img)
    assert [q.name for q in tmp_path.iterdir()] == ["a.png"]  # no temp files left


def test_missing_and_corrupt_files_are_clear_errors(tmp_path):
    with pytest.raises(mlxnet.MlxnetError, match="no such image file"):
        image.load_image(tmp_path / "none.png")
    (tmp_path / "bad.png").write_bytes(b"not an image")
    with pytest.raises(mlxnet.MlxnetError, match="bad.png: not a readable image"):
        image.load_image(tmp_path / "bad.png")


def test_output_may_not_overwrite_input(tmp_path):
    src = image.save_image(np.zeros((2, 2, 3), np.uint8), tmp_path / "in.png")
    with pytest.raises(mlxnet.MlxnetError, match="overwrite the input"):
        image.check_output_path(src, [src])


def test_resize_bilinear_matches_half_pixel_definition():
    img = np.array([[0, 100], [200, 255]], dtype=np.float32)
    up = image.resize_bilinear(img, (4, 4))
    # OpenCV INTER_LINEAR for 2→4: samples at -0.25, 0.25, 0.75, 1.25 (clamped).
    np.testing.assert_allclose(up[0], [0, 25, 75, 100])
    np.testing.assert_allclose(up[:, 0], [0, 50, 150, 200])
    assert image.resize_bilinear(np.zeros((10, 20, 3), np.uint8), (7, 3)).shape == (3, 7, 3)


def test_center_crop_and_drawing():
    img = np.zeros((10, 12, 3), np.uint8)
    assert image.center_crop(img, 8).shape == (8, 8, 3)
    drawn = image.draw_boxes(img, np.array([[1, 1, 9, 8]]), ["cat 0.9"])
    assert drawn.shape == img.shape and drawn.any() and not img.any()
    over = image.overlay_masks(img, [np.eye(10, 12, dtype=bool)])
    assert over[0, 0].any() and not over[0, 1].any()


def test_as_rgb_reads_a_pil_image_as_its_file_is_read(tmp_path):
    """EXIF orientation, 16-bit and palette conversions: a PIL image gives the pixels its file gives."""
    from PIL import Image

    rows = (np.arange(6 * 10 * 3) % 251).astype(np.uint8).reshape(6, 10, 3)
    rotated = Image.fromarray(rows)
    exif = rotated.getexif()
    exif[0x0112] = 6  # orientation: rotate 90° clockwise to view
    rotated.save(tmp_path / "r.jpg", exif=exif, quality=100)
    grey16 = Image.fromarray((np.arange(12, dtype=np.uint16) * 5000).reshape(3, 4))
    grey16.save(tmp_path / "g.png")
    for path in (tmp_path / "r.jpg", tmp_path / "g.png"):
        with Image.open(path) as im:
            np.testing.assert_array_equal(image.as_rgb(im), image.load_image(path))
    assert image.as_rgb(tmp_path / "r.jpg").shape == (10, 6, 3)  # upright


def test_as_rgb_and_as_mask_convert_arrays_by_the_file_rules():
    import mlx.core as mx

    pixels = (np.arange(4 * 5 * 3) * 4).astype(np.uint8).reshape(4, 5, 3)
    rgba = np.dstack([pixels, pixels[..., :1]])
    for same in (pixels.astype(np.uint16) * 257, pixels / 255.0, mx.array(pixels), rgba):
        np.testing.assert_array_equal(image.as_rgb(same), pixels)
    half = image.as_rgb(mx.array(pixels.astype(np.float32) / 255).astype(mx.bfloat16))  # no NumPy bfloat16
    assert half.dtype == np.uint8 and np.abs(half.astype(int) - pixels).max() <= 1
    exact = np.float32(0.1234567)
    assert image.as_rgb(np.full((2, 2, 3), exact), dtype="float32")[0, 0, 0] == exact  # float kept, not 8-bit
    np.testing.assert_array_equal(image.as_rgb(pixels, dtype="float32"), pixels.astype(np.float32) / 255)
    mask = np.array([[0, 1], [0, 0.01]])
    np.testing.assert_array_equal(image.as_mask(mask), mask != 0)  # every non-zero value fills, as in files
    np.testing.assert_array_equal(image.as_mask(np.dstack([mask, mask, mask, np.ones((2, 2))])), mask != 0)  # alpha
    with pytest.raises(mlxnet.MlxnetError, match=r"^photo: float pixels must be in \[0, 1\], got 0\.\.236 "):
        image.as_rgb(pixels.astype(np.float64), "photo")
