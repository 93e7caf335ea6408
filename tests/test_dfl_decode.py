"""ops.dfl_decode: YOLOv8's head decoding (DFL boxes + sigmoid classes), definition and kernel."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxnet
from mlxnet import ops
from mlxnet.ops.core import kernel_launches

from testutil import assert_close


def _numpy_decode(bins: np.ndarray, maps: list[np.ndarray], strides: tuple[int, ...]) -> np.ndarray:
    """ultralytics' decoding written out per anchor: softmax over each side's bins, expected bin
    value, sides around the cell centre, then xywh × stride; classes through a sigmoid."""
    rows = []
    for box, cls, stride in zip(maps[0::2], maps[1::2], strides):
        n, h, w, _ = box.shape
        for y in range(h):
            for x in range(w):
                logits = box[:, y, x].astype(np.float64).reshape(n, 4, bins.size)
                p = np.exp(logits - logits.max(-1, keepdims=True))
                d = (p / p.sum(-1, keepdims=True)) @ bins
                cx, cy = x + 0.5, y + 0.5
                x1, y1, x2, y2 = cx - d[:, 0], cy - d[:, 1], cx + d[:, 2], cy + d[:, 3]
                xywh = np.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], -1) * stride
                probs = 1 / (1 + np.exp(-cls[:, y, x].astype(np.float64)))
                rows.append(np.concatenate([xywh, probs], -1))
    return np.stack(rows, 1)


def _maps(levels: list[tuple[int, int]], n: int = 2, bins: int = 16, nc: int = 5, seed: int = 0) -> list[mx.array]:
    rng = np.random.default_rng(seed)
    maps = []
    for h, w in levels:
        maps += [mx.array(rng.normal(0, 3, (n, h, w, 4 * bins)).astype(np.float32)),
                 mx.array(rng.normal(0, 2, (n, h, w, nc)).astype(np.float32))]
    return maps


@pytest.mark.parametrize("levels, strides", [([(4, 6), (2, 3), (1, 2)], (8, 16, 32)),
                                             ([(8, 8), (4, 4), (2, 2), (1, 1)], (4, 8, 16, 32)),
                                             ([(3, 5)], (8,))])
def test_definition_matches_ultralytics_decoding(levels, strides):
    maps = _maps(levels)
    bins = mx.arange(16, dtype=mx.float32)
    with mlxnet.use_kernels(False):
        out = ops.dfl_decode(bins, *maps, strides=strides)
    expected = _numpy_decode(np.arange(16.0), [np.array(m) for m in maps], strides)
    assert out.dtype == mx.float32 and out.shape == expected.shape
    np.testing.assert_allclose(np.array(out), expected, rtol=1e-5, atol=1e-4)


def test_kernel_is_one_launch_reading_every_level_in_place():
    maps = _maps([(4, 6), (2, 3), (1, 2)])
    op = ops.get("dfl_decode")
    launches = kernel_launches.op_launches(op, (mx.arange(16, dtype=mx.float32), *maps), {"strides": (8, 16, 32)})
    assert len(launches) == 1
    (launch,) = launches
    # bins, then each level's two maps as they are (unused slot: 1-element placeholders), params
    assert [tuple(a.shape) for a in launch.inputs[1:7]] == [tuple(m.shape) for m in maps]
    assert [a.size for a in launch.inputs[7:9]] == [1, 1]
    assert launch.output_shapes == ((2, 24 + 6 + 2, 4 + 5),)


@pytest.mark.parametrize("maps, strides, message", [
    (lambda: _maps([(2, 2)], bins=15), (8,), r"level 0 has box map \(2, 2, 2, 60\).*expected \(N, H, W, 64\)"),
    (lambda: _maps([(2, 2), (1, 1)]), (8,), "a box map and a class map per stride"),
    (lambda: _maps([(2, 2)]) + _maps([(1, 1)], n=3), (8, 16), "level 1 has box map"),
])
def test_mismatched_maps_are_one_line_errors(maps, strides, message):
    with pytest.raises(mlxnet.MlxnetError, match=message):
        ops.dfl_decode(mx.arange(16, dtype=mx.float32), *maps(), strides=strides)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("levels, strides", [([(80, 80), (40, 40), (20, 20)], (8, 16, 32)),
                                             ([(16, 16), (8, 8), (4, 4), (2, 2)], (4, 8, 16, 32))])
def test_kernel_equals_definition_at_detector_sizes(gpu, dtype, levels, strides):
    maps = [m.astype(dtype) for m in _maps(levels, n=3, nc=80, seed=1)]
    bins = mx.arange(16, dtype=mx.float32)
    out = ops.dfl_decode(bins, *maps, strides=strides)
    with mlxnet.use_kernels(False):
        ref = ops.dfl_decode(bins, *maps, strides=strides)
    assert out.dtype == mx.float32
    assert_close(out[..., :4], ref[..., :4], scale=4)  # boxes, in pixels
    assert_close(out[..., 4:], ref[..., 4:], scale=4)  # probabilities
