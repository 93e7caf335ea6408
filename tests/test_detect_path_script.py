"""scripts/bench/bench_detect_path.py: the whole `detect` path timed as users run it, counting each
photo's detections from the line the command prints for it (or its JSON record)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench" / "bench_detect_path.py"


def _run(tmp_path: Path, *extra: str) -> dict:
    report = tmp_path / f"report{len(extra)}.json"
    out = subprocess.run([sys.executable, str(SCRIPT), "--photos", "3", "--runs", "1", "--only", "mlxnet",
                          "--model", "yolov8n", "--device", "cpu", "--keep", str(tmp_path / "work"),
                          "--json", str(report), *extra], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(report.read_text())


def test_the_default_commands_lines_and_the_json_records_count_the_same_detections(tmp_path):
    plain, records = _run(tmp_path), _run(tmp_path, "--records")
    assert plain["records"] is False and records["records"] is True
    (a,), (b,) = plain["runs"]["mlxnet"], records["runs"]["mlxnet"]
    assert a["results"] == b["results"] == 3  # one result line a photo, either way
    assert a["detections_per_image"] == b["detections_per_image"] > 0  # random weights find many


def test_summary_lines_are_parsed_and_other_lines_are_not():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import bench_detect_path as bench
    finally:
        sys.path.pop(0)
    assert bench._detections_in("photos/a b.jpg: 3 person, 12 bus -> out/a b.jpg\n") == 15
    assert bench._detections_in("photos/c.jpg: nothing -> out/c.jpg\n") == 0
    assert bench._detections_in("photos/c.jpg 4\n") == 4
    assert bench._detections_in('{"path": "x", "detections": [{}, {}]}') == 2
    assert bench._detections_in("Results saved to out\n") is None
