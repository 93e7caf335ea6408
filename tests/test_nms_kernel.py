"""nms's kernel face (custom_kernels/nms.kern, mlxnet/ops/nms/kernel.py) keeps exactly the
definition's indices.

Here (any machine): the two kernels are replaced by NumPy models that mirror their bodies line
by line (the mask words, the block scan with its removed bits and diagonal words), so the host
side (sizes, prefix passes, bit unpacking, fallbacks) and the bit-mask algorithm are checked
against the definition without a GPU. The models leave the words the scan must never read
filled with ones, so reading one would show.

On a GPU (``pytest -m gpu tests/test_nms_kernel.py``): the real kernels, through the op's
dispatcher, against the definition and torchvision's stored goldens."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import mlxnet
from mlxnet import ops
from mlxnet.ops.nms import definition, kernel
from test_nms_fast import problems, reference

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "fixtures" / "nms" / "nms_golden.npz"


# --- NumPy models of the two kernels ---------------------------------------------------------

def model_mask(b: np.ndarray, limit: np.float32, n: int, words: int) -> np.ndarray:
    """nms_mask: word w of row i, bit k set where j = 32 w + k > i, j < n and IoU(i, j) > limit,
    the IoU in the kernel's (and the definition's) float32 operations. Words w < i // 32 are not
    written by the kernel: here they hold all ones."""
    mask = np.full((n, words), 0xFFFFFFFF, np.uint32)
    areas = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for i in range(n):
            for w in range(i // 32, words):
                j = np.arange(max(i + 1, 32 * w), min(32 * w + 32, n))
                c = b[j]
                width = np.maximum(np.minimum(b[i, 2], c[:, 2]) - np.maximum(b[i, 0], c[:, 0]), np.float32(0))
                height = np.maximum(np.minimum(b[i, 3], c[:, 3]) - np.maximum(b[i, 1], c[:, 1]), np.float32(0))
                inter = width * height
                over = (inter > 0) & (inter / ((areas[i] + areas[j]) - inter) > limit)
                mask[i, w] = np.bitwise_or.reduce(np.left_shift(np.uint32(1), (j - 32 * w).astype(np.uint32))[over],
                                                  initial=np.uint32(0))
    return mask.reshape(-1)


def model_scan(mask: np.ndarray, n: int, words: int, max_det: int) -> np.ndarray:
    """nms_scan, step by step as the one group runs it (thread 0's settling of a block, then
    every thread's ORs into the later words, the next diagonal words fetched)."""
    mask = mask.reshape(n, words) if n else mask
    removed = np.zeros(words, np.uint32)
    keep = np.full(words, 0xDEADBEEF, np.uint32)  # every word must be written
    diagonal = [int(mask[t, 0]) if t < n else 0 for t in range(32)]
    count, k = 0, 0
    while k < words:
        gone, kept, rows = int(removed[k]), 0, []
        for bit in range(32):
            if count >= max_det:
                break
            row = 32 * k + bit
            if row >= n:
                break
            if (gone >> bit) & 1:
                continue
            kept |= 1 << bit
            rows.append(row)
            count += 1
            gone |= diagonal[bit]
        keep[k] = kept
        if count >= max_det or k + 1 >= words:
            break
        for w in range(k + 1, words):
            for row in rows:
                removed[w] |= mask[row, w]
        diagonal = [int(mask[32 * (k + 1) + t, k + 1]) if 32 * (k + 1) + t < n else 0 for t in range(32)]
        k += 1
    keep[k + 1:] = 0
    return keep


class _Model:
    """Stands for a PortableKernel: checks the launch the face asks for, runs the model."""

    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def __call__(self, inputs, *, template, grid, threadgroup, output_shapes, output_dtypes, init_value=None):
        n, words, max_det = (int(v) for v in np.array(inputs[-1]))
        assert words == (n + 31) // 32 and output_dtypes == [mx.uint32] and init_value is None
        self.log.append((self.name, n))
        if self.name == "nms_mask":
            (packed,) = (np.array(x) for x in inputs[:1])
            assert packed.dtype == np.float32 and packed.shape == (4 * n + 1,) and len(inputs) == 2
            assert grid == (n * words, 1, 1) and output_shapes == [(n * words,)]
            return [mx.array(model_mask(packed[:-1].reshape(n, 4), packed[-1], n, words))]
        assert grid == ((kernel._SCAN_GROUP if n else 0), 1, 1) and threadgroup == (kernel._SCAN_GROUP, 1, 1)
        assert output_shapes == [(words,)]
        return [mx.array(model_scan(np.array(inputs[0]), n, words, max_det))]


@pytest.fixture
def modelled(monkeypatch):
    """The kernel face with its two kernels replaced by the models; the launches made."""
    log: list = []
    monkeypatch.setattr(kernel, "NMS_MASK", _Model("nms_mask", log))
    monkeypatch.setattr(kernel, "NMS_SCAN", _Model("nms_scan", log))
    return log


def _both(boxes, scores, classes, **kw) -> tuple[list[int], list[int]]:
    args = (mx.array(boxes), mx.array(scores), None if classes is None else mx.array(classes))
    return np.array(kernel.nms(*args, **kw)).tolist(), np.array(definition.nms(*args, **kw)).tolist()


@settings(max_examples=60, deadline=None)
@given(problems(), st.sampled_from([0, 33, 100]))
def test_the_modelled_kernels_keep_the_definitions_indices(modelled_problem, first_rows) -> None:
    # The fixture cannot be used with @given: models set up by hand, restored after.
    boxes, scores, classes, iou, max_det = modelled_problem
    log: list = []
    saved = kernel.NMS_MASK, kernel.NMS_SCAN, kernel._FIRST_ROWS
    kernel.NMS_MASK, kernel.NMS_SCAN = _Model("nms_mask", log), _Model("nms_scan", log)
    kernel._FIRST_ROWS = first_rows  # 0: prefix passes of 4 * max_det, growing
    try:
        got, want = _both(boxes, scores, classes, iou_threshold=iou, max_det=max_det)
    finally:
        kernel.NMS_MASK, kernel.NMS_SCAN, kernel._FIRST_ROWS = saved
    assert got == want == reference(boxes, scores, classes, iou, max_det)


def test_many_blocks_prefix_passes_and_score_threshold(modelled, monkeypatch) -> None:
    rng = np.random.default_rng(3)
    n = 700
    xy = rng.integers(0, 40, (n, 2)) * 4
    boxes = np.concatenate([xy, xy + rng.integers(1, 12, (n, 2)) * 4], axis=1).astype(np.float32)
    boxes[350:400] = boxes[:50]  # duplicates at later indices
    scores = rng.integers(1, 9, n).astype(np.float32) / 8  # ties
    classes = rng.integers(0, 3, n)
    monkeypatch.setattr(kernel, "_FIRST_ROWS", 0)
    passes = []
    for cls in (classes, None):
        for iou, max_det, threshold in [(0.5, 40, None), (0.7, 1000, None), (0.3, 25, 0.4), (0.0, 7, None), (0.0, 60, None)]:
            start = len(modelled)
            got, want = _both(boxes, scores, cls, iou_threshold=iou, max_det=max_det, score_threshold=threshold)
            assert got == want, (iou, max_det, threshold)
            sizes = [size for name, size in modelled[start:] if name == "nms_mask"]
            candidates = n if threshold is None else int((scores > threshold).sum())
            assert sizes == sorted(sizes) and sizes[0] == min(4 * max_det, candidates)
            assert sizes[-1] == candidates or len(got) == max_det
            passes.append(len(sizes))
    assert max(passes) > 1  # some call needed a longer prefix


def test_non_finite_or_huge_coordinates_run_the_definition(modelled) -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [0, 0, np.nan, 5], [0, 0, np.inf, 9], [2, 2, 9, 9]],
                     np.float32)
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.5], np.float32)
    got, want = _both(boxes, scores, None, iou_threshold=0.5)
    assert got == want and modelled == []
    boxes[2:4] = [[0, 0, 3e18, 5], [-1e19, 0, 1, 1]]
    got, want = _both(boxes, scores, None, iou_threshold=0.5)
    assert got == want and modelled == []
    boxes[2:4] = [[0, 0, 1e18, 5], [-1e18, 0, 1, 1]]  # at the limit: the kernels
    got, want = _both(boxes, scores, None, iou_threshold=0.5)
    assert got == want and modelled


def test_more_rows_than_the_scan_holds_runs_the_definition(modelled, monkeypatch) -> None:
    rng = np.random.default_rng(5)
    xy = rng.uniform(0, 50, (300, 2))
    boxes = np.concatenate([xy, xy + 30], axis=1).astype(np.float32)  # heavy overlap: few kept
    scores = rng.uniform(size=300).astype(np.float32)
    monkeypatch.setattr(kernel, "_FIRST_ROWS", 0)
    monkeypatch.setattr(kernel, "_MAX_ROWS", 64)
    got, want = _both(boxes, scores, None, iou_threshold=0.5, max_det=20)
    assert got == want and max(size for _, size in modelled) == 64


def test_empty_and_all_filtered(modelled) -> None:
    got, want = _both(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), None)
    assert got == want == []
    got, want = _both(np.ones((3, 4), np.float32), np.float32([0.1, 0.2, 0.3]), None, score_threshold=0.5)
    assert got == want == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, -0.0, 0.5, 0.25, -1.0, 1e-40, -1e-40, 3e38, np.inf, -np.inf, np.nan, 0.5]),
                max_size=80),
       st.integers(0, 2**32 - 1))
def test_the_descending_order_is_numpys_stable_argsort(values, seed) -> None:
    rng = np.random.default_rng(seed)
    scores = np.concatenate([np.float32(values), rng.uniform(-1, 1, rng.integers(0, 50)).astype(np.float32)])
    scores = rng.permutation(scores)
    assert definition.descending(scores).tolist() == np.argsort(-scores, kind="stable").tolist()


# --- on a GPU: the real kernels ---------------------------------------------------------------

def _golden_cases():
    spec = importlib.util.spec_from_file_location("golden_nms", ROOT / "scripts" / "goldens" / "golden_nms.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _on_gpu(boxes, scores, classes, **kw) -> tuple[list[int], list[int]]:
    """(the op on the GPU, by its kernel face; the definition) for one call."""
    op = ops.get("nms")
    assert op.face() == "kernel"
    args = (mx.array(boxes), mx.array(scores), None if classes is None else mx.array(classes))
    got = np.array(ops.nms(*args, **kw)).tolist()
    with mlxnet.use_kernels(False):
        want = np.array(ops.nms(*args, **kw)).tolist()
    return got, want


def detector_candidates(n: int = 8400, classes: int = 80, seed: int = 0):
    """bench_nms.py's eval-like candidates: 8400 boxes of a 640² image, scores as at conf 0.001."""
    rng = np.random.default_rng(seed)
    centre = rng.uniform(0, 640, (n, 2))
    size = rng.uniform(8, 200, (n, 2))
    boxes = np.concatenate([centre - size / 2, centre + size / 2], axis=1).astype(np.float32)
    scores = (rng.beta(0.5, 20, n) + 0.001).astype(np.float32)
    return boxes, scores, rng.integers(0, classes, n).astype(np.int32)


@pytest.mark.gpu
def test_gpu_goldens_of_torchvision(gpu) -> None:
    golden_nms = _golden_cases()
    golden = np.load(GOLDEN)
    for name, (boxes, scores, classes) in golden_nms.cases().items():
        assert str(golden[f"{name}/sha256"]) == golden_nms.digest(boxes, scores, classes)
        for iou in golden_nms.THRESHOLDS[name]:
            for op in ("batched_nms", "nms"):
                got, want = _on_gpu(boxes, scores, classes if op == "batched_nms" else None,
                                    iou_threshold=iou, max_det=len(boxes))
                assert got == want, (name, iou, op)
                expected = golden[f"{name}/{iou}/{op}"].astype(np.int64).tolist()
                assert got[:len(expected)] == expected, (name, iou, op)
                mask = golden.get(f"{name}/{iou}/{op}/mask")
                if mask is None:
                    assert len(got) == len(expected)
                else:
                    assert np.flatnonzero(np.unpackbits(mask)[:len(boxes)]).tolist() == sorted(got)


@pytest.mark.gpu
@settings(max_examples=200, deadline=None)
@given(problems())
def test_gpu_random_boxes_with_ties_and_duplicates(problem) -> None:
    mlxnet.use_device("gpu")
    boxes, scores, classes, iou, max_det = problem
    if boxes.shape[0] == 0:
        return  # the dispatcher's empty rule: the definition (test_gpu_edges)
    got, want = _on_gpu(boxes, scores, classes, iou_threshold=iou, max_det=max_det)
    assert got == want


@pytest.mark.gpu
@pytest.mark.parametrize("aware", [True, False])
@pytest.mark.parametrize("max_det, threshold", [(300, None), (300, 0.001), (3000, None), (1, None), (7, None)])
def test_gpu_detector_candidates(gpu, aware, max_det, threshold) -> None:
    boxes, scores, classes = detector_candidates()
    for iou in (0.7, 0.45, 0.0, 1.0):
        got, want = _on_gpu(boxes, scores, classes if aware else None, iou_threshold=iou, max_det=max_det,
                            score_threshold=threshold)
        assert got == want, (iou, max_det, threshold)
        assert len(got) == min(max_det, len(want))


@pytest.mark.gpu
def test_gpu_dense_overlaps_need_a_second_pass(gpu) -> None:
    # 20000 candidates clustered on a few objects: the first pass (8448 rows) keeps fewer than
    # max_det, the next takes them all; a scan over 625 words.
    rng = np.random.default_rng(7)
    centre = rng.integers(0, 6, (20000, 2)) * 100 + rng.normal(0, 2, (20000, 2))
    boxes = np.concatenate([centre - 40, centre + 40], axis=1).astype(np.float32)
    scores = rng.uniform(size=20000).astype(np.float32)
    classes = rng.integers(0, 3, 20000)
    for aware in (True, False):
        got, want = _on_gpu(boxes, scores, classes if aware else None, iou_threshold=0.7, max_det=300)
        assert got == want


@pytest.mark.gpu
def test_gpu_edges(gpu) -> None:
    # non-finite coordinates (the definition runs), degenerate boxes (0 / 0), inverted boxes,
    # an empty input, everything under the score threshold, one box.
    boxes = np.array([[0, 0, 10, 10], [0, 0, 10, 10], [5, 5, 5, 5], [5, 5, 5, 5], [9, 9, 1, 1],
                      [1, 1, 11, 11], [0, 0, np.nan, 4], [0, 0, np.inf, 4], [-np.inf, 0, 3, 3]], np.float32)
    scores = np.float32([0.9, 0.9, 0.8, 0.8, 0.7, 0.6, 0.5, 0.5, 0.4])
    classes = np.array([0, 0, 1, 1, 0, 0, 2, 2, 2])
    for count in (6, 9):  # finite only: the kernels; with the non-finite rows: the definition
        for aware in (True, False):
            for iou in (0.0, 0.5, 1.0):
                got, want = _on_gpu(boxes[:count], scores[:count], classes[:count] if aware else None,
                                    iou_threshold=iou)
                assert got == want, (count, aware, iou)
    assert _on_gpu(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), None) == ([], [])
    assert _on_gpu(boxes[:6], scores[:6], None, score_threshold=0.95) == ([], [])
    assert _on_gpu(boxes[:1], scores[:1], None) == ([0], [0])


# --- several images at once (nms_many) ---------------------------------------------------------

def _many_problems() -> list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    """Images as a batch gives them: ordinary ones, one without boxes, one whose scores all fall
    under the threshold, one with a non-finite box, one whose first pass keeps too few."""
    rng = np.random.default_rng(11)
    out = []
    for n in (40, 0, 7, 120):
        xy = rng.uniform(0, 300, (n, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(5, 60, (n, 2))], axis=1).astype(np.float32)
        out.append((boxes, rng.uniform(0.05, 1, n).astype(np.float32), rng.integers(0, 3, n).astype(np.int32)))
    out[2] = (out[2][0], np.full(7, 0.01, np.float32), out[2][2])  # all under score_threshold 0.02
    bad = out[0][0].copy()
    bad[3, 2] = np.nan
    out.append((bad, out[0][1], None))
    centre = rng.integers(0, 3, (400, 2)) * 100 + rng.normal(0, 2, (400, 2))
    out.append((np.concatenate([centre - 40, centre + 40], axis=1).astype(np.float32),
                rng.uniform(size=400).astype(np.float32), None))  # ~9 kept of 400: a second pass
    return out


def _as_arrays(problem):
    boxes, scores, classes = problem
    return mx.array(boxes), mx.array(scores), None if classes is None else mx.array(classes)


def test_nms_many_keeps_each_images_definition_indices(modelled, monkeypatch) -> None:
    """The kernel face of nms_many (the kernels modelled): every image's indices are the
    definition's, the first passes of all images launched before any second pass."""
    monkeypatch.setattr(kernel, "_FIRST_ROWS", 0)
    problems = [_as_arrays(p) for p in _many_problems()]
    options = dict(iou_threshold=0.5, max_det=50, score_threshold=0.02)
    got = kernel.nms_many(problems, **options)
    want = [definition.nms(*p, **options) for p in problems]
    assert [np.array(g).tolist() for g in got] == [np.array(w).tolist() for w in want]
    sizes = [size for name, size in modelled if name == "nms_mask"]
    dense = int((problems[-1][1] > 0.02).sum())
    # First passes (prefix 4 · max_det) of the images with candidates: 40, 120, the dense one's
    # 200 (the empty and all-filtered images ask for empty grids: no launch); then the dense one alone goes on to
    # a second pass, which takes all of it.
    assert sizes == [40, 0, 0, 120, 200, dense]


def test_nms_many_on_the_cpu_is_nms_of_each() -> None:
    problems = [_as_arrays(p) for p in _many_problems()]
    got = ops.nms_many(problems, iou_threshold=0.6, max_det=30)
    assert [np.array(g).tolist() for g in got] == [np.array(ops.nms(*p, iou_threshold=0.6, max_det=30)).tolist()
                                                   for p in problems]


@pytest.mark.gpu
def test_gpu_nms_many_equals_the_definition(gpu) -> None:
    problems = [_as_arrays(p) for p in _many_problems()]
    problems.append(_as_arrays(detector_candidates(seed=3)))
    problems.append(_as_arrays(detector_candidates(n=3000, classes=3, seed=4)))
    for options in (dict(iou_threshold=0.7, max_det=300), dict(iou_threshold=0.45, max_det=20, score_threshold=0.02)):
        got = ops.nms_many(problems, **options)
        with mlxnet.use_kernels(False):
            want = ops.nms_many(problems, **options)
        assert [np.array(g).tolist() for g in got] == [np.array(w).tolist() for w in want], options
