"""mlxnet's CPU primitives (custom_kernels/cpu_ops.cpp via mlxnet._native): built, equal to the
MLX references and the ops' definitions (sigmoid, GELU and softmax at edge values too), differentiable,
used by the ops, and a clean fallback when they cannot build."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import mlxnet
from mlxnet import _native, ops
from mlxnet.ops.activations import cpu as activations_cpu
from mlxnet.ops.conv import cpu as conv_cpu
from testutil import assert_close

# nanobind is a dependency on Linux; a machine without it (or without g++) runs the composed paths.
BUILDABLE = (sys.platform.startswith("linux") and shutil.which("g++") is not None
             and importlib.util.find_spec("nanobind") is not None)
pytestmark = pytest.mark.skipif(not BUILDABLE, reason="the CPU primitives are built on Linux with g++ and nanobind")


@pytest.fixture
def native():
    with mlxnet.use_device("cpu"):
        module = _native.module()
        assert module is not None, f"CPU primitives did not load: {mlxnet.native_info()}"
        yield module


def _im2col_reference(x, k, s, p, d, lib=np):
    """The patch matrix by padding and strided slices, in numpy (``lib=np``) or MLX (``lib=mx``)."""
    n, h, w, c = x.shape
    xp = lib.pad(x, [(0, 0), (p[0], p[0]), (p[1], p[1]), (0, 0)])
    oh = (h + 2 * p[0] - d[0] * (k[0] - 1) - 1) // s[0] + 1
    ow = (w + 2 * p[1] - d[1] * (k[1] - 1) - 1) // s[1] + 1
    taps = [xp[:, i * d[0]: i * d[0] + s[0] * (oh - 1) + 1: s[0], j * d[1]: j * d[1] + s[1] * (ow - 1) + 1: s[1]]
            for i in range(k[0]) for j in range(k[1])]
    return lib.concatenate(taps, axis=-1)


GEOMETRIES = [  # kernel, stride, padding, dilation, input (N, H, W, C)
    ((3, 3), (2, 2), (1, 1), (1, 1), (2, 17, 12, 3)),
    ((3, 3), (1, 1), (1, 1), (1, 1), (1, 9, 14, 16)),
    ((7, 7), (2, 2), (3, 3), (1, 1), (1, 23, 20, 3)),    # ResNet's stem
    ((3, 2), (2, 3), (0, 2), (1, 1), (2, 11, 13, 5)),
    ((3, 3), (1, 2), (2, 2), (2, 3), (1, 15, 16, 4)),    # dilated: runs copied pixel by pixel
    ((1, 1), (2, 2), (0, 0), (1, 1), (1, 8, 9, 6)),
]


@pytest.mark.parametrize("k,s,p,d,shape", GEOMETRIES)
def test_im2col_equals_numpy_patches(native, k, s, p, d, shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for dtype in (mx.float32, mx.float16):
        got = native.im2col(mx.array(x).astype(dtype), k, s, p, d)
        assert got.dtype == dtype
        want = _im2col_reference(np.array(mx.array(x).astype(dtype).astype(mx.float32)), k, s, p, d)
        np.testing.assert_array_equal(np.array(got.astype(mx.float32)), want)
    # a non-contiguous input (a transposed view) is read correctly too
    xt = mx.array(x).transpose(0, 2, 1, 3)
    np.testing.assert_array_equal(np.array(native.im2col(xt, k, s, p, d)),
                                  _im2col_reference(np.array(xt), k, s, p, d))


def test_im2col_rejects_a_kernel_larger_than_the_input(native):
    with pytest.raises(ValueError, match="does not fit"):
        native.im2col(mx.zeros((1, 2, 2, 3)), (5, 5), (1, 1), (0, 0), (1, 1))


@pytest.mark.parametrize("k,s,p,d,shape", GEOMETRIES)
def test_im2col_gradient_is_col2im(native, k, s, p, d, shape):
    x = mx.random.normal(shape, key=mx.random.key(3))
    probe = mx.random.normal(native.im2col(x, k, s, p, d).shape, key=mx.random.key(4))
    got = mx.grad(lambda x: (native.im2col(x, k, s, p, d) * probe).sum())(x)
    want = mx.grad(lambda x: (_im2col_reference(x, k, s, p, d, lib=mx) * probe).sum())(x)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,k,stride,padding", [
    ((1, 32, 32, 16), 3, 2, 1),      # strided
    ((2, 20, 24, 32), 3, 1, 1),      # stride 1, small map (≤ 2500 output pixels)
    ((1, 21, 19, 3), 7, 2, 3),
])
def test_conv2d_runs_im2col_and_equals_mx_conv2d(native, monkeypatch, shape, k, stride, padding):
    x = mx.random.normal(shape, key=mx.random.key(5))
    w = mx.random.normal((24, k, k, shape[-1]), key=mx.random.key(6)) * 0.1
    b = mx.random.normal((24,), key=mx.random.key(7))
    calls = []
    im2col = native.im2col
    monkeypatch.setattr(native, "im2col", lambda *a: calls.append(a[1:]) or im2col(*a))
    got = ops.conv2d(x, w, b, stride=stride, padding=padding)
    want = mx.conv2d(x, w, stride=stride, padding=padding) + b
    assert calls == [((k, k), (stride, stride), (padding, padding), (1, 1))]
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-4)
    # gradients through the im2col path equal MLX's own convolution's
    gx, gw = mx.grad(lambda x, w: (ops.conv2d(x, w, stride=stride, padding=padding) ** 2).sum(), (0, 1))(x, w)
    rx, rw = mx.grad(lambda x, w: (mx.conv2d(x, w, stride=stride, padding=padding) ** 2).sum(), (0, 1))(x, w)
    np.testing.assert_allclose(np.array(gx), np.array(rx), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(np.array(gw), np.array(rw), rtol=1e-3, atol=2e-3)


def test_bias_silu_equals_the_composed_reference(native, monkeypatch):
    x = mx.random.normal((3, 7, 5, 48), key=mx.random.key(8)) * 8
    x = mx.concatenate([x.reshape(-1), mx.array([0.0, -0.0, 90.0, -90.0, 1e30, -1e30, float("inf"), -float("inf")])])
    x = x[: (x.size // 48) * 48].reshape(-1, 48)
    b = mx.random.normal((48,), key=mx.random.key(9))
    calls = []
    fused = native.bias_silu
    monkeypatch.setattr(native, "bias_silu", lambda *a: calls.append(len(a)) or fused(*a))
    for bias in (b, None):
        got = np.array(ops.silu(x, bias))
        v = x if bias is None else x + bias
        ref = np.array(activations_cpu._silu_f32(v))  # the MLX-composed reference
        np.testing.assert_allclose(got, ref, rtol=5e-7, atol=0)
        v64 = np.array(v).astype(np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            exact = np.where(v64 < -700, -0.0, v64 / (1 + np.exp(-np.clip(v64, -700, 700))))
        np.testing.assert_allclose(got, exact, rtol=1e-6, atol=1e-30)
    assert calls == [2, 2]
    # float16 and a bias of another shape take the composed path (and keep their semantics)
    half = ops.silu(x.astype(mx.float16), b.astype(mx.float16))
    assert half.dtype == mx.float16 and calls == [2, 2]


def test_bias_silu_gradients(native):
    x = mx.random.normal((4, 6, 16), key=mx.random.key(10)) * 3
    b = mx.random.normal((16,), key=mx.random.key(11))

    def reference(x, b):
        v = x + b
        return (v * mx.sigmoid(v) * mx.arange(16)).sum()
    got = mx.grad(lambda x, b: (ops.silu(x, b) * mx.arange(16)).sum(), (0, 1))(x, b)
    want = mx.grad(reference, (0, 1))(x, b)
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.array(g), np.array(r), rtol=1e-5, atol=1e-5)



# Shapes for sigmoid and softmax: rows of 1, 16 (the DFL's bins), 80 (YOLOv8's classes) and
# longer; sizes past the primitives' grain of 16384 elements, so that the rows split over the
# cores, unevenly (an odd count of grains, rows that are not a multiple of the chunk).
ACTIVATION_SHAPES = [(7,), (3, 1), (2, 9, 7, 33), (1001, 37), (2, 420, 4, 16), (3, 11, 1009), (1, 8400, 80)]
EDGES = [0.0, -0.0, 1e-8, 30.0, -30.0, 88.5, -88.5, 100.0, -100.0, 1e4, -1e4, 1e30, -1e30,
         3e38, -3e38, float("inf"), -float("inf"), float("nan")]


def _sample(shape, key):
    return mx.random.normal(shape, key=mx.random.key(key)) * 6


def test_sigmoid_equals_the_definition(native, monkeypatch):
    calls = []
    fused = native.sigmoid
    monkeypatch.setattr(native, "sigmoid", lambda x: calls.append(x.shape) or fused(x))
    for i, shape in enumerate(ACTIVATION_SHAPES):
        x = _sample(shape, 40 + i)
        got = np.array(ops.sigmoid(x))
        # the composed CPU path (the same polynomial, as mx.compile'd passes) and the definition
        np.testing.assert_allclose(got, np.array(activations_cpu._sigmoid_f32(x)), rtol=5e-7, atol=0)
        assert_close(mx.array(got), ops.sigmoid.op.definition(x), scale=2)
        x64 = np.array(x).astype(np.float64)
        np.testing.assert_allclose(got, 1 / (1 + np.exp(-x64)), rtol=1e-6, atol=1e-30)
    assert calls == ACTIVATION_SHAPES
    edges = mx.array(EDGES)
    got, want = np.array(ops.sigmoid(edges)), np.array(ops.sigmoid.op.definition(edges))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-30)  # NaN where the definition's is
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(got, 1 / (1 + np.exp(-np.array(EDGES))), rtol=1e-6, atol=1e-30)
    assert got[EDGES.index(float("inf"))] == 1.0 and got[EDGES.index(-float("inf"))] == 0.0
    # float16 takes the composed path and keeps its dtype
    assert ops.sigmoid(edges.astype(mx.float16)).dtype == mx.float16 and len(calls) == len(ACTIVATION_SHAPES) + 1


def _softmax64(x, axis=-1):
    x = np.array(x).astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_softmax_equals_the_definition(native, monkeypatch):
    calls = []
    fused = native.softmax
    monkeypatch.setattr(native, "softmax", lambda x: calls.append(x.shape) or fused(x))
    definition = ops.softmax.op.definition
    for i, shape in enumerate(ACTIVATION_SHAPES):
        x = _sample(shape, 50 + i)
        for axis in range(len(shape)):
            got = ops.softmax(x, axis=axis)
            assert got.shape == x.shape and got.dtype == mx.float32
            assert_close(got, definition(x, axis=axis), scale=2)
            np.testing.assert_allclose(np.array(got), _softmax64(x, axis), rtol=2e-5, atol=1e-30)
    assert len(calls) == sum(len(shape) for shape in ACTIVATION_SHAPES)
    # float16 takes the composed path and keeps its dtype
    assert ops.softmax(x.astype(mx.float16)).dtype == mx.float16 and len(calls) == sum(map(len, ACTIVATION_SHAPES))


def test_softmax_is_stable_and_propagates_what_the_definition_does(native):
    inf, nan = float("inf"), float("nan")
    rows = mx.array([
        [1.0, 2.0, 3.0, 4.0, 5.0],
        [1e30, -1e30, 0.0, 1e30, 5.0],       # huge: the row's max is subtracted first
        [3e38, -3e38, 1.0, 2.0, -1.0],       # x − max overflows to −inf: exp 0, not NaN
        [88.0, 89.0, 100.0, 1e4, 80.0],      # exp(x) itself would overflow
        [-inf, 0.0, -inf, 1.0, -inf],        # masked scores: exactly 0
        [-inf, -inf, -inf, -inf, -inf],      # nothing left: NaN, as the definition
        [inf, 1.0, 2.0, 3.0, 4.0],           # inf − inf: NaN, as the definition
        [nan, 1.0, 2.0, 3.0, 4.0],
        [1.0, 2.0, 3.0, 4.0, nan],
        [-100.0, -200.0, -300.0, -400.0, -1e4],
    ])
    got = np.array(native.softmax(rows))
    want = np.array(ops.softmax.op.definition(rows))
    assert (np.isnan(got) == np.isnan(want)).all()
    assert np.isnan(got[5:9]).all() and not np.isnan(got[:5]).any() and not np.isnan(got[9]).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-30)
    np.testing.assert_array_equal(got[4, [0, 2, 4]], 0.0)
    np.testing.assert_allclose(got[[0, 1, 2, 3, 4, 9]].sum(-1), 1.0, rtol=1e-6)


def test_sigmoid_and_softmax_read_non_contiguous_inputs(native):
    x = _sample((6, 40, 33), 60)
    views = [x.transpose(2, 0, 1), x[:, ::3, 1::2], mx.broadcast_to(x[:1, :1], (5, 7, 33)), x.T[::-1]]
    for v in views:
        np.testing.assert_allclose(np.array(native.sigmoid(v)), np.array(ops.sigmoid.op.definition(v)),
                                   rtol=1e-6, atol=1e-30)
        np.testing.assert_allclose(np.array(native.softmax(v)), _softmax64(v), rtol=1e-5, atol=1e-30)


def test_sigmoid_and_softmax_refuse_other_dtypes(native):
    with pytest.raises(ValueError, match="float32"):
        native.sigmoid(mx.zeros((3,), mx.float16))
    with pytest.raises(ValueError, match="float32"):
        native.softmax(mx.zeros((3,), mx.bfloat16))
    with pytest.raises(ValueError, match="at least one axis"):
        native.softmax(mx.array(1.0))


@pytest.mark.parametrize("shape", [(4, 6, 16), (1001, 37), (2, 420, 4, 16)])
def test_sigmoid_and_softmax_gradients(native, shape):
    x = _sample(shape, 70)
    probe = mx.random.normal(shape, key=mx.random.key(71))
    definition = {"sigmoid": ops.sigmoid.op.definition, "softmax": ops.softmax.op.definition}
    for name in ("sigmoid", "softmax"):
        for axis in ([None] if name == "sigmoid" else [-1, 0]):
            kw = {} if axis is None else {"axis": axis}
            got = mx.grad(lambda v: (getattr(ops, name)(v, **kw) * probe).sum())(x)
            want = mx.grad(lambda v: (definition[name](v, **kw) * probe).sum())(x)
            assert_close(got, want, scale=4)
    # the primitives' own vjps, called directly
    got = mx.vjp(native.softmax, [x], [probe])[1][0]
    want = mx.vjp(lambda v: definition["softmax"](v), [x], [probe])[1][0]
    assert_close(got, want, scale=4)
    got = mx.vjp(native.sigmoid, [x], [probe])[1][0]
    want = mx.vjp(definition["sigmoid"], [x], [probe])[1][0]
    assert_close(got, want, scale=4)


def test_sigmoid_and_softmax_gradients_at_edge_values(native):
    inf = float("inf")
    x = mx.array([EDGES[:-1]])  # NaN aside: its gradient is NaN in both
    g = mx.grad(lambda v: (ops.sigmoid(v) * mx.arange(v.size)).sum())(x)
    want = mx.grad(lambda v: (ops.sigmoid.op.definition(v) * mx.arange(v.size)).sum())(x)
    np.testing.assert_allclose(np.array(g), np.array(want), rtol=1e-5, atol=1e-30)
    assert float(g[0, EDGES.index(inf)]) == 0.0 and float(g[0, EDGES.index(-inf)]) == 0.0
    rows = mx.array([[-inf, 0.5, -inf, 2.0], [1e30, -1e30, 0.0, 3.0], [88.0, 100.0, 1e4, -3e38]])
    probe = mx.array([[1.0, -2.0, 3.0, 0.5]] * 3)
    g = mx.grad(lambda v: (native.softmax(v) * probe).sum())(rows)
    want = mx.grad(lambda v: (ops.softmax.op.definition(v) * probe).sum())(rows)
    assert np.isfinite(np.array(g)).all()
    np.testing.assert_allclose(np.array(g), np.array(want), rtol=1e-5, atol=1e-30)
    np.testing.assert_array_equal(np.array(g)[0, [0, 2]], 0.0)


def test_sigmoid_and_softmax_fall_back_without_the_primitives(native, monkeypatch):
    x = _sample((3, 50, 16), 80)
    with_native = ops.sigmoid(x), ops.softmax(x), ops.softmax(x, axis=1)
    monkeypatch.setattr(native, "sigmoid", None)  # would fail if called
    monkeypatch.setattr(native, "softmax", None)
    monkeypatch.setattr(_native, "on_cpu", lambda: None)
    without = ops.sigmoid(x), ops.softmax(x), ops.softmax(x, axis=1)
    for a, b in zip(with_native, without):
        assert_close(a, b, scale=2)


_NO_JIT = """
import mlxnet, mlx.core as mx
from mlxnet import _native, ops
mlxnet.use_device("cpu")
x = mx.random.normal((2, 300, 4, 16))
mx.eval(ops.sigmoid(x), ops.softmax(x), ops.softmax(x, axis=1))
print(_native.module() is not None)
"""


def test_sigmoid_and_softmax_compile_nothing_into_tmpdir(tmp_path):
    # MLX's CPU JIT compiles mx.compile'd passes with g++ into $TMPDIR/mlx, again in every fresh
    # TMPDIR (the cost of a cold first result): with the primitives these ops leave nothing there.
    out = subprocess.run([sys.executable, "-c", _NO_JIT], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and "mlx" in p.parts], list(tmp_path.rglob("*"))


GELU_FORMS = ["none", "tanh"]


def _gelu64(x, approximate="none"):
    """GELU in float64 (torch's erfc: x·Φ(x) keeps its digits in the negative tail)."""
    import torch

    t = torch.tensor(np.array(x).astype(np.float64))
    if approximate == "tanh":
        return (0.5 * t * (1 + torch.tanh(0.7978845608028654 * (t + 0.044715 * t ** 3)))).numpy()
    return (t * 0.5 * torch.special.erfc(-t / 2 ** 0.5)).numpy()


@pytest.mark.parametrize("approximate", GELU_FORMS)
def test_gelu_equals_the_definition(native, monkeypatch, approximate):
    calls = []
    fused = native.gelu
    monkeypatch.setattr(native, "gelu", lambda x, tanh: calls.append((x.shape, tanh)) or fused(x, tanh=tanh))
    definition = ops.gelu.op.definition
    for i, shape in enumerate(ACTIVATION_SHAPES):  # uneven splits over the cores among them
        x = _sample(shape, 90 + i)
        got = ops.gelu(x, approximate=approximate)
        assert got.shape == x.shape and got.dtype == mx.float32
        assert_close(got, definition(x, approximate=approximate), scale=2)
        want = _gelu64(x, approximate)
        np.testing.assert_allclose(np.array(got), want, rtol=1e-6, atol=2e-7 * np.abs(np.array(x)).max())
    assert calls == [(shape, approximate == "tanh") for shape in ACTIVATION_SHAPES]
    # edge values: NaN and ±inf where the definition has them (−inf·0 = NaN at −inf), the rest close
    edges = mx.array(EDGES)
    got, want = np.array(ops.gelu(edges, approximate=approximate)), np.array(definition(edges, approximate=approximate))
    assert (np.isnan(got) == np.isnan(want)).all() and np.isnan(got[[-2, -1]]).all()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30)
    assert got[EDGES.index(float("inf"))] == float("inf")
    # float16 takes the composed path and keeps its dtype
    assert ops.gelu(edges.astype(mx.float16), approximate=approximate).dtype == mx.float16
    assert len(calls) == len(ACTIVATION_SHAPES) + 1


def test_gelu_is_float32_accurate(native):
    """The erfc fit, in float32, against float64 on a dense grid: 1.2e-7·max(|x|, 1) absolute
    everywhere, and relative accuracy in the negative tail too (x·Φ(x), not 1 + erf)."""
    x = np.concatenate([np.linspace(-20, 20, 400001), -np.logspace(-8, 1.5, 20001),
                        np.logspace(-8, 3, 2001)]).astype(np.float32)
    got = np.array(native.gelu(mx.array(x))).astype(np.float64)
    want = _gelu64(x)
    assert (np.abs(got - want) <= 1.2e-7 * np.maximum(np.abs(x), 1)).all()
    normal = np.abs(want) > np.finfo(np.float32).tiny  # the float32 result is not subnormal
    rel = np.abs(got - want)[normal] / np.abs(want[normal])
    assert rel.max() < 1.2e-6
    assert (rel[x[normal] > -10] < 5e-7).all()
    gt = np.array(native.gelu(mx.array(x), tanh=True)).astype(np.float64)
    assert (np.abs(gt - _gelu64(x, "tanh")) <= 1.5e-7 * np.maximum(np.abs(x), 1)).all()


def test_gelu_reads_non_contiguous_inputs_and_refuses_other_dtypes(native):
    x = _sample((6, 40, 33), 61)
    views = [x.transpose(2, 0, 1), x[:, ::3, 1::2], mx.broadcast_to(x[:1, :1], (5, 7, 33)), x.T[::-1]]
    for v in views:
        for approximate in GELU_FORMS:
            got = native.gelu(v, tanh=approximate == "tanh")
            assert_close(got, ops.gelu.op.definition(v, approximate=approximate), scale=2)
            np.testing.assert_allclose(np.array(got), _gelu64(v, approximate), rtol=1e-6, atol=2e-6)
    with pytest.raises(ValueError, match="float32"):
        native.gelu(mx.zeros((3,), mx.float16))


@pytest.mark.parametrize("approximate", GELU_FORMS)
def test_gelu_gradients(native, approximate):
    definition = ops.gelu.op.definition
    tanh = approximate == "tanh"
    for shape in [(4, 6, 16), (2, 420, 4, 16)]:
        x = _sample(shape, 72)
        probe = mx.random.normal(shape, key=mx.random.key(73))
        got = mx.grad(lambda v: (ops.gelu(v, approximate=approximate) * probe).sum())(x)
        want = mx.grad(lambda v: (definition(v, approximate=approximate) * probe).sum())(x)
        assert_close(got, want, scale=4)
        got = mx.vjp(lambda v: native.gelu(v, tanh=tanh), [x], [probe])[1][0]
        assert_close(got, want, scale=4)
    # edge values: the same NaN (±inf: inf·0, as autodiff of the definition) and values; at
    # ±3e38 the slope is the true 1 and 0 (MLX's erf vjp overflows to NaN there, x² = inf)
    x = mx.array([EDGES])
    g = np.array(mx.grad(lambda v: (native.gelu(v, tanh=tanh) * (1 + mx.arange(v.size))).sum())(x))[0]
    want = np.array(mx.grad(lambda v: (definition(v, approximate=approximate) * (1 + mx.arange(v.size))).sum())(x))[0]
    huge = [EDGES.index(3e38), EDGES.index(-3e38)]
    assert g[huge[0]] == 1 + huge[0] and g[huge[1]] == 0.0
    keep = [i for i in range(len(EDGES)) if i not in huge]
    assert (np.isnan(g[keep]) == np.isnan(want[keep])).all() and np.isnan(g[-3:]).all()
    np.testing.assert_allclose(g[keep], want[keep], rtol=1e-5, atol=1e-30)


def test_gelu_falls_back_without_the_primitives(native, monkeypatch):
    x = _sample((3, 50, 16), 81)
    with_native = ops.gelu(x), ops.gelu(x, approximate="tanh")
    monkeypatch.setattr(native, "gelu", None)  # would fail if called
    monkeypatch.setattr(_native, "on_cpu", lambda: None)
    without = ops.gelu(x), ops.gelu(x, approximate="tanh")
    for a, b in zip(with_native, without):
        assert_close(a, b, scale=2)


DIRECT = [  # kernel, stride, padding, dilation, input (N, H, W, C), C_out
    ((3, 3), (1, 1), (1, 1), (1, 1), (2, 13, 29, 16), 16),   # edge pixels, full tiles, a remainder
    ((3, 3), (2, 2), (1, 1), (1, 1), (1, 17, 12, 3), 32),    # an RGB stride-2 stem
    ((3, 3), (1, 1), (1, 1), (1, 1), (1, 9, 31, 8), 112),    # blocks of 64, 32 and 16 channels
    ((7, 7), (2, 2), (3, 3), (1, 1), (1, 23, 20, 3), 64),    # ResNet's stem
    ((3, 2), (2, 3), (0, 1), (1, 1), (2, 11, 13, 5), 48),    # non-square, unpadded rows
    ((3, 3), (1, 2), (2, 2), (2, 3), (1, 15, 16, 4), 16),    # dilated
    ((5, 5), (1, 1), (2, 2), (1, 1), (1, 3, 4, 6), 16),      # a map smaller than the kernel
]


def _conv_reference(x, w, b, s, p, d, act):
    y = mx.conv2d(x, w, stride=s, padding=p, dilation=d)
    y = y if b is None else y + b
    return y * mx.sigmoid(y) if act else y


@pytest.mark.parametrize("k,s,p,d,shape,c_out", DIRECT)
def test_direct_conv_equals_mx_conv2d(native, k, s, p, d, shape, c_out):
    x = mx.random.normal(shape, key=mx.random.key(20))
    w = mx.random.normal((c_out, *k, shape[-1]), key=mx.random.key(21)) * 0.3
    b = mx.random.normal((c_out,), key=mx.random.key(22))
    for bias in (b, None):
        for act in (False, True):
            got = native.direct_conv2d(x, w, bias, s, p, d, act)
            want = _conv_reference(x, w, bias, s, p, d, act)
            assert got.shape == want.shape
            np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=2e-5)
    # a non-contiguous input (a transposed view) is read correctly too
    xt = x.transpose(0, 2, 1, 3)
    np.testing.assert_allclose(np.array(native.direct_conv2d(xt, w, b, s, p, d, True)),
                               np.array(_conv_reference(xt, w, b, s, p, d, True)), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("k,s,p,d,shape,c_out", DIRECT[:3] + DIRECT[5:6])
def test_direct_conv_gradients(native, k, s, p, d, shape, c_out):
    x = mx.random.normal(shape, key=mx.random.key(23))
    w = mx.random.normal((c_out, *k, shape[-1]), key=mx.random.key(24)) * 0.3
    b = mx.random.normal((c_out,), key=mx.random.key(25))
    probe = mx.random.normal(_conv_reference(x, w, b, s, p, d, True).shape, key=mx.random.key(26))
    for act in (False, True):
        got = mx.grad(lambda *a: (native.direct_conv2d(*a, s, p, d, act) * probe).sum(), (0, 1, 2))(x, w, b)
        want = mx.grad(lambda *a: (_conv_reference(*a, s, p, d, act) * probe).sum(), (0, 1, 2))(x, w, b)
        for g, r in zip(got, want):
            np.testing.assert_allclose(np.array(g), np.array(r), rtol=1e-4, atol=1e-4)


def test_direct_conv_rejects_what_it_cannot_run(native):
    x = mx.zeros((1, 8, 8, 4))
    with pytest.raises(ValueError, match="C_out a multiple of 16"):
        native.direct_conv2d(x, mx.zeros((24, 3, 3, 4)), None, (1, 1), (1, 1), (1, 1), False)
    with pytest.raises(ValueError, match=r"\(C_out, KH, KW, C\) weight"):
        native.direct_conv2d(x, mx.zeros((16, 3, 3, 5)), None, (1, 1), (1, 1), (1, 1), False)
    with pytest.raises(ValueError, match="does not fit"):
        native.direct_conv2d(x, mx.zeros((16, 11, 11, 4)), None, (1, 1), (1, 1), (1, 1), False)


def test_conv2d_takes_the_direct_conv_where_it_fits(native, monkeypatch):
    monkeypatch.setattr(conv_cpu, "_direct_conv_tuned", lambda: True)  # the rules where it is tuned
    calls = []
    direct = native.direct_conv2d
    monkeypatch.setattr(native, "direct_conv2d", lambda *a: calls.append((a[1].shape, a[-1])) or direct(*a))
    x = mx.random.normal((1, 20, 20, 32), key=mx.random.key(27))
    w = mx.random.normal((32, 3, 3, 32), key=mx.random.key(28)) * 0.1
    b = mx.random.normal((32,), key=mx.random.key(29))
    got = ops.conv2d(x, w, b, padding=1, activation="silu")
    np.testing.assert_allclose(np.array(got), np.array(_conv_reference(x, w, b, 1, 1, 1, True)), rtol=1e-5, atol=2e-5)
    assert calls == [((32, 3, 3, 32), True)]
    # not for: C_out off 16s, float16, grouped convs, wide channels without a SiLU (3×3 and 1×1)
    ops.conv2d(x, w[:24], padding=1)
    ops.conv2d(x.astype(mx.float16), w.astype(mx.float16), padding=1)
    ops.conv2d(x, w[:, :, :, :16], groups=2, padding=1)
    ops.conv2d(mx.zeros((1, 8, 8, 128)), mx.zeros((128, 3, 3, 128)), padding=1)
    ops.conv2d(mx.zeros((1, 8, 8, 128)), mx.zeros((128, 1, 1, 128)))
    assert len(calls) == 1
    # without an activation too, and the SiLU of other paths still gets the bias
    ops.conv2d(x, w, b, padding=1)
    assert len(calls) == 2
    got = ops.conv2d(x, w[:24], b[:24], padding=1, activation="silu")
    np.testing.assert_allclose(np.array(got), np.array(_conv_reference(x, w[:24], b[:24], 1, 1, 1, True)),
                               rtol=1e-5, atol=2e-5)


def test_direct_conv_reads_channel_parts_in_place(native):
    parts = [mx.random.normal((2, 9, 7, c), key=mx.random.key(30 + c)) for c in (3, 16, 5)]
    w = mx.random.normal((48, 3, 3, 24), key=mx.random.key(33)) * 0.2
    b = mx.random.normal((48,), key=mx.random.key(34))
    whole = mx.concatenate(parts, axis=-1)
    got = native.direct_conv2d(parts, w, b, (2, 1), (1, 1), (1, 1), True)
    np.testing.assert_allclose(np.array(got), np.array(_conv_reference(whole, w, b, (2, 1), 1, 1, True)),
                               rtol=1e-5, atol=2e-5)
    # the parts' gradients are the concatenation's, split
    probe = mx.random.normal(got.shape, key=mx.random.key(35))
    grads = mx.grad(lambda ps: (native.direct_conv2d(ps, w, b, (2, 1), (1, 1), (1, 1), True) * probe).sum())(parts)
    want = mx.grad(lambda x: (_conv_reference(x, w, b, (2, 1), 1, 1, True) * probe).sum())(whole)
    np.testing.assert_allclose(np.array(mx.concatenate(grads, axis=-1)), np.array(want), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="parts of the same N, H, W"):
        native.direct_conv2d([parts[0], parts[1][:, :8]], w[:, :, :, :19], None, (1, 1), (1, 1), (1, 1), False)


def test_the_direct_conv_runs_only_where_its_tiles_fit_the_registers(native, monkeypatch):
    """Its register tiles are written for AVX-512 and AVX2 (most users' x86 CPUs); on older x86
    CPUs the other formulations run."""
    calls = []
    direct = native.direct_conv2d
    monkeypatch.setattr(native, "direct_conv2d", lambda *a: calls.append(a[1].shape) or direct(*a))
    x, w = mx.random.normal((1, 20, 20, 32)), mx.random.normal((32, 3, 3, 32)) * 0.1
    for level, taken in (("x86-64-v2", 0), ("x86-64-v3", 1), ("x86-64-v4", 2)):
        monkeypatch.setattr(conv_cpu._native, "instruction_set", lambda level=level: level)
        conv_cpu._direct_conv_tuned.cache_clear()
        got = ops.conv2d(x, w, padding=1, activation="silu")
        np.testing.assert_allclose(np.array(got), np.array(_conv_reference(x, w, None, 1, 1, 1, True)),
                                   rtol=1e-5, atol=2e-5)
        assert len(calls) == taken, level
    conv_cpu._direct_conv_tuned.cache_clear()


def test_convs_ending_in_a_silu_take_the_direct_conv_at_any_width(native, monkeypatch):
    monkeypatch.setattr(conv_cpu, "_direct_conv_tuned", lambda: True)  # the rules where it is tuned
    calls = []
    direct = native.direct_conv2d
    monkeypatch.setattr(native, "direct_conv2d", lambda *a: calls.append(a[1].shape) or direct(*a))
    x = mx.random.normal((1, 20, 20, 128), key=mx.random.key(36))
    w3, w1 = mx.random.normal((128, 3, 3, 128)) * 0.05, mx.random.normal((48, 1, 1, 192)) * 0.1
    b = mx.random.normal((48,))
    parts = [x, x[..., :64]]
    ops.conv2d(x, w3, padding=1)  # wide, no SiLU: a GEMM formulation
    ops.pointwise_conv_of_concat(parts, w1, b)
    assert calls == []
    y3 = ops.conv2d(x, w3, padding=1, activation="silu")
    y1 = ops.pointwise_conv_of_concat(parts, w1, b, activation="silu")
    ops.conv2d(x, w3[:24], padding=1, activation="silu")  # C_out off 16s still cannot
    assert calls == [(128, 3, 3, 128), (48, 1, 1, 192)]
    np.testing.assert_allclose(np.array(y3), np.array(_conv_reference(x, w3, None, 1, 1, 1, True)), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.array(y1), np.array(_conv_reference(mx.concatenate(parts, -1), w1, b, 1, 0, 1, True)),
                               rtol=1e-4, atol=1e-4)
    assert len(calls) == 2


_PROBE = """
import warnings
warnings.simplefilter("always")
import mlxnet, mlx.core as mx
from mlxnet import _native, ops
mlxnet.use_device("cpu")
x = mx.random.normal((1, 12, 12, 4), key=mx.random.key(0))
w = mx.random.normal((8, 3, 3, 4), key=mx.random.key(1))
diff = mx.abs(ops.conv2d(x, w, stride=2, padding=1) - mx.conv2d(x, w, stride=2, padding=1)).max()
print(_native.module() is None, float(diff), mlxnet.native_info(), sep="|")
"""


def _probe(tmp_path, **env) -> tuple[list[str], str]:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), **env})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split("|"), out.stderr


def test_without_the_primitives_the_composed_paths_run(tmp_path):
    (none, diff, why), _ = _probe(tmp_path, MLXNET_NATIVE="off")
    assert none == "True" and float(diff) < 1e-4 and why == "off (MLXNET_NATIVE=off)"
    # a compiler that fails: one warning naming the build log, the same results
    (none, diff, why), err = _probe(tmp_path, CXX="false")
    assert none == "True" and float(diff) < 1e-4
    assert why.startswith("building cpu_ops.cpp failed: see ") and why.endswith("build.log")
    assert "CPU primitives unavailable" in err
    assert not list((tmp_path / "cache" / "mlxnet" / "native").glob("*/*.so"))  # nothing half-built is kept


@pytest.fixture(scope="module")
def fresh_build(tmp_path_factory) -> tuple[Path, str]:
    """A first build into an empty cache (a folder of its own), and what it reported."""
    home = tmp_path_factory.mktemp("native-home")
    (none, diff, why), _ = _probe(home)
    assert none == "False" and float(diff) < 1e-4 and why.startswith("on (")
    return home, why


def test_the_build_is_cached_per_machine(fresh_build):
    home, why = fresh_build
    built = list((home / "cache" / "mlxnet" / "native").glob("*/mlxnet_cpu_ops*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    (none, _, why_again), _ = _probe(home)
    assert none == "False" and why_again == why and built[0].stat().st_mtime_ns == stamp


# Each case is a full rebuild (half a minute on 2 cores): they run with the slow tests; the default
# run still builds once (fresh_build) and checks that the build is cached per machine (above).
@pytest.mark.parametrize("damage", [pytest.param("truncate", marks=pytest.mark.slow),
                                    pytest.param("empty", marks=pytest.mark.slow)])
def test_a_damaged_cached_build_is_rebuilt_with_a_note(fresh_build, tmp_path, damage):
    shutil.copytree(fresh_build[0] / "cache", tmp_path / "cache")  # the first build, not a second one
    why = fresh_build[1].replace(str(fresh_build[0]), str(tmp_path))
    (built,) = (tmp_path / "cache" / "mlxnet" / "native").glob("*/mlxnet_cpu_ops*.so")
    data = built.read_bytes()
    built.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"")
    (none, diff, why_again), err = _probe(tmp_path)
    assert none == "False" and float(diff) < 1e-4 and why_again == why
    assert "do not match their record" in err and built.stat().st_size == len(data)


def test_the_build_targets_the_cpus_instruction_set_level():
    level = mlxnet._native.instruction_set()
    commands = mlxnet._native._commands(mlxnet._native._toolchain(), Path("a.cpp"), Path("w"), Path("t.so"))
    flat = " ".join(" ".join(c) for c in commands)
    assert "-march=native" not in flat
    if level.startswith("x86-64"):
        assert f"-march={level}" in flat


@pytest.mark.parametrize("k,s,p,d,shape", GEOMETRIES)
def test_col2im_is_the_adjoint_of_im2col(native, k, s, p, d, shape):
    """<im2col(x), P> = <x, col2im(P)> for any x and patches P: col2im sums every patch entry
    back onto the pixel it was copied from."""
    x = mx.random.normal(shape, key=mx.random.key(40))
    patches = mx.random.normal(native.im2col(x, k, s, p, d).shape, key=mx.random.key(41))
    back = native.col2im(patches, shape[1:3], k, s, p, d)
    assert back.shape == x.shape
    lhs = float((native.im2col(x, k, s, p, d) * patches).sum())
    rhs = float((x * back).sum())
    assert abs(lhs - rhs) <= 1e-4 * max(1.0, abs(lhs))
    # and it is the numpy scatter-add of the patches
    want = np.zeros((shape[0], shape[1] + 2 * p[0], shape[2] + 2 * p[1], shape[3]), np.float64)
    cols = np.array(patches, np.float64).reshape(*patches.shape[:3], k[0] * k[1], shape[3])
    oh, ow = patches.shape[1:3]
    for t, (i, j) in enumerate((i, j) for i in range(k[0]) for j in range(k[1])):
        want[:, i * d[0]: i * d[0] + s[0] * (oh - 1) + 1: s[0], j * d[1]: j * d[1] + s[1] * (ow - 1) + 1: s[1]] += cols[:, :, :, t]
    want = want[:, p[0]: p[0] + shape[1], p[1]: p[1] + shape[2]]
    np.testing.assert_allclose(np.array(back), want, rtol=1e-5, atol=1e-5)


def test_col2im_refuses_patches_that_do_not_fit(native):
    with pytest.raises(ValueError, match="do not match"):
        native.col2im(mx.zeros((1, 4, 4, 27)), (9, 9), (3, 3), (1, 1), (1, 1), (1, 1))
    with pytest.raises(ValueError, match="float32"):
        native.col2im(mx.zeros((1, 4, 4, 27), dtype=mx.float16), (8, 8), (3, 3), (2, 2), (1, 1), (1, 1))


BN_SHAPES = [(2, 5, 7, 3), (1, 9, 11, 32), (3, 13, 24), (130, 16), (1, 1, 1, 4)]


@pytest.mark.parametrize("shape", BN_SHAPES)
@pytest.mark.parametrize("act", [None, "silu"])
def test_batch_norm_train_primitive_equals_the_definition(native, shape, act):
    """Outputs (y, mean, biased var) and the gradient of every input, with cotangents on all
    three outputs (the statistics' own included), against the definition's autodiff."""
    from mlxnet.ops.norm import definition

    key = mx.random.key(50)
    x = mx.random.normal(shape, key=key) * 3 + 1.5
    w = mx.random.normal(shape[-1:], key=mx.random.key(51))
    b = mx.random.normal(shape[-1:], key=mx.random.key(52))
    got = native.batch_norm_train(x, w, b, 1e-3, act == "silu")
    want = definition.batch_norm_train(x, w, b, eps=1e-3, activation=act)
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.array(g), np.array(r), rtol=2e-5, atol=2e-5)
    probes = [mx.random.normal(a.shape, key=mx.random.key(53 + i)) for i, a in enumerate(want)]

    def weighted(f):
        return lambda *a: sum((o * p).sum() for o, p in zip(f(*a), probes))
    grads = mx.grad(weighted(lambda *a: native.batch_norm_train(*a, 1e-3, act == "silu")), (0, 1, 2))(x, w, b)
    ref = mx.grad(weighted(lambda *a: definition.batch_norm_train(*a, eps=1e-3, activation=act)), (0, 1, 2))(x, w, b)
    for g, r in zip(grads, ref):
        scale = float(mx.abs(r).max()) or 1.0
        np.testing.assert_allclose(np.array(g), np.array(r), rtol=1e-4, atol=1e-5 * scale)


def test_batch_norm_train_cpu_face_takes_the_primitive_for_float32_unsynchronised(native, monkeypatch):
    calls = []
    bn = native.batch_norm_train
    monkeypatch.setattr(native, "batch_norm_train", lambda *a: calls.append(a[0].dtype) or bn(*a))
    x = mx.random.normal((2, 4, 4, 8), key=mx.random.key(60))
    w, b = mx.ones((8,)), mx.zeros((8,))
    ops.batch_norm_train(x, w, b, activation="silu")
    ops.batch_norm_train(x.astype(mx.bfloat16), w, b)
    assert calls == [mx.float32]


# conv2d's CPU face is differentiated by GEMMs (mlxnet.ops.conv.cpu_grad): every formulation the
# forward takes, strided, dilated, 1×1, with and without bias, against MLX's own conv gradients.
CONV_GRADS = [  # weight (C_out, KH, KW, C), stride, padding, dilation, input
    ((16, 3, 3, 3), 2, 1, 1, (2, 33, 30, 3)),       # a stem: im2col forward, col2im backward
    ((24, 3, 3, 16), 1, 1, 1, (2, 60, 50, 16)),     # stride 1, large map: shifted GEMMs, flipped conv back
    ((8, 3, 3, 48), 1, 1, 1, (1, 20, 22, 48)),      # few outputs: taps then shift
    ((16, 3, 3, 8), 1, 2, 2, (1, 19, 21, 8)),       # dilated
    ((32, 1, 1, 16), 1, 0, 1, (2, 12, 9, 16)),      # 1×1: one GEMM each way
    ((32, 1, 1, 16), 2, 0, 1, (2, 12, 9, 16)),      # strided 1×1
    ((12, 5, 3, 7), (2, 1), (2, 0), 1, (1, 17, 14, 7)),  # uneven kernel, stride and padding
    ((16, 3, 3, 16), 1, 0, 1, (1, 8, 8, 16)),       # no padding
]


@pytest.mark.parametrize("wshape,s,p,d,shape", CONV_GRADS)
def test_conv2d_cpu_gradients_equal_mlx_conv_gradients(native, wshape, s, p, d, shape):
    x = mx.random.normal(shape, key=mx.random.key(70))
    w = mx.random.normal(wshape, key=mx.random.key(71)) * 0.2
    b = mx.random.normal(wshape[:1], key=mx.random.key(72))
    y = mx.conv2d(x, w, stride=s, padding=p, dilation=d)
    probe = mx.random.normal(y.shape, key=mx.random.key(73))
    for bias in (b, None):
        args = (x, w) if bias is None else (x, w, bias)
        got = mx.grad(lambda *a: (ops.conv2d(*a, stride=s, padding=p, dilation=d) * probe).sum(),
                      tuple(range(len(args))))(*args)
        ref = mx.grad(lambda *a: ((mx.conv2d(*a[:2], stride=s, padding=p, dilation=d)
                                   + (a[2] if len(a) > 2 else 0)) * probe).sum(), tuple(range(len(args))))(*args)
        for g, r in zip(got, ref):
            np.testing.assert_allclose(np.array(g), np.array(r), rtol=1e-4, atol=1e-4 * float(mx.abs(r).max()))


def test_pointwise_conv_of_parts_gradients(native):
    parts = [mx.random.normal((2, 7, 9, c), key=mx.random.key(80 + c)) for c in (8, 16, 3)]
    w = mx.random.normal((32, 1, 1, 27), key=mx.random.key(90))
    b = mx.random.normal((32,), key=mx.random.key(91))
    probe = mx.random.normal((2, 7, 9, 32), key=mx.random.key(92))
    got = mx.grad(lambda ps, w, b: (ops.pointwise_conv_of_concat(ps, w, b) * probe).sum(), (0, 1, 2))(parts, w, b)
    ref = mx.grad(lambda ps, w, b: ((mx.conv2d(mx.concatenate(ps, axis=-1), w) + b) * probe).sum(),
                  (0, 1, 2))(parts, w, b)
    for g, r in zip([*got[0], *got[1:]], [*ref[0], *ref[1:]]):
        np.testing.assert_allclose(np.array(g), np.array(r), rtol=1e-4, atol=1e-4 * float(mx.abs(r).max()))
