"""mlxnet's once-per-machine CUDA build: every launch's generated kernel compiles with NVRTC (no
GPU needed; the environment with PyTorch's CUDA wheels has NVRTC and the CUDA headers), and a
binary is compiled once, kept in the cache, and recompiled when the cache is damaged."""
from __future__ import annotations

import re

import mlx.core as mx
import pytest

from mlxnet.ops.core import cuda_build, kernel_launches, kernel_source


def _nvrtc():
    try:
        return cuda_build._find_nvrtc()
    except cuda_build.NvrtcError:
        return None


NVRTC = _nvrtc()
needs_nvrtc = pytest.mark.skipif(NVRTC is None, reason="NVRTC is not installed (PyTorch's CUDA wheels bring it)")


def _sources() -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for op, launch in kernel_launches.every_launch():
        made = launch.kernel.cuda_source(launch)
        if made is not None:
            out.setdefault(made[0], (op, made[1]))
    return out


@needs_nvrtc
def test_every_generated_kernel_compiles_with_nvrtc():
    sources = _sources()
    assert len(sources) > 100
    failures = {}
    for symbol, (op, source) in sources.items():
        try:
            cubin = cuda_build.compile_source(NVRTC, source, "sm_80")
        except cuda_build.NvrtcError as e:
            failures[f"{op}/{symbol}"] = str(e)[:500]
            continue
        assert cubin[:4] == b"\x7fELF" and symbol.encode() in cubin
    assert not failures, failures


@needs_nvrtc
def test_nvrtc_errors_carry_the_compiler_log():
    with pytest.raises(cuda_build.NvrtcError, match="undefined"):
        cuda_build.compile_source(NVRTC, 'extern "C" __global__ void k() { undefined_name(); }', "sm_80")


def test_generated_source_puts_inputs_then_outputs_and_the_template_inside():
    launch = next(la for _, la in kernel_launches.every_launch([mx.float16])
                  if la.kernel.kernel == "max_pool2d_indices")
    symbol, source = launch.kernel.cuda_source(launch)
    assert re.fullmatch(r"mlxnet_max_pool2d_indices_[0-9a-f]{16}", symbol)
    start = source.index('extern "C"')
    signature = source[start:source.index(") {", start)]
    names = re.findall(r"\* (\w+)", signature)
    assert names == list(launch.kernel.input_names) + list(launch.kernel.output_names)
    assert "const __half* x" in signature and "#include <cuda_fp16.h>" in source
    assert "cuda_bf16.h" not in source and "using T = __half;" in source
    # A different template is a different symbol: binaries never collide in the cache.
    other = next(la for _, la in kernel_launches.every_launch([mx.float32])
                 if la.kernel.kernel == "max_pool2d_indices")
    assert launch.kernel.cuda_source(other)[0] != symbol


def test_kernels_that_read_strides_keep_mlx_signature():
    reading = {k.kernel for k in kernel_source.KERNELS
               if cuda_build.needs_mlx_signature(kernel_source.render(k.filename, k.kernel, "cuda")[1], k.input_names)}
    assert reading == {"bias_act_pad2d"}


@pytest.fixture
def fake_machine(tmp_path, monkeypatch):
    """A machine whose NVRTC compiles by counting (or for real where NVRTC is installed)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cuda_build, "_state", {"tried": True, "nvrtc": NVRTC or object(), "arch": "sm_80",
                                               "key": "nvrtc-test-sm_80", "why": "test"})
    calls = []
    real = cuda_build.compile_source

    def counting(lib, source, arch):
        calls.append(arch)
        return real(lib, source, arch) if NVRTC is not None else b"\x7fELF binary of " + source.encode()
    monkeypatch.setattr(cuda_build, "compile_source", counting)
    return tmp_path, calls


def test_a_binary_is_compiled_once_then_read_from_the_cache(fake_machine):
    tmp_path, calls = fake_machine
    source = 'extern "C" __global__ void mlxnet_probe_0() {}\n'
    first = cuda_build.binary("mlxnet_probe_0", source)
    assert cuda_build.binary("mlxnet_probe_0", source) == first and calls == ["sm_80"]  # the cache on disk
    cached = tmp_path / "mlxnet" / "cuda" / "nvrtc-test-sm_80" / "mlxnet_probe_0.cubin"
    assert cached.read_bytes() == first and (cached.stat().st_mode & 0o777) == 0o644
    cached.write_bytes(b"damaged")  # a damaged file is compiled again, never loaded
    assert cuda_build.binary("mlxnet_probe_0", source) == first and len(calls) == 2


def test_without_nvrtc_launches_keep_mlx_compile_and_info_says_why(monkeypatch):
    monkeypatch.setattr(cuda_build, "_state", {"tried": False, "nvrtc": None, "why": ""})

    def missing():
        raise cuda_build.NvrtcError("NVRTC (libnvrtc) was not found")
    monkeypatch.setattr(cuda_build, "_find_nvrtc", missing)
    assert cuda_build.binary("mlxnet_probe_1", "") is None
    assert cuda_build.info() == "compiled by MLX in every process (NVRTC (libnvrtc) was not found)"
