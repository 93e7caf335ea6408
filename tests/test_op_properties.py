"""Property tests of every registered op: each fast face agrees with the definition, and the
definition with PyTorch, forward and backward, on drawn shapes, arguments, dtypes, layouts and
extreme values; every face refuses exactly what the definition refuses.

The default run is derandomized (the same examples every run, within the time budget); the
longer sweep draws fresh ones: ``HYPOTHESIS_PROFILE=sweep python -m pytest tests/test_op_properties.py``.
"""
from __future__ import annotations

import os

import mlx.core as mx
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import mlxnet
from mlxnet import ops
from op_cases import CASES, Case, t
from testutil import assert_agree

# Relative tolerance of a face against the definition, and of the definition against PyTorch
# (float64) on the same rounded inputs, by the dtype the op computes its output in.
FACE_TOL = {mx.float32: 2e-5, mx.float16: 4e-3, mx.bfloat16: 3e-2}
# MLX's CUDA float32 GEMMs and convolutions run as TF32 (10-bit mantissa)
TF32_TOL = 2e-3
TORCH_TOL = {mx.float32: 1e-4, mx.float16: 4e-3, mx.bfloat16: 3e-2}


def leaves(out) -> list[mx.array]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def float_positions(case: Case) -> list[int]:
    return [i for i, a in enumerate(case.args)
            if isinstance(a, mx.array) and mx.issubdtype(a.dtype, mx.floating)]


def largest_input(case: Case) -> float:
    values = [np.abs(np.array(a.astype(mx.float32))) for a in case.args
              if isinstance(a, mx.array) and mx.issubdtype(a.dtype, mx.floating) and a.size]
    return max((float(v[np.isfinite(v)].max(initial=0)) for v in values), default=0.0)


def cotangent(o: mx.array) -> mx.array:
    return mx.cos(mx.arange(o.size, dtype=mx.float32) * 0.7).reshape(o.shape)


def run(fn, case: Case) -> tuple[list[mx.array], list[mx.array]]:
    """Outputs of ``fn(*case.args, **case.kwargs)`` and the gradients of a weighted sum of them
    with respect to every floating input."""
    outs = leaves(fn(*case.args, **case.kwargs))
    positions = float_positions(case)
    if not case.grads or not positions:
        return outs, []

    def loss(*xs):
        full = list(case.args)
        for i, x in zip(positions, xs):
            full[i] = x
        total = mx.array(0.0)
        for o in leaves(fn(*full, **case.kwargs)):
            if mx.issubdtype(o.dtype, mx.floating):
                total = total + (o.astype(mx.float32) * cotangent(o)).sum()
        return total
    grads = mx.grad(loss, argnums=list(range(len(positions))))(*[case.args[i] for i in positions])
    return outs, leaves(grads)


def out_dtype(case: Case) -> mx.Dtype:
    """The least precise floating dtype among the inputs (it sets the tolerance)."""
    dtypes = [a.dtype for a in case.args if isinstance(a, mx.array) and mx.issubdtype(a.dtype, mx.floating)]
    return max(dtypes, key=lambda d: FACE_TOL[d], default=mx.float32)


def compare_faces(name: str, case: Case) -> None:
    """The face the dispatcher picks on the current device against the definition."""
    op = ops.get(name)
    fast_out, fast_grads = run(op.dispatch, case)
    with mlxnet.use_kernels(False):
        def_out, def_grads = run(op.dispatch, case)
    dtype = out_dtype(case)
    tol = (TF32_TOL if dtype == mx.float32 and mlxnet.backend() == "cuda" else FACE_TOL[dtype]) * case.conditioning
    for k, (f, d) in enumerate(zip(fast_out, def_out)):
        assert f.dtype == d.dtype, f"{name} output {k}: dtype {f.dtype} != {d.dtype}"
        assert_agree(np.array(f.astype(mx.float32) if mx.issubdtype(f.dtype, mx.floating) else f),
                     np.array(d.astype(mx.float32) if mx.issubdtype(d.dtype, mx.floating) else d),
                     tol, f"{name} ({op.face()}) output {k}")
    # A gradient element sums about (output size / input size) products; faces may order or widen
    # that sum differently, and rounding grows with the square root of its length.
    out_size = sum(o.size for o in def_out)
    for k, (f, d) in enumerate(zip(fast_grads, def_grads)):
        terms = max(1.0, out_size / max(d.size, 1))
        assert_agree(np.array(f.astype(mx.float32)), np.array(d.astype(mx.float32)),
                     4 * tol * terms ** 0.5, f"{name} ({op.face()}) gradient {k}")


def representable(expected: np.ndarray, dtype: mx.Dtype) -> np.ndarray:
    """The float64 reference as the op's dtype holds it: rounded, and ±inf past its range (a
    float16 gradient of 7e4 is inf)."""
    return np.array(mx.array(expected.astype(np.float32)).astype(dtype).astype(mx.float32))


def compare_torch(name: str, case: Case) -> None:
    """The definition against PyTorch in float64 on the same (rounded) inputs."""
    op = ops.get(name)
    with mlxnet.use_kernels(False):
        outs, grads = run(op.dispatch, case)
    inputs = [t(a) if isinstance(a, mx.array) else a for a in case.args]
    positions = float_positions(case)
    for i in positions:
        inputs[i].requires_grad_(case.grads)
    with torch.enable_grad():
        ref = leaves(case.torch_fn(*[a for a in inputs if a is not None]))
    tol = TORCH_TOL[out_dtype(case)] * case.conditioning
    for k, (o, r) in enumerate(zip(outs, ref)):
        assert_agree(np.array(o.astype(mx.float32)), representable(r.detach().numpy(), o.dtype), tol,
                     f"{name} output {k} vs torch")
    if case.grads and grads:
        total = sum((r * torch.tensor(np.array(cotangent(o)), dtype=torch.float64)).sum()
                    for o, r in zip(outs, ref))
        if not total.requires_grad:
            return
        tgrads = torch.autograd.grad(total, [inputs[i] for i in positions], allow_unused=True)
        # a half-precision gradient sums products of the inputs rounded to its dtype: its
        # error grows with their magnitude, not the result's
        grad_tol = 8 * tol * (1.0 if out_dtype(case) == mx.float32 else max(1.0, largest_input(case)))
        for k, (g, tg) in enumerate(zip(grads, tgrads)):
            want = np.zeros(g.shape) if tg is None else representable(tg.numpy(), g.dtype)
            assert_agree(np.array(g.astype(mx.float32)), want, grad_tol, f"{name} gradient {k} vs torch")


def test_every_registered_op_has_a_property_strategy():
    assert set(CASES) == set(ops.REGISTRY), "an op without a drawn-call strategy in tests/op_cases.py"


@pytest.mark.parametrize("name", sorted(CASES))
def test_cpu_faces_equal_the_definition(name):
    @given(case=CASES[name])
    def check(case: Case) -> None:
        with mlxnet.use_device("cpu"):
            compare_faces(name, case)
    check()


TORCH_OPS = sorted(n for n in CASES if n not in ("nms", "dfl_decode", "max_unpool2d"))


# PyTorch notes that its own 'same' padding of even kernels copies the input
@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("name", TORCH_OPS)
def test_definition_equals_torch(name):
    @given(case=CASES[name])
    def check(case: Case) -> None:
        if case.torch_fn is None:
            return
        with mlxnet.use_device("cpu"):
            compare_torch(name, case)
    check()


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_faces_equal_the_definition(gpu, name):
    @given(case=CASES[name])
    def check(case: Case) -> None:
        compare_faces(name, case)
    check()


# ---- refusals: exactly what PyTorch refuses, by every face ----------------------------------

def _outcome(call) -> tuple[str, object]:
    try:
        return "ok", call()
    except mlxnet.MlxnetError as e:
        assert "\n" not in str(e), f"error of several lines: {e}"
        return "refused", str(e)


def assert_refused_alike(name: str, args: tuple, kwargs: dict, torch_call) -> None:
    """mlxnet refuses (MlxnetError, one line) exactly when PyTorch raises, and every face
    agrees with the definition on refusing."""
    try:
        torch_call()
        torch_ok = True
    except (RuntimeError, ValueError, TypeError, IndexError):
        torch_ok = False
    op = ops.get(name)
    fast = _outcome(lambda: mx.eval(op.dispatch(*args, **kwargs)))
    with mlxnet.use_kernels(False):
        definition = _outcome(lambda: mx.eval(op.dispatch(*args, **kwargs)))
    assert fast[0] == definition[0], f"{name}: {op.face()} face {fast}, definition {definition}"
    assert (definition[0] == "ok") == torch_ok, f"{name} {kwargs}: torch {'accepts' if torch_ok else 'refuses'}, mlxnet {definition}"


def _spelled(v: int, spelling: str):
    return {"int": v, "one": (v,), "pair": (v, v), "empty": ()}[spelling]


spellings = st.sampled_from(("int", "one", "pair", "empty"))


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@given(data=st.data())
def test_conv2d_refuses_what_torch_refuses(data):
    c, o, groups = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4)), data.draw(st.integers(0, 3))
    k, size = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 5))
    kwargs = {key: _spelled(data.draw(st.integers(lo, 3)), data.draw(spellings))
              for key, lo in (("stride", -1), ("padding", -1), ("dilation", -1))}
    if data.draw(st.booleans()):
        kwargs["padding"] = data.draw(st.sampled_from(("same", "valid", "full")))
    c_g = c // groups if groups and c % groups == 0 else c
    x, w = mx.ones((1, size, size, c)), mx.ones((o, k, k, c_g))
    tx, tw = torch.ones(1, c, size, size), torch.ones(o, c_g, k, k)
    with mlxnet.use_device("cpu"):
        assert_refused_alike("conv2d", (x, w), {**kwargs, "groups": groups},
                             lambda: torch.nn.functional.conv2d(tx, tw, groups=groups, **kwargs))


@given(data=st.data())
def test_conv_transpose2d_refuses_what_torch_refuses(data):
    c, o = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    k, size = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 4))
    kwargs = {key: _spelled(data.draw(st.integers(lo, 3)), data.draw(spellings))
              for key, lo in (("stride", -1), ("padding", -1), ("output_padding", -1), ("dilation", -1))}
    x, w = mx.ones((1, size, size, c)), mx.ones((o, k, k, c))
    tx, tw = torch.ones(1, c, size, size), torch.ones(c, o, k, k)
    with mlxnet.use_device("cpu"):
        assert_refused_alike("conv_transpose2d", (x, w), kwargs,
                             lambda: torch.nn.functional.conv_transpose2d(tx, tw, **kwargs))


@given(shape=st.lists(st.integers(0, 3), max_size=3), axis=st.integers(-4, 3))
def test_softmax_refuses_what_torch_refuses(shape, axis):
    x = mx.ones(shape)
    with mlxnet.use_device("cpu"):
        assert_refused_alike("softmax", (x,), {"axis": axis},
                             lambda: torch.softmax(torch.ones(shape), dim=axis))


@given(approximate=st.sampled_from(("none", "tanh", "erf", "")))
def test_gelu_refuses_what_torch_refuses(approximate):
    with mlxnet.use_device("cpu"):
        assert_refused_alike("gelu", (mx.ones((2, 3)),), {"approximate": approximate},
                             lambda: torch.nn.functional.gelu(torch.ones(2, 3), approximate=approximate))


@given(data=st.data())
def test_attention_refuses_what_torch_refuses(data):
    L, S, E, S2, E2 = (data.draw(st.integers(1, 4)) for _ in range(5))
    p = data.draw(st.sampled_from((0.0, 0.5, 1.0, 1.5, -0.1)))
    q, k, v = torch.ones(2, L, E), torch.ones(2, S, E2), torch.ones(2, S2, 3)
    args = tuple(mx.array(a.numpy()) for a in (q, k, v))
    with mlxnet.use_device("cpu"):
        if not 0 <= p < 1:  # PyTorch's attention takes any p silently; mlxnet refuses, as F.dropout does
            with pytest.raises(mlxnet.MlxnetError):
                ops.scaled_dot_product_attention(*args, dropout_p=p)
            return
        assert_refused_alike("scaled_dot_product_attention", args, {"dropout_p": p},
                             lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p))


def test_float16_attention_is_as_accurate_as_torch():
    """Scores formed in float16 lose what softmax amplifies: mlxnet's float16 attention must be
    within 2× of PyTorch's float16 error against a float64 reference."""
    rng = np.random.default_rng(0)
    ours, theirs = [], []
    for _ in range(10):
        q, k, v = (rng.standard_normal((2, 4, 64, 32)) * 3 for _ in range(3))
        want = torch.nn.functional.scaled_dot_product_attention(*(torch.tensor(a) for a in (q, k, v))).numpy()
        half = torch.nn.functional.scaled_dot_product_attention(
            *(torch.tensor(a, dtype=torch.float16) for a in (q, k, v))).double().numpy()
        with mlxnet.use_device("cpu"):
            got = ops.scaled_dot_product_attention(*(mx.array(a.astype(np.float16)) for a in (q, k, v)))
        ours.append(np.abs(np.array(got.astype(mx.float32)) - want).max())
        theirs.append(np.abs(half - want).max())
    assert max(ours) <= 2 * max(theirs), f"float16 attention error {max(ours):.4g}, PyTorch's {max(theirs):.4g}"


# ---- unbatched samples and empty inputs ------------------------------------------------------

@pytest.mark.parametrize("name", sorted(n for n, op in ops.REGISTRY.items() if op.batched is not None))
def test_unbatched_sample_equals_a_batch_of_one(name):
    """PyTorch's unbatched inputs: (H, W, C) for the 2-d ops, (L, C) for the 1-d ones."""
    op = ops.get(name)
    args, kwargs = op.example()
    first = [i for i, a in enumerate(args) if isinstance(a, mx.array)][:op.per_sample]
    assert args[first[0]].ndim == op.batched
    one = list(args)
    for i in first:
        one[i] = args[i][0]
    batch = list(one)
    for i in first:
        batch[i] = one[i][None]
    with mlxnet.use_device("cpu"):
        want = leaves(op.dispatch(*batch, **kwargs))
        got = leaves(op.dispatch(*one, **kwargs))
        grad = mx.grad(lambda x: sum(o.astype(mx.float32).sum() for o in leaves(
            op.dispatch(*[x if i == first[0] else a for i, a in enumerate(one)], **kwargs))
            if mx.issubdtype(o.dtype, mx.floating)))(one[first[0]])
    assert grad.shape == one[first[0]].shape
    for g, w in zip(got, want):
        assert g.shape == w.shape[1:]
        np.testing.assert_array_equal(np.array(g), np.array(w[0]))


EMPTY_CALLS = '''
import mlxnet, mlx.core as mx
from mlxnet import ops
x = mx.zeros((0, 4, 5, 3))
for face in (True, False):
    with mlxnet.use_kernels(face):
        g = mx.grad(lambda a: ops.pad2d(a, (1, 1, 1, 1)).sum())(x)
        gl = mx.grad(lambda a, w: ops.layer_norm(a, w, w).sum(), argnums=[0, 1])(x, mx.ones((3,)))
        gs = mx.grad(lambda a: ops.softmax(a).sum())(mx.zeros((2, 0)))
        gc = mx.grad(lambda a: ops.conv_transpose1d(a, mx.ones((1, 3, 2)), stride=2).sum())(mx.zeros((0, 2, 2)))
        mx.eval(g, gl, gs, gc)
        assert g.shape == x.shape and gl[0].shape == x.shape and gl[1].tolist() == [0, 0, 0]
        assert gs.shape == (2, 0) and gc.shape == (0, 2, 2)
        assert ops.softmax(mx.zeros((2, 0))).shape == (2, 0)
        assert ops.softmax(mx.array(3.0)).item() == 1.0 and ops.softmax(mx.array(3.0), axis=0).item() == 1.0
print("ok")
'''


def test_empty_inputs_never_reach_mlx_defects():
    """The calls that crashed (SIGFPE), hung or raised: in a child process, under a time limit."""
    import subprocess
    import sys
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", EMPTY_CALLS], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "MLXNET_DEVICE": "cpu"})
        assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
