"""Click-to-mask as a person sees it: ``mlxnet app`` in its own process, driven by a real browser.

    python scripts/bench/bench_page.py [--clicks 20] [--device cpu|gpu] [--chromium /usr/bin/chromium]

Starts ``mlxnet app`` (the tests' seeded SAM weights, the other models random) on a free port,
opens the page in chromium through Playwright, loads bus.jpg, then clicks the man on the left
``--clicks`` times, clearing the selection between clicks, and reads the page's own timing line
after each: the server's milliseconds for the mask (``/api/segment``: prompt encoder, mask
decoder, the best mask upsampled and encoded) and the page's, from the click's request to the
mask drawn on the canvas (upload of the prompt, the server, the PNG's decode and compositing).
Prints the medians and ranges as one JSON line; the first click, which waits for the image's
embedding, is reported apart.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
BUS = ROOT / "tests" / "fixtures" / "yolo" / "bus.jpg"
PERSON = (150, 650)
TIMING = re.compile(r"mask: ([\d.]+) ms on the server(?: \(\+ ([\d.]+) ms embedding the image once\))?, ([\d.]+) ms in the page")


def start_app(weights: str, device: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "mlxnet", "app", "--port", "0", "--device", device,
                             "--sam-weights", weights, "--lama-weights", "random", "--yolo-weights", "random",
                             "--resnet-weights", "random"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:\d+", line)
        if found:
            return proc, found.group(0)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit("mlxnet app did not print its address")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clicks", type=int, default=20)
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    a = ap.parse_args()
    from playwright.sync_api import sync_playwright
    from safetensors.numpy import save_file

    from bench_sam_everything import seeded_weights

    with tempfile.TemporaryDirectory() as tmp:
        weights = str(Path(tmp) / "sam_seeded.safetensors")
        save_file(seeded_weights(), weights)
        proc, url = start_app(weights, a.device)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=a.chromium, headless=True)
                page = browser.new_page(viewport={"width": 1100, "height": 760})
                page.goto(url)
                page.set_input_files("#file", str(BUS))
                page.wait_for_function("document.getElementById('status').textContent.includes('click an object')")
                server, in_page, first = [], [], None
                for i in range(a.clicks + 1):
                    if i:
                        page.click("#clear")
                    page.evaluate("document.getElementById('timing').textContent = ''")
                    box = page.locator("#overlay").bounding_box()
                    width, height = page.evaluate("[overlay.width, overlay.height]")
                    page.mouse.click(box["x"] + PERSON[0] * box["width"] / width,
                                     box["y"] + PERSON[1] * box["height"] / height)
                    page.wait_for_function("document.getElementById('timing').textContent.includes('in the page')",
                                           timeout=300_000)
                    found = TIMING.search(page.inner_text("#timing"))
                    assert found, page.inner_text("#timing")
                    if i == 0:
                        first = {"server_ms": float(found.group(1)), "embed_ms": float(found.group(2) or 0),
                                 "page_ms": float(found.group(3))}
                    else:
                        server.append(float(found.group(1)))
                        in_page.append(float(found.group(3)))
                browser.close()
        finally:
            proc.terminate()
            proc.wait(30)
    summary = (lambda v: {"median": statistics.median(v), "min": min(v), "max": max(v)})
    print(json.dumps({"device": a.device, "clicks": a.clicks, "first_click": first,
                      "server_ms": summary(server), "page_ms": summary(in_page)}))


if __name__ == "__main__":
    main()
