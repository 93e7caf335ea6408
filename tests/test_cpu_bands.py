"""Ops whose CPU face splits work into bands on several CPU streams (mlxnet.ops.core.cpu_bands)
give exactly what they give whole: depthwise convs and attention, with three streams forced
(uneven bands, whatever this machine's core count), against MLX's conv and the attention's
definition."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlxnet
from mlxnet import ops
from mlxnet.ops.attention.definition import scaled_dot_product_attention as attention_definition
from mlxnet.ops.conv.cpu import _DEPTHWISE_BAND
from mlxnet.ops.core import cpu_bands


@pytest.fixture
def three_streams(monkeypatch):
    streams = tuple(mx.new_stream(mx.cpu) for _ in range(3))
    monkeypatch.setattr(cpu_bands, "_streams", lambda: streams)
    with mlxnet.use_device("cpu"):
        yield


@pytest.mark.parametrize("shape,stride,dilation,bias", [
    ((1, 97, 64, 96), 1, 1, True), ((2, 121, 80, 64), 2, 1, False), ((1, 83, 50, 80), 1, 2, True),
    ((3, 240, 18, 128), 2, 2, True)])
def test_depthwise_conv_in_bands(three_streams, shape, stride, dilation, bias):
    c = shape[-1]
    keys = mx.random.split(mx.random.key(3), 3)
    x, w = mx.random.normal(shape, key=keys[0]), mx.random.normal((c, 3, 3, 1), key=keys[1])
    b = mx.random.normal((c,), key=keys[2]) if bias else None
    got = ops.conv2d(x, w, b, stride=stride, padding=1, dilation=dilation, groups=c)
    want = mx.conv2d(x, w, stride=stride, padding=1, dilation=dilation, groups=c)
    want = want if b is None else want + b
    assert got.shape == want.shape
    assert cpu_bands.band_count(want.size, _DEPTHWISE_BAND) > 1  # big enough for the banded path
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("q_shape,kv_shape,bias_shape", [
    ((338, 2, 49, 64), (338, 2, 49, 64), (1, 2, 49, 49)),      # TinyViT's windows, one bias per head
    ((1, 8, 4096, 16), (1, 8, 7, 16), None),                   # SAM's image-to-token attention: heads split
    ((8, 4096, 16), (1, 8, 7, 16), (7,)),                      # q without the batch axis, a bias per key
    ((40, 3, 64, 8), (64, 8), (2, 1, 3, 64, 64)),              # bias with a leading axis of its own
])
def test_attention_in_bands(three_streams, q_shape, kv_shape, bias_shape):
    keys = mx.random.split(mx.random.key(4), 4)
    q, k, v = (mx.random.normal(s, key=key) for s, key in zip((q_shape, kv_shape, kv_shape), keys))
    bias = None if bias_shape is None else mx.random.normal(bias_shape, key=keys[3])
    got = ops.scaled_dot_product_attention(q, k, v, bias, scale=0.3)
    want = attention_definition(q, k, v, bias, scale=0.3)
    assert got.shape == want.shape
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-6)


def test_no_bands_inside_a_compiled_trace(three_streams):
    """A compiled forward's trace runs the op whole (mlxnet.device.tracing)."""
    from mlxnet.device import tracing

    with tracing():
        assert cpu_bands.band_count(10**9, 1) == 1
    assert cpu_bands.band_count(10**9, 1) == 3
    assert cpu_bands.band_count(5, 2) == 2


def test_bands_on_other_threads():
    """MLX's streams belong to the thread that made them: each thread gets its own (mlxnet app
    runs its models on a worker thread)."""
    import threading

    with mlxnet.use_device("cpu"):
        x, w = mx.random.normal((1, 128, 128, 64), key=mx.random.key(5)), mx.random.normal((64, 3, 3, 1))
        want = np.array(ops.conv2d(x, w, padding=1, groups=64))
    got: list[np.ndarray] = []

    def work() -> None:
        with mlxnet.use_device("cpu"):
            got.append(np.array(ops.conv2d(x, w, padding=1, groups=64)))
    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 2 and all(np.array_equal(g, want) for g in got)
