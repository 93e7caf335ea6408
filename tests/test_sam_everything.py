"""Segment-everything's speed and memory work keeps SAM's result.

- The mask resize as two matrix products (mlxnet.nn.resize.BilinearResize) equals its definition
  (interpolate_bilinear, SAM's two F.interpolate calls) and PyTorch's F.interpolate.
- The generator, which filters by predicted IoU before upscaling and upscales, decodes and keeps
  masks in bounded parts, gives the masks of SAM's order (every mask upscaled by the definition,
  then filtered), on seeded weights; and, where MobileSAM's code is at hand, MobileSAM's own.
- Its progress: the library's callback, and `mlxnet segment --everything`'s bar, plain lines or
  silence; the one line the first build of the CPU primitives prints.
"""
from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from rich.console import Console

from mlxnet import progress
from mlxnet.models import sam, sam_amg
from mlxnet.models.sam_amg import SamAutomaticMaskGenerator, masks_to_boxes, stability_score
from mlxnet.nn.resize import BilinearResize, bilinear_matrix, interpolate_bilinear
from mlxnet.ops import nms
from test_sam import FIX, IMAGE, seeded_model

ROOT = Path(__file__).resolve().parents[1]


# --- the resize ------------------------------------------------------------------------------------

SIZES = [  # (input_size, original_size): SAM's crop of the 1024 square, then the image's size
    ((768, 1024), (96, 128)),      # the test photo: landscape, downscaled
    ((1024, 768), (1080, 810)),    # bus.jpg: portrait, upscaled by a non-integer factor
    ((1024, 1024), (1024, 1024)),  # square at the model's size: the last resize is the identity
    ((1024, 731), (7, 5)),         # tiny, odd sizes
]


def torch_reference(low_res: np.ndarray, input_size, original_size) -> np.ndarray:
    """SAM's Sam.postprocess_masks in PyTorch."""
    x = F.interpolate(torch.from_numpy(low_res), (1024, 1024), mode="bilinear", align_corners=False)
    x = x[..., :input_size[0], :input_size[1]]
    return F.interpolate(x, original_size, mode="bilinear", align_corners=False).numpy()


@pytest.mark.parametrize("input_size, original_size", SIZES)
def test_the_matrix_resize_equals_the_definition_and_pytorch(input_size, original_size):
    low_res = np.random.default_rng(0).standard_normal((2, 3, 256, 256)).astype(np.float32) * 8
    chain = BilinearResize((256, 256)).resize((1024, 1024)).crop(input_size).resize(original_size)
    fast = np.array(chain(mx.array(low_res)))
    definition = np.array(interpolate_bilinear(interpolate_bilinear(mx.array(low_res), (1024, 1024), keep=input_size),
                                               original_size))
    ref = torch_reference(low_res, input_size, original_size)
    assert fast.shape == definition.shape == ref.shape == (2, 3, *original_size)
    # A few float32 ulps of the largest value: PyTorch's source coordinates and weights are
    # reproduced exactly (float64 coordinates, as the old resize had them, are off by ~1e-5 of it).
    tol = 5e-7 * np.abs(ref).max()
    assert np.abs(fast - ref).max() <= tol and np.abs(definition - ref).max() <= tol
    sure = np.abs(ref) > tol
    assert np.array_equal(fast[sure] > 0, ref[sure] > 0)
    assert chain.out_size == original_size


def test_bilinear_matrix_rows_are_two_tap_blends():
    m = bilinear_matrix(4, 10)
    np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-7)
    assert ((m > 0).sum(axis=1) <= 2).all()
    np.testing.assert_array_equal(m[0], [1, 0, 0, 0])  # clamped at the first pixel
    np.testing.assert_array_equal(bilinear_matrix(5, 5), np.eye(5))
    with pytest.raises(ValueError, match=r"expected \(\.\.\., 4, 4\)"):
        BilinearResize((4, 4))(mx.zeros((1, 4, 5)))


# --- the generator: SAM's order as the definition --------------------------------------------------

def generate_in_sams_order(predictor: sam.SamPredictor, grid: int, points_per_batch: int, pred_iou: float,
                           stability: float, offset: float, nms_thresh: float) -> list[dict]:
    """segment-anything's _process_batch as it is: each batch's every mask upscaled (by the
    definition), then the IoU filter, the stability score and filter, boxes; then NMS."""
    h, w = predictor.original_size
    points = sam_amg.build_point_grid(grid) * np.array([[w, h]])
    kept: dict[str, list] = {"masks": [], "iou": [], "stability": [], "points": []}
    for start in range(0, len(points), points_per_batch):
        batch = points[start:start + points_per_batch]
        coords = mx.array(sam.apply_coords(batch, (h, w), 1024).astype(np.float32))[:, None]
        low_res, iou = predictor.predict_low_res(coords, mx.ones((len(batch), 1), mx.int32))
        logits = interpolate_bilinear(interpolate_bilinear(low_res.reshape(-1, 256, 256), (1024, 1024),
                                                           keep=predictor.input_size), (h, w))
        iou = np.array(iou).reshape(-1)
        keep = iou > pred_iou if pred_iou > 0 else np.ones(len(iou), bool)
        stab = np.array(stability_score(logits, 0.0, offset))
        keep &= stab >= stability if stability > 0 else True
        kept["masks"].append(np.array(logits > 0)[keep])
        kept["iou"].append(iou[keep])
        kept["stability"].append(stab[keep])
        kept["points"].append(np.repeat(batch, 3, axis=0)[keep])
    data = {k: np.concatenate(v) for k, v in kept.items()}
    boxes = np.array(masks_to_boxes(mx.array(data["masks"])))
    order = np.array(nms(mx.array(boxes.astype(np.float32)), mx.array(data["iou"]), iou_threshold=nms_thresh,
                         max_det=len(boxes)))
    return [{"segmentation": data["masks"][i], "predicted_iou": float(data["iou"][i]),
             "stability_score": float(data["stability"][i]), "point_coords": [data["points"][i].tolist()],
             "bbox": [int(boxes[i, 0]), int(boxes[i, 1]), int(boxes[i, 2] - boxes[i, 0]),
                      int(boxes[i, 3] - boxes[i, 1])], "area": int(data["masks"][i].sum())} for i in order]


@pytest.fixture(scope="module")
def photo_predictor() -> sam.SamPredictor:
    predictor = sam.SamPredictor(seeded_model())
    predictor.set_image(IMAGE)
    return predictor


# (pred_iou_thresh, stability_score_thresh, stability_score_offset): no filter (every mask, of
# several shapes: the seeded model's kept masks all cover the photo), and both filters dropping some.
SETTINGS = [(0.0, 0.0, 1.0), (0.3, 0.5, 0.25)]


@pytest.mark.parametrize("pred_iou, stability, offset", SETTINGS)
def test_everything_gives_the_masks_of_sams_order(photo_predictor, monkeypatch, pred_iou, stability, offset):
    # Upscaling in parts of 7 masks and decoding 3 points at a time: the parts' edges fall inside
    # batches. Batches of 6 points decode in parts of 3 in both (the decoder's batch is a rounding
    # matter; the definition decodes a batch in one call).
    monkeypatch.setattr(sam_amg, "UPSCALE_BYTES", 7 * 4 * IMAGE.shape[0] * IMAGE.shape[1])
    monkeypatch.setattr(sam_amg, "DECODE_POINTS", 6)
    settings = dict(points_per_batch=6, pred_iou_thresh=pred_iou, stability_score_thresh=stability,
                    stability_score_offset=offset, box_nms_thresh=1.0)  # NMS keeps all: every mask compared
    anns = SamAutomaticMaskGenerator(photo_predictor, points_per_side=4, **settings).generate()
    ref = generate_in_sams_order(photo_predictor, 4, 6, pred_iou, stability, offset, 1.0)
    assert len(anns) == len(ref) >= 10
    for a, r in zip(anns, ref):
        assert a["point_coords"] == r["point_coords"] and a["predicted_iou"] == r["predicted_iou"]
        assert a["bbox"] == r["bbox"] and a["area"] == r["area"]
        assert abs(a["stability_score"] - r["stability_score"]) < 1e-6
        np.testing.assert_array_equal(a["segmentation"], r["segmentation"])
    if pred_iou == 0:
        assert len({a["area"] for a in anns}) > 5


def test_only_masks_past_the_iou_filter_are_upscaled_in_bounded_parts(photo_predictor, monkeypatch):
    upscaled, decoded = [], []
    upscale, decode = photo_predictor.upscale_masks, photo_predictor.predict_low_res
    monkeypatch.setattr(photo_predictor, "upscale_masks", lambda x: upscaled.append(x.shape[0]) or upscale(x))
    monkeypatch.setattr(photo_predictor, "predict_low_res",
                        lambda c, *a, **k: decoded.append(c.shape[0]) or decode(c, *a, **k))
    monkeypatch.setattr(sam_amg, "UPSCALE_BYTES", 5 * 4 * IMAGE.shape[0] * IMAGE.shape[1])  # 5 masks
    monkeypatch.setattr(sam_amg, "DECODE_POINTS", 4)
    generator = SamAutomaticMaskGenerator(photo_predictor, points_per_side=3, points_per_batch=9,
                                          pred_iou_thresh=0.3, stability_score_thresh=0.0)
    generator.generate()
    assert decoded == [4, 4, 1]
    _, iou = decode(mx.array(sam.apply_coords(generator.point_grid * np.array([[128, 96]]), (96, 128), 1024)
                             .astype(np.float32))[:, None], mx.ones((9, 1), mx.int32))
    passing = int((np.array(iou) > 0.3).sum())
    assert 0 < passing < 27 and sum(upscaled) == passing and max(upscaled) <= 5


# --- against MobileSAM's own generator --------------------------------------------------------------

def bench_script():
    spec = importlib.util.spec_from_file_location("bench_sam_everything",
                                                  ROOT / "scripts" / "bench" / "bench_sam_everything.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.mark.slow
@pytest.mark.skipif(not (ROOT / ".ref-sam" / "mobile_sam").is_dir(), reason="MobileSAM's code is not in .ref-sam/")
@pytest.mark.parametrize("pred_iou, stability, offset", SETTINGS)
def test_everything_matches_mobile_sams_generator(photo_predictor, tmp_path, pred_iou, stability, offset):
    """MobileSAM's SamAutomaticMaskGenerator (its torchvision needs from the benchmark's stand-in)
    in a subprocess, on the same photo, grid, thresholds and seeded weights."""
    from safetensors.numpy import save_file

    bench = bench_script()
    weights = tmp_path / "seeded.safetensors"
    save_file(bench.seeded_weights(), str(weights))
    out = tmp_path / "mobile_sam.npz"
    code = (f"import sys, numpy as np; sys.path.insert(0, {str(ROOT / 'scripts' / 'bench')!r})\n"
            "import bench_sam_everything as b, torch; torch.set_num_threads(2)\n"
            f"anns = b.mobile_sam_masks({str(FIX / 'stage_128x96.png')!r}, {str(weights)!r}, 4, dict("
            f"points_per_batch=6, pred_iou_thresh={pred_iou}, stability_score_thresh={stability}, "
            f"stability_score_offset={offset}, box_nms_thresh=1.0))\n"
            f"np.savez({str(out)!r}, masks=np.stack([a['segmentation'] for a in anns]), "
            "records=np.array([b.json.dumps({k: a[k] for k in ('bbox', 'area', 'predicted_iou', "
            "'stability_score', 'point_coords')}) for a in anns]))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    ref = np.load(out)
    records = [json.loads(r) for r in ref["records"]]
    anns = SamAutomaticMaskGenerator(photo_predictor, points_per_side=4, points_per_batch=6, pred_iou_thresh=pred_iou,
                                     stability_score_thresh=stability, stability_score_offset=offset,
                                     box_nms_thresh=1.0).generate()
    # The models agree to ~1e-5 (test_sam.py's goldens), so scores agree to that; the masks are the
    # same but for pixels whose logit is within that of 0, and IoU ties may swap places.
    assert len(anns) == len(records) >= 10
    by_point = lambda recs: sorted(range(len(recs)), key=lambda i: (recs[i]["point_coords"], recs[i]["predicted_iou"]))
    for i, j in zip(by_point(anns), by_point(records)):
        a, r = anns[i], records[j]
        assert a["point_coords"] == r["point_coords"]
        assert abs(a["predicted_iou"] - r["predicted_iou"]) < 1e-4
        assert abs(a["stability_score"] - r["stability_score"]) < 1e-3
        assert (a["segmentation"] != ref["masks"][j]).mean() < 1e-3
        assert np.abs(np.array(a["bbox"]) - r["bbox"]).max() <= 1


# --- progress -----------------------------------------------------------------------------------------

def test_the_generator_reports_progress_per_batch_and_is_quiet_by_default(photo_predictor, capsys):
    calls = []
    SamAutomaticMaskGenerator(photo_predictor, points_per_side=3, points_per_batch=4,
                              progress=lambda done, total: calls.append((done, total))).generate()
    assert calls == [(4, 9), (8, 9), (9, 9)]
    SamAutomaticMaskGenerator(photo_predictor, points_per_side=2).generate()
    assert capsys.readouterr() == ("", "")
    with pytest.raises(Exception, match="progress must be a callable"):
        SamAutomaticMaskGenerator(photo_predictor, points_per_side=2, progress="yes")  # type: ignore[arg-type]


def segment_everything(photo_predictor, monkeypatch, tmp_path, *options: str):
    """`mlxnet segment --everything` in-process on the photo already embedded (3×3 grid, batches of 4)."""
    from typer.testing import CliRunner

    from mlxnet.cli import app

    monkeypatch.setattr(sam.SamPredictor, "from_pretrained", classmethod(lambda cls, *a, **k: photo_predictor))
    monkeypatch.setattr(photo_predictor, "set_image", lambda image: None)
    return CliRunner().invoke(app, ["segment", str(FIX / "stage_128x96.png"), "--everything", "-o",
                                    str(tmp_path / "all.png"), "--points-per-side", "3", "--points-per-batch", "4",
                                    *options])


def test_segment_everything_draws_a_bar_over_the_points_on_a_terminal(photo_predictor, monkeypatch, tmp_path):
    drawn = io.StringIO()
    monkeypatch.setattr(progress, "progress_console",
                        lambda: Console(file=drawn, force_terminal=True, width=120, color_system=None))
    result = segment_everything(photo_predictor, monkeypatch, tmp_path)
    assert result.exit_code == 0, result.output
    screen = drawn.getvalue()
    # The points' bar under the images' bar (drawn at the console's refresh: some counts of 9)
    assert "stage_128x96.png: points" in screen and "/9 " in screen and "pt/s" in screen, repr(screen)
    assert "segment" in screen and "1/1" in screen


def test_segment_everything_prints_plain_progress_lines_without_a_terminal(photo_predictor, monkeypatch, tmp_path):
    from mlxnet.commands import segment

    monkeypatch.setattr(segment, "PROGRESS_LINE_EVERY_S", 0.0)
    result = segment_everything(photo_predictor, monkeypatch, tmp_path)
    assert result.exit_code == 0, result.output
    name = str(FIX / "stage_128x96.png")  # the image as named on the command line
    assert [line for line in result.stderr.splitlines() if "points" in line] == [
        f"{name}: 4/9 points", f"{name}: 8/9 points", f"{name}: 9/9 points"]
    # --json: nothing but the JSON line
    result = segment_everything(photo_predictor, monkeypatch, tmp_path, "--json")
    assert result.exit_code == 0 and "points" not in result.output
    assert json.loads(result.stdout)["mode"] == "everything"


def test_a_bar_opened_under_another_is_drawn_on_its_console_and_goes_when_done(monkeypatch):
    consoles = []

    def console():
        consoles.append(Console(file=io.StringIO(), force_terminal=True, width=100, color_system=None))
        return consoles[-1]

    monkeypatch.setattr(progress, "progress_console", console)
    with progress.progress_bar("images", 1) as outer:
        with progress.progress_bar("points", 4) as inner:
            assert inner.drawn and inner._progress.console is outer._progress.console  # type: ignore[union-attr]
            assert inner._progress.live.transient  # type: ignore[union-attr]
            inner.advance()
        outer.advance()
    assert len(consoles) == 1


# --- the first build of the CPU primitives -----------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU primitives are built on Linux only")
def test_the_first_build_says_so_once_on_stderr(tmp_path):
    code = ("import mlxnet\nfrom mlxnet import _native\nmlxnet.use_device('cpu')\n"
            "print(_native.module() is not None)\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("MLXNET_NATIVE", None)
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
            for _ in range(2)]
    assert [r.stdout for r in runs] == ["True\n", "True\n"]  # stdout untouched (--json stays JSON)
    note = "mlxnet: building CPU primitives for this CPU (once, ~10 s)..."
    assert runs[0].stderr.splitlines() == [note]
    assert runs[1].stderr == ""  # a cache hit says nothing
