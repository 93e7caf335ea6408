"""Compile every registered kernel for CUDA with nvcc on a machine without a GPU.

Each op's example call (and float16/bfloat16 variants) is traced on the host: the kernel
launches are captured instead of run, and the exact source MLX's ``cuda_kernel`` would build
(signature, template constants, prelude, body) is compiled for sm_90. This catches syntax and
type errors before spending GPU time; the GPU-marked tests prove correctness.

    python scripts/check_cuda_compile.py --mlx-src /path/to/mlx-checkout --cccl /path/to/cccl/include
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

import mlxnet  # noqa: F401  (binds BLAS before mlx.core)
import mlx.core as mx

from mlxnet import ops
from mlxnet.ops import kernel_source

CUDA_TYPES = {mx.float32: "float", mx.float16: "__half", mx.bfloat16: "__nv_bfloat16",
              mx.int32: "int32_t", mx.uint32: "uint32_t", mx.int64: "int64_t", mx.bool_: "bool",
              mx.uint8: "uint8_t", mx.int8: "int8_t"}


def cuda_source(kernel: kernel_source.PortableKernel, inputs, template, output_dtypes) -> str:
    header, body = kernel_source.render(kernel.filename, kernel.kernel, "cuda")
    params = []
    for name, x in zip(kernel.input_names, inputs):
        params.append(f"const {CUDA_TYPES[x.dtype]}* {name}")
        if x.ndim > 0:
            if f"{name}_shape" in body:
                params.append(f"const __grid_constant__ Shape {name}_shape")
            if f"{name}_strides" in body:
                params.append(f"const __grid_constant__ Strides {name}_strides")
            if f"{name}_ndim" in body:
                params.append(f"const __grid_constant__ int {name}_ndim")
    for name, dt in zip(kernel.output_names, output_dtypes):
        params.append(f"{CUDA_TYPES[dt]}* {name}")
    consts = []
    for name, value in template:
        if isinstance(value, bool):
            consts.append(f"  constexpr bool {name} = {'true' if value else 'false'};")
        elif isinstance(value, int):
            consts.append(f"  constexpr int {name} = {value};")
        else:
            consts.append(f"  using {name} = {CUDA_TYPES[value]};")
    return ('#include "mlx/backend/cuda/device/utils.cuh"\n#include <cooperative_groups.h>\n'
            + header + "\nnamespace mlx::core::cu {\nnamespace cg = cooperative_groups;\n"
            + f"__global__ void custom_kernel_{kernel.kernel}(\n    " + ",\n    ".join(params)
            + ") {\n" + "\n".join(consts) + "\n" + body + "\n}\n}\n")


def capture_launches(op: ops.Op, dtype: mx.Dtype) -> list[str]:
    sources: list[str] = []

    def fake_call(self, inputs, *, template, grid, threadgroup, output_shapes, output_dtypes,
                  init_value=None):
        sources.append(cuda_source(self, inputs, template, output_dtypes))
        return [mx.zeros(tuple(s), d) for s, d in zip(output_shapes, output_dtypes)]

    args, kwargs = op.example()
    args = tuple(a.astype(dtype) if isinstance(a, mx.array) and a.dtype == mx.float32 else a for a in args)
    with mock.patch.object(kernel_source.PortableKernel, "__call__", fake_call):
        mx.eval(op.kernel(*args, **kwargs))
    return sources


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mlx-src", required=True, help="an MLX source checkout (for device/utils.cuh)")
    ap.add_argument("--cccl", required=True, help="CCCL include dir (mlx-cuda wheel: mlx/include/cccl)")
    ap.add_argument("--only", nargs="*", help="op names")
    a = ap.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, op in sorted(ops.REGISTRY.items()):
            if not op.has_kernel or (a.only and name not in a.only):
                continue
            for dtype in (mx.float32, mx.float16, mx.bfloat16):
                for i, src in enumerate(dict.fromkeys(capture_launches(op, dtype))):
                    path = Path(tmp) / f"{name}_{i}.cu"
                    path.write_text(src)
                    r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-I", a.mlx_src, "-I", a.cccl,
                                        "-c", str(path), "-o", str(path.with_suffix(".o"))],
                                       capture_output=True, text=True)
                    ok = r.returncode == 0
                    failures += not ok
                    print(f"{'ok  ' if ok else 'FAIL'} {name} {dtype} launch {i}")
                    if not ok:
                        print(r.stderr[-3000:])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
