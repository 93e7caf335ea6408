"""The page in a real browser: Debian's chromium driven by Playwright, against a real server.

Open bus.jpg, click a person: SAM's mask appears (the server's, equal to the library's); erase:
the result differs inside the mask and equals the photo outside it; undo brings the photo back;
detect draws its boxes. ``MLXNET_SCREENSHOT=docs/images/app.png`` also saves the page, as the
README shows it. Seeded weights (SAM's of tests/test_erase.py): the mask is SAM's answer for those weights, not a
person's outline."""
from __future__ import annotations

import base64
import contextlib
import io
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

CHROMIUM = "/usr/bin/chromium"
pytest.importorskip("starlette", reason="the app extra (pip install -e '.[app]')")
playwright = pytest.importorskip("playwright.sync_api", reason="Playwright (pip install -e '.[test]')")
if not os.path.exists(CHROMIUM):
    pytest.skip(f"no browser at {CHROMIUM} (apt-get install -y chromium; .ci/run installs it)",
                allow_module_level=True)

from test_app import Server, call, library_mask, seeded_models  # noqa: E402

from mlxnet.app import regions  # noqa: E402
from mlxnet.app.models import Models  # noqa: E402
from mlxnet.image import load_image  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BUS = ROOT / "tests/fixtures/yolo/bus.jpg"
PERSON = (150, 650)  # the man on the left, in bus.jpg's pixels
PALETTE = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#bfef45",
           "#469990", "#9a6324", "#800000", "#808000", "#000075"]  # app.js's box colours


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Models:
    return seeded_models(tmp_path_factory)


@pytest.fixture(scope="module")
def server(models):
    running = Server(models)
    yield running
    running.stop()


@contextlib.contextmanager
def browser_page(url: str):
    """Chromium showing the page at ``url``; on leaving, no uncaught error may have happened in it."""
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = browser.new_page(viewport={"width": 1100, "height": 760})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url)
        yield page
        browser.close()
        assert errors == [], errors


@pytest.fixture()
def page(server):
    with browser_page(server.url) as page:
        yield page


def data_url_pixels(url: str, mode: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert(mode))


def click_image(page, x: float, y: float) -> None:
    """A click at (x, y) in the image's pixels, wherever the page shows the image."""
    box = page.locator("#overlay").bounding_box()
    width, height = page.evaluate("[overlay.width, overlay.height]")
    page.mouse.click(box["x"] + x * box["width"] / width, box["y"] + y * box["height"] / height)


def test_click_a_person_erase_undo_and_detect(page, server, models, tmp_path):
    photo = load_image(BUS)
    page.set_input_files("#file", str(BUS))
    page.wait_for_function("document.getElementById('status').textContent.includes('click an object')")
    assert page.evaluate("[overlay.width, overlay.height]") == [810, 1080]

    click_image(page, *PERSON)
    page.wait_for_function("Number(overlay.dataset.maskArea) > 0", timeout=120_000)
    shown = data_url_pixels(page.evaluate("mlxnet.maskDataURL()"), "L") > 127
    expected, _ = library_mask(models, photo, [list(PERSON)], [1])
    assert np.mean(shown != expected) < 1e-4  # the page shows SAM's mask for that click
    assert "ms on the server" in page.inner_text("#timing")

    # Seeded YOLOv8n finds hundreds of overlapping boxes: the page's threshold keeps the best three.
    status, _, found = call(server, "/api/detect", {"image": BUS.read_bytes()})
    conf = sorted((d["score"] for d in found["detections"]), reverse=True)[2]
    page.fill("#conf", str(conf))
    page.click("#detect")
    page.wait_for_function("Number(overlay.dataset.boxes) > 0", timeout=120_000)
    status, _, found = call(server, "/api/detect", {"image": BUS.read_bytes(), "conf": str(conf)})
    boxes = found["detections"]
    assert 3 <= len(boxes) < 10
    assert page.evaluate("Number(overlay.dataset.boxes)") == len(boxes)
    assert page.locator("#results li.detection").count() == len(boxes)
    for d in boxes:  # each box's left edge is drawn in its class colour (boxes drawn later may cross it)
        x0, y0, _, y1 = d["box"]
        colour = PALETTE[d["class"] % len(PALETTE)]
        want = [int(colour[i:i + 2], 16) for i in (1, 3, 5)] + [255]
        edge = [page.evaluate(f"Array.from(overlay.getContext('2d').getImageData({int(x0)}, {int(y)}, 1, 1).data)")
                for y in np.linspace(y0 + 4, y1 - 4, 9)]
        assert want in edge, (d, edge)
    screenshot = tmp_path / "app.png"
    page.screenshot(path=str(screenshot))
    assert Image.open(screenshot).size == (1100, 760)
    if os.environ.get("MLXNET_SCREENSHOT"):
        small = Image.open(screenshot).convert("RGB").resize((880, 608), Image.LANCZOS)  # small enough to commit
        small.quantize(48).save(os.environ["MLXNET_SCREENSHOT"], optimize=True)

    page.click("#erase")
    page.wait_for_function("document.getElementById('status').textContent.startsWith('erased')", timeout=300_000)
    result = data_url_pixels(page.evaluate("mlxnet.imageDataURL()"), "RGB")
    grown = regions.dilate(shown, regions.DILATE_PX)
    assert result.shape == photo.shape
    np.testing.assert_array_equal(result[~grown], photo[~grown])
    assert np.abs(result[grown].astype(int) - photo[grown]).sum() > 0
    assert page.evaluate("Number(overlay.dataset.maskArea)") == 0  # a fresh selection on the result

    page.click("#undo")
    page.wait_for_function("document.getElementById('status').textContent === 'undone'")
    restored = data_url_pixels(page.evaluate("mlxnet.imageDataURL()"), "RGB")
    np.testing.assert_array_equal(restored, photo)


def test_brush_adds_to_and_removes_from_the_mask(page):
    page.set_input_files("#file", str(BUS))
    page.wait_for_function("document.getElementById('status').textContent.includes('click an object')")
    page.click("#mode-add")
    box = page.locator("#overlay").bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + 40, y)
    page.mouse.down()
    page.mouse.move(box["x"] + 200, y, steps=8)
    page.mouse.up()
    added = page.evaluate("Number(overlay.dataset.maskArea)")
    assert added > 0
    # the status line says what the selection is now, not the last click's count
    assert page.locator("#status").text_content() == f"selected {added} pixels (brush added)"
    page.click("#mode-remove")
    page.mouse.move(box["x"] + 40, y)
    page.mouse.down()
    page.mouse.move(box["x"] + 120, y, steps=4)
    page.mouse.up()
    left = page.evaluate("Number(overlay.dataset.maskArea)")
    assert 0 < left < added
    assert page.locator("#status").text_content() == f"selected {left} pixels (brush removed)"
    assert not page.locator("#erase").is_disabled()


@pytest.mark.slow  # LaMa fills a photo's worth of masks: about 35 s on two cores
def test_erase_every_instance_of_a_class_with_a_segment_checkpoint(tmp_path):
    """With a -seg detector the page's "Erase every NAME" removes the model's own masks of that
    class (no click); the API refuses class ids the detector lacks with a 400."""
    from test_detect_tasks import saved_checkpoint

    from mlxnet.app.models import Weights
    from mlxnet.models.yolo import YOLO

    seg = saved_checkpoint("yolo11n-seg", tmp_path)
    server = Server(Models(Weights(sam=str(tmp_path / "unused.pt"), lama="random", yolo=str(seg), resnet="random")))
    try:
        status, _, error = call(server, "/api/erase", {"image": BUS.read_bytes(), "classes": "[999]"})
        assert status == 400 and "out of range" in error["error"]
        status, _, error = call(server, "/api/erase", {"image": BUS.read_bytes(), "classes": '["person"]'})
        assert status == 400 and "class ids" in error["error"]
        found = YOLO.from_pretrained(str(seg)).predict(str(BUS), conf=0.25)
        target = int(found.classes[0])
        union = found.masks[found.classes == target].any(axis=0)
        photo = load_image(BUS)
        with browser_page(server.url) as page:
            page.set_input_files("#file", str(BUS))
            page.wait_for_function("document.getElementById('status').textContent.includes('click an object')")
            page.fill("#conf", "0.25")
            page.click("#detect")
            button = page.locator(f"#results button[data-class-id='{target}']")
            button.wait_for(timeout=120_000)
            assert button.inner_text() == f"Erase every {found.names[target]}"
            button.click()
            page.wait_for_function("document.getElementById('status').textContent.startsWith('erased every')",
                                   timeout=300_000)
            result = data_url_pixels(page.evaluate("mlxnet.imageDataURL()"), "RGB")
        grown = regions.dilate(union, regions.DILATE_PX)
        np.testing.assert_array_equal(result[~grown], photo[~grown])  # only the class's masks were filled
        assert np.abs(result[union].astype(int) - photo[union]).sum() > 0
    finally:
        server.stop()
