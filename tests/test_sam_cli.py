"""`mlxnet segment` end to end (subprocess), with seeded weights in a PyTorch-keyed safetensors file."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import load_file, save_file
from typer.testing import CliRunner

import mlxnet
from mlxnet.cli import app
from mlxnet.weights.seeded import seeded_state_dict

FIX = Path(__file__).parent / "fixtures" / "sam"
IMG = str(FIX / "stage_128x96.png")
META = json.loads((FIX / "sam_golden.json").read_text())


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("sam") / "mobile_sam_seeded.safetensors"
    save_file(seeded_state_dict([(k, tuple(s)) for k, s in META["state_dict_shapes"]], META["seed"]), str(path))
    return str(path)


def cli(*args: str) -> subprocess.CompletedProcess:
    # CPU everywhere: the outputs are compared with float32 goldens at CPU precision.
    env = {**os.environ, "MLXNET_DEVICE": "cpu"}
    return subprocess.run([sys.executable, "-m", "mlxnet", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=env)


@pytest.mark.slow
def test_segment_point_writes_overlay_mask_and_json(tmp_path, weights):
    out = tmp_path / "out.png"
    r = cli("segment", IMG, "--point", "64,48", "-o", out, "--weights", weights, "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    gold = load_file(str(FIX / "sam_golden.safetensors"))
    ref_scores = gold["predictor.point_multi.scores"]
    assert result["mode"] == "prompt" and len(result["masks"]) == 3  # a lone point: 3 masks, best kept
    np.testing.assert_allclose([m["score"] for m in result["masks"]], ref_scores, atol=1e-4)
    assert result["best"] == int(np.argmax(ref_scores))
    assert result["mask"] == str(tmp_path / "out.mask.png")
    overlay = np.asarray(Image.open(out))
    mask = np.asarray(Image.open(tmp_path / "out.mask.png"))
    image = np.asarray(Image.open(IMG).convert("RGB"))
    assert overlay.shape == image.shape and mask.shape == image.shape[:2]
    assert set(np.unique(mask)) <= {0, 255}
    ref = gold["predictor.point_multi.logits"][result["best"]]
    sure = np.abs(ref) > 1e-3 * np.abs(ref).max()
    np.testing.assert_array_equal(mask[sure] == 255, ref[sure] > 0)
    assert mask.sum() // 255 == result["masks"][result["best"]]["area"]
    assert (np.abs(overlay.astype(int) - image).sum(-1)[mask == 255] > 0).mean() > 0.9  # coloured


@pytest.mark.parametrize("args,message", [
    (["missing.png", "--point", "1,1"], "missing.png: no such image file"),
    ([IMG, "--point", "64;48"], "--point: expected X,Y (2 comma-separated numbers), got '64;48'"),
    ([IMG, "--point", "500,20"], f"{IMG}: --point 500,20 lies outside the 128x96 image"),  # per image
])
def test_segment_bad_input_is_one_line(tmp_path, args, message):
    r = cli("segment", *args, "-o", tmp_path / "o.png")
    assert r.returncode == 1 and r.stderr.strip() == f"error: {message}"


def test_segment_rejects_weights_of_another_model(tmp_path):
    other = tmp_path / "resnet.safetensors"
    save_file({"conv1.weight": np.zeros((8, 3, 3, 3), np.float32), "fc.weight": np.zeros((2, 8), np.float32)},
              str(other))
    r = cli("segment", IMG, "--point", "10,10", "-o", tmp_path / "o.png", "--weights", other)
    assert r.returncode == 1
    assert r.stderr.startswith("error: spec 'sam-tiny' cannot map 2 checkpoint key(s)") and "unmapped key" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,message", [
    ([IMG, "--everything", "--point", "1,1"], "--everything takes no --point/--label/--box prompts"),
    ([IMG], "give at least one --point X,Y or a --box X1,Y1,X2,Y2 (or --everything)"),
    ([IMG, "--point", "1,1", "--point", "2,2", "--label", "1"], "--label: got 1 label(s) for 2 point(s)"),
    ([IMG, "--point", "1,1", "--label", "3"], "--label: 1 marks foreground, 0 background; got [3]"),
    ([IMG, "--box", "50,10,20,30"], "--box: need X1 < X2 and Y1 < Y2, got 50,10,20,30"),
])
def test_segment_prompt_errors(tmp_path, args, message):
    result = CliRunner().invoke(app, ["segment", *args, "-o", str(tmp_path / "o.png")])
    assert isinstance(result.exception, mlxnet.MlxnetError)
    assert str(result.exception).startswith(message)


def test_segment_help_lists_the_prompts():
    result = CliRunner().invoke(app, ["segment", "--help"])
    assert result.exit_code == 0
    for option in ("--point", "--label", "--box", "--everything", "--weights", "--json"):
        assert option in result.output
