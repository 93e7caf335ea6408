"""pad2d against PyTorch's F.pad ('reflect', 'replicate', 'constant') and numpy's np.pad
('symmetric'): values and gradients, negative pads (crops), empty batches, the argument rules
and their one-line errors. The GPU kernel's C is also compiled for this CPU and run over its
recorded launches, so its index arithmetic is checked without a GPU."""
from __future__ import annotations

import ctypes
import functools
import re
import shutil
import subprocess
import tempfile

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import mlxnet
from mlxnet import ops
from mlxnet.ops.core import kernel_source
from testutil import TOLERANCE

torch = pytest.importorskip("torch")
F = torch.nn.functional

DTYPES = [mx.float32, mx.float16, mx.bfloat16]
TORCH_DTYPES = {mx.float32: torch.float32, mx.float16: torch.float16, mx.bfloat16: torch.bfloat16}
definition = ops.pad2d.op.definition


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """The maps here are tiny: handing them to torch's thread pool costs more than the work."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _valid(shape: tuple, pads: tuple, mode: str) -> bool:
    """The rules, written from PyTorch's (and for 'symmetric' by analogy): the output is not
    negative; 'constant' crops at most the map; a padded axis must be non-empty, and reflect
    pads less than its size, symmetric at most it, replicate any width."""
    for size, lo, hi in ((shape[-3], *pads[:2]), (shape[-2], *pads[2:])):
        grow = max(lo, hi, 0)
        if size + lo + hi < 0 or (mode == "constant" and max(-lo, 0) + max(-hi, 0) > size):
            return False
        if grow and ((mode == "reflect" and grow >= size) or (mode == "symmetric" and grow > size)
                     or (mode == "replicate" and size == 0)):
            return False
    return True


def _to_torch(x: np.ndarray, dtype: mx.Dtype) -> "torch.Tensor":
    """NHWC (any leading dims) float32 values as an (N, C, H, W) tensor in ``dtype``."""
    t = torch.from_numpy(np.ascontiguousarray(x.reshape(-1, *x.shape[-3:])))
    return t.permute(0, 3, 1, 2).to(TORCH_DTYPES[dtype])


def _from_torch(t: "torch.Tensor", lead: tuple) -> np.ndarray:
    return t.detach().float().permute(0, 2, 3, 1).numpy().reshape(*lead, *t.shape[2:], t.shape[1])


def _symmetric_index(h: int, w: int, pads: tuple) -> np.ndarray:
    """Source pixel of every output pixel for 'symmetric': np.pad of the pixel numbers by the
    positive pads, then the negative ones cropping (F.pad's order for its modes)."""
    top, bottom, left, right = pads
    padded = np.pad(np.arange(h * w).reshape(h, w), [(max(top, 0), max(bottom, 0)), (max(left, 0), max(right, 0))],
                    mode="symmetric")
    rows, cols = padded.shape
    return padded[max(-top, 0):rows - max(-bottom, 0), max(-left, 0):cols - max(-right, 0)]


def reference(x: np.ndarray, pads: tuple, mode: str, cotangent: np.ndarray | None = None,
              dtype: mx.Dtype = mx.float32, value: float | None = None):
    """(output, gradient of sum(output * cotangent)) of NHWC ``x``: F.pad and torch autograd,
    or for 'symmetric' np.pad and the adjoint of its gather."""
    top, bottom, left, right = pads
    lead, (h, w, c) = x.shape[:-3], x.shape[-3:]
    if mode == "symmetric":
        index = _symmetric_index(h, w, pads)
        flat = x.reshape(*lead, h * w, c)
        out = flat[..., index.ravel(), :].reshape(*lead, *index.shape, c)
        if cotangent is None:
            return out, None
        grad = np.zeros_like(flat, dtype=np.float64)
        np.add.at(grad, (..., index.ravel(), slice(None)),
                  cotangent.reshape(*lead, -1, c).astype(np.float64))
        return out, grad.reshape(x.shape)
    t = _to_torch(x, dtype).requires_grad_(cotangent is not None)
    out = F.pad(t, (left, right, top, bottom), mode=mode, value=value)
    grad = None
    if cotangent is not None:
        (out * _to_torch(cotangent, dtype)).sum().backward()
        grad = _from_torch(t.grad, lead)
    return _from_torch(out, lead), grad


def _values(shape: tuple, dtype: mx.Dtype, seed: int = 0) -> np.ndarray:
    """Random values exactly representable in ``dtype`` (so both sides start equal)."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return np.array(mx.array(x).astype(dtype).astype(mx.float32))


def _mlx_pad_and_grad(x: np.ndarray, pads, mode, cotangent, dtype, value=None):
    xm, cm = mx.array(x).astype(dtype), mx.array(cotangent).astype(dtype)

    def loss(v):
        return (ops.pad2d(v, pads, mode, value) * cm).astype(mx.float32).sum()

    with mlxnet.use_device("cpu"):
        out = ops.pad2d(xm, pads, mode, value)
        grad = mx.grad(loss)(xm)
    assert out.dtype == dtype and grad.dtype == dtype
    return np.array(out.astype(mx.float32)), np.array(grad.astype(mx.float32))


def _check_against_reference(x, pads, mode, dtype, value=None, seed=1):
    top, bottom, left, right = pads
    out_shape = (*x.shape[:-3], x.shape[-3] + top + bottom, x.shape[-2] + left + right, x.shape[-1])
    cotangent = _values(out_shape, dtype, seed)
    want, want_grad = reference(x, pads, mode, cotangent, dtype, value)
    got, grad = _mlx_pad_and_grad(x, pads, mode, cotangent, dtype, value)
    np.testing.assert_array_equal(got, want)  # padding copies values, bit for bit
    tol = TOLERANCE[dtype] * 4  # a pixel read several times sums its cotangents
    np.testing.assert_allclose(grad, want_grad, rtol=tol, atol=tol * max(1.0, np.abs(want_grad).max()))


# (pads, modes that take them) on 5×6 maps; PyTorch's pad order is (left, right, top, bottom)
PADS = [((2, 1, 3, 0), "all"), ((0, 0, 0, 0), "all"), ((1, 1, -1, -2), "all"), ((-1, 2, 3, -2), "all"),
        ((-1, 0, 0, -2), "all"), ((4, 4, 5, 5), ("symmetric", "replicate", "constant")),
        ((7, 0, 1, 9), ("replicate", "constant")),
        # a crop of the whole axis (or more) with the other side padded: the pad's pixels remain,
        # read from the input beyond the crop (PyTorch's OpInfo samples have such pads)
        ((-5, 4, 2, -6), ("replicate",)), ((-7, 8, -6, 1), ("replicate",)),
        ((3, -5, -4, 5), ("reflect", "symmetric", "replicate")), ((4, -3, 0, 0), ("reflect", "symmetric"))]
MODES = ("reflect", "symmetric", "replicate", "constant")
CASES = [(pads, mode) for pads, modes in PADS for mode in MODES if modes == "all" or mode in modes]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pads, mode", CASES)
def test_values_and_gradients_match_torch(pads, mode, dtype):
    _check_against_reference(_values((2, 5, 6, 3), dtype), pads, mode, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_constant_value_matches_torch(dtype):
    x = _values((2, 5, 6, 3), dtype)
    for pads in [(2, 1, 3, 0), (-1, 2, 3, -2)]:
        _check_against_reference(x, pads, "constant", dtype, value=2.5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(5, 6, 2), (2, 3, 5, 6, 2)])
def test_unbatched_and_extra_leading_dims(mode, shape):
    _check_against_reference(_values(shape, mx.float32), (2, -1, 1, 3), mode, mx.float32)


@pytest.mark.parametrize("mode", MODES)
def test_empty_batch_pads_forward(mode):
    # forward only: a backward on an empty batch is the registry's to guard
    x = mx.zeros((0, 4, 5, 2))
    want, _ = reference(np.zeros((0, 4, 5, 2), np.float32), (2, -1, 1, 3), mode)
    with mlxnet.use_device("cpu"):
        for fn in (ops.pad2d, definition):
            out = fn(x, (2, -1, 1, 3), mode)
            mx.eval(out)
            assert out.shape == want.shape == (0, 5, 9, 2)


def test_a_crop_to_nothing_still_pads_the_other_axis():
    # all 6 columns cropped: the 8 padded rows hold no pixels, as in F.pad's output
    x = _values((1, 5, 6, 2), mx.float32)
    for mode in MODES:
        want, _ = reference(x, (1, 2, -6, 0), mode)
        with mlxnet.use_device("cpu"):
            assert ops.pad2d(mx.array(x), (1, 2, -6, 0), mode).shape == want.shape == (1, 8, 0, 2)


@pytest.mark.parametrize("x_shape, pads, mode, words", [
    ((2, 5, 6, 3), (1, 1, 1), "reflect", "pads must be 4 ints"),
    ((2, 5, 6, 3), (1, 1, 1, 1.5), "reflect", "pads must be 4 ints"),
    ((2, 5, 6, 3), (1, 1, 1, True), "replicate", "pads must be 4 ints"),
    ((2, 5, 6, 3), (1, 1, 1, 1), "wrap", "unknown mode 'wrap'"),
    ((2, 5, 6, 3), (-4, -2, 0, 0), "reflect", "crop 6 rows of a 5×6 map, which has only 5 (reflect mode)"),
    ((2, 5, 6, 3), (0, 0, -7, 1), "constant", "crop 7 columns of a 5×6 map"),
    ((2, 5, 6, 3), (5, 0, 0, 0), "reflect", "too wide to reflect-pad a 5×6 map"),
    ((2, 5, 6, 3), (0, 0, -2, 6), "reflect", "less than the 6 columns it pads"),
    ((2, 5, 6, 3), (-9, 3, 0, 0), "replicate", "crop 9 rows of a 5×6 map, which has only 5"),
    ((2, 5, 6, 3), (6, 0, 0, 0), "symmetric", "at most the 5 rows it pads"),
    ((2, 0, 6, 3), (1, 0, 0, 0), "replicate", "leave no rows to replicate in a 0×6 map"),
    ((2, 5, 6, 3), (1, 0, 0, 0), "reflect", "takes no value"),
    ((5, 6), (1, 0, 0, 0), "reflect", "must be an (..., H, W, C) array, got (5, 6)"),
])
def test_bad_calls_are_one_line_errors(x_shape, pads, mode, words):
    x = mx.zeros(x_shape)
    value = 1.0 if words == "takes no value" else None
    with mlxnet.use_device("cpu"):
        # every face refuses, before anything runs (the kernel face launches nothing here)
        for fn in (ops.pad2d, definition, ops.pad2d.op.kernel):
            with pytest.raises(mlxnet.MlxnetError) as caught:
                fn(x, pads, mode, value)
            message = str(caught.value)
            assert "\n" not in message and message.startswith("pad2d: ")
            assert words in message, message
            if not any(w in words for w in ("unknown mode", "takes no value", "array")):
                assert str(tuple(pads)) in message, message


def test_mlxnet_and_torch_accept_the_same_calls_with_the_same_values_on_a_sweep():
    # Pads from -6 to 6 on each side of a 3×4 map (crops of the whole axis and beyond
    # included): where F.pad gives a non-empty map, pad2d gives the same values; where F.pad
    # refuses, pad2d refuses in one line naming the pads. (F.pad also refuses some empty outputs
    # in 'reflect' and 'replicate', where pad2d returns the empty map, as 'constant' does.)
    # The axes are ruled independently: each axis's every pair beside a few of the other's.
    x = np.arange(12, dtype=np.float32).reshape(1, 3, 4, 1)
    t = _to_torch(x, mx.float32)
    pairs = [(a - 6, b - 6) for a in range(13) for b in range(13)]
    others = [(0, 0), (-4, 5), (2, -1), (-3, 0)]
    sweep = [(*rows, *cols) for rows in pairs for cols in others] + [(*rows, *cols) for rows in others for cols in pairs]
    for mode in ("reflect", "replicate", "constant"):
        for pads in sweep:
            if 3 + pads[0] + pads[1] < 0 or 4 + pads[2] + pads[3] < 0:
                continue  # a negative size: both refuse (checked by the hypothesis test)
            try:
                want = _from_torch(F.pad(t, (pads[2], pads[3], pads[0], pads[1]), mode=mode), (1,))
            except RuntimeError:
                want = None
            if want is None and mode != "constant" and (3 + pads[0] + pads[1]) * (4 + pads[2] + pads[3]) == 0:
                continue  # F.pad's refusal of an empty map
            assert _valid(x.shape, pads, mode) == (want is not None), (pads, mode)
            if want is None:
                with pytest.raises(mlxnet.MlxnetError, match=re.escape(str(pads))):
                    definition(mx.array(x), pads, mode)
            else:
                np.testing.assert_array_equal(np.array(definition(mx.array(x), pads, mode)), want,
                                              err_msg=f"{pads} {mode}")


# The kernel's C, compiled for this CPU: the shared header and body of pad.kern, each grid
# thread run in turn (a thread's early `return` ends only its own call), for 4- and 8-byte words.
_HOST_SHIM = """
#include <cstdint>
typedef unsigned int uint;
struct uint3 {{ uint x, y, z; }};
#define MX_FN static inline
{header}
template <typename T>
static void one_thread(const uint3 mx_tid, const T* x, const int* p, T* out) {{
{body}
}}
template <typename T>
static void grid(const T* x, const int* p, T* out, uint gx, uint gy, uint gz) {{
  for (uint z = 0; z < gz; ++z)
    for (uint y = 0; y < gy; ++y)
      for (uint i = 0; i < gx; ++i)
        one_thread(uint3{{i, y, z}}, x, p, out);
}}
extern "C" void run4(const uint32_t* x, const int* p, uint32_t* out, uint gx, uint gy, uint gz) {{
  grid(x, p, out, gx, gy, gz);
}}
extern "C" void run8(const uint64_t* x, const int* p, uint64_t* out, uint gx, uint gy, uint gz) {{
  grid(x, p, out, gx, gy, gz);
}}
"""
needs_cxx = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")


@functools.cache
def _host_kernel() -> ctypes.CDLL:
    header, bodies = kernel_source.read_source("pad.kern")
    folder = tempfile.TemporaryDirectory(prefix="mlxnet_pad_")
    source, library = f"{folder.name}/pad.cpp", f"{folder.name}/pad.so"
    with open(source, "w") as f:
        f.write(_HOST_SHIM.format(header=header, body=bodies["pad2d"]))
    subprocess.run([shutil.which("c++"), "-O1", "-shared", "-fPIC", "-o", library, source],
                   check=True, capture_output=True)
    lib = ctypes.CDLL(library)
    lib.folder = folder  # removed with the library, at exit
    return lib


def _run_kernel_on_host(x: np.ndarray, pads: tuple, mode: str) -> np.ndarray:
    """The kernel face's launch for float32 ``x``, recorded, then its C run here on the
    recorded inputs (the words and the launcher's p)."""
    with kernel_source.record_launches() as launches:
        ops.pad2d.op.kernel(mx.array(x), pads, mode)
    (launch,) = launches
    words, params = (np.ascontiguousarray(np.array(a)) for a in launch.inputs)
    assert params.dtype == np.int32 and params[8] == {"reflect": 0, "symmetric": 1, "replicate": 2}[mode]
    out = np.zeros(launch.output_shapes[0], words.dtype)
    run = {4: _host_kernel().run4, 8: _host_kernel().run8}[words.dtype.itemsize]
    pointers = (ctypes.c_void_p(a.ctypes.data) for a in (words, params, out))
    run(*pointers, *launch.grid)
    return out.view(np.float32)


@needs_cxx
@pytest.mark.parametrize("channels", [3, 2])  # 4-byte, 8-byte words
@pytest.mark.parametrize("pads, mode", [c for c in CASES if c[1] != "constant" and any(c[0])])
def test_kernel_source_run_on_this_cpu_matches_the_reference(pads, mode, channels):
    x = _values((2, 5, 6, channels), mx.float32)
    np.testing.assert_array_equal(_run_kernel_on_host(x, pads, mode), reference(x, pads, mode)[0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pads, mode", CASES)
def test_gpu_kernel_matches_the_definition_bit_for_bit(gpu, pads, mode, dtype):
    x = mx.array(_values((2, 5, 6, 3), dtype)).astype(dtype)
    got = ops.pad2d(x, pads, mode)
    with mlxnet.use_kernels(False):
        want = ops.pad2d(x, pads, mode)
    np.testing.assert_array_equal(np.array(got.astype(mx.float32)), np.array(want.astype(mx.float32)))


@st.composite
def _calls(draw):
    mode = draw(st.sampled_from(MODES))
    n, c = draw(st.sampled_from([0, 1, 1, 2])), draw(st.integers(1, 3))
    h, w = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    if draw(st.integers(0, 3)):  # mostly pads and crops within the map's size, most of them valid
        pads = [draw(st.integers(-(size // 2), size - 1)) for size in (h, h, w, w)]
    else:  # anything, mostly refused
        pads = [draw(st.integers(-7, 7)) for _ in "tblr"]
    return (n, h, w, c), tuple(pads), mode


@settings(max_examples=60, deadline=None)
@given(_calls())
def test_any_call_matches_the_reference_or_is_refused(call):
    shape, pads, mode = call
    x = _values(shape, mx.float32, seed=sum(shape))
    if not _valid(shape, pads, mode):
        with pytest.raises(mlxnet.MlxnetError, match=re.escape(str(pads))):
            definition(mx.array(x), pads, mode)
        return
    out_shape = (shape[0], shape[1] + pads[0] + pads[1], shape[2] + pads[2] + pads[3], shape[3])
    if 0 in out_shape:  # nothing to compare but the shape (and no backward of empties)
        with mlxnet.use_device("cpu"):
            assert ops.pad2d(mx.array(x), pads, mode).shape == out_shape
        return
    _check_against_reference(x, pads, mode, mx.float32)
    if mode != "constant" and any(pads) and shutil.which("c++"):
        np.testing.assert_array_equal(_run_kernel_on_host(x, pads, mode), reference(x, pads, mode)[0])
