"""The CPU fast paths of the activations and softmax, on an exp computed from + − × only.

MLX's Linux CPU back end evaluates exp/erf one scalar at a time, but it vectorises what
``mx.compile`` fuses, so the CPU fast paths compute exp(z) = p(r)·2^n from + − × only, in
shallow passes that each fuse into one loop (fusion stops at a bit-cast, at chains deeper than
MLX's limit, and at values shared outside the chain):

1. z, clipped to |z| ≤ 1e6 (exp is 0 or inf there already; it keeps r finite for any input);
2. the float32 bits of 2^n, n = round(z·log2 e) (rounded by adding and subtracting
   1.5·2^23, clamped so that 2^n is 0 or inf outside float32's range);
3. r = z − n·ln2 (n recomputed by the same float ops, so it is the same n), the Cephes
   polynomial p(r) by Estrin's scheme (shallow), times 2^n, and the activation around it.

|rel err| of exp < 2.5e-7.

Where mlxnet's C++ primitives are built (:mod:`mlxnet._native`, Linux), float32 SiLU (with or
without a per-channel bias), sigmoid and softmax run those instead: the same polynomial in one
pass on every core; float32 GELU (both forms) runs there too, as x·Φ(x) with Φ from an erfc fit
around that polynomial (not A&S 7.1.26 as below: relative accuracy also in the negative tail).
They also spare a fresh process the passes above: MLX's CPU JIT compiles each fused pass with
g++ into ``$TMPDIR/mlx`` (about 0.35 s apiece, again after every reboot), while the primitives
are compiled once per installation. The passes here remain the path for
other dtypes and wherever the primitives are unavailable (macOS, ``MLXNET_NATIVE=off``).
"""
from __future__ import annotations

from typing import Callable

import mlx.core as mx

from ... import _native
from . import definition
from .definition import _SQRT_HALF, _tanh_arg

_LOG2E = 1.4426950408889634
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4  # ln 2 = HI + LO, n·HI exact for |n| < 2^15
_C0, _C1, _C2, _C3, _C4, _C5 = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3,
                                4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
_ROUND = 12582912.0  # 1.5·2^23: (v + _ROUND) − _ROUND is v rounded to an integer, |v| < 2^22
_ERF_P = 0.3275911
_ERF_A = (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)


def _round_log2(z: mx.array) -> mx.array:
    # n is piecewise constant in z: no gradient flows through it.
    return mx.stop_gradient((z * _LOG2E + _ROUND) - _ROUND)


def _pow2_bits(z: mx.array) -> mx.array:
    """int32 bits of 2^n as a float32: n ≤ −127 gives 0.0, n ≥ 128 gives inf."""
    n = mx.clip(_round_log2(z).astype(mx.int32), -127, 128)
    return mx.left_shift(n + 127, 23)


def _exp_given_pow2(z: mx.array, two: mx.array) -> mx.array:
    n = _round_log2(z)
    r = (z - n * _LN2_HI) - n * _LN2_LO
    r2 = r * r
    r4 = r2 * r2
    q = r4 * (_C0 * r + _C1) + (r2 * (_C2 * r + _C3) + (_C4 * r + _C5))
    return (r2 * q + (1.0 + r)) * two


def _with_exp(z_of: Callable[..., mx.array],
              finish: Callable[..., mx.array]) -> Callable[..., mx.array]:
    """f(*xs) = finish(*xs, exp(z_of(*xs))) in float32, cast back to the first input's dtype.

    Three fused passes: z (z_of must keep |z| ≤ 1e6, where exp is already 0 or inf, so that
    r stays finite for any input, ±inf included), the bits of 2^n, then exp and ``finish``.
    """
    def f32(xs: tuple) -> tuple:
        return tuple(x.astype(mx.float32) for x in xs)

    z_pass = mx.compile(lambda *xs: z_of(*f32(xs)))

    def finish_pass(z: mx.array, two: mx.array, *xs: mx.array) -> mx.array:
        return finish(*f32(xs), _exp_given_pow2(z, two)).astype(xs[0].dtype)
    last = mx.compile(finish_pass)

    def run(*xs: mx.array) -> mx.array:
        z = z_pass(*xs)
        two = mx.stop_gradient(_pow2_pass(z).view(mx.float32))
        return last(z, two, *xs)
    return run


_pow2_pass = mx.compile(_pow2_bits)
_Z_LIMIT = 1e6


def _negated(x: mx.array) -> mx.array:
    return -mx.clip(x, -_Z_LIMIT, _Z_LIMIT)


def _with_slope(forward: Callable[[mx.array], mx.array],
                slope: Callable[[mx.array, mx.array], mx.array]) -> Callable[[mx.array], mx.array]:
    """``forward`` with the gradient g·slope(x, y), y = forward(x), in float32. Autodiff of the
    arithmetic exp would multiply a zero by exp's overflow (inf) below x ≈ −88 and make NaN
    where the true gradient is 0; the closed-form slope never meets an inf there."""
    @mx.custom_function
    def f(x: mx.array) -> mx.array:
        return forward(x)

    @f.vjp
    def f_vjp(primals: tuple, cotangent: mx.array, output: mx.array) -> tuple:
        x = primals[0] if isinstance(primals, (tuple, list)) else primals
        g = cotangent[0] if isinstance(cotangent, (tuple, list)) else cotangent
        y = output[0] if isinstance(output, (tuple, list)) else output
        return (_times_slope(g, x, y),)

    # the slope and the product in one fused pass (SiLU's recomputed sigmoid adds its own)
    _times_slope = mx.compile(lambda g, x, y: (g.astype(mx.float32) * slope(
        x.astype(mx.float32), y.astype(mx.float32))).astype(x.dtype))
    return f


_sigmoid_arith = _with_exp(_negated, lambda x, e: 1.0 / (1.0 + e))
# sigmoid' = s·(1 − s); silu' = s·(1 + x·(1 − s)), s = sigmoid(x) recomputed in float32
_sigmoid_f32 = _with_slope(_sigmoid_arith, lambda x, y: y * (1.0 - y))
_silu_f32 = _with_slope(
    _with_exp(_negated, lambda x, e: x / (1.0 + e)),
    lambda x, y: (lambda s: s * (1.0 + x * (1.0 - s)))(_sigmoid_arith(x)))
# exp(−x²/2), for GELU
_gauss = _with_exp(lambda x: (lambda c: c * (c * -0.5))(mx.clip(x, -1e3, 1e3)), lambda x, e: e)
# exp(x − m), m ≥ x (softmax; x = −inf, a masked score, gives 0)
_exp_below = _with_exp(lambda x, m: mx.maximum(x - m, -_Z_LIMIT), lambda x, m, e: e)


# exp(z): |rel err| < 2.5e-7; 0 and inf outside float32's range
_exp = _with_exp(lambda z: mx.clip(z, -_Z_LIMIT, _Z_LIMIT), lambda z, e: e)


@mx.compile
def _gelu_given_gauss(x: mx.array, gauss: mx.array) -> mx.array:
    # 0.5·x·(1 + erf(x/√2)) = 0.5·(x + |x|·erf(|x|/√2)), with A&S 7.1.26 for erf of the
    # non-negative argument, erf(u) = 1 − t·P(t)·exp(−u²): one expression for both signs of x,
    # whose gradient at 0 is the true 0.5 (|x|' = 0 there) and which is inf at x = inf.
    xf = x.astype(mx.float32)
    a = mx.abs(xf)
    t = 1.0 / (1.0 + (_ERF_P * _SQRT_HALF) * a)
    t2 = t * t
    a0, a1, a2, a3, a4 = _ERF_A
    tp = ((a2 + a1 * t) + t2 * a0) * t2 + (a4 + a3 * t)  # P(t) by Estrin's scheme
    return (0.5 * (xf + a * (1.0 - tp * (t * gauss)))).astype(x.dtype)


# GELU's tanh form with tanh(|u|) = (1 − e)/(1 + e), e = exp(−2|u|) in [0, 1]
_gelu_tanh_f32 = _with_exp(lambda x: -mx.minimum(2.0 * mx.abs(_tanh_arg(x)), _Z_LIMIT),
                           lambda x, e: 0.5 * (x + mx.abs(x) * ((1.0 - e) / (1.0 + e))))


def silu(x: mx.array, bias: mx.array | None = None) -> mx.array:
    # Float32 with a per-channel bias: one pass of mlxnet's CPU primitive on every core.
    native = _native.on_cpu()
    if native is not None and x.dtype == mx.float32 and (
            bias is None or (bias.dtype == mx.float32 and bias.shape == x.shape[-1:])):
        return native.bias_silu(x, bias)
    return _silu_f32(x if bias is None else x + bias)


def bias_act(x: mx.array, bias: mx.array, residual: mx.array | None = None, *,
             activation: str | None = "relu") -> mx.array:
    """A convolution's epilogue in one pass on every core (mlxnet's C++ primitive, float32),
    where MLX's CPU back end takes a pass per op, each on one core; the definition elsewhere."""
    native = _native.on_cpu()
    same = x.dtype == bias.dtype == mx.float32 and (residual is None or residual.dtype == mx.float32)
    if native is None or not same:
        return definition.bias_act(x, bias, residual, activation=activation)
    return native.bias_act(x, bias, residual, activation == "relu")


def sigmoid(x: mx.array) -> mx.array:
    native = _native.on_cpu()
    if native is not None and x.dtype == mx.float32:
        return native.sigmoid(x)
    return _sigmoid_f32(x)


def gelu(x: mx.array, *, approximate: str = "none") -> mx.array:
    # Float32: one pass of mlxnet's CPU primitive on every core (x·Φ(x) from an erfc fit); the
    # passes below remain for other dtypes and where the primitives are not built.
    native = _native.on_cpu()
    if native is not None and x.dtype == mx.float32:
        return native.gelu(x, tanh=approximate == "tanh")
    if approximate == "tanh":
        return _gelu_tanh_f32(x)
    return _gelu_given_gauss(x, _gauss(x.astype(mx.float32)))


def _softmax_last(x: mx.array) -> mx.array:
    e = _exp_below(x, mx.stop_gradient(x.max(axis=-1, keepdims=True)))
    return e / e.sum(axis=-1, keepdims=True)


def softmax(x: mx.array, *, axis: int = -1) -> mx.array:
    native = _native.on_cpu()
    if native is not None and x.dtype == mx.float32:
        # The primitive reduces the last axis; another axis is moved there (the primitive reads
        # its input contiguous, as the compiled passes read the moved view) and back.
        last = axis % x.ndim == x.ndim - 1
        y = native.softmax(x if last else mx.moveaxis(x, axis, -1))
        return y if last else mx.moveaxis(y, -1, axis)
    xf = mx.moveaxis(x.astype(mx.float32), axis, -1)
    return mx.moveaxis(_softmax_last(xf), -1, axis).astype(x.dtype)
