"""The C++ CPU primitives behind layer_norm and few-key attention (custom_kernels/cpu_ops.cpp):
equal to float64 references and to the definitions, on strided and broadcast inputs, with the
definitions' gradients, and taken by the ops' CPU faces exactly where they are meant to run."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxnet import ops

from test_native import BUILDABLE, native  # noqa: F401 - the fixture, shared

pytestmark = pytest.mark.skipif(not BUILDABLE, reason="the CPU primitives are built on Linux with g++ and nanobind")


def _sample(shape, key, scale=3.0):
    return mx.random.normal(shape, key=mx.random.key(key)) * scale


def _layer_norm64(x, w=None, b=None, eps=1e-5):
    x = np.array(x).astype(np.float64)
    y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
    if w is not None:
        y = y * np.array(w)
    return y if b is None else y + np.array(b)


def _assert_attention(got, q, k, v, scale, tol=1e-5):
    """Within float32 rounding of the float64 attention (scores of a few units carry ~1e-6
    relative error into the weights, so the tolerance is relative to the outputs' size)."""
    want = _attention64(q, k, v, scale)
    np.testing.assert_allclose(np.array(got), want, rtol=tol, atol=tol * np.abs(want).max())


def _attention64(q, k, v, scale):
    q, k, v = (np.array(a).astype(np.float64) for a in (q, k, v))
    s = (q * scale) @ np.swapaxes(k, -1, -2)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


LN_SHAPES = [(3,), (2, 7, 256), (1001, 37), (4, 5, 64), (1, 128, 128, 64)]


@pytest.mark.parametrize("shape", LN_SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_equals_the_float64_reference(native, shape, affine):
    x = _sample(shape, 1) + 5.0  # an offset mean: the two-pass variance has no cancellation
    w, b = (_sample(shape[-1:], 2), _sample(shape[-1:], 3)) if affine else (None, None)
    got = native.layer_norm(x, w, b, 1e-6)
    np.testing.assert_allclose(np.array(got), _layer_norm64(x, w, b, 1e-6), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.array(got), np.array(ops.layer_norm.op.definition(x, w, b, eps=1e-6)),
                               rtol=1e-5, atol=1e-5)


def test_layer_norm_reads_views_and_keeps_what_the_definition_keeps(native):
    x = _sample((6, 40, 33), 4)
    for v in (x.transpose(1, 0, 2), x[:, ::3, ::2], mx.broadcast_to(x[:1, :1], (5, 7, 33)), x[::-1]):
        np.testing.assert_allclose(np.array(native.layer_norm(v)), _layer_norm64(v), rtol=2e-5, atol=2e-5)
    inf, nan = float("inf"), float("nan")
    rows = mx.array([[2.0, 2.0, 2.0, 2.0], [1e30, -1e30, 0.0, 1.0], [nan, 1.0, 2.0, 3.0], [inf, 1.0, 2.0, 3.0]])
    got, want = np.array(native.layer_norm(rows, eps=1e-5)), np.array(ops.layer_norm.op.definition(rows))
    assert (np.isnan(got) == np.isnan(want)).all() and np.isnan(got[2:]).all()
    np.testing.assert_array_equal(got[0], 0.0)  # a constant row: (x − mean) = 0, eps keeps it finite
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)


def test_layer_norm_gradients_are_the_definitions(native):
    x, w, b = _sample((5, 3, 33), 5), _sample((33,), 6), _sample((33,), 7)
    cot = _sample((5, 3, 33), 8)
    loss = (lambda f: lambda *a: (f(*a) * cot).sum())
    got = mx.grad(loss(lambda x, w, b: native.layer_norm(x, w, b, 1e-5)), argnums=(0, 1, 2))(x, w, b)
    want = mx.grad(loss(lambda x, w, b: ops.layer_norm.op.definition(x, w, b)), argnums=(0, 1, 2))(x, w, b)
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.array(g), np.array(r), rtol=1e-4, atol=1e-4)


def test_layer_norm_cpu_face_takes_the_primitive_for_float32_only(native, monkeypatch):
    calls = []
    fused = native.layer_norm
    monkeypatch.setattr(native, "layer_norm", lambda *a: calls.append(a[0].shape) or fused(*a))
    x = _sample((2, 9, 64), 9)
    w16 = mx.ones((64,), mx.float16)
    np.testing.assert_allclose(np.array(ops.layer_norm(x, w16, None, eps=1e-6)), _layer_norm64(x, eps=1e-6),
                               rtol=2e-5, atol=2e-5)
    assert calls == [(2, 9, 64)]
    assert ops.layer_norm(x.astype(mx.float16)).dtype == mx.float16 and len(calls) == 1
    with pytest.raises(ValueError, match="float32"):
        native.layer_norm(mx.zeros((3, 4), mx.bfloat16))


# (q leading, k leading, v leading, Lq, Lk, D, Dv): SAM's image-to-token attention, lane tails,
# fewer rows than a vector, broadcast leading axes, a different value width.
ATTENTION = [((1, 8), (1, 8), (1, 8), 4096, 7, 16, 16), ((2, 3), (2, 3), (2, 3), 37, 5, 16, 16),
             ((4,), (4,), (4,), 3, 9, 8, 8), ((3, 8), (1, 8), (8,), 70, 7, 16, 16),
             ((1, 2), (1, 2), (1, 2), 130, 16, 12, 24), ((5,), (5,), (5,), 64, 1, 16, 4)]


@pytest.mark.parametrize("ql,kl,vl,lq,lk,d,dv", ATTENTION)
def test_attention_equals_the_float64_reference(native, ql, kl, vl, lq, lk, d, dv):
    q, k, v = _sample((*ql, lq, d), 10), _sample((*kl, lk, d), 11), _sample((*vl, lk, dv), 12)
    got = native.attention(q, k, v, d ** -0.5)
    lead = np.broadcast_shapes(ql, kl, vl)
    assert got.shape == (*lead, lq, dv)
    _assert_attention(got, q, k, v, d ** -0.5)


def test_attention_reads_head_views_and_stays_stable(native):
    base = _sample((2, 50, 4, 16), 13)  # (batch, tokens, heads, width): heads split as a transposed view
    q = base.transpose(0, 2, 1, 3)
    k, v = _sample((2, 6, 4, 16), 14).transpose(0, 2, 1, 3), _sample((2, 4, 6, 16), 15)[..., ::-1, :]
    _assert_attention(native.attention(q, k, v, 0.25), q, k, v, 0.25)
    # Scores far beyond exp's range: the row's max is subtracted first, as the definition does.
    got = native.attention(q * 1e3, k, v, 1.0)
    assert np.isfinite(np.array(got)).all()
    _assert_attention(got, q * 1e3, k, v, 1.0, tol=1e-4)


def test_attention_gradients_are_the_definitions(native):
    q, k, v = _sample((2, 4, 40, 16), 16), _sample((1, 4, 7, 16), 17), _sample((2, 4, 7, 16), 18)
    cot = _sample((2, 4, 40, 16), 19)
    definition = ops.scaled_dot_product_attention.op.definition
    loss = (lambda f: lambda *a: (f(*a) * cot).sum())
    got = mx.grad(loss(lambda q, k, v: native.attention(q, k, v, 0.25)), argnums=(0, 1, 2))(q, k, v)
    want = mx.grad(loss(lambda q, k, v: definition(q, k, v, scale=0.25)), argnums=(0, 1, 2))(q, k, v)
    for g, r in zip(got, want):
        assert g.shape == r.shape
        np.testing.assert_allclose(np.array(g), np.array(r), rtol=1e-4, atol=1e-4)


def test_attention_refuses_what_it_cannot_run(native):
    with pytest.raises(ValueError, match="float32"):
        native.attention(*(mx.zeros((1, 4, 8), mx.float16) for _ in range(3)), 1.0)
    with pytest.raises(ValueError, match="Lk > 0"):
        native.attention(mx.zeros((1, 4, 8)), mx.zeros((1, 0, 8)), mx.zeros((1, 0, 8)), 1.0)
    with pytest.raises(ValueError, match="broadcastable"):
        native.attention(mx.zeros((1, 4, 8)), mx.zeros((1, 3, 7)), mx.zeros((1, 3, 8)), 1.0)


def test_attention_cpu_face_takes_the_primitive_for_few_keys_only(native, monkeypatch):
    calls = []
    fused = native.attention
    monkeypatch.setattr(native, "attention", lambda *a: calls.append(a[0].shape) or fused(*a))
    sdpa = ops.scaled_dot_product_attention
    image_to_token = [_sample((1, 8, 4096, 16), 20), _sample((1, 8, 7, 16), 21), _sample((1, 8, 7, 16), 22)]
    got = sdpa(*image_to_token, scale=0.25)
    assert calls == [(1, 8, 4096, 16)]
    _assert_attention(got, *image_to_token, 0.25)
    token_to_image = [image_to_token[1], image_to_token[0], image_to_token[0]]  # 7 queries, 4096 keys
    windows = [_sample((4, 49, 32), 23)] * 3  # TinyViT's windows: 49 keys, width 32
    with_bias = image_to_token + [_sample((1, 8, 4096, 7), 24)]
    for args in (token_to_image, windows, with_bias):
        sdpa(*args, scale=0.25)
    assert len(calls) == 1
    assert sdpa(*(a.astype(mx.float16) for a in image_to_token), scale=0.25).dtype == mx.float16 and len(calls) == 2


def test_elementwise_and_row_primitives_write_in_place_only_into_unshared_inputs(native):
    x = _sample((64, 33), 30)
    mx.eval(x)
    before = np.array(x)
    for f in (native.gelu, native.sigmoid, native.softmax, native.layer_norm, native.bias_silu):
        want = np.array(f(mx.array(before)))
        got = f(x)  # x is held here: its buffer must not be taken over
        mx.eval(got)
        np.testing.assert_array_equal(np.array(x), before)
        np.testing.assert_array_equal(np.array(got), want)
        # A temporary nobody else holds is taken over, with the same result.
        np.testing.assert_array_equal(np.array(f(x * 1)), want)
