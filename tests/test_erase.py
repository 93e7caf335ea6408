"""`mlxnet erase` and what it is made of (mlxnet/app/regions.py, erasing.py): the region from
points, boxes, masks and classes, the dilation, the crop-and-resize rule, and that outside the
dilated region the output is the input, byte for byte. Seeded weights throughout (the masks mean
nothing, but every side computes the same ones): SAM's from mobile_sam.pt's keys and shapes
(tests/fixtures/sam/) with a seed whose masks cover part of bus.jpg, not none or all of it
(``random``'s SAM gives empty masks); LaMa's, YOLOv8's and ResNet's ``random``."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mlxnet.app import erasing, regions
from mlxnet.app.models import Models, Weights
from mlxnet.cli import app
from mlxnet.image import load_image, load_mask, save_image

ROOT = Path(__file__).resolve().parents[1]
BUS = ROOT / "tests/fixtures/yolo/bus.jpg"
RANDOM = ["--sam-weights", "random", "--lama-weights", "random", "--yolo-weights", "random"]
SAM_SEED = 9  # a click's best mask on bus.jpg covers about a tenth of it
FAST = ["--max-side", "256"]  # LaMa at most 256 px a side: seconds on a CPU, same code path
runner = CliRunner()


def seeded_sam(path: Path, seed: int = SAM_SEED) -> Path:
    """mobile_sam.pt's tensors (names and shapes from the SAM goldens), seeded, as safetensors."""
    from safetensors.numpy import save_file

    from mlxnet.weights.seeded import seeded_state_dict

    meta = json.loads((ROOT / "tests/fixtures/sam/sam_golden.json").read_text())
    save_file(seeded_state_dict([(k, tuple(v)) for k, v in meta["state_dict_shapes"]], seed), str(path))
    return path


@pytest.fixture(scope="module")
def sam_file(tmp_path_factory) -> Path:
    return seeded_sam(tmp_path_factory.mktemp("sam") / "sam_seeded.safetensors")


@pytest.fixture(scope="module")
def models(sam_file) -> Models:
    return Models(Weights(sam=str(sam_file), lama="random", yolo="random"))


@pytest.fixture(scope="module")
def bus() -> np.ndarray:
    return load_image(BUS)


@pytest.fixture(scope="module")
def predictor(models, bus):
    p = models.sam().fresh()
    p.set_image(bus)
    return p


@pytest.fixture(scope="module")
def erase_cli(sam_file):
    def run(*args: str) -> dict:
        result = runner.invoke(app, ["erase", *args, *RANDOM, "--sam-weights", str(sam_file), "--json"])
        assert result.exit_code == 0, (result.output, result.exception)
        (line,) = result.stdout.strip().splitlines()
        return json.loads(line)
    return run


def sam_reference(predictor, points=None, labels=None, box=None) -> np.ndarray:
    """The best mask by SamPredictor.predict, which upsamples every candidate (golden-tested)."""
    multi = box is None and points is not None and len(points) == 1
    masks, scores, _ = predictor.predict(points, labels, None if box is None else np.array(box), multimask_output=multi)
    return masks[int(np.argmax(scores))]


def square_dilation(mask: np.ndarray, px: int) -> np.ndarray:
    """The definition: a pixel is set if any pixel within px (Chebyshev distance) is."""
    h, w = mask.shape
    out = np.zeros_like(mask)
    for y, x in zip(*np.nonzero(mask)):
        out[max(0, y - px):y + px + 1, max(0, x - px):x + px + 1] = True
    return out


# --- the parts --------------------------------------------------------------------------------------

@pytest.mark.parametrize("px", [0, 1, 3, 7])
def test_dilate_is_the_square_maximum(px):
    rng = np.random.default_rng(px)
    for shape, density in [((23, 31), 0.03), ((9, 40), 0.2), ((30, 30), 0.0)]:
        mask = rng.random(shape) < density
        mask[0, -1] = density > 0  # a pixel on the border
        np.testing.assert_array_equal(regions.dilate(mask, px), square_dilation(mask, px))


@pytest.mark.parametrize("prompt", [
    dict(points=np.array([[420.0, 310.0]]), labels=np.array([1])),                       # three candidates
    dict(points=np.array([[420.0, 310.0], [100.0, 80.0]]), labels=np.array([1, 0])),   # one
    dict(box=[50.0, 400.0, 250.0, 900.0]),
    dict(points=np.array([[120.0, 700.0]]), labels=np.array([0]), box=[50.0, 400.0, 250.0, 900.0]),
])
def test_predict_best_is_the_predictors_best_candidate(predictor, prompt):
    """The click path upsamples only the kept mask; it is the one SamPredictor.predict ranks first."""
    mask, score = predictor.predict_best(prompt.get("points"), prompt.get("labels"), prompt.get("box"))
    expected = sam_reference(predictor, prompt.get("points"), prompt.get("labels"), prompt.get("box"))
    assert mask.shape == expected.shape == (1080, 810) and mask.dtype == bool
    assert np.mean(mask != expected) < 1e-4  # float32 sums in another order may flip an edge pixel
    assert 0 < mask.sum() < 0.9 * mask.size  # part of the image: the test can tell


def test_each_image_gets_a_fresh_predictor_on_the_shared_weights(models, predictor):
    """The app keeps a predictor per cached image: one more shares the weights, not the image."""
    from mlxnet import MlxnetError

    other = models.sam().fresh()
    assert other.model is predictor.model is models.sam().model
    assert predictor.is_image_set and not other.is_image_set
    with pytest.raises(MlxnetError, match="no image set"):
        other.predict_best(np.array([[10.0, 10.0]]), np.array([1]))
    with pytest.raises(MlxnetError, match="give points or a box"):
        predictor.predict_best()


def test_crop_and_resize_rule():
    mask = np.zeros((3000, 4000), bool)
    mask[1000:1500, 2000:2600] = True
    assert erasing.crop_box(mask, 128) == (1872, 872, 2728, 1628)
    mask[2990:, :5] = True  # reaches two borders: clipped there
    assert erasing.crop_box(mask, 128) == (0, 872, 2728, 3000)
    assert erasing.lama_size(2728, 2128, 1024) == (1024, 799)
    assert erasing.lama_size(800, 600, 1024) == (800, 600)
    assert erasing.crop_box(np.zeros((5, 5), bool)) is None


def test_erase_keeps_every_pixel_outside_the_dilated_mask(models, bus):
    mask = np.zeros(bus.shape[:2], bool)
    mask[500:560, 300:380] = True
    done = erasing.erase(models.lama(), bus, mask, dilate_px=6, margin=40, max_side=1024)
    grown = square_dilation(mask, 6)
    np.testing.assert_array_equal(done.mask, grown)
    np.testing.assert_array_equal(done.image[~grown], bus[~grown])
    assert np.abs(done.image[grown].astype(int) - bus[grown]).sum() > 0
    assert done.crop == (254, 454, 426, 606) and done.size == (172, 152)
    empty = erasing.erase(models.lama(), bus, np.zeros_like(mask))
    assert empty.crop is None and np.array_equal(empty.image, bus)


# --- the command ------------------------------------------------------------------------------------

def test_erase_a_point(tmp_path, predictor, bus, erase_cli):
    out = tmp_path / "erased.png"
    before = BUS.read_bytes()
    record = erase_cli(str(BUS), "--point", "420,310", "-o", str(out), "--save-mask", *FAST)
    assert BUS.read_bytes() == before  # the input is never written
    expected = regions.dilate(sam_reference(predictor, np.array([[420.0, 310.0]]), np.array([1])), 15)
    written, mask = load_image(out), load_mask(record["mask"]) > 0
    assert np.mean(mask != expected) < 1e-4
    np.testing.assert_array_equal(written[~mask], bus[~mask])
    assert np.abs(written[mask].astype(int) - bus[mask]).sum() > 0
    assert record["filled_pixels"] == int(mask.sum()) and len(record["scores"]) == 1
    assert max(record["lama_size"]) <= 256 and record["output"] == str(out)


def test_erase_boxes_background_points_and_a_mask_file(tmp_path, predictor, bus, erase_cli):
    drawn = np.zeros(bus.shape[:2], np.uint8)
    drawn[20:60, 700:790] = 255
    save_image(drawn, tmp_path / "mine.png")
    boxes = [[50, 400, 250, 900], [600, 380, 810, 880]]
    record = erase_cli(str(BUS), "--box", "50,400,250,900", "--box", "600,380,810,880", "--neg-point", "700,600",
                       "--mask", str(tmp_path / "mine.png"), "--dilate", "4", "-o", str(tmp_path / "out.png"),
                       "--save-mask", *FAST)
    expected = drawn > 0
    for box in boxes:
        expected |= sam_reference(predictor, np.array([[700.0, 600.0]]), np.array([0]), box)
    expected = regions.dilate(expected, 4)  # the square maximum (test_dilate_is_the_square_maximum)
    mask = load_mask(record["mask"]) > 0
    assert np.mean(mask != expected) < 1e-4 and mask[20:60, 700:790].all()
    written = load_image(tmp_path / "out.png")
    np.testing.assert_array_equal(written[~mask], bus[~mask])
    assert len(record["scores"]) == 2


def test_erase_every_instance_of_a_class(tmp_path, models, predictor, bus, erase_cli):
    detections = models.yolo().predict(bus, conf=0.25, classes=[0]).to_list()
    assert detections, "seeded YOLOv8n finds persons in bus.jpg"
    record = erase_cli(str(BUS), "--class", "person", "-o", str(tmp_path / "out.png"), "--save-mask", *FAST)
    assert record["instances"] == detections
    expected = np.zeros(bus.shape[:2], bool)
    for row in detections:
        expected |= sam_reference(predictor, box=row["box"])
    expected = regions.dilate(expected, 15)
    mask = load_mask(record["mask"]) > 0
    assert np.mean(mask != expected) < 1e-4
    np.testing.assert_array_equal(load_image(tmp_path / "out.png")[~mask], bus[~mask])


def test_a_large_photo_runs_on_a_resized_crop(tmp_path, erase_cli):
    """A 4000×3000 photo: LaMa sees the crop around the mask, resized to --max-side, and the
    result is pasted back inside the dilated mask only."""
    rng = np.random.default_rng(0)
    photo = np.repeat(np.repeat(rng.integers(0, 256, (300, 400, 3), dtype=np.uint8), 10, 0), 10, 1)
    save_image(photo, tmp_path / "photo.png")
    drawn = np.zeros((3000, 4000), np.uint8)
    drawn[1000:1500, 2000:2600] = 255
    save_image(drawn, tmp_path / "mask.png")
    record = erase_cli(str(tmp_path / "photo.png"), "--mask", str(tmp_path / "mask.png"), "--dilate", "10",
                       "-o", str(tmp_path / "out.png"), "--max-side", "200")
    assert record["crop"] == [2000 - 138, 1000 - 138, 2600 + 138, 1500 + 138]
    assert record["lama_size"] == [200, round(776 * 200 / 876)]
    grown = np.zeros((3000, 4000), bool)
    grown[990:1510, 1990:2610] = True
    written = load_image(tmp_path / "out.png")
    assert written.shape == photo.shape
    np.testing.assert_array_equal(written[~grown], photo[~grown])
    assert np.abs(written[grown].astype(int) - photo[grown]).mean() > 1


def test_an_image_without_instances_is_written_unchanged(tmp_path, bus, erase_cli):
    record = erase_cli(str(BUS), "--class", "toothbrush", "--conf", "0.99", "-o", str(tmp_path / "out.png"))
    assert record["instances"] == [] and record["crop"] is None
    np.testing.assert_array_equal(load_image(tmp_path / "out.png"), bus)


def mlxnet(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlxnet", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


@pytest.mark.parametrize("args, message", [
    ([], "error: say what to erase: --point X,Y, --box X0,Y0,X1,Y1, --mask FILE or --class NAME"),
    (["--neg-point", "3,4"], "error: --neg-point marks background for a --point or --box; give one of those too"),
    (["--point", "3"], "error: --point: expected X,Y (2 comma-separated numbers), got '3'"),
    (["--box", "9,9,1,1"], "error: --box: need X0 < X1 and Y0 < Y1, got 9,9,1,1"),
    (["--mask", "nowhere.png"], "error: --mask nowhere.png: no such file or folder"),
])
def test_bad_options_are_one_line_before_any_work(args, message, tmp_path):
    run = mlxnet("erase", str(BUS), "-o", str(tmp_path / "o.png"), *args)
    assert run.returncode != 0 and run.stderr.strip() == message, run.stderr
    assert not (tmp_path / "o.png").exists()


def test_bad_inputs_fail_their_image_in_one_line(tmp_path):
    save_image(np.zeros((10, 10), np.uint8), tmp_path / "small.png")
    run = mlxnet("erase", str(BUS), "-o", str(tmp_path / "o.png"), "--mask", str(tmp_path / "small.png"), *RANDOM)
    assert run.returncode == 1 and run.stderr.strip() == f"error: {BUS}: --mask is 10x10 but the image is 810x1080"
    run = mlxnet("erase", str(BUS), "-o", str(tmp_path / "o.png"), "--point", "900,10", *RANDOM)
    assert run.returncode == 1
    assert run.stderr.strip() == f"error: {BUS}: --point/--neg-point 900,10 lies outside the 810x1080 image"
    run = mlxnet("erase", str(BUS), "-o", str(BUS), "--point", "9,9", *RANDOM)
    assert run.returncode == 1 and len(run.stderr.strip().splitlines()) == 1 and "input" in run.stderr
    run = mlxnet("erase", str(BUS), "-o", str(tmp_path / "o.png"), "--class", "unicorn", *RANDOM)
    assert run.returncode == 1 and run.stderr.startswith("error: --class: unknown class 'unicorn'")
    assert len(run.stderr.strip().splitlines()) == 1


@pytest.mark.gpu
def test_erase_on_the_gpu(tmp_path, gpu, bus, erase_cli):
    """The command on the GPU: the same invariants (the masks may differ from the CPU's by
    TF32 rounding, so they are checked against themselves)."""
    drawn = np.zeros(bus.shape[:2], np.uint8)
    drawn[600:760, 300:420] = 255  # a region of its own, whatever the random models find
    save_image(drawn, tmp_path / "region.png")
    record = erase_cli(str(BUS), "--point", "420,310", "--class", "person", "--mask", str(tmp_path / "region.png"),
                       "-o", str(tmp_path / "out.png"), "--save-mask", "--device", "gpu")
    assert record["backend"] == gpu
    mask = load_mask(record["mask"]) > 0
    assert mask[600:760, 300:420].all()
    written = load_image(tmp_path / "out.png")
    np.testing.assert_array_equal(written[~mask], bus[~mask])
    assert np.abs(written[mask].astype(int) - bus[mask]).sum() > 0
    assert len(record["scores"]) == 1 + len(record["instances"])
