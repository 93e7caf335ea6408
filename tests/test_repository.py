"""The repository speaks of the project and its users only: no build machines, borrowed GPUs,
their staging folders or the workspace outside the checkout."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Written in pieces so that this file does not match itself.
FORBIDDEN = re.compile("|".join([
    r"\.\./" + "shared", "lent " + r"(CUDA|GPU|machine)", "mlx-cuda-" + "[ab]", "/root/" + "mlx-cuda",
    r"device " + r"calls?\b", "the GPU " + "machine", "GPU " + "machine's",
]))


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / p for p in out.decode().split("\0") if p and not p.startswith("tests/fixtures/")]


def test_no_tracked_file_speaks_of_build_machines():
    hits = []
    for path in _tracked():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if FORBIDDEN.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not hits, "tracked files speak of our build machines:\n" + "\n".join(hits)


def test_the_check_catches_what_it_is_for():
    for line in ["see ../" "shared/device", "on the lent " "GPU", "carry .mlx-cuda-" "a", "two device " "calls"]:
        assert FORBIDDEN.search(line), line
    assert not FORBIDDEN.search("run the GPU-marked tests on a Mac")
