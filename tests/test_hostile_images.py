"""Hostile images (issue 22): 16-bit and float images scaled (not clipped), palette/LA/CMYK
converted, EXIF orientation applied, decompression bombs refused in one line, and masks whose
every non-black pixel is filled."""
from __future__ import annotations

import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import mlxnet
from mlxnet import image


def png(path: Path, width: int, height: int, bit_depth: int, colour_type: int, rows: bytes) -> Path:
    """A PNG written by hand, for what Pillow cannot write (16-bit RGB) or would refuse to
    (a header claiming billions of pixels)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
                     + chunk(b"IEND", b""))
    return path


def test_16_bit_grey_png_is_scaled_not_clipped(tmp_path):
    values = np.array([[0, 257, 32768, 65535]], dtype=np.uint16)
    p = tmp_path / "grey16.png"
    Image.fromarray(values).save(p)
    assert Image.open(p).mode == "I;16"  # what Pillow reads a 16-bit grey PNG as
    assert image.load_image(p, mode="L").tolist() == [[0, 1, 128, 255]]
    rgb = image.load_image(p)
    assert rgb.shape == (1, 4, 3) and rgb[0, 2].tolist() == [128, 128, 128]


def test_big_endian_16_bit_and_32_bit_integer_images(tmp_path):
    big = Image.frombytes("I;16B", (3, 1), struct.pack(">3H", 1000, 32768, 65280))
    big.save(tmp_path / "big.tif")
    assert Image.open(tmp_path / "big.tif").mode == "I;16B"
    assert image.load_image(tmp_path / "big.tif", mode="L").tolist() == [[4, 128, 254]]  # round(v / 257)
    ints = Image.fromarray(np.array([[-5, 32768, 70000]], dtype=np.int32))  # mode I: clipped to 16 bits
    ints.save(tmp_path / "i32.tif")
    assert image.load_image(tmp_path / "i32.tif", mode="L").tolist() == [[0, 128, 255]]


def test_float_images_are_taken_as_0_to_1(tmp_path):
    f = Image.fromarray(np.array([[0.0, 0.5, 1.0, 2.0, -1.0, np.nan]], dtype=np.float32))
    f.save(tmp_path / "f.tif")
    assert image.load_image(tmp_path / "f.tif", mode="L").tolist() == [[0, 128, 255, 255, 0, 0]]


def test_16_bit_rgb_and_rgba_pngs(tmp_path):
    rgb = png(tmp_path / "rgb16.png", 2, 1, 16, 2, b"\0" + struct.pack(">6H", 32768, 65535, 0, 257, 1000, 65280))
    assert image.load_image(rgb).tolist() == [[[128, 255, 0], [1, 3, 255]]]  # Pillow keeps the high byte
    rgba = png(tmp_path / "rgba16.png", 1, 1, 16, 6, b"\0" + struct.pack(">4H", 32768, 65535, 0, 0))
    assert image.load_image(rgba).tolist() == [[[128, 255, 0]]]  # alpha dropped, colour kept


def test_palette_la_and_cmyk_images(tmp_path):
    pal = Image.new("P", (2, 1))
    pal.putpalette([0, 0, 0, 10, 200, 30] + [0] * 762)
    pal.putpixel((1, 0), 1)
    pal.save(tmp_path / "p.png")
    assert image.load_image(tmp_path / "p.png").tolist() == [[[0, 0, 0], [10, 200, 30]]]
    Image.new("LA", (1, 1), (90, 0)).save(tmp_path / "la.png")
    assert image.load_image(tmp_path / "la.png").tolist() == [[[90, 90, 90]]]
    Image.new("CMYK", (1, 1), (0, 255, 255, 0)).save(tmp_path / "c.tif")
    assert image.load_image(tmp_path / "c.tif").tolist() == [[[255, 0, 0]]]


def test_exif_orientation_is_applied(tmp_path):
    pixels = np.zeros((2, 3, 3), np.uint8)
    pixels[0, 0] = (255, 0, 0)  # top-left red, as stored
    pil = Image.fromarray(pixels)
    exif = pil.getexif()
    exif[0x0112] = 6  # Orientation: the viewer rotates 90° clockwise
    pil.save(tmp_path / "rotated.png", exif=exif)
    upright = image.load_image(tmp_path / "rotated.png")
    assert upright.shape == (3, 2, 3)  # width and height swapped
    assert upright[0, 1].tolist() == [255, 0, 0]  # the stored top-left is now top-right


@pytest.mark.parametrize("side", [10_000, 20_000])  # over the limit (Pillow warns), over twice it (errors)
def test_decompression_bombs_are_refused_in_one_line(tmp_path, side):
    bomb = png(tmp_path / "bomb.png", side, side, 8, 0, b"")
    limit = Image.MAX_IMAGE_PIXELS
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(mlxnet.MlxnetError) as err:
            image.load_image(bomb)
    msg = str(err.value)
    assert msg.startswith(f"{bomb}: image has {side * side:,} pixels") and "\n" not in msg, msg
    assert "decompression bomb" in msg
    assert not [w for w in seen if issubclass(w.category, Image.DecompressionBombWarning)]
    assert Image.MAX_IMAGE_PIXELS == limit  # Pillow's global limit untouched


def test_truncated_and_fake_images_are_one_line(tmp_path):
    good = image.save_image(np.full((64, 64, 3), 7, np.uint8), tmp_path / "good.png")
    (tmp_path / "cut.png").write_bytes(good.read_bytes()[:60])
    (tmp_path / "text.png").write_text("hello")
    for name in ("cut.png", "text.png"):
        with pytest.raises(mlxnet.MlxnetError) as err:
            image.load_image(tmp_path / name)
        assert str(err.value).startswith(f"{tmp_path / name}: not a readable image") and "\n" not in str(err.value)


def test_every_non_black_mask_pixel_is_filled(tmp_path):
    rgb = np.zeros((1, 4, 3), np.uint8)
    rgb[0, 1] = (0, 0, 2)  # grey conversion would make this 0
    rgb[0, 2] = (1, 0, 0)
    rgb[0, 3] = (255, 255, 255)
    image.save_image(rgb, tmp_path / "m.png")
    assert image.load_mask(tmp_path / "m.png").tolist() == [[0, 255, 255, 255]]
    assert image.load_image(tmp_path / "m.png", mode="L")[0, 1] == 0  # why masks need their own reader
    # 16-bit: 1 of 65535 is not black
    Image.fromarray(np.array([[0, 1, 65535]], np.uint16)).save(tmp_path / "m16.png")
    assert image.load_mask(tmp_path / "m16.png").tolist() == [[0, 255, 255]]
    # alpha is ignored: a black opaque pixel stays unfilled, a white transparent one is filled
    Image.fromarray(np.array([[[0, 0, 0, 255], [255, 255, 255, 0]]], np.uint8), "RGBA").save(tmp_path / "ma.png")
    assert image.load_mask(tmp_path / "ma.png").tolist() == [[0, 255]]
    # a palette mask through its palette
    pal = Image.new("P", (2, 1))
    pal.putpalette([0, 0, 0, 0, 0, 3] + [0] * 762)
    pal.putpixel((1, 0), 1)
    pal.save(tmp_path / "mp.png")
    assert image.load_mask(tmp_path / "mp.png").tolist() == [[0, 255]]
