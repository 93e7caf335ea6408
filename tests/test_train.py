"""`mlxnet train classify` in one process: the ImageFolder scan and its errors, a run whose model
`mlxnet classify` loads with the class names, and a killed run resumed to the same result."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from mlxnet.cli import app
from mlxnet.errors import MlxnetError
from mlxnet.training import data as D

MLXNET = [sys.executable, "-m", "mlxnet"]
TINY = ["--weights", "none", "--size", "32", "--batch", "4", "--lr", "0.05"]


def make_folder(root: Path, classes: dict[str, tuple[int, int, int]], per_class: int = 6, seed: int = 0) -> Path:
    """Classes of noisy flat colours (learnable in a few steps), 40×48 PNGs."""
    rng = np.random.default_rng(seed)
    for name, colour in classes.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = (np.array(colour) + rng.integers(-40, 40, (40, 48, 3))).clip(0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


@pytest.fixture
def folder(tmp_path) -> Path:
    return make_folder(tmp_path / "data", {"apple": (200, 40, 40), "sky": (40, 60, 200)})


def run(*args, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([*MLXNET, *map(str, args)], capture_output=True, text=True, timeout=300)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def test_scan_and_split(folder):
    (folder / "apple" / ".hidden.png").write_bytes(b"x")
    (folder / "apple" / "notes.txt").write_text("not an image")
    (folder / "sky" / "more").mkdir()
    Image.new("RGB", (8, 8)).save(folder / "sky" / "more" / "deep.png")
    data = D.scan(folder)
    assert data.classes == ("apple", "sky")
    assert sum(s.label == 0 for s in data.samples) == 6 and sum(s.label == 1 for s in data.samples) == 7
    train, val = D.split(data, 0.34, seed=1)
    assert len(train) + len(val) == len(data) and {s.path for s in train.samples}.isdisjoint(s.path for s in val.samples)
    assert {s.label for s in val.samples} == {0, 1}
    assert D.split(data, 0.34, seed=1) == (train, val)  # seeded


@pytest.mark.parametrize("layout, message", [
    ({}, "found 0 class folder"),
    ({"only": 2}, "found 1 class folder"),
    ({"a": 2, "b": 0}, "class folder without images"),
])
def test_bad_folders_are_one_line_errors(tmp_path, layout, message):
    root = tmp_path / "d"
    root.mkdir()
    for name, count in layout.items():
        (root / name).mkdir()
        for i in range(count):
            Image.new("RGB", (8, 8)).save(root / name / f"{i}.png")
    with pytest.raises(MlxnetError, match=message):
        D.scan(root)


def test_augmentation_depends_only_on_seed_epoch_and_image(folder):
    data = D.scan(folder)
    a, _ = D.batch_of(data, [3, 7], 32, epoch=2, seed=5)
    b, _ = D.batch_of(data, [7], 32, epoch=2, seed=5)  # read elsewhere (another rank's batch)
    np.testing.assert_array_equal(a[1], b[0])
    c, _ = D.batch_of(data, [7], 32, epoch=3, seed=5)
    assert not np.array_equal(b, c)
    assert a.shape == (2, 32, 32, 3) and a.dtype == np.float32


def test_cli_errors_name_the_problem(folder, tmp_path):
    result = CliRunner().invoke(app, ["train", "classify", str(folder), *TINY[:4], "--batch", "100",
                                      "-o", str(tmp_path / "o")])
    assert result.exit_code != 0 and "--batch 100 is larger than the" in str(result.exception or result.output)
    done = run("train", "classify", folder, *TINY, "--resume", "-o", tmp_path / "none", check=False)
    assert done.returncode == 1 and "no training checkpoint to resume from" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "model.safetensors").write_bytes(b"a model to start from")
    for option, message in ((["--dtype", "float16"], "without loss scaling"),
                            (["--batchnorm", "sync"], "unknown --batchnorm 'sync': expected frozen or train"),
                            (["--optimizer", "lion"], "unknown --optimizer 'lion': expected sgd or adamw"),
                            (["--schedule", "linear"], "expected cosine, step or constant"),
                            (["--val", tmp_path / "missing"], "missing: not a folder"),
                            (["-o", folder / "apple" / "0.png"], "is not a folder"),
                            (["--weights", tmp_path / "o" / "model.safetensors"], "would overwrite the input")):
        result = CliRunner().invoke(app, ["train", "classify", str(folder), *map(str, TINY),
                                          "-o", str(tmp_path / "o"), *map(str, option)])
        assert result.exit_code != 0 and message in str(result.exception), (option, result.exception)


def test_trained_model_classifies_with_its_class_names(folder, tmp_path):
    out = tmp_path / "run"
    done = run("train", "classify", folder, *TINY, "--epochs", "3", "--val-split", "0.34", "-o", out,
               "--schedule", "step", "--warmup", "0.5")
    assert "epoch 3/3" in done.stdout and "val accuracy" in done.stdout
    losses = [float(line.split("loss ")[1].split()[0]) for line in done.stdout.splitlines() if "loss" in line]
    assert losses[-1] < losses[0]
    labelled = run("classify", folder / "sky" / "0.png", "-w", out / "model.safetensors", "--top", "2")
    assert "sky" in labelled.stdout and "apple" in labelled.stdout
    assert (out / "last.safetensors").stat().st_mode & 0o777 == 0o666 & ~_umask()
    # A second run with different settings cannot resume this one.
    again = run("train", "classify", folder, *TINY, "--epochs", "4", "--seed", "9", "--resume", "-o", out, check=False)
    assert again.returncode == 1 and "cannot resume: " in again.stderr and len(again.stderr.splitlines()) == 1


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _params(path: Path) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in mx.load(str(path)).items()}


@pytest.mark.slow  # two runs and a SIGKILL (9 s on 2 cores); train detect's resume test stays in the default run
def test_a_killed_run_resumes_to_the_uninterrupted_result(folder, tmp_path):
    args = ["train", "classify", folder, *TINY, "--epochs", "3", "--val-split", "0", "--optimizer", "adamw", "--lr", "1e-4"]
    run(*args, "-o", tmp_path / "whole")
    # Kill the second run as soon as its first epoch is saved, then resume it.
    cut = tmp_path / "cut"
    # A session of its own: on CUDA builds `python -m mlxnet` starts itself again with its load-time
    # settings, and the kill must reach the run, not only the parent.
    proc = subprocess.Popen([*MLXNET, *map(str, args), "-o", str(cut)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 240
    while not (cut / "last.safetensors").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert not (cut / "model.safetensors").exists(), "the run finished before it could be killed"
    resumed = run(*args, "-o", cut, "--resume")
    assert "epoch 1/3" not in resumed.stdout and "epoch 3/3" in resumed.stdout
    whole, again = _params(tmp_path / "whole" / "model.safetensors"), _params(cut / "model.safetensors")
    assert whole.keys() == again.keys()
    for key in whole:
        np.testing.assert_allclose(again[key], whole[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_pretrained_weights_get_a_new_head_unless_they_have_these_classes(folder, tmp_path):
    from mlxnet.models import resnet
    from mlxnet.nn.init import scale_preserving_init

    imagenet_like = tmp_path / "r18.safetensors"
    scale_preserving_init(resnet.resnet("resnet18")).save_weights(str(imagenet_like))  # 1000 classes
    args = ["train", "classify", folder, "--size", "32", "--batch", "4", "--epochs", "1", "--val-split", "0"]
    run(*args, "--weights", imagenet_like, "-o", tmp_path / "first")
    first = mx.load(str(tmp_path / "first" / "model.safetensors"))
    assert first["fc.weight"].shape == (2, 512)
    # Its conv weights came from the file (they moved by one epoch of small steps, not more).
    start = mx.load(str(imagenet_like))
    for key in ("conv1.weight", "layer4.1.conv2.weight"):
        change = np.linalg.norm(np.array(first[key] - start[key])) / np.linalg.norm(np.array(start[key]))
        assert change < 0.3, (key, change)
    # A model trained on these classes keeps its head when trained further.
    run(*args, "--weights", tmp_path / "first" / "model.safetensors", "--lr", "0", "--weight-decay", "0",
        "-o", tmp_path / "second")
    second = mx.load(str(tmp_path / "second" / "model.safetensors"))
    np.testing.assert_array_equal(np.array(second["fc.weight"]), np.array(first["fc.weight"]))


def test_bfloat16_compute_keeps_float32_master_weights(folder, tmp_path):
    done = run("train", "classify", folder, *TINY, "--epochs", "2", "--val-split", "0.34", "--precision", "bfloat16",
               "-o", tmp_path / "bf16")
    losses = [float(line.split("loss ")[1].split()[0]) for line in done.stdout.splitlines() if "loss" in line]
    assert len(losses) == 2 and all(np.isfinite(losses))
    saved = mx.load(str(tmp_path / "bf16" / "model.safetensors"))
    assert {v.dtype for v in saved.values()} == {mx.float32}
    state = mx.load(str(tmp_path / "bf16" / "last.safetensors"))
    assert any(k.startswith("optimizer.") for k in state) and state["optimizer.step"].item() == 2 * (8 // 4)
