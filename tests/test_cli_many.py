"""The image commands on many inputs: folders, patterns, batches, per-file errors, JSON Lines,
outputs mirrored and checked before any work, and the progress bar (mlxnet/commands/images.py).

Small random-weight models written here (no hub): a 3-class ResNet-18, a seeded YOLOv8n, a
random LaMa-Fourier and the seeded MobileSAM of tests/fixtures/sam; tiny images.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

import mlxnet
from mlxnet import progress
from mlxnet.cli import app
from mlxnet.commands import images as many
from mlxnet.image import load_image, save_image

GOOD = ["a0.png", "a1.png", "a2.jpg", "sub/b0.png", "sub/deeper/b1.png"]  # sorted as a folder walk gives them
SAM_FIXTURES = Path(__file__).parent / "fixtures" / "sam"


def cli(*args: object) -> subprocess.CompletedProcess:
    """The real command line, its stderr a pipe (not a terminal); no FORCE_COLOR/TTY_COMPATIBLE,
    which would make rich draw on a pipe anyway."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    env["MLXNET_DEVICE"] = "cpu"
    return subprocess.run([sys.executable, "-m", "mlxnet", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300)


def jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def make_tree(root: Path, seed: int = 0) -> Path:
    """Five good images (one nested two deep), an unreadable .png, a text file and hidden ones."""
    rng = np.random.default_rng(seed)
    sizes = [(40, 48), (48, 48), (56, 40), (32, 32), (40, 40)]
    for name, (h, w) in zip(GOOD, sizes):
        save_image(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), root / name)
    (root / "bad.png").write_bytes(b"not an image")
    (root / "notes.txt").write_text("not an image, skipped")
    save_image(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), root / ".hidden.png")
    save_image(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), root / ".cache" / "x.png")
    return root


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> dict[str, Path]:
    from safetensors.numpy import save_file

    from mlxnet import families
    from mlxnet.models import resnet, yolo
    from mlxnet.nn.init import scale_preserving_init
    from mlxnet.weights.seeded import seeded_state_dict

    d = tmp_path_factory.mktemp("weights")
    out = {"resnet": d / "resnet18.safetensors", "yolo": d / "yolov8n.safetensors",
           "lama": d / "lama.safetensors", "sam": d / "sam.safetensors", "labels": d / "labels.txt"}
    scale_preserving_init(resnet.resnet("resnet18", 3)).save_weights(str(out["resnet"]))
    yolo.seeded("n", 1234, 2.5, 5.0).save_weights(str(out["yolo"]))
    families.family_of("lama-fourier").build("lama-fourier").save_weights(str(out["lama"]))
    meta = json.loads((SAM_FIXTURES / "sam_golden.json").read_text())
    save_file(seeded_state_dict([(k, tuple(s)) for k, s in meta["state_dict_shapes"]], meta["seed"]),
              str(out["sam"]))
    out["labels"].write_text("cat\ndog\nbird\n")
    return out


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return make_tree(tmp_path_factory.mktemp("tree") / "photos")


# --- inputs and outputs, no model ------------------------------------------------------------------

def test_folder_is_searched_recursively_for_visible_image_files(tree, tmp_path):
    sources = many.expand_inputs([str(tree)])
    assert [s.rel.as_posix() for s in sources] == sorted(GOOD[:3] + ["bad.png"]) + GOOD[3:]
    assert all(s.name == os.path.join(str(tree), str(s.rel)) for s in sources)
    # a pattern keeps the paths below its fixed leading folders; ** matches any depth
    found = many.expand_inputs([f"{tree}/**/*.png"])
    assert [s.rel.as_posix() for s in found] == ["a0.png", "a1.png", "bad.png", "sub/b0.png", "sub/deeper/b1.png"]
    # a file named twice (by the folder and by name) runs once; a file argument's output is its name
    again = many.expand_inputs([str(tree / "sub"), str(tree / "sub" / "b0.png"), str(tree / "a0.png")])
    assert [s.rel.as_posix() for s in again] == ["b0.png", "deeper/b1.png", "a0.png"]
    # the output folder inside an input folder is not searched (a second run skips the first's outputs)
    assert [s.rel.as_posix() for s in many.expand_inputs([str(tree)], skip=tree / "sub")] == \
        sorted(GOOD[:3] + ["bad.png"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(mlxnet.MlxnetError, match="empty: no image files in this folder or below it"):
        many.expand_inputs([str(tmp_path / "empty")])
    with pytest.raises(mlxnet.MlxnetError, match=r"\*\.webp: no image files match this pattern"):
        many.expand_inputs([f"{tree}/*.webp"])


def test_one_file_form_of_the_output_option(tree, tmp_path):
    one = str(tree / "a0.png")
    assert many.names_one_file([one], str(tmp_path / "out.png"))
    assert not many.names_one_file([one], str(tmp_path))  # an existing folder
    assert not many.names_one_file([one], str(tmp_path / "new") + "/")  # a folder to be
    assert not many.names_one_file([str(tree)], str(tmp_path / "out") + "/")
    # several sources, a folder or a pattern write into a folder: an output named like an image
    # file is refused in one line, not made a folder of that name
    for args in ([str(tree)], [f"{tree}/*.png"], [one, str(tree / "a1.png")]):
        with pytest.raises(mlxnet.MlxnetError, match=r"names an image file; give a folder"):
            many.names_one_file(args, str(tmp_path / "out.png"))
    assert not (tmp_path / "out.png").exists()


def test_an_input_format_pillow_cannot_write_gets_a_png_output(tmp_path):
    source = many.Source("scan.psd", Path("deep/scan.psd"))
    assert many.mirror(source, tmp_path) == tmp_path / "deep" / "scan.png"
    assert many.mirror(many.Source("a.jpg", Path("a.jpg")), tmp_path) == tmp_path / "a.jpg"


@pytest.mark.parametrize("case", ["same_name", "over_input", "mask_names", "over_mask"])
def test_outputs_are_checked_before_any_work(case, tree, tmp_path):
    """Colliding outputs and an output over an input fail at once: the weights named here do not
    exist, so reaching them (or any image) would be another error; nothing is written."""
    before = digests(tree)
    missing = str(tmp_path / "no-such-weights.safetensors")
    if case == "same_name":  # two files of one name from two folders, into one folder
        args = ["detect", str(tree / "a0.png"), str(tree / "sub" / "deeper" / ".." / ".." / "a0.png"),
                str(tree / "sub" / "b0.png"), str(tmp_path / "b0.png"), "-o", str(tmp_path / "out"), "-w", missing]
        save_image(np.zeros((8, 8, 3), np.uint8), tmp_path / "b0.png")
        expect = f"{tree / 'sub' / 'b0.png'} and {tmp_path / 'b0.png'} would both write {tmp_path / 'out' / 'b0.png'}"
    elif case == "over_input":  # a folder's outputs mirrored onto the folder itself
        args = ["detect", str(tree), "-o", str(tree), "-w", missing]
        expect = f"{tree / 'a0.png'}: output would overwrite the input {tree / 'a0.png'}"
    elif case == "mask_names":  # p.png and p.jpg: both masks would be p.mask.png
        src = tmp_path / "src"
        save_image(np.zeros((8, 8, 3), np.uint8), src / "p.png")
        save_image(np.zeros((8, 8, 3), np.uint8), src / "p.jpg")
        args = ["segment", str(src), "--point", "1,1", "-o", str(tmp_path / "out"), "-w", missing]
        expect = f"would both write {tmp_path / 'out' / 'p.mask.png'}"
    else:  # inpaint's output folder is its folder of masks
        masks = tmp_path / "masks"
        save_image(np.zeros((40, 48), np.uint8), masks / "a0.png")
        args = ["inpaint", str(tree), str(masks), "-o", str(masks), "-w", missing]
        expect = f"{masks / 'a0.png'}: output would overwrite the input {masks / 'a0.png'}"
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, mlxnet.MlxnetError), result.output
    assert expect in str(result.exception)
    assert digests(tree) == before and not (tmp_path / "out").exists()


# --- many images through the models -----------------------------------------------------------------

def test_classify_folder_streams_batches_with_per_file_errors(tree, weights):
    """--batch 2 and --batch 1 give the same JSON Lines; the unreadable file is one error line
    (and one JSON record), the others still run, the run ends 1 with a summary; no progress bar
    on a pipe."""
    runs = [cli("classify", tree, "-w", weights["resnet"], "--labels", weights["labels"], "--top", "3",
                "--json", "--batch", b) for b in (2, 1)]
    for out in runs:
        assert out.returncode == 1
        assert out.stderr.splitlines() == [
            f"error: {tree / 'bad.png'}: not a readable image (cannot identify image file '{tree / 'bad.png'}')",
            "1 of 6 images failed"]  # nothing else: no bar, no escape codes, on a pipe
    batched, single = (jsonl(out.stdout) for out in runs)
    names = [str(tree / n) for n in sorted(GOOD[:3] + ["bad.png"]) + GOOD[3:]]
    assert [r["image"] for r in batched] == [r["image"] for r in single] == names
    assert batched[names.index(str(tree / "bad.png"))] == {
        "image": str(tree / "bad.png"), "error": f"not a readable image (cannot identify image file "
                                                 f"'{tree / 'bad.png'}')"}
    for b, s in zip(batched, single):
        if "error" in b:
            continue
        assert [t["label"] for t in b["top"]] == [t["label"] for t in s["top"]]
        assert {t["label"] for t in b["top"]} == {"cat", "dog", "bird"}  # --labels names the classes
        np.testing.assert_allclose([t["probability"] for t in b["top"]], [t["probability"] for t in s["top"]],
                                   atol=1e-5)


def test_detect_folder_and_pattern_mirror_the_tree(tree, weights, tmp_path):
    before = digests(tree)
    out = cli("detect", tree, "-w", weights["yolo"], "-o", tmp_path / "out", "--imgsz", "64", "--conf", "0.5",
              "--batch", "2", "--json")
    assert out.returncode == 1 and out.stderr.splitlines()[-1] == "1 of 6 images failed"
    rows = {r["image"]: r for r in jsonl(out.stdout)}
    assert "error" in rows.pop(str(tree / "bad.png"))
    assert sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*.*")) == \
        sorted(GOOD)  # one output per image, at its relative path; none for the bad, hidden or text files
    for name in GOOD:
        row = rows[str(tree / name)]
        assert row["output"] == str(tmp_path / "out" / name) and row["detections"]
        assert load_image(row["output"]).shape == load_image(tree / name).shape
    assert digests(tree) == before  # inputs untouched
    # a quoted pattern, one image at a time: the same detections for the same images
    out = cli("detect", f"{tree}/**/*.png", "-w", weights["yolo"], "-o", tmp_path / "glob", "--imgsz", "64",
              "--conf", "0.5", "--batch", "1", "--json")
    assert out.returncode == 1
    alone = {r["image"]: r for r in jsonl(out.stdout) if "error" not in r}
    assert sorted(alone) == sorted(str(tree / n) for n in GOOD if n.endswith(".png"))
    for image, row in alone.items():
        assert row["output"] == str(tmp_path / "glob" / Path(image).relative_to(tree))
        batched = rows[image]["detections"]
        assert [d["class"] for d in row["detections"]] == [d["class"] for d in batched]
        np.testing.assert_allclose([d["box"] + [d["score"]] for d in row["detections"]],
                                   [d["box"] + [d["score"]] for d in batched], atol=1e-3)


def test_progress_bar_on_a_terminal_only(tree, weights, monkeypatch):
    """In-process, with the progress console forced to be a terminal: the bar (description,
    count, rate, ETA) is drawn and the error line printed above it; --json draws nothing."""
    screen = io.StringIO()
    monkeypatch.setattr(progress, "progress_console",
                        lambda: Console(file=screen, force_terminal=True, width=120, color_system=None))
    args = ["classify", str(tree), "-w", str(weights["resnet"]), "--top", "1", "--batch", "4"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    drawn = screen.getvalue()
    assert "classify" in drawn and "6/6" in drawn and "img/s" in drawn and "ETA" in drawn
    assert f"error: {tree / 'bad.png'}: not a readable image" in drawn
    assert result.stdout.count(str(tree)) == 5  # the results stay on stdout (not a terminal here)
    screen.truncate(0)
    result = CliRunner().invoke(app, args + ["--json"])
    assert result.exit_code == 1 and screen.getvalue() == ""
    assert len(jsonl(result.stdout)) == 6


@pytest.mark.slow
def test_segment_many_applies_the_prompts_to_each_image(weights, tmp_path):
    """A point outside a smaller image fails that image only; the mask is NAME.mask.png."""
    src = tmp_path / "src"
    save_image(np.full((20, 24, 3), 90, np.uint8), src / "small.png")
    save_image(np.random.default_rng(1).integers(0, 256, (48, 64, 3), dtype=np.uint8), src / "big.jpg")
    (src / "bad.png").write_bytes(b"\x89PNG broken")
    out = cli("segment", src, "--point", "30,30", "-w", weights["sam"], "-o", tmp_path / "out", "--json")
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        f"error: {src / 'bad.png'}: not a readable image (cannot identify image file '{src / 'bad.png'}')",
        f"error: {src / 'small.png'}: --point 30,30 lies outside the 24x20 image",
        "2 of 3 images failed"]
    bad, good, small = jsonl(out.stdout)
    assert "error" in bad and small == {"image": str(src / "small.png"),
                                        "error": "--point 30,30 lies outside the 24x20 image"}
    assert good["image"] == str(src / "big.jpg") and good["mode"] == "prompt"
    assert good["overlay"] == str(tmp_path / "out" / "big.jpg")
    assert good["mask"] == str(tmp_path / "out" / "big.mask.png")
    assert load_image(good["overlay"]).shape == (48, 64, 3) and load_image(good["mask"], mode="L").shape == (48, 64)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["big.jpg", "big.mask.png"]


def test_inpaint_many_with_one_mask_or_a_folder_of_masks(tree, weights, tmp_path):
    mask = np.zeros((40, 48), np.uint8)
    mask[10:20, 10:30] = 255
    save_image(mask, tmp_path / "mask.png")
    # one mask for every image, resized to each
    out = cli("inpaint", tree / "sub", tree / "a1.png", tmp_path / "mask.png", "-w", weights["lama"],
              "-o", tmp_path / "one", "--resize-mask")
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == 3
    for rel, name in [("b0.png", "sub/b0.png"), ("deeper/b1.png", "sub/deeper/b1.png"), ("a1.png", "a1.png")]:
        assert load_image(tmp_path / "one" / rel).shape == load_image(tree / name).shape
    # a folder of masks: the same relative path, or the same path with another image extension
    save_image(mask, tmp_path / "masks" / "a0.png")
    save_image(np.full((56, 40), 255, np.uint8), tmp_path / "masks" / "a2.png")  # for a2.jpg
    save_image(np.zeros((32, 32), np.uint8), tmp_path / "masks" / "sub" / "b0.png")
    out = cli("inpaint", tree, tmp_path / "masks", "-w", weights["lama"], "-o", tmp_path / "folder", "--json")
    assert out.returncode == 1 and out.stderr.splitlines()[-1] == "3 of 6 images failed"
    rows = {r["image"]: r for r in jsonl(out.stdout)}
    assert rows[str(tree / "a1.png")]["error"] == \
        f"no mask {tmp_path / 'masks' / 'a1.png'} for it in the folder of masks"
    assert rows[str(tree / "a2.jpg")]["mask"] == str(tmp_path / "masks" / "a2.png")
    assert rows[str(tree / "a2.jpg")]["filled_fraction"] == 1.0
    assert rows[str(tree / "sub/b0.png")]["filled_pixels"] == 0
    assert sorted(p.relative_to(tmp_path / "folder").as_posix() for p in (tmp_path / "folder").rglob("*.*")) == \
        ["a0.png", "a2.jpg", "sub/b0.png"]


def test_inpaint_without_a_mask_says_the_mask_is_missing(tree, tmp_path):
    from typer.testing import CliRunner

    from mlxnet.cli import app
    result = CliRunner().invoke(app, ["inpaint", str(tree / "a0.png"), "-o", str(tmp_path / "o.png")])
    said = result.output + str(result.exception)
    assert result.exit_code != 0
    assert "no MASK after" in said and "SOURCE... MASK" in said
    assert "Missing argument 'SOURCE" not in said
    assert not (tmp_path / "o.png").exists()


@pytest.mark.parametrize("command", ["detect", "classify"])
def test_a_labels_file_of_the_wrong_count_is_named(command, tree, tmp_path):
    from typer.testing import CliRunner

    from mlxnet.cli import app
    labels = tmp_path / "names.txt"
    labels.write_text("cat\ndog\n")
    args = [command, str(tree / "a0.png"), "-w", "random", "--labels", str(labels)]
    result = CliRunner().invoke(app, args + (["-o", str(tmp_path / "o.png")] if command == "detect" else []))
    assert result.exit_code != 0
    assert f"{labels}: 2 class names for a" in result.output + str(result.exception)
