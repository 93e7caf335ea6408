"""The op registry, the portable kernel sources, and the first op end to end."""
from __future__ import annotations

import functools
import importlib
from importlib import resources
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import mlxnet
from mlxnet import ops
from mlxnet.ops.core import kernel_source, registry
from testutil import TOLERANCE, assert_close, to_numpy

DTYPES = [mx.float32, mx.float16, mx.bfloat16]


def _kernel_files() -> list[str]:
    return sorted(p.name for p in resources.files("mlxnet.custom_kernels").iterdir()
                  if p.name.endswith(".kern"))


def test_every_op_has_a_reference_and_an_example():
    assert ops.REGISTRY, "no ops registered"
    for name, op in ops.REGISTRY.items():
        assert callable(op.definition), name
        assert op.example is not None, f"{name} has no example call"
        args, kwargs = op.example()
        with mlxnet.use_device("cpu"):
            mx.eval(op.dispatch(*args, **kwargs))


def test_every_kernel_source_is_shipped_and_used():
    used = {k.filename for op in ops.REGISTRY.values() for k in op.sources}
    assert used <= set(_kernel_files())
    assert set(_kernel_files()) <= used, "a kernel file no op uses"
    for op in ops.REGISTRY.values():
        for k in op.sources:
            assert k.kernel in kernel_source.read_source(k.filename)[1]


@pytest.mark.parametrize("target", ["metal", "cuda"])
def test_prelude_binds_portable_names_per_backend(target):
    header, body = kernel_source.render("pool.kern", "max_pool2d", target)
    assert "window_max" in header and "MX_FN float mx_exp" in header
    if target == "metal":
        assert "thread_position_in_grid" in body and "threadgroup_barrier" in header
        assert "__syncthreads" not in header
    else:
        assert "blockIdx.x * blockDim.x + threadIdx.x" in body and "__syncthreads()" in header
        assert "thread_position_in_grid" not in body


# Face -> the file of its family package that holds it (a kernel's backward lives with it).
FACE_FILES = {"definition": "definition", "cpu": "cpu", "kernel": "kernel", "kernel_vjp": "kernel",
              "check": "check"}


def _module_of(fn) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn.__module__


def test_every_op_keeps_its_faces_in_the_files_named_after_them():
    """mlxnet/ops/: core/ is the machinery, every other package one family of ops, registering
    them in its __init__.py and keeping each face in the file named after it; a family has a
    cpu.py, kernel.py or check.py exactly where one of its ops has that face."""
    root = Path(ops.__file__).parent
    assert sorted(p.name for p in root.glob("*.py")) == ["__init__.py"], "a module outside core/ and the families"
    families = {p.name for p in root.iterdir() if (p / "__init__.py").is_file()} - {"core"}
    faces_in = {family: {"definition"} for family in families}
    for name, op in ops.REGISTRY.items():
        family, _, file = _module_of(op.definition).removeprefix("mlxnet.ops.").partition(".")
        assert family in families and file == "definition", f"{name}: definition in {_module_of(op.definition)}"
        assert getattr(importlib.import_module(f"mlxnet.ops.{family}"), name) is op.dispatch, \
            f"{name} is not registered in mlxnet/ops/{family}/__init__.py"
        fused = op.kernel is not None and getattr(op.kernel, "__code__", None) is op.definition.__code__
        faces = {"cpu": op.cpu, "kernel": None if fused else op.kernel, "check": op.check,
                 "kernel_vjp": None if op.kernel_vjp is registry.DEFINITION_VJP else op.kernel_vjp}
        for face, fn in faces.items():
            if fn is not None:
                assert _module_of(fn) == f"mlxnet.ops.{family}.{FACE_FILES[face]}", f"{name}: {face} in {_module_of(fn)}"
                faces_in[family].add(FACE_FILES[face])
    for family, files in faces_in.items():
        present = {p.stem for p in (root / family).glob("*.py")} & set(FACE_FILES.values())
        assert present == files, f"mlxnet/ops/{family}/ has {sorted(present)}, its ops' faces {sorted(files)}"


def test_unknown_op_is_a_clear_error():
    with pytest.raises(mlxnet.MlxnetError, match="unknown op 'nope'; registered: .*layer_norm"):
        ops.get("nope")


def _numpy_layer_norm(x, w, b, eps):
    x = x.astype(np.float64)
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 5, 7, 96), (1, 3, 3, 1), (4, 300), (2, 1, 1, 1000)])
def test_layer_norm_reference_matches_numpy(dtype, shape):
    key = mx.random.key(sum(shape))
    x = mx.random.normal(shape, key=key).astype(dtype)
    w = mx.random.normal(shape[-1:], key=mx.random.key(1)).astype(dtype)
    b = mx.random.normal(shape[-1:], key=mx.random.key(2)).astype(dtype)
    with mlxnet.use_device("cpu"):
        y = ops.layer_norm(x, w, b, eps=1e-6)
    assert y.dtype == dtype
    expected = _numpy_layer_norm(to_numpy(x), to_numpy(w), to_numpy(b), 1e-6)
    assert_close(y, expected, dtype, scale=4)


def test_layer_norm_layer_and_gradient_on_cpu():
    layer = mlxnet.nn.LayerNorm(16, eps=1e-6)
    x = mx.random.normal((2, 3, 16), key=mx.random.key(5))
    g = mx.grad(lambda x: (layer(x) * mx.arange(16)).sum())(x)
    # d/dx of a normalised output is orthogonal to constant shifts: gradients sum to ~0 per row.
    np.testing.assert_allclose(to_numpy(g.sum(-1)), 0, atol=1e-4)
    assert float(mx.abs(g).max()) > 0.1


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(ops.REGISTRY))
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_equals_reference_forward_and_backward(gpu, name, dtype):
    op = ops.get(name)
    if not op.has_kernel:
        pytest.skip(f"{name} has no kernel")
    args, kwargs = op.example()
    args = tuple(a.astype(dtype) if isinstance(a, mx.array) and a.dtype == mx.float32 else a
                 for a in args)
    assert op.uses_kernel()
    out_k = op.dispatch(*args, **kwargs)
    with mlxnet.use_kernels(False):
        out_r = op.dispatch(*args, **kwargs)
    for k, r in zip(_leaves(out_k), _leaves(out_r)):
        if mx.issubdtype(r.dtype, mx.floating):
            assert_close(k, r, dtype, scale=4)
        else:  # indices (nms): exactly the definition's
            np.testing.assert_array_equal(np.array(k), np.array(r))
    if not any(mx.issubdtype(o.dtype, mx.floating) for o in _leaves(out_r)):
        return  # nothing to differentiate

    arrays = [i for i, a in enumerate(args) if isinstance(a, mx.array) and mx.issubdtype(a.dtype, mx.floating)]

    def loss(*xs):
        full = list(args)
        for i, x in zip(arrays, xs):
            full[i] = x
        return sum((o.astype(mx.float32) * mx.cos(mx.arange(o.size).reshape(o.shape))).sum()
                   for o in _leaves(op.dispatch(*full, **kwargs)) if mx.issubdtype(o.dtype, mx.floating))

    grads_k = mx.grad(loss, argnums=list(range(len(arrays))))(*[args[i] for i in arrays])
    with mlxnet.use_kernels(False):
        grads_r = mx.grad(loss, argnums=list(range(len(arrays))))(*[args[i] for i in arrays])
    for gk, gr in zip(grads_k, grads_r):
        assert_close(gk, gr, dtype, scale=8)


@pytest.mark.gpu
def test_every_kernel_compiles_and_builds_once(gpu):
    for op in ops.REGISTRY.values():
        if op.has_kernel:
            args, kwargs = op.example()
            mx.eval(op.dispatch(*args, **kwargs))
            builds = {k.kernel: (list(k._handles), dict(k._cuda)) for k in op.sources}
            mx.eval(op.dispatch(*args, **kwargs))
            for k in op.sources:
                assert any(b[0] == gpu for b in k.built), f"{k.kernel} never ran on {gpu}"
                # The second call reuses the first's build: MLX's handle, or on CUDA the binary
                # mlxnet compiled once per machine (kernels reading strides keep MLX's handle).
                assert (list(k._handles), dict(k._cuda)) == builds[k.kernel]
                if gpu == "cuda" and not k._handles:
                    assert k._cuda and all(v is not None for v in k._cuda.values()), k.kernel
                else:
                    assert list(k._handles) == [gpu]


def _leaves(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def test_frozen_batchnorm_and_fusing_match_torch_eval_bn():
    import torch

    from mlxnet.nn import FrozenBatchNorm2d, LayerNorm2d, fuse_conv_bn

    rng = np.random.default_rng(0)
    tconv = torch.nn.Conv2d(6, 8, 3, stride=2, padding=1, groups=2, bias=True)
    tbn = torch.nn.BatchNorm2d(8, eps=1e-3).eval()
    with torch.no_grad():
        for p in (tbn.weight, tbn.bias, tbn.running_mean):
            p.copy_(torch.from_numpy(rng.standard_normal(8).astype(np.float32)))
        tbn.running_var.copy_(torch.from_numpy(rng.uniform(0.5, 2, 8).astype(np.float32)))
    x = rng.standard_normal((2, 6, 9, 11)).astype(np.float32)
    with torch.no_grad():
        want = tbn(tconv(torch.from_numpy(x))).numpy().transpose(0, 2, 3, 1)
    conv = mlxnet.nn.layers.nn.Conv2d(6, 8, 3, stride=2, padding=1, groups=2)
    conv.weight = mx.array(tconv.weight.detach().numpy().transpose(0, 2, 3, 1))
    conv.bias = mx.array(tconv.bias.detach().numpy())
    bn = FrozenBatchNorm2d(8, eps=1e-3)
    bn.load_weights([(k, mx.array(getattr(tbn, k).detach().numpy()))
                     for k in ("weight", "bias", "running_mean", "running_var")])
    assert bn.trainable_parameters() == {}
    xm = mx.array(x.transpose(0, 2, 3, 1))
    assert_close(bn(conv(xm)), want, scale=10)
    assert_close(fuse_conv_bn(conv, bn)(xm), want, scale=10)
    assert issubclass(LayerNorm2d, mlxnet.nn.LayerNorm)


def test_every_op_has_its_faces_named():
    faces = {name: (op.cpu is not None, op.kernel is not None) for name, op in ops.REGISTRY.items()}
    assert faces["conv2d"] == (True, True) and faces["silu"] == (True, True)
    assert faces["layer_norm"] == (True, True) and faces["nms"] == (False, True)
    with mlxnet.use_device("cpu"):
        assert ops.get("conv2d").face() == "cpu"
        with mlxnet.use_kernels(False):
            assert ops.get("conv2d").face() == "definition"


@pytest.mark.parametrize("name", sorted(n for n, op in ops.REGISTRY.items() if op.cpu is not None))
def test_cpu_fast_path_equals_definition_forward_and_backward(name):
    op = ops.get(name)
    args, kwargs = op.example()
    arrays = [i for i, a in enumerate(args) if isinstance(a, mx.array)]

    def loss(face):
        def f(*xs):
            full = list(args)
            for i, x in zip(arrays, xs):
                full[i] = x
            return sum((o * mx.cos(mx.arange(o.size).reshape(o.shape))).sum() for o in _leaves(face(*full, **kwargs)))
        return f

    with mlxnet.use_device("cpu"):
        assert op.face() == "cpu"
        for fast, definition in zip(_leaves(op.dispatch(*args, **kwargs)), _leaves(op.definition(*args, **kwargs))):
            assert mx.abs(fast - definition).max().item() <= 1e-4 * max(1.0, mx.abs(definition).max().item())
        for g_fast, g_def in zip(mx.grad(loss(op.cpu), argnums=list(range(len(arrays))))(*[args[i] for i in arrays]),
                                 mx.grad(loss(op.definition), argnums=list(range(len(arrays))))(*[args[i] for i in arrays])):
            assert mx.abs(g_fast - g_def).max().item() <= 1e-3 * max(1.0, mx.abs(g_def).max().item())
