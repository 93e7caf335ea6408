"""Two processes on this machine through MLX's ring back end (loopback only), against one:
a data-parallel training step, and image commands sharding their files."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from PIL import Image

from mlxnet.models import yolo

from test_train import TINY, make_folder, run as single

LAUNCH = Path(sys.executable).with_name("mlx.launch")
MLXNET = Path(sys.executable).with_name("mlxnet")
pytestmark = pytest.mark.skipif(not LAUNCH.exists(), reason="mlx.launch is installed with mlx")


def _free_port_pair() -> int:
    """A port p with p + 1 free too (the ring gives rank r port p + r)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65000:
            try:
                with socket.socket() as t:
                    t.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    raise RuntimeError("no two consecutive free ports")


def launch(*args, ranks: int = 2, check: bool = True) -> subprocess.CompletedProcess:
    """``mlx.launch --backend ring -n RANKS mlxnet ARGS`` on 127.0.0.1, bounded in time."""
    # One BLAS thread per process: more than the cores make their threads spin against each
    # other (3x slower on two cores).
    cmd = [str(LAUNCH), "--backend", "ring", "-n", str(ranks), "--hosts", "127.0.0.1",
           "-p", str(_free_port_pair()), "--env", "OPENBLAS_NUM_THREADS=1", str(MLXNET), *map(str, args)]
    # Its own process group, so that a run past the time limit is stopped with its ranks.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.slow  # two processes, two runs and a resume: 20 s on 2 cores (the detector's two-rank test stays)
def test_two_ranks_take_one_process_steps_and_resume_to_its_result(tmp_path):
    folder = make_folder(tmp_path / "data", {"a": (200, 40, 40), "b": (40, 60, 200), "c": (40, 200, 60)}, 4)
    # 12 images, 3 steps of 4 per epoch; the cosine schedule spans both epochs.
    args = ["train", "classify", folder, *TINY, "--epochs", "2", "--val-split", "0"]
    single(*args, "--max-steps", "1", "-o", tmp_path / "one")
    two = launch(*args, "--max-steps", "1", "-o", tmp_path / "two")
    assert "(2 processes)" in two.stdout and two.stdout.count("wrote ") == 1  # rank 0 logs and writes
    one = mx.load(str(tmp_path / "one" / "model.safetensors"))
    par = mx.load(str(tmp_path / "two" / "model.safetensors"))
    mx.random.seed(0)  # the run's seed: the model before its step
    from mlxnet.models import resnet
    start = dict(tree_flatten(resnet.resnet("resnet18", 3).parameters()))
    assert one.keys() == par.keys() == start.keys()
    moved = 0.0
    for key in one:
        np.testing.assert_allclose(np.array(par[key]), np.array(one[key]), rtol=1e-5, atol=1e-6, err_msg=key)
        moved = max(moved, float(mx.abs(one[key] - start[key]).max()))
    assert moved > 1e-4  # the step changed the weights
    # Stopped inside its first epoch, the two-rank run resumes from its checkpoint to what one
    # process trains uninterrupted.
    resumed = launch(*args, "--resume", "-o", tmp_path / "two")
    assert "epoch 1/2" in resumed.stdout and "epoch 2/2" in resumed.stdout
    single(*args, "-o", tmp_path / "whole")
    launch(*args, "-o", tmp_path / "two-whole")
    whole = mx.load(str(tmp_path / "whole" / "model.safetensors"))
    unbroken = mx.load(str(tmp_path / "two-whole" / "model.safetensors"))
    par = mx.load(str(tmp_path / "two" / "model.safetensors"))
    for key in whole:
        # the resumed two-rank run is the unbroken two-rank run
        np.testing.assert_allclose(np.array(par[key]), np.array(unbroken[key]), rtol=1e-5, atol=1e-6, err_msg=key)
        # and one process's to rounding: each rank's half batch runs its convolutions as GEMMs of
        # another size, whose sums round differently, and six steps grow that to about 1e-5
        np.testing.assert_allclose(np.array(par[key]), np.array(whole[key]), rtol=1e-3, atol=1e-4, err_msg=key)


def test_two_ranks_train_a_detector_as_one_process(tmp_path):
    """train detect under mlx.launch: each rank takes half of every batch, BatchNorm normalises
    with the whole batch's statistics (synchronised), the loss is normalised over the whole
    batch and the gradients summed: an epoch of two ranks reaches one process's weights."""
    from test_train_detect import shapes

    data = shapes.make(tmp_path / "shapes", train=8, val=2, seed=4)
    args = ["train", "detect", data, "-w", "none", "-m", "yolov8n", "--imgsz", "64", "--batch", "4",
            "--close-mosaic", "1", "--epochs", "1", "--no-val", "--optimizer", "sgd", "--warmup-epochs", "0"]
    single(*args, "-o", tmp_path / "one")
    two = launch(*args, "-o", tmp_path / "two")
    assert two.stdout.count("wrote ") == 1  # rank 0 logs and writes
    one = mx.load(str(tmp_path / "one" / "state.safetensors"))
    par = mx.load(str(tmp_path / "two" / "state.safetensors"))
    assert one.keys() == par.keys()
    for key in one:
        if key.startswith("model."):
            np.testing.assert_allclose(np.array(par[key]), np.array(one[key]), rtol=1e-4, atol=1e-5, err_msg=key)
    from mlxnet.training.detect_loop import DetectTrainConfig, build_network

    moved = 0.0
    start, _ = build_network(DetectTrainConfig(data=str(data), weights="none", model="yolov8n"), shapes.NAMES)
    for key, value in tree_flatten(start.parameters()):
        moved = max(moved, float(mx.abs(one["model." + key] - value).max()))
    assert moved > 1e-4  # the epoch's steps changed the weights


SYNCED_BN = """
import json, sys
import mlx.core as mx
import numpy as np
import mlxnet
from mlxnet import distributed, ops

rank = distributed.rank()
x = mx.array(np.random.default_rng(rank).normal(1, 2, (2, 3, 4, 8)).astype(np.float32))
w, b = mx.array(np.linspace(0.5, 1.5, 8, dtype=np.float32)), mx.array(np.linspace(-1, 1, 8, dtype=np.float32))
probe = mx.array(np.random.default_rng(10 + rank).normal(size=(2, 3, 4, 8)).astype(np.float32))

def loss(x, w, b):
    y, mean, var = ops.batch_norm_train(x, w, b, eps=1e-3, activation="silu", sync=True)
    return (y * probe).sum() + (mean * probe[0, 0, 0]).sum() + 0.5 * (var * probe[1, 1, 1]).sum()

results = {}
for face, kernels in (("fast", True), ("definition", False)):
    with mlxnet.use_kernels(kernels):
        y, mean, var = ops.batch_norm_train(x, w, b, eps=1e-3, activation="silu", sync=True)
        grads = mx.grad(loss, argnums=(0, 1, 2))(x, w, b)
    results[face] = [np.array(a).tolist() for a in (y, mean, var, *grads)]
# Each rank's own file: two ranks' lines longer than a pipe's atomic write interleave on stdout.
with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:
    json.dump({"rank": rank, "results": results, "mean": mean.tolist(),
               "whole_mean": np.concatenate([np.random.default_rng(r).normal(1, 2, (2, 3, 4, 8))
                                             for r in range(2)]).reshape(-1, 8).mean(0).tolist()}, f)
"""


def test_synchronised_batch_norm_faces_agree_over_two_ranks(tmp_path):
    """batch_norm_train(sync=True) on two ranks: the statistics are the whole batch's, and the
    fast face's analytic gradient equals autodiff of the definition (whose cross-rank sums
    carry the other ranks' cotangents back)."""
    script = tmp_path / "synced.py"
    script.write_text(SYNCED_BN)
    cmd = [str(LAUNCH), "--backend", "ring", "-n", "2", "--hosts", "127.0.0.1", "-p", str(_free_port_pair()),
           "--env", "OPENBLAS_NUM_THREADS=1", sys.executable, str(script), str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    files = sorted(tmp_path.glob("rank*.json"))
    assert len(files) == 2, done.stdout + done.stderr
    lines = [json.loads(f.read_text()) for f in files]
    for line in lines:
        np.testing.assert_allclose(line["mean"], line["whole_mean"], rtol=1e-5, atol=1e-5)
        for fast, definition in zip(line["results"]["fast"], line["results"]["definition"]):
            np.testing.assert_allclose(np.array(fast), np.array(definition), rtol=1e-4, atol=1e-5)


def test_a_batch_that_does_not_split_evenly_is_refused(tmp_path):
    from test_train_detect import shapes

    data = shapes.make(tmp_path / "shapes", train=5, val=2, seed=4)  # batches of 4 and 1
    done = launch("train", "detect", data, "-w", "none", "--imgsz", "64", "--batch", "4", "--epochs", "1",
                  "-o", tmp_path / "out", check=False)
    assert "equal shares" in done.stdout + done.stderr


# The detector test above trains through synchronised statistics too; this one runs with the slow tests.
@pytest.mark.slow
def test_batch_statistics_are_averaged_over_the_ranks(tmp_path):
    """--batchnorm train: each rank normalises with its own half of the batch, and the running
    statistics are averaged after the epoch. The first BatchNorm's input does not depend on
    that normalisation, so its running mean is then the one process's: the mean of the halves'
    means (rank 0's own would be its half's)."""
    folder = make_folder(tmp_path / "data", {"a": (200, 40, 40), "b": (40, 60, 200)}, 4)
    args = ["train", "classify", folder, *TINY, "--val-split", "0", "--batchnorm", "train", "--max-steps", "1"]
    single(*args, "-o", tmp_path / "one")
    launch(*args, "-o", tmp_path / "two")
    one = mx.load(str(tmp_path / "one" / "model.safetensors"))
    par = mx.load(str(tmp_path / "two" / "model.safetensors"))
    assert float(mx.abs(one["bn1.running_mean"]).max()) > 1e-3
    np.testing.assert_allclose(np.array(par["bn1.running_mean"]), np.array(one["bn1.running_mean"]), atol=1e-6)
    assert all(bool(mx.isfinite(v).all()) for v in par.values())


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pictures")
    rng = np.random.default_rng(3)
    for i in range(5):
        sub = root / ("deep" if i % 2 else ".")
        sub.mkdir(exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (48 + 8 * i, 64, 3), dtype=np.uint8)).save(sub / f"p{i}.png")
    return root


def _records(stdout: str) -> list[dict]:
    return sorted((json.loads(line) for line in stdout.splitlines() if line.startswith("{")),
                  key=lambda r: r["image"])


# Sharding's outputs are checked on detect in the default run; classify's with the slow tests.
@pytest.mark.slow
def test_sharded_classify_prints_what_one_process_prints(tmp_path, pictures):
    folder = make_folder(tmp_path / "data", {"x": (200, 40, 40), "y": (40, 60, 200)}, 4)
    single("train", "classify", folder, *TINY, "--epochs", "1", "--val-split", "0", "-o", tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    alone = _records(single("classify", pictures, "-w", weights, "--json", "--batch", "2").stdout)
    shared = _records(launch("classify", pictures, "-w", weights, "--json", "--batch", "2").stdout)
    assert len(alone) == 5 and {r["top"][0]["label"] for r in alone} <= {"x", "y"}
    assert [r["image"] for r in shared] == [r["image"] for r in alone]
    for a, b in zip(alone, shared):
        assert [t["label"] for t in a["top"]] == [t["label"] for t in b["top"]]
        np.testing.assert_allclose([t["probability"] for t in b["top"]], [t["probability"] for t in a["top"]],
                                   rtol=1e-5)


def test_sharded_detect_writes_the_same_files(tmp_path, pictures):
    weights = tmp_path / "yolo.safetensors"
    yolo.seeded("n", 1234, 2.5, 5.0).save_weights(str(weights))
    common = ["-w", weights, "--imgsz", "64", "--conf", "0.3", "--json"]
    alone = single("detect", pictures, "-o", tmp_path / "alone", *common)
    shared = launch("detect", pictures, "-o", tmp_path / "shared", *common)
    files = sorted(p.relative_to(tmp_path / "alone") for p in (tmp_path / "alone").rglob("*.png"))
    assert len(files) == 5
    assert sorted(p.relative_to(tmp_path / "shared") for p in (tmp_path / "shared").rglob("*.png")) == files
    for rel in files:
        a = np.array(Image.open(tmp_path / "alone" / rel))
        b = np.array(Image.open(tmp_path / "shared" / rel))
        assert np.abs(a.astype(int) - b.astype(int)).max() <= 1, rel
    assert [r["image"] for r in _records(shared.stdout)] == [r["image"] for r in _records(alone.stdout)]


def test_failures_are_counted_over_all_ranks(tmp_path, pictures):
    folder = tmp_path / "mixed"
    folder.mkdir()
    for name in ("a.png", "b.png", "c.png"):
        (folder / name).write_bytes((pictures / "p0.png").read_bytes())
    (folder / "broken1.png").write_bytes(b"not a png")
    (folder / "broken2.png").write_bytes(b"not a png either")
    weights = tmp_path / "yolo.safetensors"
    yolo.seeded("n", 1234, 2.5, 5.0).save_weights(str(weights))
    done = launch("detect", folder, "-w", weights, "--imgsz", "64", "-o", tmp_path / "out", check=False)
    # Summed over the ranks and reported once, by rank 0; every rank exits with code 1 (the
    # launcher reports it; mlx.launch itself exits 0).
    assert done.stderr.count("2 of 5 images failed") == 1, done.stderr
    assert "exited with code 1" in done.stdout + done.stderr
    assert len(list((tmp_path / "out").glob("*.png"))) == 3
