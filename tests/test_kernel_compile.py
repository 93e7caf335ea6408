"""Both renderings of every kernel body compile: Metal type-checked here (clang, Metal's
address spaces enforced, on MLX's own generated source), CUDA and Metal compiled and run on
a GPU (the gpu-marked test)."""
from __future__ import annotations

import functools
import importlib.util
import re

import mlx.core as mx
import numpy as np
import pytest

from mlxnet import ops
from mlxnet.errors import MlxnetError
from mlxnet.ops.core import kernel_launches, kernel_source
from metal_check import metal_errors

LAUNCHES = kernel_launches.every_launch()


@functools.cache
def metal_sources() -> dict[str, tuple[str, kernel_source.Launch]]:
    """One entry per distinct Metal source (many launches share a signature)."""
    sources: dict[str, tuple[str, kernel_source.Launch]] = {}
    for op, launch in LAUNCHES:
        sources.setdefault(launch.metal_source(), (op, launch))
    return sources

# Needs libclang (the test extra installs it); skipped where it is missing.
needs_clang = pytest.mark.skipif(importlib.util.find_spec("clang") is None,
                                 reason="libclang is not installed (pip install -e '.[test]')")
_PARAM = re.compile(r"const (constant|device) (\w+)(\*|&) (\w+) \[\[buffer")


@needs_clang
def test_every_rendered_metal_kernel_type_checks():
    failures = {}
    for source, (op, launch) in metal_sources().items():
        errors = metal_errors(source)
        if errors:
            failures[f"{op}/{launch.kernel.kernel} {launch.template}"] = errors[:3]
    assert not failures, failures
    assert len(metal_sources()) > 100


def test_renderings_cover_every_kernel_dtype_and_address_space():
    kernels = {k.kernel for k in kernel_source.KERNELS}
    assert len(kernels) == 30
    seen: dict[str, set] = {k: set() for k in kernels}
    spaces: dict[str, set] = {k: set() for k in kernels}
    inputs: dict[str, set] = {k: set() for k in kernels}
    for source, (_, launch) in metal_sources().items():
        name = launch.kernel.kernel
        seen[name] |= {str(v) for _, v in launch.template if isinstance(v, mx.Dtype)}
        spaces[name] |= {m.group(1) for m in _PARAM.finditer(source) if m.group(4) != "p"}
        inputs[name] |= {str(x.dtype) for x in launch.inputs}
    floats = {"mlx.core.float32", "mlx.core.float16", "mlx.core.bfloat16"}
    # pad2d and the window copies move bytes, as 8- or 4-byte words where they tile a pixel's channels
    words = floats | {"mlx.core.uint64", "mlx.core.uint32"}
    copies = {"pad2d", "window_partition", "window_merge"}
    # NMS computes in float32 whatever the boxes' dtype (the host converts them, as the
    # definition does, to keep its bits): no dtype template, float32 boxes and uint32 mask words.
    float32_only = {"nms_mask": {"mlx.core.float32", "mlx.core.int32"},
                    "nms_scan": {"mlx.core.uint32", "mlx.core.int32"}}
    for name in kernels:
        if name in float32_only:
            assert seen[name] == set() and inputs[name] == float32_only[name], (name, inputs[name])
        else:
            assert seen[name] == (words if name in copies else floats), name
        # Each kernel's data inputs were rendered both under and over 8 elements.
        assert spaces[name] == {"constant", "device"}, (name, spaces[name])


def _probe_source(x: mx.array, body: str, header_extra: str = "") -> str:
    header = kernel_source.render("pool.kern", "max_pool2d", "metal")[0]
    return kernel_source.generated_metal_source(
        "probe", ["x", "p"], ["out"], header + header_extra, body, [x, kernel_source.int_params((max(x.size, 1),))], template=[("T", x.dtype)],
        grid=(max(x.size, 1), 1, 1), threadgroup=(32, 1, 1), output_shapes=[x.shape],
        output_dtypes=[x.dtype])


_GOOD = "const uint i = thread_position_in_grid.x;\nif (i < uint(p[0])) out[i] = x[i];\n"
_HELPER_BY_DEVICE = ("MX_FN float first(const device float* v) { return v[0]; }\n")


@needs_clang
@pytest.mark.parametrize("body, header_extra, expected", [
    (_GOOD, "", None),
    # A helper that names the device address space, called with a small (constant) input.
    ("out[0] = first(x);\n", _HELPER_BY_DEVICE, "no matching function for call to 'first'"),
    ("__syncthreads();\nout[0] = x[0];\n", "", "undeclared identifier '__syncthreads'"),
    ("out[threadIdx.x] = x[0];\n", "", "undeclared identifier 'threadIdx'"),
    ("out[0] = mx_not_a_function(x[0]);\n", "", "undeclared identifier 'mx_not_a_function'"),
    ("out[0] = metal::erf(x[0]);\n", "", "no member named 'erf' in namespace 'metal'"),
])
def test_the_check_fails_what_metal_would_reject(body, header_extra, expected):
    x = mx.array([1.0, 2.0, 3.0])
    errors = metal_errors(_probe_source(x, body, header_extra))
    if expected is None:
        assert errors == []
    else:
        assert any(expected in e for e in errors), errors


@needs_clang
def test_a_0d_input_would_not_compile_so_it_reaches_kernels_as_1d():
    scalar = mx.array(2.0)
    assert "const constant float& x" in _probe_source(scalar, _GOOD)
    assert any("subscripted value is not an array" in e for e in metal_errors(_probe_source(scalar, _GOOD)))
    kernel = ops.get("max_pool2d").sources[0]
    with kernel_source.record_launches() as launches:
        (out,) = kernel([scalar, kernel_source.int_params((1,))], template=[("T", scalar.dtype), ("KH", 1), ("KW", 1)],
                        grid=(1, 1, 1), threadgroup=(32, 1, 1), output_shapes=[()], output_dtypes=[scalar.dtype])
    assert out.shape == () and launches[0].inputs[0].shape == (1,)


def test_outputs_of_launches_not_made_keep_their_integer_dtypes():
    # An empty grid (or recording) returns initial values: in the requested dtype, indices and
    # byte words included (MLX's mx.full of a float value would make them float32).
    kernel = ops.get("max_pool2d").sources[0]
    x = mx.zeros((0, 2, 2, 1))
    outs = kernel([x, kernel_source.int_params((1,))], template=[("T", x.dtype), ("KH", 1), ("KW", 1)],
                  grid=(0, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(0, 2, 2, 1)] * 3,
                  output_dtypes=[mx.int32, mx.uint64, mx.float16])
    assert [o.dtype for o in outs] == [mx.int32, mx.uint64, mx.float16]


@pytest.mark.parametrize("name", sorted(n for n, op in ops.REGISTRY.items() if op.sources))
def test_empty_inputs_never_launch(name):
    op = ops.get(name)
    empties = [(a, k) for a, k in kernel_launches.op_cases(op)
               if any(isinstance(x, mx.array) and x.size == 0 for x in a)]
    if not empties:  # an op that refuses empty inputs (as PyTorch's training BatchNorm) never launches on one
        args, kwargs = op.example()
        first = next(i for i, a in enumerate(args) if isinstance(a, mx.array))
        emptied = list(args)
        emptied[first] = mx.zeros((0,) + tuple(args[first].shape[1:]), args[first].dtype)
        with pytest.raises(MlxnetError, match=name):
            op.dispatch(*emptied, **kwargs)
        return
    for args, kwargs in empties:
        launches = kernel_launches.op_launches(op, args, kwargs)
        assert launches and all(0 in launch.grid for launch in launches)
        # Outside recording the kernel path returns without launching: on this CPU-only
        # machine a launch would raise (no GPU back end), so returning proves none happened.
        for out in kernel_launches._as_list(op.kernel(*args, **kwargs)):
            assert out.size == 0
        reference = op.definition(*args, **kwargs)
        for out, ref in zip(kernel_launches._as_list(op.kernel(*args, **kwargs)),
                            kernel_launches._as_list(reference)):
            assert out.shape == ref.shape


@pytest.mark.gpu
def test_every_launch_compiles_and_runs_on_this_gpu(gpu):
    """MLX compiles each launch's rendering for this GPU (CUDA or Metal) and runs it: one launch
    per distinct generated signature (kernel, template, input dtypes and size classes)."""
    ran, signatures = set(), set()
    for op, launch in LAUNCHES:
        signature = (launch.kernel.kernel, str(launch.template),
                     tuple((str(x.dtype), x.size < 8) for x in launch.inputs))
        if 0 in launch.grid or signature in signatures:
            continue
        signatures.add(signature)
        outputs = launch.run()
        mx.eval(outputs)
        for out, shape in zip(outputs, launch.output_shapes):
            assert out.shape == shape
            if mx.issubdtype(out.dtype, mx.floating):
                assert not np.isnan(np.array(out.astype(mx.float32))).any() or op.startswith("max"), op
        ran.add(launch.kernel.kernel)
    assert ran == {k.kernel for k in kernel_source.KERNELS}
