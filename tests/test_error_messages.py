"""Errors say what the user did (issue 39, points 3 and 8): a file given as weights is named for
what it is, a missing input for what it may have been meant as, a hub failure suggests what the
entry point takes, and an error of one image names that image; drawing never fails on a box."""
from __future__ import annotations

import gzip
import io
import os
import pickle
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import typer

from mlxnet.commands.images import Job, Source
from mlxnet.commands.pipeline import run_jobs
from mlxnet.errors import MlxnetError
from mlxnet.image import box_on_image, draw_boxes
from mlxnet.weights import read_torch_checkpoint

FIXTURES = Path(__file__).parent / "fixtures"
MLXNET = [sys.executable, "-m", "mlxnet"]


def run(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(MLXNET + list(args), capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def npz_bytes() -> bytes:
    buf = io.BytesIO()
    np.savez(buf, x=np.zeros(2))
    return buf.getvalue()


def zip_bytes(names: list[str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name in names:
            zf.writestr(name, b"x")
    return buf.getvalue()


NOT_CHECKPOINTS = {
    "jpeg": ((FIXTURES / "yolo" / "bus.jpg").read_bytes(), "not a checkpoint (a JPEG image)"),
    "png": ((FIXTURES / "sam" / "stage_128x96.png").read_bytes(), "not a checkpoint (a PNG image)"),
    "gif": (b"GIF89a" + bytes(20), "not a checkpoint (a GIF image)"),
    "webp": (b"RIFF\x10\x00\x00\x00WEBPVP8 " + bytes(8), "not a checkpoint (a WebP image)"),
    "gguf": (b"GGUF\x03\x00\x00\x00" + bytes(16), "not a checkpoint (a GGUF model file); mlxnet reads PyTorch"),
    "onnx": (b"\x08\x07\x12\x07pytorch\x1a\x032.0", "not a checkpoint (an ONNX model); mlxnet reads PyTorch"),
    "gzip": (gzip.compress(b"x"), "not a checkpoint (a gzip-compressed file); decompress it first"),
    "html": (b"<!DOCTYPE html>\n<html><body>Not Found</body></html>", "not a checkpoint (an HTML page); a web page"),
    "lfs": (b"version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 9\n",
            "not a checkpoint (a Git LFS pointer, not the file itself); fetch the file with `git lfs pull`"),
    "text": (b"hello\nworld\n", "not a checkpoint (a text file beginning 'hello')"),
    "empty": (b"", "not a checkpoint (an empty file)"),
    "npz": (npz_bytes(), "not a checkpoint (a NumPy .npz archive)"),
    "zip": (zip_bytes(["a.txt", "b.txt"]), "not a checkpoint (a zip archive of 2 file(s) without <name>/data.pkl: a.txt"),
    "pickle": (pickle.dumps({"w": [1.0]}, protocol=4), "not a checkpoint (a Python pickle without torch.save's magic"),
    "safetensors": (b"\x10\x00\x00\x00\x00\x00\x00\x00{}" + bytes(14),
                    "not a PyTorch checkpoint (a safetensors file); read it with load_safetensors or open_checkpoint"),
    "unknown": (bytes(range(200, 232)), "not a checkpoint (a file of unknown format, beginning c8 c9 ca cb cc cd ce cf)"),
}


@pytest.mark.parametrize("kind", list(NOT_CHECKPOINTS))
def test_a_file_that_is_no_checkpoint_is_named_for_what_it_is(kind, tmp_path):
    data, message = NOT_CHECKPOINTS[kind]
    path = tmp_path / "weights.pt"
    path.write_bytes(data)
    with pytest.raises(MlxnetError) as err:
        read_torch_checkpoint(path)
    assert str(err.value).startswith(f"{path}: {message}") and "\n" not in str(err.value), err.value


def test_convert_of_an_image_says_it_is_an_image(tmp_path):
    shutil.copy(FIXTURES / "yolo" / "bus.jpg", tmp_path / "bus.jpg")
    out = run("convert", "bus.jpg", "x.safetensors", "--model", "resnet50", cwd=tmp_path)
    assert out.returncode == 1 and out.stderr == "error: bus.jpg: not a checkpoint (a JPEG image)\n"
    assert not (tmp_path / "x.safetensors").exists()


def test_offline_convert_suggests_what_convert_takes(tmp_path):
    """convert has no --weights: the way out is a local file in place of the id (or 'random')."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    out = run("convert", "resnet50", "r50.safetensors", "--model", "resnet50", cwd=tmp_path, env=env)
    assert out.returncode == 1 and len(out.stderr.splitlines()) == 1
    assert "--weights" not in out.stderr
    assert out.stderr.rstrip().endswith("download them once online, or give the path of a local copy of the file "
                                        "instead of the id 'resnet50' (or 'random': seeded random weights, "
                                        "nothing to download)")


def test_a_missing_folder_is_not_called_an_image_file(tmp_path):
    out = run("detect", "photos/", "-o", "out", "-w", "random", cwd=tmp_path)
    assert out.returncode == 1 and out.stderr == "error: photos/: no such file or folder\n", out.stderr
    out = run("detect", "photos", "-o", "out", "-w", "random", cwd=tmp_path)
    assert out.stderr == "error: photos: no such file or folder\n", out.stderr
    out = run("detect", "missing.jpg", "-o", "out", "-w", "random", cwd=tmp_path)  # meant as an image
    assert out.stderr == "error: missing.jpg: no such image file\n", out.stderr


def test_image_arguments_other_than_sources_say_what_they_are_too(tmp_path):
    """A mask or --image argument meant as a folder is not "no such image file" either."""
    from mlxnet.image import save_image

    save_image(np.zeros((8, 8, 3), np.uint8), tmp_path / "a.png")
    (tmp_path / "photos").mkdir()
    out = run("inpaint", "a.png", "masks/", "-o", "out.png", "-w", "random", cwd=tmp_path)
    assert out.returncode == 1 and out.stderr.strip().endswith("masks/: no such file or folder"), out.stderr
    out = run("check", "resnet18", "--image", "photos", "-w", "random", cwd=tmp_path)
    assert out.returncode == 1 and out.stderr == "error: photos is a folder, not an image file\n", out.stderr
    out = run("check", "resnet18", "--image", "nope.jpg", "-w", "random", cwd=tmp_path)
    assert out.stderr == "error: nope.jpg: no such image file\n", out.stderr


def test_a_folder_given_as_weights_says_so(tmp_path):
    out = run("classify", str(FIXTURES / "yolo" / "bus.jpg"), "-w", str(tmp_path))
    assert out.returncode == 1 and out.stderr == f"error: {tmp_path} is a directory, not a weights file\n"


# --- one image's error names the image ----------------------------------------------------------------

def test_any_error_of_one_image_names_it_and_the_others_go_on(tmp_path, capsys):
    names = [str(tmp_path / f"{n}.png") for n in ("a", "bad", "c")]
    for name in names:
        Path(name).write_bytes(b"")
    jobs = [Job(Source(name, Path(Path(name).name))) for name in names]

    def finish(job: Job, item: str, result: str) -> tuple[dict, str]:
        if "bad" in job.name:
            raise ValueError("x1 must be greater than or equal to x0")  # what PIL said of a reversed box
        return {"result": result}, f"{job.name}: {result}"

    with pytest.raises(typer.Exit) as ended:
        run_jobs(jobs, 2, what="test", as_json=False, load=lambda: "model", prepare=lambda job: job.name,
                 predict=lambda model, items: [f"ok {Path(i).stem}" for i in items], finish=finish)
    assert ended.value.exit_code == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"{names[0]}: ok a", f"{names[2]}: ok c"]
    assert err.splitlines() == [f"error: {names[1]}: ValueError: x1 must be greater than or equal to x0",
                                "1 of 3 images failed"]


def test_an_error_in_a_batch_falls_back_to_each_image(tmp_path, capsys):
    jobs = [Job(Source(str(tmp_path / f"{n}.png"), Path(f"{n}.png"))) for n in ("a", "b")]
    for job in jobs:
        job.source.path.write_bytes(b"")

    def predict(model, items: list[str]) -> list[str]:
        if any(item.endswith("b.png") for item in items):
            raise ZeroDivisionError("division by zero")
        return ["ok" for _ in items]

    with pytest.raises(typer.Exit):
        run_jobs(jobs, 2, what="test", as_json=True, load=lambda: "model", prepare=lambda job: job.name,
                 predict=predict, finish=lambda job, item, result: ({"r": result}, ""))
    out, err = capsys.readouterr()
    assert '"error": "ZeroDivisionError: division by zero"' in out.splitlines()[1] and '"r": "ok"' in out.splitlines()[0]
    assert f"error: {jobs[1].name}: ZeroDivisionError: division by zero" in err


# --- drawing -----------------------------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("box, drawn", [
    ((5, 5, 1, 2), (1.0, 2.0, 5.0, 5.0)),          # negative width and height: corners in order
    ((3, 3, 3, 3), (3.0, 3.0, 3.0, 3.0)),          # zero width and height
    ((-5, -5, 100, 100), (0.0, 0.0, 29.0, 19.0)),  # larger than the image: clipped
    ((NAN, 1, 2, 3), None), ((0, 0, INF, 2), None),  # not finite: left out
    ((-100, -100, -50, -50), None), ((40, 1, 50, 2), None),  # wholly outside: left out
])
def test_box_on_image(box, drawn):
    assert box_on_image(box, 30, 20) == drawn


def test_drawing_never_fails_on_a_degenerate_box():
    image = np.full((20, 30, 3), 7, np.uint8)
    boxes = np.array([[5, 5, 1, 1], [3, 3, 3, 3], [NAN, 1, 2, 3], [-100, -100, -50, -50], [0, 0, INF, 2],
                      [29, 19, 29, 19], [28, 0, 40, 3]])
    drawn = draw_boxes(image, boxes, [f"label {i}" for i in range(len(boxes))], colour_ids=list(range(len(boxes))))
    assert drawn.shape == image.shape and (drawn != 7).any()
    untouched = draw_boxes(image, np.array([[NAN, NAN, NAN, NAN], [50, 50, 60, 60]]), ["a", "b"])
    assert (untouched == image).all()  # nothing to draw: the image as it was
    for h, w in ((1, 1), (1, 5), (5, 1)):
        assert draw_boxes(np.zeros((h, w, 3), np.uint8), np.array([[0, 0, w - 1, h - 1]]), ["x"]).shape == (h, w, 3)


def test_train_names_none_among_the_weights_it_takes(tmp_path):
    from mlxnet.image import save_image

    for cls in ("a", "b"):
        for i in range(2):
            save_image(np.zeros((8, 8, 3), np.uint8), tmp_path / "data" / cls / f"{i}.png")
    out = run("train", "classify", "data", "-o", "run", "--weights", "bogus", "--epochs", "1", "--batch", "1",
              "--val-split", "0", cwd=tmp_path)
    assert out.returncode == 1 and len(out.stderr.splitlines()) == 1
    assert "'bogus' is neither a weights file nor a model id" in out.stderr and "'none'" in out.stderr


def test_debug_shows_where_an_images_error_came_from(tmp_path):
    (tmp_path / "bad.png").write_bytes(b"not an image")
    out = run("detect", "bad.png", "-o", "out", "-w", "random", cwd=tmp_path)
    assert out.returncode == 1 and out.stderr.startswith("error: bad.png: ") and "Traceback" not in out.stderr
    out = run("--debug", "detect", "bad.png", "-o", "out", "-w", "random", cwd=tmp_path)
    assert out.returncode == 1 and out.stderr.startswith("error: bad.png: ")
    assert "Traceback (most recent call last)" in out.stderr and "image.py" in out.stderr
