"""The README and the guides (``docs/*.md``) run as written: every fenced code block is run here,
or named with the reason it is not.

- ``python`` blocks: each is written to a file and run by this Python, in a fresh folder.
- ``bash`` blocks: each line is one command, run by bash in a fresh folder; ``NOT_RUN`` says
  which lines are not run and why (the reasons show in pytest's skip summary).
- Blocks without a language are diagrams; they must not look like commands.

The folder holds a link to the repository's ``tests/`` (the blocks read ``tests/fixtures/...``,
as they do from the repository's root) and links to the files a command takes from its user
(``resnet18.pth``, ``yolov8s.pt``, ``runs/detect/train/weights/best.pt``, ``resnet50.pth``,
``mine.json``), made here. Weights named by hub id (``resnet50``, ``yolov8n``, ``sam-tiny``,
``lama``) come from a local huggingface_hub cache holding seeded weights under the hub's file
names, read with ``HF_HUB_OFFLINE=1`` (``HF_HUB_CACHE``: the README's offline note): the blocks
go through the real download path without a network.

Also checked: the quick start's first command needs no test extras, fails offline with the
documented one-line error, and its documented offline alternative works.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from safetensors.numpy import save_file

from hubcache import prepare_hub_cache
from mlxnet import families
from mlxnet.image import load_image
from mlxnet.models import resnet, yolo
from mlxnet.weights import get_spec, to_torch_layout
from mlxnet.weights.seeded import seeded_state_dict
from testutil import save_ultralytics_pt

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BENCHMARKS = (ROOT / "docs/benchmarks.md").read_text()
# The pages whose blocks run: the README and every guide.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SEED = 1234

# Bash lines not run, by pattern (first match wins), each with its reason.
NOT_RUN: list[tuple[str, str]] = [
    (r"\bpython -m pytest\b", "the test suite itself, this test included"),
    (r"\bpip install\b", "installs from PyPI into a virtual environment (checked by hand in a fresh one; "
                         "the quick start's mlxnet command runs in test_first_readme_command_detects_...)"),
    (r"https?://", "reads a URL: needs the network"),
    (r"^mlx\.launch\b", "starts several processes or hosts (tests/test_distributed.py runs two ranks here)"),
    (r"\btrain classify\b", "fine-tunes ResNet-50 for epochs: minutes on a CPU (tests/test_train.py trains small)"),
    (r"runs/pets/", "reads the model the training run above writes"),
    (r"\btrain detect\b", "fine-tunes a YOLOv8 for epochs: minutes on a CPU (tests/test_train_detect.py trains small)"),
    (r"runs/shapes/", "reads the model the training run above writes"),
    (r"runs/mine/", "reads the model the training run above writes"),
    (r"--everything\b", "segment-everything runs 1024 prompts through SAM's decoder: over a minute on a 2-core CPU"),
    (r"^mlxnet bench(?!\s+--(list|markdown)\b)", "times the models: minutes on a CPU (tests/test_bench.py times "
                                                 "one small case)"),
]


@dataclass(frozen=True)
class Case:
    kind: str  # "python", "bash" (one line) or "text"
    line: int  # where it starts in its page
    code: str
    page: str = "README.md"  # relative to the repository's root

    @property
    def id(self) -> str:
        first = self.code.strip().splitlines()[0] if self.code.strip() else ""
        return f"{self.page}:{self.line} {self.kind} {first[:48]}"


def readme_blocks(readme: str = README) -> list[tuple[str, int, str]]:
    """(language, first line, body) of every fenced block."""
    return [(found.group(1), readme.count("\n", 0, found.start()) + 2, found.group(2))
            for found in re.finditer(r"^```(\w*)\n(.*?)^```[ \t]*$", readme, re.S | re.M)]


def readme_cases(readme: str = README, page: str = "README.md") -> list[Case]:
    """Every python block, every line of every bash block, every other block."""
    cases = []
    for lang, start, body in readme_blocks(readme):
        if lang == "python":
            cases.append(Case("python", start, body, page))
        elif lang == "bash":
            for offset, text in enumerate(body.splitlines()):
                if text.strip() and not text.lstrip().startswith("#"):
                    cases.append(Case("bash", start + offset, text.strip(), page))
        else:
            cases.append(Case("text", start, body, page))
    return cases


def page_cases() -> list[Case]:
    """:func:`readme_cases` of the README and of every guide."""
    return [c for path in PAGES for c in readme_cases(path.read_text(), str(path.relative_to(ROOT)))]


def not_run_reason(case: Case) -> str | None:
    if case.kind == "text":
        return "a diagram, not code"
    if case.kind == "bash":
        return next((reason for pattern, reason in NOT_RUN if re.search(pattern, case.code)), None)
    return None


# --- the world the blocks run in ---------------------------------------------------------------------

def torchvision_state(variant: str, seed: int) -> dict[str, np.ndarray]:
    """Seeded weights for a torchvision ResNet, in its keys and PyTorch layouts."""
    shapes = [(k, tuple(to_torch_layout(np.zeros(v.shape, np.float32), "conv2d").shape) if v.ndim == 4
               else tuple(v.shape)) for k, v in tree_flatten(resnet.resnet(variant).parameters())]
    return seeded_state_dict(shapes, seed)


def torch_save(path: Path, state: dict[str, np.ndarray]) -> Path:
    import torch

    torch.save({k: torch.from_numpy(v) for k, v in state.items()}, path)
    return path


def sam_state() -> dict[str, np.ndarray]:
    """mobile_sam.pt's keys and shapes (recorded with the SAM goldens), seeded."""
    meta = json.loads((ROOT / "tests/fixtures/sam/sam_golden.json").read_text())
    return seeded_state_dict([(k, tuple(s)) for k, s in meta["state_dict_shapes"]], meta["seed"])


def lama_weights(path: Path) -> Path:
    # The family's seeded random weights as big-lama's own save_weights file, which loads as it
    # is whatever its name (the hub's Lightning checkpoint holds a whole training module).
    mx.random.seed(SEED)
    net = families.variants()["lama"].build("lama")
    saved = path.with_name(path.name + ".safetensors")  # MLX picks the format by the extension
    net.save_weights(str(saved))
    return saved.rename(path)


# hub id -> writes a file in the format the hub's file has (or one the loader takes as it is)
def timm_safetensors(path: Path) -> Path:
    save_file(torchvision_state("resnet50", SEED), str(path))  # timm publishes torchvision's keys
    return path


HUB_FILES = {
    "resnet50": timm_safetensors,
    "yolov8n": lambda p: save_ultralytics_pt(p, yolo.seeded_torch_state("n", SEED, 2.5, 5.0)),
    "sam-tiny": lambda p: torch_save(p, sam_state()),
    "lama": lama_weights,
}
# a path the README's commands take from their user -> writes it
USER_FILES = {
    "resnet18.pth": lambda p: torch_save(p, torchvision_state("resnet18", SEED)),
    "resnet50.pth": lambda p: torch_save(p, torchvision_state("resnet50", SEED)),
    "yolov8s.pt": lambda p: save_ultralytics_pt(p, yolo.seeded_torch_state("s", SEED, 2.5, 5.0)),
    "runs/detect/train/weights/best.pt": lambda p: save_ultralytics_pt(
        p, yolo.seeded_torch_state("n", 7, 2.5, 5.0, nc=3), names={0: "cat", 1: "dog", 2: "bird"}),
    "mine.json": lambda p: shutil.copyfile(ROOT / "docs/bench/gpu-h200.json", p),
}


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without HF_*/MLXNET_* settings, this Python's scripts first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MLXNET_"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """(folder of the user's files, environment with the seeded hub cache)."""
    root = tmp_path_factory.mktemp("readme")
    cache = root / "hf" / "hub"
    for model_id, write in HUB_FILES.items():
        spec = get_spec(model_id)
        src = root / "hub-src" / spec.filename
        src.parent.mkdir(parents=True, exist_ok=True)
        prepare_hub_cache(cache, spec.repo, spec.filename, write(src))
    user = root / "user"
    for name, write in USER_FILES.items():
        (user / name).parent.mkdir(parents=True, exist_ok=True)
        write(user / name)
    return user, clean_env(HF_HOME=str(root / "hf"), HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")


def workdir(tmp_path: Path, user: Path) -> Path:
    """A fresh folder as the repository's root looks to the blocks, with the user's files."""
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    for top in {Path(name).parts[0] for name in USER_FILES}:
        (tmp_path / top).symlink_to(user / top)
    return tmp_path


def run_case(case: Case, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    if case.kind == "python":
        (cwd / "block.py").write_text(case.code)
        command = [sys.executable, "block.py"]
    else:
        command = ["bash", "-c", case.code]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("case", page_cases(), ids=lambda c: c.id)
def test_readme_block_runs_as_written(case, request, tmp_path):
    reason = not_run_reason(case)
    if case.kind == "text":
        assert not re.search(r"^\s*(mlxnet|python|pip|import|from \w+ import)\b", case.code, re.M), \
            "an untagged block that looks like code: tag it python or bash"
    if reason:
        pytest.skip(f"not run: {reason}")
    user, env = request.getfixturevalue("world")  # made only when a case runs
    run = run_case(case, workdir(tmp_path, user), env)
    assert run.returncode == 0, f"{case.id}\nstdout:\n{run.stdout[-2000:]}\nstderr:\n{run.stderr[-4000:]}"
    assert "Traceback" not in run.stderr, run.stderr


def test_the_readme_blocks_are_found():
    """The parser sees every page's blocks (a broken fence would silently leave them out)."""
    for path in PAGES:
        text = path.read_text()
        assert len(re.findall(r"^```", text, re.M)) == 2 * len(readme_blocks(text)), path
    cases = page_cases()
    assert {c.kind for c in cases} >= {"python", "bash", "text"}
    run = [c for c in cases if not not_run_reason(c)]
    assert sum(c.kind == "python" for c in run) >= 8 and sum(c.kind == "bash" for c in run) >= 10
    assert any(c.page == "README.md" for c in run) and len({c.page for c in run}) >= 10


# --- the quick start ---------------------------------------------------------------------------------

def first_block_lines() -> list[str]:
    return re.search(r"```bash\n(.*?)```", README, re.S).group(1).strip().splitlines()


def first_command() -> list[str]:
    """The mlxnet part of the README's first shell block (after the install steps)."""
    return shlex.split(first_block_lines()[0].split("&&")[-1])


def test_first_readme_command_detects_on_the_bundled_photo(tmp_path):
    """YOLOv8n seeded to find boxes, through the real download path from a prepared cache."""
    args = first_command()
    assert args[:2] == ["mlxnet", "detect"] and "-o" in args
    spec = get_spec("yolov8n")
    src = save_ultralytics_pt(tmp_path / "yolov8n.pt", yolo.seeded_torch_state("n", SEED, 2.5, 5.0))
    cache = tmp_path / "hf" / "hub"
    prepare_hub_cache(cache, spec.repo, spec.filename, src)
    out_dir = tmp_path / "out"
    args[args.index("-o") + 1] = str(out_dir)
    env = clean_env(HF_HOME=str(tmp_path / "hf"), HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    run = subprocess.run([sys.executable, "-m", "mlxnet", *args[1:]], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    written = out_dir / "bus.jpg"
    photo = load_image(ROOT / "tests/fixtures/yolo/bus.jpg")
    annotated = load_image(written)
    assert annotated.shape == photo.shape and np.abs(annotated.astype(int) - photo).max() > 100  # boxes drawn
    assert "bus.jpg" in run.stdout


def test_quick_start_installs_no_test_extras_and_the_test_command_does():
    """`pip install -e .` is the first command's whole install (no PyTorch, no libclang); the test
    command installs the test extra, and the README's CPU-wheel line pins what the extra pins."""
    install = first_block_lines()[0]
    assert re.search(r"pip install -e \.(\s|$)", install) and "[test]" not in install
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if re.match(r"(torch|libclang|pytest)\b", d)]
    test_block = re.findall(r"```bash\n(.*?)```", README, re.S)[1]
    assert 'pip install -e ".[test]"' in test_block and "python -m pytest" in test_block
    pinned = next(d for d in project["optional-dependencies"]["test"] if d.startswith("torch"))
    cpu_wheel = re.search(r"(pip install (torch\S*) --index-url https://download\.pytorch\.org/whl/cpu)", test_block)
    assert cpu_wheel, "the test command installs PyTorch's CPU wheel"
    assert cpu_wheel.group(2) == pinned, f"README installs {cpu_wheel.group(2)}, the test extra pins {pinned}"
    # before the extra, which would otherwise pull the default (on Linux: CUDA) wheel
    assert test_block.index(cpu_wheel.group(1)) < test_block.index('pip install -e ".[test]"')


def test_first_command_offline_is_one_line_and_the_documented_alternative_runs(tmp_path):
    """Nothing cached and no Hub: the first command stops with one line naming the file; the
    README's offline alternative (`--weights random`) runs the same pipeline."""
    args = first_command()
    args[args.index("-o") + 1] = str(tmp_path / "out")
    env = clean_env(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    run = subprocess.run([sys.executable, "-m", "mlxnet", *args[1:]], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 1 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert run.stderr.startswith("error: weights for 'yolov8n' (Ultralytics/YOLOv8/yolov8n.pt) are not in the cache")
    alternative = re.search(r"`(mlxnet detect tests/fixtures/yolo/bus\.jpg -o out/ --weights random)`", README)
    assert alternative, "the quick start's offline note gives a command that needs no download"
    alt = shlex.split(alternative.group(1))
    alt[alt.index("-o") + 1] = str(tmp_path / "out")
    run = subprocess.run([sys.executable, "-m", "mlxnet", *alt[1:]], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "out" / "bus.jpg").is_file()


def test_the_gpu_table_is_regenerated_from_the_benchmark_json():
    """The benchmark page's GPU table is the benchmark's own output (mlxnet bench --markdown)."""
    command = re.search(r"`mlxnet (bench --markdown [^`]*)`", BENCHMARKS)
    args = command.group(1).split()
    table = subprocess.run([sys.executable, "-m", "mlxnet", *args], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout
    assert table.count("\n") > 10 and "PyTorch / mlxnet" in table
    assert table.strip() in BENCHMARKS
