"""The fuzzer: seeded mutations of small real-format checkpoints and images (tests/fuzz_seeds.py,
tests/fuzz_cases.py), each loaded in a child process under an address-space limit
(tests/fuzz_worker.py), through ``open_checkpoint``, ``load_model``, ``load_image``,
``load_mask`` and ``mlxnet app``'s HTTP API (a 4xx is its MlxnetError, a 5xx a breach). Every
case must end in a normal load or in an MlxnetError of one line that names the file, within
``BOUND_MB`` of peak memory growth.

The default run draws ``DEFAULT_CASES`` cases; the slow-marked campaign draws ``SLOW_CASES``
(``MLXNET_FUZZ_CASES`` changes it). Both are seeded: the same cases every run, and Hypothesis
shrinks a failing one to a small input, which goes into tests/fixtures/fuzz/regressions/ with a
line in its index.json, where ``test_regression_inputs`` loads it on every run from then on.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings

from fuzz_cases import Case, Worker, breach, cases
from fuzz_seeds import SEED_LOADERS, SEEDS

REGRESSIONS = Path(__file__).resolve().parent / "fixtures" / "fuzz" / "regressions"
# The worker decodes images within this pixel budget (MLXNET_MAX_PIXELS), so that an image
# header's claim costs at most ~11 bytes a pixel of it; checkpoints are bounded by their size.
FUZZ_MAX_PIXELS = 4_000_000
BOUND_MB = 100  # peak RSS growth allowed for any one load (the inputs are kilobytes)
DEFAULT_CASES = 500  # ~2 s here: every load is of a file of a few KB
SLOW_CASES = int(os.environ.get("MLXNET_FUZZ_CASES", "20000"))  # ~100 s


@pytest.fixture(scope="module")
def worker() -> Worker:
    w = Worker(env={"MLXNET_MAX_PIXELS": str(FUZZ_MAX_PIXELS)})
    yield w
    w.close()


def test_worker_limits_address_space(worker):
    result = worker.load("allocate_2GiB", SEEDS / "rgb.png")
    assert result["outcome"] == "MemoryError" and result["growth_mb"] < 64, result


# Seeds that are refused on purpose, and the words that say why.
REFUSED_SEEDS = {("ultralytics_tiny.pt", "load_model:yolov8n"): "do not fit model 'yolov8n'",  # two tensors
                 ("segment.http", "app_request"): "HTTP 404: image_id"}  # prompts for an image not held


def seed_results(worker: Worker) -> dict[tuple[str, str], dict]:
    """Every seed through each of its loaders: what the cases mutate, and the worker's warm-up
    (the first use of a loader imports its modules and builds its model once, which is no
    case's own memory)."""
    return {(name, loader): worker.load(loader, SEEDS / name)
            for name, loaders in SEED_LOADERS.items() for loader in loaders}


def test_seeds_load(worker):
    """Every seed is a valid input that its loaders read, or refuse by name (REFUSED_SEEDS)."""
    for (name, loader), result in seed_results(worker).items():
        refused = REFUSED_SEEDS.get((name, loader))
        if refused:
            assert result["outcome"] == "error" and refused in result["message"], result
        else:
            assert result["outcome"] == "loaded", (name, loader, result)
        assert result["peak_reset"], "the worker cannot reset its peak RSS: growth would not be per case"


def campaign(worker: Worker, folder: Path, count: int, at: int) -> Counter:
    """``count`` cases drawn with seed ``at``; the counts by outcome (and the peak growth)."""
    tally: Counter = Counter()
    seed_results(worker)

    @seed(at)
    @settings(max_examples=count, database=None, deadline=None, derandomize=False,
              phases=[Phase.generate, Phase.shrink],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(case=cases())
    def one(case: Case) -> None:
        path = folder / f"case{Path(case.seed).suffix}"
        path.write_bytes(case.data())
        result = worker.load(case.loader, path)
        tally[result["outcome"]] += 1
        tally[case.loader] += 1
        tally["max_growth_mb"] = max(tally["max_growth_mb"], round(result["growth_mb"]))
        problem = breach(path, result, BOUND_MB)
        if problem:  # keep the (shrunk) input beside the report
            (folder / f"failing{Path(case.seed).suffix}").write_bytes(case.data())
        assert problem is None, f"{case.loader} on a mutant of {case.seed}: {problem} ({case})"

    one()
    print(f"fuzz: {count} cases (seed {at}): {json.dumps(dict(tally))}")
    # Every case was run, every surface was reached, and the mutants both load and fail: a
    # campaign whose mutations all broke the signature (or none did) would test little.
    assert tally["loaded"] + tally["error"] == count
    assert {loader for loaders in SEED_LOADERS.values() for loader in loaders} <= set(tally), tally
    assert tally["loaded"] >= count // 20 and tally["error"] >= count // 2, tally
    return tally


def test_fuzz(worker, tmp_path):
    campaign(worker, tmp_path, DEFAULT_CASES, 44)


@pytest.mark.slow
def test_fuzz_campaign(worker, tmp_path):
    campaign(worker, tmp_path, SLOW_CASES, 4444)


def _regressions() -> list[tuple[str, str]]:
    index = json.loads((REGRESSIONS / "index.json").read_text())
    return [(name, loader) for name, entry in index.items() for loader in entry["loaders"]]


@pytest.mark.parametrize("name,loader", _regressions())
def test_regression_inputs(worker, name, loader):
    """Every input that once broke the contract (index.json says how) keeps to it, and says
    what the index expects of its message."""
    entry = json.loads((REGRESSIONS / "index.json").read_text())[name]
    path = REGRESSIONS / name
    result = worker.load(loader, path)
    assert breach(path, result, entry.get("max_growth_mb", BOUND_MB)) is None, result
    assert result["outcome"] == entry.get("outcome", "error"), result
    assert entry.get("says", "") in result["message"], result
