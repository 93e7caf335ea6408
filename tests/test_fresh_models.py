"""A freshly built model runs end to end (issue 39, point 3): every variant's ``build()``, saved
with ``save_weights``, runs through its command on a fixture image; ``--weights random`` (the
same weights, nothing downloaded) works for every command that takes --weights; the
architecture's constants (YOLOv8's DFL bins) are never drawn at random."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from PIL import Image
from typer.testing import CliRunner

from mlxnet import families
from mlxnet.cli import app
from mlxnet.weights import fixed_parameters, get_spec, load_safetensors, open_checkpoint

IMAGE = Path(__file__).parent / "fixtures" / "sam" / "stage_128x96.png"  # small: every model runs fast on it
MLXNET = [sys.executable, "-m", "mlxnet"]


@pytest.fixture(scope="module")
def mask(tmp_path_factory) -> Path:
    """A mask for IMAGE: a rectangle in the middle."""
    pixels = np.zeros((96, 128), np.uint8)
    pixels[30:60, 40:90] = 255
    path = tmp_path_factory.mktemp("mask") / "mask.png"
    Image.fromarray(pixels).save(path)
    return path


def command_for(variant: str, weights: str, out: Path, mask: Path) -> list[str]:
    """The command line that runs ``variant``'s family on IMAGE with ``weights``, JSON Lines out."""
    task = families.family_of(variant).task
    options = {
        "classify": ["-k", "2"],
        "detect": ["-o", str(out), "--imgsz", "64"],
        "segment": ["-o", str(out), "-p", "60,40"],
        "inpaint": ["-o", str(out)],
    }[task]
    inputs = [str(IMAGE), str(mask)] if task == "inpaint" else [str(IMAGE)]
    return ["--device", "cpu", task, *inputs, "-w", weights, *options, "--json"]


def run_ok(args: list[str]) -> list[dict]:
    """Run a command in this process; it must succeed, every image with a result."""
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, f"{args}: {result.output}\n{result.exception!r}"
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert records and all("error" not in r for r in records), result.output
    return records


def well_formed(records: list[dict], ordered: bool = True) -> None:
    """Detections, where there are any, are boxes inside the image with ordered corners
    (``ordered=False``: a YOLO26's, whose direct left/top/right/bottom distances can cross on
    random weights; ultralytics decodes and outputs them the same way)."""
    for record in records:
        for det in record.get("detections", []):
            x1, y1, x2, y2 = det["box"]
            assert all(0 <= x <= record["width"] for x in (x1, x2)), det
            assert all(0 <= y <= record["height"] for y in (y1, y2)), det
            if ordered:
                assert x1 <= x2 and y1 <= y2, det


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(families.variants()))
def test_a_freshly_built_variant_runs_through_its_command(variant, tmp_path, mask):
    weights = tmp_path / f"{variant}.safetensors"
    families.family_of(variant).build(variant).save_weights(str(weights))
    well_formed(run_ok(command_for(variant, str(weights), tmp_path / "out", mask)),
                ordered=not variant.startswith("yolo26"))


# One variant per command: every command takes --weights random without per-command code (that
# the weights are seeded, and build()'s, is test_random_weights_are_what_build_gives_and_seeded).
@pytest.mark.parametrize("variant", ["resnet18", "yolov8n", "sam-tiny", "lama-fourier"])
def test_weights_random_works_for_every_image_command(variant, tmp_path, mask):
    model = ["-m", variant] if variant != "sam-tiny" else []  # not the command's default model
    well_formed(run_ok(command_for(variant, "random", tmp_path / "out", mask) + model))


def test_weights_random_works_for_check_and_train(tmp_path):
    check = CliRunner().invoke(app, ["--device", "cpu", "check", "resnet18", "-w", "random", "--size", "32"])
    assert check.exit_code == 0 and "passed" in check.output, check.output
    data = tmp_path / "data"
    for cls in ("a", "b"):
        (data / cls).mkdir(parents=True)
        for i in range(2):
            Image.open(IMAGE).save(data / cls / f"{i}.png")
    train = CliRunner().invoke(app, ["--device", "cpu", "train", "classify", str(data), "-m", "resnet18", "-w", "random",
                                     "--epochs", "1", "--batch", "2", "--size", "32", "--max-steps", "1",
                                     "--val-split", "0", "-o", str(tmp_path / "run")])
    assert train.exit_code == 0, train.output
    assert (tmp_path / "run" / "model.safetensors").is_file()


def test_default_variant_of_random_weights_is_the_commands_default(tmp_path):
    """classify's default model is resnet50 (not the family's first variant, resnet18)."""
    net = families.family_of("resnet50").predictor("random", None).net
    assert len(net.layer3) == 6 and "conv3" in net.layer1[0]


@pytest.mark.parametrize("variant", ["resnet18", "yolov8n", "lama-fourier", "sam-tiny"])
def test_random_weights_are_what_build_gives_and_seeded(variant):
    built = dict(tree_flatten(families.family_of(variant).build(variant).parameters()))
    first = open_checkpoint("random", spec=variant).tensors
    second = open_checkpoint("random", spec=variant).tensors
    assert first.keys() == built.keys()
    for key, value in built.items():
        assert mx.array_equal(first[key], value) and mx.array_equal(first[key], second[key]), key


def test_the_dfl_bins_are_fixed_at_0_to_15_in_every_yolo():
    for variant in ("yolov8n", "yolov8x"):
        net = families.family_of(variant).build(variant)
        assert fixed_parameters(net) == {"model.22.dfl.conv.weight"}
        assert np.array_equal(np.array(net.model[22].dfl.bin_values()), np.arange(16, dtype=np.float32))


@pytest.mark.slow  # builds every variant of every family (9 s on 2 cores)
def test_fixed_parameters_survive_build_in_every_family():
    """A constant of the architecture that build() re-drew would make build()'s output unrunnable;
    every declared one is as constructed (the families' own audit: only YOLOv8's DFL so far)."""
    for variant, family in families.variants().items():
        fresh = get_spec(variant).build()  # constructed only: its random arrays are never evaluated
        fixed = fixed_parameters(fresh)
        if not fixed:
            continue
        built, constructed = dict(tree_flatten(family.build(variant).parameters())), dict(tree_flatten(fresh.parameters()))
        for key in fixed:
            assert mx.array_equal(built[key], constructed[key]), f"{variant}: {key}"


def test_weights_none_is_a_one_line_error_naming_what_is_accepted(tmp_path):
    for args, ids in [(["classify", str(IMAGE)], "resnet18, resnet34, resnet50, resnet101, resnet152"),
                      (["detect", str(IMAGE), "-o", str(tmp_path / "d")],
                       ", ".join(f"{family}[nsmlx]{task}" for task in ("", "-seg", "-pose")
                                 for family in ("yolov8", "yolo11", "yolo26")))]:
        out = subprocess.run(MLXNET + [*args, "-w", "none"], capture_output=True, text=True)
        assert out.returncode == 1 and out.stderr == (
            f"error: 'none' is neither a weights file nor a model id; give a weights file (.safetensors, .pt, .pth, "
            f".ckpt), a model id ({ids}: downloaded once from the Hub) or 'random' (seeded random weights, nothing "
            "to download)\n"), out.stderr


def test_convert_writes_random_weights_and_folds_a_models_own_file(tmp_path):
    """`mlxnet convert random` writes the seeded weights; --fold-bn folds a save_weights file
    (it was written unfolded with fold_bn=1 in its metadata before)."""
    plain, folded = tmp_path / "plain.safetensors", tmp_path / "folded.safetensors"
    for dst, extra in ((plain, []), (folded, ["--fold-bn"])):
        result = CliRunner().invoke(app, ["convert", "random", str(dst), "--model", "yolov8n", *extra])
        assert result.exit_code == 0, result.output
    assert "model.0.bn.weight" in load_safetensors(plain)
    folded_weights = load_safetensors(folded)
    assert "model.0.bn.weight" not in folded_weights and "model.0.conv.bias" in folded_weights
    out = tmp_path / "out"
    a = run_ok(["--device", "cpu", "detect", str(IMAGE), "-w", str(plain), "-o", str(out / "a"), "--imgsz", "64", "--json"])
    b = run_ok(["--device", "cpu", "detect", str(IMAGE), "-w", str(folded), "-o", str(out / "b"), "--imgsz", "64", "--json"])
    assert [d["class"] for d in a[0]["detections"]] == [d["class"] for d in b[0]["detections"]]


def test_sam_build_keeps_its_positional_frequencies():
    """SAM's random positional frequencies are a fixed buffer: build() keeps them as drawn (a
    zeroed matrix encodes every position alike, and a random SAM's masks come out empty)."""
    import numpy as np

    from mlxnet import families

    built = families.family_of("sam-tiny").build("sam-tiny")
    again = families.family_of("sam-tiny").build("sam-tiny")
    g = np.array(built.prompt_encoder.pe_layer.positional_encoding_gaussian_matrix)
    assert g.shape == (2, 128) and 0.5 < g.std() < 2.0
    assert np.array_equal(g, np.array(again.prompt_encoder.pe_layer.positional_encoding_gaussian_matrix))
