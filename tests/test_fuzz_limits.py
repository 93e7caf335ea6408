"""The bounds the fuzzer holds the loaders to, checked directly: the image pixel budget (per
call, ``MLXNET_MAX_PIXELS``, the command line), the readers' error boundary and the one-line
summary of a problem list."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mlxnet import image
from mlxnet.errors import MlxnetError, reading, summary

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def picture(tmp_path: Path) -> Path:
    path = tmp_path / "wide.png"
    Image.fromarray(np.full((50, 100, 3), 200, np.uint8)).save(path)  # 5,000 pixels
    return path


def test_pixel_budget_per_call(picture):
    assert image.load_image(picture, max_pixels=5000).shape == (50, 100, 3)
    assert image.load_mask(picture, max_pixels=5000).all()
    for load in (image.load_image, image.load_mask):
        with pytest.raises(MlxnetError) as err:
            load(picture, max_pixels=4999)
        assert str(err.value) == (f"{picture}: image has 5,000 pixels (100x50), over the 4,999-pixel budget "
                                  "(max_pixels, MLXNET_MAX_PIXELS); not decoded")


def test_pixel_budget_default_and_environment(picture, monkeypatch):
    monkeypatch.delenv("MLXNET_MAX_PIXELS", raising=False)
    assert image.pixel_budget() == 50_000_000 < Image.MAX_IMAGE_PIXELS
    monkeypatch.setenv("MLXNET_MAX_PIXELS", "4999")
    assert image.pixel_budget() == 4999 and image.pixel_budget(5000) == 5000  # a call's own wins
    with pytest.raises(MlxnetError, match=r"over the 4,999-pixel budget"):
        image.load_image(picture)
    monkeypatch.setenv("MLXNET_MAX_PIXELS", "lots")
    with pytest.raises(MlxnetError, match=r"^MLXNET_MAX_PIXELS: image pixel budget must be a positive number, "
                                          r"got 'lots'$"):
        image.load_image(picture)
    monkeypatch.setenv("MLXNET_MAX_PIXELS", "1e9")
    with pytest.raises(MlxnetError, match=r"^MLXNET_MAX_PIXELS: the image pixel budget 1,000,000,000 is over "
                                          r"Pillow's decompression-bomb limit of 89,478,485 pixels"):
        image.load_image(picture)
    for bad in (0, -5, "many", True):
        with pytest.raises(MlxnetError, match=r"^max_pixels: the image pixel budget must be a positive number"):
            image.pixel_budget(bad)


def test_pixel_budget_on_the_command_line(picture, tmp_path):
    """Any image command takes the budget from MLXNET_MAX_PIXELS: one line naming the file."""
    env = {**os.environ, "MLXNET_MAX_PIXELS": "1000", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "mlxnet", "classify", str(picture), "--weights", "random",
                        "-m", "resnet18"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert f"{picture}: image has 5,000 pixels (100x50), over the 1,000-pixel budget" in r.stderr, r.stderr
    env["MLXNET_MAX_PIXELS"] = "-1"  # checked with the other settings before any work
    r = subprocess.run([sys.executable, "-m", "mlxnet", "classify", str(picture), "--weights", "random"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 1 and r.stderr.strip() == ("error: MLXNET_MAX_PIXELS: image pixel budget must be a "
                                                      "positive number, got '-1'"), r.stderr


@pytest.mark.parametrize("name", ["jpeg-claims-9500x9000.jpg", "gif-screen-9500x4096.gif"])
def test_a_header_claiming_more_than_the_file_can_hold_is_refused_within_the_budget(name):
    """Under the default budget (50,000,000 pixels) too: these files are a few hundred bytes."""
    path = ROOT / "tests" / "fixtures" / "fuzz" / "regressions" / name
    with pytest.raises(MlxnetError) as err:
        image.load_image(path)
    size = path.stat().st_size
    assert str(err.value).startswith(f"{path}: a {size:,}-byte ") and "file cannot hold" in str(err.value)
    assert "(at most 8,256 a byte); its header is corrupt; not decoded" in str(err.value)


def test_the_densest_honest_files_still_load(tmp_path):
    """Near the bounds of what a byte can hold: 1-bit blank PNG (deflate's 1032:1 of 8 pixels a
    byte), a uniform progressive JPEG, a blank GIF."""
    for name, im, options in [("blank.png", Image.new("1", (4000, 3000)), {"optimize": True}),
                              ("flat.jpg", Image.new("L", (3000, 2000), 5), {"progressive": True, "optimize": True}),
                              ("blank.gif", Image.new("P", (3000, 2000)), {})]:
        im.save(tmp_path / name, **options)
        assert image.load_image(tmp_path / name).shape == (im.height, im.width, 3)


def test_reading_boundary_makes_one_line_naming_the_file():
    with pytest.raises(MlxnetError) as err:
        with reading("w.pt", "checkpoint"):
            {}["model"]
    assert str(err.value) == "w.pt: corrupt or unexpected checkpoint content (KeyError: 'model')"
    with pytest.raises(MlxnetError) as err:
        with reading("w.pt"):
            raise MlxnetError("spec 'x' cannot map:\n  a\n  b")
    assert str(err.value) == "w.pt: spec 'x' cannot map: a b"
    with pytest.raises(MlxnetError) as err:
        with reading("w.pt"):
            raise MemoryError
    assert str(err.value) == "w.pt: out of memory reading the file"
    original = MlxnetError("w.pt: already one line")
    with pytest.raises(MlxnetError) as err:
        with reading("w.pt"):
            raise original
    assert err.value is original
    with pytest.raises(OSError):  # not the file's content: left alone
        with reading("w.pt"):
            raise OSError("disk on fire")


def test_summary_shows_the_first_three_and_a_count():
    assert summary("x", ["a"]) == "x: 1 problem(s): a"
    assert summary("x", list("abcdef")) == "x: 6 problem(s): a; b; c; ... and 3 more"
    assert summary("x of 2", ["a\nb", "c"], counted=True) == "x of 2: a b; c"
