"""The NHWC rfft2 / irfft2 (DFT GEMMs for small maps, mx.fft otherwise) against numpy."""
from __future__ import annotations

import mlxnet  # noqa: F401  (gives MLX OpenBLAS on Linux)
import mlx.core as mx
import numpy as np
import pytest

from mlxnet.errors import MlxnetError
from mlxnet.ops import fft

SHAPES = [(1, 8, 8, 3), (2, 7, 10, 5), (1, 9, 15, 4), (1, 64, 64, 6), (1, 130, 12, 2)]  # last: FFT path


def check_against_numpy(shape: tuple, norm: str, tol: float, monkeypatch) -> None:
    if max(shape[1:3]) <= 128:  # these must be the DFT GEMMs, not a pass-through to mx.fft
        def no_fft(*a, **k):
            raise AssertionError("mx.fft called for a map the DFT path covers")
        monkeypatch.setattr(mx.fft, "rfft2", no_fft)
        monkeypatch.setattr(mx.fft, "irfft2", no_fft)
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    got = np.array(fft.rfft2(mx.array(x), norm=norm))
    want = np.fft.rfft2(x.astype(np.float64), axes=(1, 2), norm=norm)
    assert got.shape == want.shape and got.dtype == np.complex64
    np.testing.assert_allclose(got, want, atol=tol * np.abs(want).max())
    planes = np.array(fft.rfft2_planar(mx.array(x), norm=norm))  # (N, H, K, 2, C)
    assert planes.dtype == np.float32
    np.testing.assert_allclose(planes, np.stack([want.real, want.imag], 3), atol=tol * np.abs(want).max())
    # any spectrum, not only a Hermitian one: the inverse ignores what irfft2 ignores
    spec = (rng.standard_normal(want.shape) + 1j * rng.standard_normal(want.shape)).astype(np.complex64)
    back = np.array(fft.irfft2(mx.array(spec), s=shape[1:3], norm=norm))
    ref = np.fft.irfft2(spec.astype(np.complex128), s=shape[1:3], axes=(1, 2), norm=norm)
    assert back.shape == shape and back.dtype == np.float32
    np.testing.assert_allclose(back, ref, atol=tol * np.abs(ref).max())
    back = np.array(fft.irfft2_planar(mx.array(np.stack([spec.real, spec.imag], 3)), s=shape[1:3], norm=norm))
    np.testing.assert_allclose(back, ref, atol=tol * np.abs(ref).max())


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
def test_rfft2_and_irfft2_match_numpy(shape, norm, monkeypatch):
    with mlxnet.use_device("cpu"):
        check_against_numpy(shape, norm, 2e-6, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES + [(8, 64, 64, 192)])
def test_rfft2_and_irfft2_match_numpy_on_gpu(gpu, shape, monkeypatch):
    # CUDA runs float32 GEMMs as TF32 (float16's 10-bit mantissa) by MLX's default
    check_against_numpy(shape, "ortho", 2e-3 if gpu == "cuda" else 2e-6, monkeypatch)


def test_round_trip_and_bad_arguments():
    x = mx.random.normal((1, 12, 16, 3))
    with mlxnet.use_device("cpu"):
        y = fft.irfft2(fft.rfft2(x, norm="ortho"), s=(12, 16), norm="ortho")
        assert mx.abs(y - x).max().item() < 1e-5
        with pytest.raises(MlxnetError, match="norm must be one of"):
            fft.rfft2(x, norm="unitary")
        for s in ((12, 20), (12, 200)):  # both paths
            with pytest.raises(MlxnetError, match=rf"a spectrum of 12×9 does not give an 12×{s[1]} map"):
                fft.irfft2(fft.rfft2(x), s=s)
            with pytest.raises(MlxnetError, match=rf"a spectrum of 12×9 does not give an 12×{s[1]} map"):
                fft.irfft2_planar(fft.rfft2_planar(x), s=s)


@pytest.mark.parametrize("side", [8, 64, 100])
def test_dense_dft_matrices_lay_out_rows_whole_multiples_of_16_bytes(side):
    """Every GEMM operand's leading dimension is a multiple of 4 floats: the inverse along W,
    (2W, 2K) with 2K = W + 2 columns, is kept as the transpose of a row-major (2K, 2W) array,
    whose leading dimension is 2W (cuBLAS picks kernels several times slower for an odd one)."""
    from mlxnet.ops.fft.definition import _matrices
    for m in _matrices(side, side, "ortho"):
        row, col = (s // 4 for s in memoryview(m).strides)
        transposed = col > row
        assert (row, col) == ((1, m.shape[0]) if transposed else (m.shape[1], 1))
        assert (m.shape[0] if transposed else m.shape[1]) % 4 == 0, (m.shape, transposed)
