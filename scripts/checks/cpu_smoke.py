"""A short run of the toolkit on whatever CPU runs it: CI runs it under qemu-user with CPUs
that lack AVX-512 (and AVX), where a library built for the wrong CPU dies with SIGILL.

    qemu-x86_64 -cpu Haswell .venv/bin/python scripts/checks/cpu_smoke.py

It imports mlxnet, multiplies matrices through the bound BLAS, runs LAPACK (inv, svd, eigh),
every op's example on the CPU (with the CPU primitives built for this CPU), and `mlxnet check
resnet18` at a small size, with every opt-in on (``mlxnet.tune_cpu()``); it exits non-zero on
any failure and prints what ran where.
"""
from __future__ import annotations

import sys
import time

import faulthandler
import mlxnet
import mlx.core as mx

from typer.testing import CliRunner

from mlxnet import ops
from mlxnet.cli import app


def _close(got: mx.array, want: mx.array, what: str) -> None:
    err = float(mx.abs(got - want).max() / (mx.abs(want).max() + 1e-6))
    if not err < 1e-4:
        raise SystemExit(f"{what}: relative error {err:.2e} on this CPU")


def main() -> int:
    faulthandler.enable()
    start = time.time()
    mlxnet.tune_cpu()  # every opt-in on: none may make this CPU's run unsafe
    mlxnet.use_device("cpu")
    print(f"BLAS: {mlxnet.blas_info()}")
    # Checked with MLX alone: numpy's own OpenBLAS is not what is under test here.
    a = mx.random.normal((128, 128), key=mx.random.key(0))
    _close(a @ a, (a[:, :, None] * a[None, :, :]).sum(axis=1), "matmul")
    spd = a @ a.T + 128 * mx.eye(128)
    _close(spd @ mx.linalg.inv(spd, stream=mx.cpu), mx.eye(128), "inv")
    u, s, vt = mx.linalg.svd(a, stream=mx.cpu)
    _close((u * s) @ vt, a, "svd")
    w, v = mx.linalg.eigh(spd, stream=mx.cpu)
    _close(spd @ v, v * w, "eigh")
    print("BLAS matmul and LAPACK inv/svd/eigh: ok")
    for name, op in sorted(ops.REGISTRY.items()):
        args, kwargs = op.example()
        mx.eval(op.dispatch(*args, **kwargs))
    print(f"{len(ops.REGISTRY)} op examples on the CPU: ok (CPU primitives: {mlxnet.native_info()})")
    # The C++ primitives' vector loops against the definitions, at shapes that take them (SAM's
    # image-to-token attention: many queries over 7 keys).
    q, k = mx.random.normal((1, 8, 100, 16), key=mx.random.key(1)), mx.random.normal((1, 8, 7, 16), key=mx.random.key(2))
    x = mx.random.normal((300, 257), key=mx.random.key(3)) * 4
    cases = {"scaled_dot_product_attention": ((q, k, k), {"scale": 0.25}), "layer_norm": ((x,), {}),
             "gelu": ((x,), {}), "softmax": ((x,), {}), "sigmoid": ((x,), {})}
    for name, (args, kwargs) in cases.items():
        _close(ops.get(name).dispatch(*args, **kwargs), ops.get(name).definition(*args, **kwargs), name)
    print(f"CPU primitives against their definitions ({', '.join(cases)}): ok")
    # A training step's CPU gradients: the BatchNorm + SiLU primitive pair, a conv's GEMM
    # backward with col2im (stride 2) and with the flipped-kernel conv (stride 1).
    xb = mx.random.normal((4, 9, 11, 37), key=mx.random.key(4)) * 2 + 1
    wb, bb = mx.random.uniform(0.5, 1.5, (37,), key=mx.random.key(5)), mx.random.normal((37,), key=mx.random.key(6))
    probe = mx.random.normal(xb.shape, key=mx.random.key(7))
    norm = ops.get("batch_norm_train")
    grads = [mx.grad(lambda *a: (f(*a, activation="silu")[0] * probe).sum(), (0, 1, 2))(xb, wb, bb)
             for f in (norm.dispatch, norm.definition)]
    for g, r in zip(*grads):
        _close(g, r, "batch_norm_train gradient")
    xc, wc = mx.random.normal((2, 13, 12, 8), key=mx.random.key(8)), mx.random.normal((16, 3, 3, 8), key=mx.random.key(9))
    for stride in (1, 2):
        probe = mx.random.normal(mx.conv2d(xc, wc, stride=stride, padding=1).shape, key=mx.random.key(10))
        grads = [mx.grad(lambda x, w: (f(x, w, stride=stride, padding=1) * probe).sum(), (0, 1))(xc, wc)
                 for f in (ops.conv2d, mx.conv2d)]
        for g, r in zip(*grads):
            _close(g, r, f"conv2d gradient (stride {stride})")
    print("training gradients (batch_norm_train, conv2d) against the definitions: ok")
    # In this process (a child process would not run under the emulator).
    check = CliRunner().invoke(app, ["check", "resnet18", "--size", "64"])
    print(check.output.strip().splitlines()[-1] if check.output.strip() else check.exception)
    print(f"done in {time.time() - start:.0f} s")
    return check.exit_code


if __name__ == "__main__":
    sys.exit(main())
