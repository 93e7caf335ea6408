"""`mlxnet bench`: rows with median, spread, images/s, peak memory and launches; an 80-column
table; a JSON report; PyTorch on the same device; one-line errors."""
from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from mlxnet.cli import app
from mlxnet.commands.bench import _split_values

runner = CliRunner()


def _bench(*args: str):
    return runner.invoke(app, ["--device", "cpu", "bench", *args])


def test_rows_table_and_json(tmp_path):
    report = tmp_path / "out" / "bench.json"
    result = _bench("resnet18", "--batch", "1", "2", "--reps", "3", "--warmup", "1", "--json", str(report))
    assert result.exit_code == 0, result.output
    table = [line for line in result.output.splitlines() if re.match(r"resnet18\s+\d", line)]
    assert len(table) == 2
    wide = [line for line in result.output.splitlines() if len(line) > 80 and not line.startswith("Linux")]
    assert not wide, wide  # the OS line may run long; the table may not
    data = json.loads(report.read_text())
    assert data["machine"]["mlx"] and data["machine"]["device"] == "cpu" and data["machine"]["chip"]
    rows = data["rows"]
    assert [(r["model"], r["batch"], r["dtype"]) for r in rows] == [("resnet18", 1, "float32"), ("resnet18", 2, "float32")]
    for r in rows:
        assert r["ms"] > 0 and r["spread_ms"] >= 0 and r["launches"] > 50
        assert r["images_per_s"] == pytest.approx(r["batch"] * 1000 / r["ms"])
        # weights (47 MB in float32) and activations are counted; earlier rows are not
        assert 40 < r["peak_mb"] < 400
    assert rows[1]["peak_mb"] > rows[0]["peak_mb"]  # batch 2 holds more activations
    assert report.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_compare_torch_times_pytorch_on_the_same_device(tmp_path):
    pytest.importorskip("torch")
    report = tmp_path / "b.json"
    result = _bench("resnet18", "--reps", "2", "--warmup", "1", "--compare", "torch", "--compare", "eager",
                    "--json", str(report))
    assert result.exit_code == 0, result.output
    (row,) = json.loads(report.read_text())["rows"]
    assert row["torch_ms"] > 0 and row["eager_ms"] > 0 and row["torch_dtype"] == "float32"
    assert "torch" in row["note"] or "torchvision" in row["note"]
    assert re.search(r"resnet18 .* \d+\.\d\dx$", result.output, re.M)
    markdown = _bench("--markdown", str(report))
    assert markdown.exit_code == 0 and "| resnet18 | 1 | float32 |" in markdown.output
    assert "PyTorch / mlxnet" in markdown.output


def test_values_after_one_flag_go_back_to_it():
    assert _split_values(["resnet18", "8", "float16"], ["1"], ["float32"]) == (
        ["resnet18"], [1, 8], ["float32", "float16"])
    assert _split_values([], ["1,8"], ["float32,bfloat16"]) == ([], [1, 8], ["float32", "bfloat16"])


@pytest.mark.parametrize("args, message", [
    (("nope",), "unknown model 'nope'; expected one of"),
    (("resnet18", "--batch", "0"), "batch sizes must be positive integers, got 0"),
    (("resnet18", "--batch", "x"), "--batch takes positive integers, got 'x'"),
    (("resnet18", "--dtype", "float64"), "dtype must be float32, float16 or bfloat16, got 'float64'"),
    (("resnet18", "--compare", "tensorflow"), "unknown comparison 'tensorflow'"),
])
def test_bad_arguments_are_one_line_errors(args, message):
    from mlxnet.cli import run
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "mlxnet", "--device", "cpu", "bench", *args],
                         capture_output=True, text=True)
    assert out.returncode != 0
    assert message in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert run  # the console entry point the module runs


def test_a_report_that_is_not_one_is_named(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    result = _bench("--markdown", str(bad))
    assert result.exit_code != 0 and "x.json: not an mlxnet bench report" in str(result.exception or result.output)


def test_list_names_every_model_and_alias():
    result = _bench("--list")
    assert result.exit_code == 0
    for name in ("resnet50", "yolov8x", "sam-tiny-encoder", "lama-512", "lama-fourier", "sam-tiny"):
        assert re.search(rf"^{name}\s", result.output, re.M), name
