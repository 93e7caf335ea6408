"""Portable custom kernels: one body for Metal and CUDA, a small prelude per back end.

A file in ``custom_kernels/`` holds a shared header (helper functions) followed by one or
more kernels, each introduced by a line ``//@kernel NAME``. Bodies are written against the
names below, which each back end's prelude defines:

    mx_tid, mx_lid, mx_gid, mx_tgsize   uint3: thread in grid, thread in group, group, group size
    MX_FN                                qualifier for helper functions
    MX_SHARED                            threadgroup / __shared__ storage (declarations)
    MX_SHARED_PTR                        address space of a shared-memory pointer parameter
    MX_BARRIER()                         threadgroup barrier
    mx_exp mx_log mx_sqrt mx_rsqrt mx_abs mx_floor mx_ceil mx_fmax mx_fmin   float math
    MX_INFINITY                          +inf as float
    mx_add_rn mx_sub_rn mx_mul_rn mx_div_rn   one float operation, correctly rounded and never
                                         contracted with another (a*b+c stays two roundings):
                                         for results that must equal the host's bit for bit
    uint                                 32-bit unsigned

Inputs are ``const T*`` buffers, outputs ``T*``; ``X_shape``/``X_strides``/``X_ndim`` exist
for input ``X`` when the body mentions them. Metal dispatches exactly ``grid`` threads, CUDA
rounds up to whole blocks, so every body bounds-checks its thread index. Avoid identifiers that
contain Metal attribute names (``grid_size``, ``thread_index_in_simdgroup``, ...): MLX adds an
attribute parameter for each such name it finds in a Metal body.

The address-space rule: on Metal, MLX passes an input of fewer than 8 elements as
``const constant T*`` and every other input as ``const device T*``, and Metal never converts
between address spaces. So a helper never names the address space of an input it reads: it
takes the pointer as a template parameter (``template <typename Src> ... f(Src x)``), which
deduces either. Two launch
rules keep every body valid for every input size (see ``PortableKernel.__call__``): a 0-d
input reaches the kernel as a 1-element array (MLX would pass it as a reference, which cannot
be indexed), and a launch with no thread to run (an empty grid) is not made at all.
"""
from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Iterator, Sequence

import mlx.core as mx

from ...device import backend
from ...errors import MlxnetError
from . import cuda_build

_METAL_HEADER = """
#define MX_FN inline
#define MX_SHARED threadgroup
#define MX_SHARED_PTR threadgroup
#define MX_BARRIER() threadgroup_barrier(mem_flags::mem_threadgroup)
#define MX_INFINITY INFINITY
MX_FN float mx_exp(float x) { return metal::exp(x); }
MX_FN float mx_log(float x) { return metal::log(x); }
MX_FN float mx_sqrt(float x) { return metal::sqrt(x); }
MX_FN float mx_rsqrt(float x) { return metal::rsqrt(x); }
MX_FN float mx_abs(float x) { return metal::abs(x); }
MX_FN float mx_floor(float x) { return metal::floor(x); }
MX_FN float mx_ceil(float x) { return metal::ceil(x); }
MX_FN float mx_fmax(float a, float b) { return metal::fmax(a, b); }
MX_FN float mx_fmin(float a, float b) { return metal::fmin(a, b); }
// One operation per function: clang contracts a*b+c only within one expression, and MLX builds
// Metal libraries with fast math off, where Metal's x / y is correctly rounded.
MX_FN float mx_add_rn(float a, float b) { return a + b; }
MX_FN float mx_sub_rn(float a, float b) { return a - b; }
MX_FN float mx_mul_rn(float a, float b) { return a * b; }
MX_FN float mx_div_rn(float a, float b) { return a / b; }
"""

# Metal adds a kernel attribute only when its name appears in the body, so the thread
# indices are bound in the body, not hidden in header macros.
_METAL_BODY_PRELUDE = """
  const uint3 mx_tid = thread_position_in_grid;
  const uint3 mx_lid = thread_position_in_threadgroup;
  const uint3 mx_gid = threadgroup_position_in_grid;
  const uint3 mx_tgsize = threads_per_threadgroup;
"""

_CUDA_HEADER = """
typedef unsigned int uint;
#define MX_FN __device__ inline
#define MX_SHARED __shared__
#define MX_SHARED_PTR
#define MX_BARRIER() __syncthreads()
#define MX_INFINITY __int_as_float(0x7f800000)
MX_FN float mx_exp(float x) { return expf(x); }
MX_FN float mx_log(float x) { return logf(x); }
MX_FN float mx_sqrt(float x) { return sqrtf(x); }
MX_FN float mx_rsqrt(float x) { return rsqrtf(x); }
MX_FN float mx_abs(float x) { return fabsf(x); }
MX_FN float mx_floor(float x) { return floorf(x); }
MX_FN float mx_ceil(float x) { return ceilf(x); }
MX_FN float mx_fmax(float a, float b) { return fmaxf(a, b); }
MX_FN float mx_fmin(float a, float b) { return fminf(a, b); }
// The _rn intrinsics round to nearest and are never fused into an FMA.
MX_FN float mx_add_rn(float a, float b) { return __fadd_rn(a, b); }
MX_FN float mx_sub_rn(float a, float b) { return __fsub_rn(a, b); }
MX_FN float mx_mul_rn(float a, float b) { return __fmul_rn(a, b); }
MX_FN float mx_div_rn(float a, float b) { return __fdiv_rn(a, b); }
"""

_CUDA_BODY_PRELUDE = """
  const uint3 mx_lid = threadIdx;
  const uint3 mx_gid = blockIdx;
  const uint3 mx_tgsize = make_uint3(blockDim.x, blockDim.y, blockDim.z);
  const uint3 mx_tid = make_uint3(blockIdx.x * blockDim.x + threadIdx.x,
                                  blockIdx.y * blockDim.y + threadIdx.y,
                                  blockIdx.z * blockDim.z + threadIdx.z);
"""

_PRELUDES = {
    "metal": (_METAL_HEADER, _METAL_BODY_PRELUDE),
    "cuda": (_CUDA_HEADER, _CUDA_BODY_PRELUDE),
}

_KERNEL_MARK = re.compile(r"^//@kernel\s+(\w+)\s*$", re.MULTILINE)


def read_source(filename: str) -> tuple[str, dict[str, str]]:
    """Split a kernel file into (shared header, {kernel name: body})."""
    text = resources.files("mlxnet.custom_kernels").joinpath(filename).read_text()
    parts = _KERNEL_MARK.split(text)
    header, rest = parts[0], parts[1:]
    bodies = {rest[i]: rest[i + 1] for i in range(0, len(rest), 2)}
    if not bodies:
        raise MlxnetError(f"custom_kernels/{filename}: no '//@kernel NAME' section")
    return header, bodies


def render(filename: str, kernel: str, target: str) -> tuple[str, str]:
    """The (header, body) MLX receives for ``kernel`` on ``target`` ('metal' or 'cuda')."""
    shared, bodies = read_source(filename)
    if kernel not in bodies:
        raise MlxnetError(f"custom_kernels/{filename}: no kernel {kernel!r} (has {sorted(bodies)})")
    header, body_prelude = _PRELUDES[target]
    return header + shared, body_prelude + bodies[kernel]


NHWC_GROUP = 256  # threads per group of the NHWC launches


def launch_nhwc(kernel: "PortableKernel", inputs: Sequence[mx.array], params: Sequence[int], template: list,
                threads: Sequence[int], shapes: Sequence[Sequence[int]], dtypes: Sequence[mx.Dtype],
                init_value: float | None = None) -> list[mx.array] | None:
    """Run ``kernel`` with one thread per element of the NHWC ``threads`` shape, on a (C * W, H, N)
    grid, the runtime sizes ``params`` appended as the last input. None, without launching,
    where that exceeds the launch limits (the caller raises or falls back): kernels index with
    int, so the largest tensor (and the grid rounded up to whole groups) stays below 2^31; CUDA
    grids have at most 65535 blocks along y and z."""
    n, h, w, c = threads
    largest = max([n * h * w * c] + [a.size for a in inputs])
    if largest >= 2**31 - NHWC_GROUP or max(n, h) > 65535:
        return None
    return kernel(list(inputs) + [int_params(tuple(params))], template=template, grid=(c * w, h, n),
                  threadgroup=(NHWC_GROUP, 1, 1), output_shapes=shapes, output_dtypes=dtypes,
                  init_value=init_value)


def as_words(x: mx.array) -> mx.array:
    """``x``'s bytes with each pixel's channels (its last axis) as 8- or 4-byte words where
    those tile them (a view), else ``x`` itself: a copy kernel then moves a word per thread."""
    row = x.shape[-1] * x.dtype.size
    word = next((d for d in (mx.uint64, mx.uint32) if row % d.size == 0), None)
    return x if word is None or x.size == 0 else x.view(word)


# MLX's CUDA back end serves arrays of up to this many bytes from a small pool of managed
# (host-migrated) memory, aligned to 8 bytes and shared with the process's scalars: a kernel
# reading its sizes from there waited about 15 µs per launch on an H100, and cuDNN plans cached
# for aligned operands can meet one of its copies (docs/performance-notes.md). Arrays mlxnet
# makes for its kernels are longer than this.
MLX_SMALL_POOL_BYTES = 8
MIN_PARAMS = MLX_SMALL_POOL_BYTES // 4 + 1  # int32 sizes, zero-padded


@functools.lru_cache(maxsize=512)
def int_params(values: tuple[int, ...]) -> mx.array:
    """Runtime sizes for a kernel as a small int32 array (not template constants, so one
    compiled kernel serves every size), of at least MIN_PARAMS elements (zeros after the
    sizes). One array per distinct tuple, reused: a fresh host array per call would be
    migrated to the GPU (unified memory) on every launch."""
    return mx.array(tuple(values) + (0,) * (MIN_PARAMS - len(values)), mx.int32)


@functools.lru_cache(maxsize=64)
def float_params(values: tuple[float, ...]) -> mx.array:
    """Runtime float constants (an epsilon) for a kernel, as :func:`int_params` makes sizes:
    float32, at least MIN_PARAMS elements, one array per distinct tuple."""
    return mx.array(tuple(values) + (0.0,) * (MIN_PARAMS - len(values)), mx.float32)


@dataclass(frozen=True, eq=False)
class Launch:
    """One kernel launch as the launch code asked for it (inputs after the launch rules)."""

    kernel: "PortableKernel"
    inputs: tuple[mx.array, ...]
    template: tuple[tuple[str, Any], ...]
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    output_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[mx.Dtype, ...]
    init_value: float | None = None

    def call_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of an MLX kernel call for this launch, its inputs aside."""
        kwargs: dict[str, Any] = dict(
            template=list(self.template), grid=self.grid, threadgroup=self.threadgroup,
            output_shapes=list(self.output_shapes), output_dtypes=list(self.output_dtypes))
        if self.init_value is not None:
            kwargs["init_value"] = self.init_value
        return kwargs

    def run(self) -> list[mx.array]:
        """Launch it for real on the back end in force (compiles it there first)."""
        return self.kernel.launch(self)

    def metal_source(self) -> str:
        """The exact Metal source ``mx.fast.metal_kernel`` generates for this launch
        (header, then MLX's signature and body; MLX prepends its own preamble when it
        compiles). MLX prints it while tracing, which works without a GPU."""
        return _generated_metal_source(self)


_UNBUILT = object()  # a PortableKernel._cuda entry not made yet (None: MLX builds that one)


def _cuda_key(template: Sequence[tuple[str, Any]], inputs: Sequence[mx.array],
              output_dtypes: Sequence[mx.Dtype]) -> tuple:
    """What a CUDA build depends on besides the kernel: its template and dtypes."""
    return tuple(template), tuple(x.dtype for x in inputs), tuple(output_dtypes)

# Every PortableKernel ever constructed, so checks can prove each one was rendered.
KERNELS: list["PortableKernel"] = []
_recording: list[list[Launch]] = []


@contextlib.contextmanager
def record_launches() -> Iterator[list[Launch]]:
    """Record launches instead of running them (outputs are zero placeholders), on any
    back end: what the compile checks use to see every kernel the launch code asks for."""
    launches: list[Launch] = []
    _recording.append(launches)
    try:
        yield launches
    finally:
        _recording.pop()


@dataclass(eq=False)
class PortableKernel:
    """One kernel of a ``custom_kernels/`` file, compiled lazily per back end.

    MLX caches the compiled code per template (dtype, constants); this object caches the
    MLX kernel handle per back end, so each (op, back end, dtype, template) builds once.
    """

    filename: str
    kernel: str
    input_names: Sequence[str]
    output_names: Sequence[str]
    atomic_outputs: bool = False
    # False: inputs reach the kernel as they are, views included, and the body reads each
    # through its ``X_strides`` (MLX otherwise copies a non-contiguous input first).
    row_contiguous: bool = True
    _handles: dict[str, Any] = field(default_factory=dict, repr=False)
    _cuda: dict[tuple, tuple[str, bytes] | None] = field(default_factory=dict, repr=False)
    built: set[tuple] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        KERNELS.append(self)

    @property
    def name(self) -> str:
        return f"mlxnet_{self.kernel}"

    def handle(self, target: str) -> Any:
        if target not in self._handles:
            header, body = render(self.filename, self.kernel, target)
            if target == "metal":
                self._handles[target] = mx.fast.metal_kernel(
                    name=self.name, input_names=list(self.input_names),
                    output_names=list(self.output_names), source=body, header=header,
                    atomic_outputs=self.atomic_outputs, ensure_row_contiguous=self.row_contiguous,
                )
            elif target == "cuda":
                self._handles[target] = mx.fast.cuda_kernel(
                    name=self.name, input_names=list(self.input_names),
                    output_names=list(self.output_names), source=body, header=header,
                    ensure_row_contiguous=self.row_contiguous,
                )
            else:
                raise MlxnetError(f"kernel {self.kernel!r} cannot run on back end {target!r}")
        return self._handles[target]

    def __call__(
        self,
        inputs: Sequence[mx.array],
        *,
        template: Sequence[tuple[str, Any]],
        grid: tuple[int, int, int],
        threadgroup: tuple[int, int, int],
        output_shapes: Sequence[Sequence[int]],
        output_dtypes: Sequence[mx.Dtype],
        init_value: float | None = None,
    ) -> list[mx.array]:
        inputs = [x.reshape(1) if x.ndim == 0 else x for x in inputs]
        if not _recording and 0 not in grid and backend() == "cuda":
            # The common case, kept short: a training step makes hundreds of launches, each
            # costing the host time the device then waits for.
            built = self._cuda.get(_cuda_key(template, inputs, output_dtypes), _UNBUILT)
            if built is _UNBUILT:
                built = self.cuda_binary(self._launch(inputs, template, grid, threadgroup, output_shapes,
                                                      output_dtypes, init_value))
            if built is not None:
                return self._run_built(built, inputs, grid, threadgroup, output_shapes, output_dtypes, init_value)
        launch = self._launch(inputs, template, grid, threadgroup, output_shapes, output_dtypes, init_value)
        if _recording or 0 in launch.grid:
            if _recording:
                _recording[-1].append(launch)
            # Nothing to launch (or only recording): every output keeps its initial value (cast:
            # MLX 0.32 makes mx.full of a float value float32 whatever dtype it is given).
            fill = 0.0 if init_value is None else init_value
            return [mx.full(s, fill).astype(d) for s, d in zip(launch.output_shapes, launch.output_dtypes)]
        return self.launch(launch)

    def _launch(self, inputs: Sequence[mx.array], template: Sequence[tuple[str, Any]], grid: Sequence[int],
                threadgroup: Sequence[int], output_shapes: Sequence[Sequence[int]],
                output_dtypes: Sequence[mx.Dtype], init_value: float | None) -> Launch:
        return Launch(self, tuple(inputs), tuple(template), tuple(grid), tuple(threadgroup),
                      tuple(tuple(s) for s in output_shapes), tuple(output_dtypes), init_value)

    def launch(self, launch: Launch) -> list[mx.array]:
        target = backend()
        if target == "cuda":
            built = self.cuda_binary(launch)
            if built is not None:
                return self._run_built(built, launch.inputs, launch.grid, launch.threadgroup, launch.output_shapes,
                                       launch.output_dtypes, launch.init_value)
        self.built.add((target, tuple((k, str(v)) for k, v in launch.template)))
        return self.handle(target)(inputs=list(launch.inputs), **launch.call_kwargs())

    def _run_built(self, built: tuple[str, bytes], inputs: Sequence[mx.array], grid: Sequence[int],
                   threadgroup: Sequence[int], output_shapes: Sequence[Sequence[int]],
                   output_dtypes: Sequence[mx.Dtype], init_value: float | None) -> list[mx.array]:
        """Launch mlxnet's own CUDA build (symbol, binary) of this kernel."""
        extra = {} if init_value is None else {"init_value": init_value}
        return mx.fast.precompiled_cuda_kernel(
            name=built[0], compiled_source=built[1], inputs=list(inputs), scalars=[], grid=tuple(grid),
            threadgroup=tuple(threadgroup), output_shapes=[tuple(s) for s in output_shapes],
            output_dtypes=list(output_dtypes), ensure_row_contiguous=self.row_contiguous, **extra)

    def cuda_source(self, launch: Launch) -> tuple[str, str] | None:
        """(symbol, whole CUDA source) of this launch for mlxnet's once-per-machine build; None
        for a body that needs MLX's generated signature."""
        header, body = render(self.filename, self.kernel, "cuda")
        if cuda_build.needs_mlx_signature(body, self.input_names):
            return None
        args = (header, body, self.input_names, [x.dtype for x in launch.inputs], self.output_names,
                launch.output_dtypes, launch.template)
        symbol = cuda_build.symbol_for(self.name, cuda_build.kernel_source("KERNEL", *args))
        return symbol, cuda_build.kernel_source(symbol, *args)

    def cuda_binary(self, launch: Launch) -> tuple[str, bytes] | None:
        """The launch's CUDA build, made (or read from the cache) once per template and dtypes;
        None where MLX builds it instead (:meth:`cuda_source`)."""
        key = _cuda_key(launch.template, launch.inputs, launch.output_dtypes)
        if key not in self._cuda:
            self.built.add(("cuda", tuple((k, str(v)) for k, v in launch.template)))
            made = self.cuda_source(launch)
            code = None if made is None else cuda_build.binary(*made)
            self._cuda[key] = None if code is None else (made[0], code)
        return self._cuda[key]


def _generated_metal_source(launch: Launch) -> str:
    kernel = launch.kernel
    header, body = render(kernel.filename, kernel.kernel, "metal")
    return generated_metal_source(
        kernel.name, kernel.input_names, kernel.output_names, header, body, launch.inputs,
        atomic_outputs=kernel.atomic_outputs, **launch.call_kwargs())


def generated_metal_source(name: str, input_names: Sequence[str], output_names: Sequence[str],
                           header: str, body: str, inputs: Sequence[mx.array], *,
                           atomic_outputs: bool = False, **call: Any) -> str:
    """What ``mx.fast.metal_kernel(name, ..., source=body, header=header)`` generates for a
    call on ``inputs`` with the kernel call's keyword arguments ``call`` (template, grid,
    threadgroup, output shapes and dtypes): MLX's own code generator, which prints the source
    while ``mx.export_function`` traces the call, with no GPU needed."""
    metal = mx.fast.metal_kernel(name=name, input_names=list(input_names),
                                 output_names=list(output_names), source=body, header=header,
                                 atomic_outputs=atomic_outputs)
    kwargs = {**call, "verbose": True}
    with tempfile.TemporaryDirectory() as tmp:
        printed = os.path.join(tmp, "stdout")
        with _stdout_to(printed):
            mx.export_function(os.path.join(tmp, "kernel.mlxfn"),
                               lambda *xs: metal(inputs=list(xs), **kwargs), *inputs)
        with open(printed) as f:
            text = f.read()
    match = re.search(r"^```\n(.*)^```$", text, re.MULTILINE | re.DOTALL)
    if match is None:
        raise MlxnetError(f"MLX printed no source for kernel {name!r}: {text[:200]!r}")
    return match.group(1)


@contextlib.contextmanager
def _stdout_to(path: str) -> Iterator[None]:
    """Send file descriptor 1 (where MLX's C++ code prints) to ``path`` for the block."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(path, "w") as f:
            os.dup2(f.fileno(), 1)
            try:
                yield
            finally:
                sys.stdout.flush()
                os.dup2(saved, 1)
    finally:
        os.close(saved)
