"""Every pooling argument rule is PyTorch's: over a sweep of small geometries, mlxnet accepts
exactly the calls torch accepts (same output shape) and refuses the others with an MlxnetError."""
from __future__ import annotations

import itertools

import mlx.core as mx
import pytest

import mlxnet
from mlxnet import ops

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _torch_shape(fn, x, **kwargs):
    try:
        out = fn(x, **kwargs)
    except (RuntimeError, ValueError):
        return None
    out = out[0] if isinstance(out, tuple) else out
    return tuple(out.shape)


def _mlx_shape(fn, x, **kwargs):
    try:
        out = fn(x, **kwargs)
    except mlxnet.MlxnetError:
        return None
    out = out[0] if isinstance(out, tuple) else out
    return tuple(out.shape)


def _nchw(shape):
    return (shape[0], shape[-1]) + tuple(shape[1:-1])


def _compare(torch_fn, mlx_fn, shapes, grid, refused=()):
    """``refused``: input shapes torch takes but mlxnet refuses on purpose."""
    mismatches = []
    for shape in shapes:
        tx, mxx = torch.zeros(_nchw(shape)), mx.zeros(shape)
        for kwargs in grid:
            want = _torch_shape(torch_fn, tx, **kwargs)
            got = _mlx_shape(mlx_fn, mxx, **kwargs)
            if want is not None:
                want = (want[0],) + want[2:] + (want[1],)
            if want != got and not (shape in refused and got is None):
                mismatches.append((shape, kwargs, want, got))
    assert not mismatches, f"{len(mismatches)} differ from torch, e.g. {mismatches[:5]}"


def _grid(**axes):
    keys = list(axes)
    return [dict(zip(keys, v)) for v in itertools.product(*axes.values())]


_FIXED = dict(kernel_size=[1, 2, 3, 4], stride=[1, 2, 3], padding=[0, 1, 2, 3], ceil_mode=[False, True])


@pytest.mark.parametrize("nd", [1, 2])
def test_max_pool_rules_match_torch(nd):
    shapes = [(1, s, 2) for s in range(1, 7)] if nd == 1 else [(1, s, 5, 2) for s in range(1, 7)]
    shapes += [(0,) + shapes[2][1:], (1,) + (0,) * nd + (2,), (1,) + shapes[2][1:-1] + (0,)]
    grid = _grid(**_FIXED, dilation=[1, 2, 3])
    torch_fn = F.max_pool1d if nd == 1 else F.max_pool2d
    with mlxnet.use_device("cpu"):
        _compare(torch_fn, ops.max_pool1d if nd == 1 else ops.max_pool2d, shapes, grid)


@pytest.mark.parametrize("nd", [1, 2])
def test_avg_pool_rules_match_torch(nd):
    shapes = [(1, s, 2) for s in range(1, 7)] if nd == 1 else [(1, s, 5, 2) for s in range(1, 7)]
    shapes += [(0,) + shapes[2][1:], (1,) + shapes[2][1:-1] + (0,)]
    grid = _grid(**_FIXED, count_include_pad=[True, False])
    torch_fn = F.avg_pool1d if nd == 1 else F.avg_pool2d
    with mlxnet.use_device("cpu"):
        _compare(torch_fn, ops.avg_pool1d if nd == 1 else ops.avg_pool2d, shapes, grid)


@pytest.mark.parametrize("kind", ["avg", "max"])
def test_adaptive_pool_rules_match_torch(kind):
    shapes = [(1, h, 3, 2) for h in range(1, 5)] + [(0, 3, 3, 2), (1, 0, 3, 2), (1, 3, 3, 0)]
    grid = _grid(output_size=[0, 1, 2, 5, (2, None), (None, 0), (0, 0)])
    torch_fn = F.adaptive_avg_pool2d if kind == "avg" else F.adaptive_max_pool2d
    # torch averages an empty height into NaNs; mlxnet refuses it (no silent wrong answer).
    empty_height = (1, 0, 3, 2)
    assert torch.isnan(F.adaptive_avg_pool2d(torch.zeros(_nchw(empty_height)), 1)).all()
    with mlxnet.use_device("cpu"):
        _compare(torch_fn, getattr(ops, f"adaptive_{kind}_pool2d"), shapes, grid,
                 refused=[empty_height])
