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
