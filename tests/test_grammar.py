"""One grammar for every command (mlxnet/commands/grammar.py), checked table-driven over every
command the CLI registers, so a new command cannot break it without failing here."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from mlxnet.cli import app
from mlxnet.errors import MlxnetError

runner = CliRunner()

# What each command is, and so which parts of the grammar it must have. A new command must be
# classified here (the first test fails until it is).
KINDS = {
    "classify": "images", "detect": "images+output", "track": "images+output", "segment": "images+output", "inpaint": "images+output",
    "check": "model", "convert": "file", "train classify": "train", "train detect": "train",
    "info": "tool", "models": "tool", "ops": "tool", "bench": "tool",
    "erase": "models+output", "app": "tool", "val detect": "val", "val classify": "val",
}
REQUIRED = {
    "images": {"--device", "--model", "--weights", "--dtype", "--batch", "--json"},
    "images+output": {"--device", "--model", "--weights", "--dtype", "--batch", "--json", "--output"},
    "model": {"--device", "--weights", "--dtype", "--json"},
    "file": {"--device", "--model", "--dtype", "--force"},
    "train": {"--device", "--model", "--weights", "--dtype", "--batch", "--output", "--force"},
    "val": {"--device", "--model", "--weights", "--dtype", "--batch", "--json"},  # a dataset in, metrics out
    "tool": {"--device"},
    # several models, each with its own weights option (--sam-weights, ...; metavars checked below)
    "models+output": {"--device", "--dtype", "--batch", "--json", "--output"},
}
SHORT = {"--model": "-m", "--weights": "-w", "--output": "-o"}
METAVAR = {"--weights": "ID|FILE|random", "--dtype": "DTYPE", "--device": "cpu|gpu"}


def commands() -> dict:
    found: dict = {}

    def walk(group, prefix: str) -> None:
        for name, command in group.commands.items():
            if hasattr(command, "commands"):  # a group (typer vendors its own click)
                walk(command, f"{prefix}{name} ")
            else:
                found[f"{prefix}{name}"] = command
    walk(typer.main.get_command(app), "")
    return found


def test_every_command_is_classified():
    assert set(commands()) == set(KINDS), "classify new commands in KINDS (tests/test_grammar.py)"


@pytest.mark.parametrize("name", sorted(KINDS))
def test_command_follows_the_grammar(name):
    command = commands()[name]
    options = {opt: param for param in command.params if param.param_type_name == "option" for opt in param.opts}
    missing = REQUIRED[KINDS[name]] - set(options)
    assert not missing, f"{name} lacks {sorted(missing)}"
    for long, short in SHORT.items():
        if long in options:
            assert short in options[long].opts, f"{name}: {long} without {short}"
    for long, metavar in METAVAR.items():
        if long in options:
            assert options[long].metavar == metavar, f"{name}: {long} metavar {options[long].metavar!r}"
    for long in options:
        if long.endswith("-weights"):
            assert options[long].metavar == METAVAR["--weights"], f"{name}: {long} metavar {options[long].metavar!r}"
    if KINDS[name].startswith(("images", "models")):
        (argument, *_) = [p for p in command.params if p.param_type_name == "argument"]
        assert argument.metavar == "SOURCE..." and argument.nargs == -1


@pytest.mark.parametrize("name", sorted(KINDS))
def test_help_shows_no_type_tags(name):
    result = runner.invoke(app, [*name.split(), "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    assert not re.search(r"<(bool|str|path|int|float|list)[^>]*>", result.output), result.output
    assert not re.search(r"\{[A-Za-z_.]+\}", result.output.split("\n", 3)[1]), result.output


def test_device_is_accepted_before_or_after_the_command():
    before = runner.invoke(app, ["--device", "cpu", "info"])
    after = runner.invoke(app, ["info", "--device", "cpu"])
    assert before.exit_code == after.exit_code == 0, (before.output, after.output)
    assert re.search(r"device\s+Device\(cpu", after.output), after.output


def test_models_lists_every_registered_variant_with_task_and_source():
    from mlxnet import families

    result = runner.invoke(app, ["models", "--json"])
    assert result.exit_code == 0, result.output
    import json

    rows = {r["model"]: r for r in map(json.loads, result.output.splitlines())}
    assert set(rows) == set(families.variants())
    assert rows["yolov8n"]["task"] == "detect" and 3.0e6 < rows["yolov8n"]["parameters"] < 3.3e6
    assert rows["resnet50"]["weights"].startswith("hf://timm/resnet50")


@pytest.mark.parametrize("sources, output, one_file", [
    (["a.jpg"], "out.jpg", True), (["a.jpg"], "out.PNG", True), (["a.jpg"], "out", False),
    (["a.jpg"], "out/", False), (["a.jpg", "b.jpg"], "out/", False), (["photos/*.jpg"], "o/", False),
    (["a.jpg", "b.jpg"], "out.jpg", None), (["photos/*.jpg"], "o.png", None),  # None: refused
])
def test_output_is_a_file_only_for_one_source_and_an_image_extension(sources, output, one_file):
    from mlxnet.commands.images import names_one_file

    if one_file is None:
        with pytest.raises(MlxnetError, match="names an image file; give a folder"):
            names_one_file(sources, output)
    else:
        assert names_one_file(sources, output) == one_file


def _command_paths(group, prefix=()):
    for name, command in group.commands.items():
        if hasattr(command, "commands"):  # a group (train, val)
            yield from _command_paths(command, prefix + (name,))
        else:
            yield prefix + (name,)


def test_every_help_page_fits_80_columns_with_whole_option_names():
    """At 80 columns no line is wider, and every option's full name is on the page (a table of
    columns cut names like --points-per-si…)."""
    import typer.main

    group = typer.main.get_command(app)
    paths = list(_command_paths(group))
    assert ("segment",) in paths and ("val", "detect") in paths
    for path in paths:
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
        assert result.exit_code == 0, (path, result.output)
        wide = [line for line in result.output.splitlines() if len(line) > 80]
        assert not wide, (path, wide)
        command = group
        for name in path:
            command = command.commands[name]
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("--"):
                    assert opt in result.output, (path, opt)


@pytest.fixture(scope="module")
def resnet_weights(tmp_path_factory) -> Path:
    from mlxnet import families

    path = tmp_path_factory.mktemp("w") / "resnet18.safetensors"
    families.family_of("resnet18").build("resnet18").save_weights(str(path))
    return path


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_on_the_cpu_computes_in_float32_and_says_so(dtype, resnet_weights, tmp_path):
    image = tmp_path / "x.png"
    from mlxnet.image import save_image

    save_image(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8), image)
    out = subprocess.run([sys.executable, "-m", "mlxnet", "--device", "cpu", "classify", str(image), "-w",
                          str(resnet_weights), "--dtype", dtype, "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    notes = [line for line in out.stderr.splitlines() if line.startswith("note:")]
    assert notes == [f"note: {dtype} on the CPU computes in float32: MLX's CPU back end has no fast "
                     f"{dtype} kernels (about 25x slower); run on a GPU for half precision"], out.stderr
    assert '"top"' in out.stdout  # JSON Lines stay clean on stdout


def test_the_python_api_computes_half_precision_in_float32_on_the_cpu(resnet_weights):
    import mlx.core as mx

    import mlxnet
    from mlxnet import families
    from mlxnet.dtypes import HalfPrecisionOnCPU

    with mlxnet.use_device("cpu"), pytest.warns(HalfPrecisionOnCPU, match="float16 on the CPU computes in float32"):
        classifier = families.family_of("resnet18").predictor(str(resnet_weights), "resnet18", "float16")
    leaves = [v for _, v in __import__("mlx.utils").utils.tree_flatten(classifier.net.parameters())]
    assert {v.dtype for v in leaves} == {mx.float32}


def test_train_refuses_a_folder_that_holds_a_run(tmp_path):
    from mlxnet.errors import MlxnetError
    from mlxnet.training.loop import TrainConfig, _check_outputs

    out = tmp_path / "run"
    out.mkdir()
    _check_outputs(TrainConfig(data="d", output=str(out)), out)  # empty: fine
    (out / "model.safetensors").write_bytes(b"x")
    with pytest.raises(MlxnetError, match=r"holds a finished run \(model.safetensors\); pass --resume .* --force"):
        _check_outputs(TrainConfig(data="d", output=str(out)), out)
    _check_outputs(TrainConfig(data="d", output=str(out), force=True), out)
    _check_outputs(TrainConfig(data="d", output=str(out), resume=True), out)
    assert (out / "model.safetensors").read_bytes() == b"x"  # checking writes nothing


@pytest.mark.parametrize("columns", [80, 160])
def test_models_keeps_every_hub_file_name_whole(columns):
    import json

    listed = runner.invoke(app, ["models", "--json"])
    names = [json.loads(line)["weights"] for line in listed.output.splitlines()]
    result = runner.invoke(app, ["models"], env={"COLUMNS": str(columns)}, terminal_width=columns)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert all(any(name in line for line in lines) for name in names)
    assert all(len(line.rstrip()) <= columns for line in lines)
