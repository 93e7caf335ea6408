"""The optimizer side of ``mlxnet train detect``, as ultralytics' trainer sets it up (8.4).

- Three parameter groups: weights with weight decay (convolution kernels), BatchNorm scales
  without, and biases without (BatchNorm shifts included).
- SGD with Nesterov momentum, or AdamW (betas (momentum, 0.999), decoupled decay), both with
  PyTorch's update rules, since ultralytics' learning rates are tuned for them.
- ``optimizer=auto``: AdamW at ``lr = round(0.002 · 5 / (4 + nc), 6)``, momentum 0.9, for runs of
  at most 10,000 iterations (every fine-tune of a small data set); beyond that ultralytics picks
  its MuSGD, which mlxnet does not have: SGD at 0.01, momentum 0.9 (ultralytics' rule before 8.4).
- Gradient accumulation to the nominal batch ``nbs`` = 64, with the weight decay scaled by
  ``batch · accumulate / nbs``; the gradient's global norm clipped to 10 before every step.
- Warm-up over ``warmup_epochs``: the learning rates rise from 0 (biases fall from
  ``warmup_bias_lr``) to their scheduled value, SGD's momentum from ``warmup_momentum``, and the
  accumulation from 1 step to its nominal count; after it the learning rate follows the linear
  schedule ``lr0 · ((1 − e/epochs)(1 − lrf) + lrf)`` per epoch e.
- An exponential moving average of the weights (and BatchNorm statistics) with decay
  ``0.9999 · (1 − exp(−updates / 2000))``: what is validated and saved.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import mlx.core as mx
import numpy as np

GROUPS = ("weight", "bn", "bias")
MUSGD_ITERATIONS = 10_000
MAX_GRAD_NORM = 10.0


def group_of(key: str) -> str:
    """ultralytics' grouping by parameter name: a bias (any name holding 'bias'), a norm layer's
    scale, else a weight with decay."""
    if "bias" in key:
        return "bias"
    if ".bn." in key:
        return "bn"
    return "weight"


@dataclass(frozen=True)
class Choice:
    """The optimizer ``auto`` (or the user) picked, with its starting learning rate and momentum."""

    name: str  # "sgd" or "adamw"
    lr: float
    momentum: float
    warmup_bias_lr: float
    note: str | None = None


def choose(name: str, *, lr: float, momentum: float, warmup_bias_lr: float, nc: int, iterations: int) -> Choice:
    """ultralytics' ``build_optimizer`` choice. ``iterations``: ceil(images / max(batch, nbs)) × epochs."""
    if name != "auto":
        return Choice(name, lr, momentum, warmup_bias_lr)
    if iterations > MUSGD_ITERATIONS:
        return Choice("sgd", 0.01, 0.9, 0.0, note=f"optimizer auto: {iterations} iterations > {MUSGD_ITERATIONS}: "
                      "SGD(lr=0.01, momentum=0.9) (ultralytics 8.4 picks its MuSGD here)")
    fit = round(0.002 * 5 / (4 + nc), 6)
    return Choice("adamw", fit, 0.9, 0.0, note=f"optimizer auto: AdamW(lr={fit}, momentum=0.9) for {nc} classes "
                  f"and {iterations} iterations (--lr is ignored; pass --optimizer sgd or adamw to set it)")


class FlatLayout:
    """Where each named array lives in one flat float32 vector: the optimizer, the EMA and the
    gradient accumulation work on that vector, a few kernels per step instead of a dozen per
    parameter (hundreds of launches, most of an eager GPU step's overhead). Unpacked arrays are
    reshaped slices of the vector, views that share its memory."""

    def __init__(self, arrays: Mapping[str, mx.array]) -> None:
        self.keys = list(arrays)
        self.shapes = {k: tuple(arrays[k].shape) for k in self.keys}
        self.dtypes = {k: arrays[k].dtype for k in self.keys}
        sizes = [math.prod(self.shapes[k]) for k in self.keys]
        self.offsets = dict(zip(self.keys, np.concatenate([[0], np.cumsum(sizes)[:-1]]).tolist()))
        self.sizes = dict(zip(self.keys, sizes))
        self.size = int(sum(sizes))

    def pack(self, arrays: Mapping[str, mx.array]) -> mx.array:
        flat = mx.concatenate([arrays[k].reshape(-1) for k in self.keys])
        return flat if flat.dtype == mx.float32 else flat.astype(mx.float32)

    def unpack(self, flat: mx.array, *, keep_dtype: bool = True) -> dict[str, mx.array]:
        out = {}
        for k in self.keys:
            o = self.offsets[k]
            a = flat[o:o + self.sizes[k]].reshape(self.shapes[k])
            out[k] = a.astype(self.dtypes[k]) if keep_dtype and a.dtype != self.dtypes[k] else a
        return out

    def host_unpack(self, flat: mx.array, *, keep_dtype: bool = True) -> dict[str, "np.ndarray | mx.array"]:
        """:meth:`unpack` on the host (numpy views of one copy of the evaluated vector): one
        copy from the device, not one per array. An array whose dtype numpy lacks (bfloat16)
        stays an MLX array, as :func:`mlxnet.weights.safetensors_io.host_copies` keeps it."""
        vector = np.array(flat)
        out: dict[str, np.ndarray | mx.array] = {}
        for k in self.keys:
            a = vector[self.offsets[k]:self.offsets[k] + self.sizes[k]].reshape(self.shapes[k])
            dtype = self.dtypes[k]
            if not keep_dtype or dtype == mx.float32:
                out[k] = a
            else:
                out[k] = a.astype(_NUMPY[dtype]) if dtype in _NUMPY else mx.array(a).astype(dtype)
        return out


_NUMPY = {mx.float16: np.float16, mx.float64: np.float64}


class GroupedOptimizer:
    """PyTorch's SGD (Nesterov) or AdamW over flat ``{key: array}`` parameters, with a learning
    rate, momentum and weight decay per group (:data:`GROUPS`), set by the trainer every step.
    The update runs on the parameters packed into one vector (:class:`FlatLayout`);
    ``compiled``: as one compiled function (the hyperparameters enter as arrays, so changing
    them does not trace it again)."""

    def __init__(self, name: str, params: Mapping[str, mx.array], *, lr: float, momentum: float,
                 weight_decay: float, compiled: bool = False) -> None:
        self.name = name
        # Ordered by group, so that each group is one contiguous segment of the vector
        self.layout = FlatLayout({k: params[k] for g in GROUPS for k in params if group_of(k) == g})
        sizes = [sum(self.layout.sizes[k] for k in self.layout.keys if group_of(k) == g) for g in GROUPS]
        # Each element's group (an index into the settings), so that one elementwise pass updates
        # the whole vector (fused into a few kernels when compiled), not a pass per group whose
        # outputs are then joined.
        self._group = mx.array(np.repeat(np.arange(len(GROUPS), dtype=np.uint8), sizes))
        self.lr = dict.fromkeys(GROUPS, lr)
        self.momentum = dict.fromkeys(GROUPS, momentum)
        self.decay = {"weight": weight_decay, "bn": 0.0, "bias": 0.0}
        zeros = mx.zeros((self.layout.size,), mx.float32)
        self.flat_state = {"step": mx.array(0, mx.int32)}
        self.flat_state.update({"buf": zeros} if name == "sgd" else {"m": zeros, "v": zeros})
        self._update = mx.compile(self._pure_update) if compiled else self._pure_update

    def host_state(self) -> dict[str, "np.ndarray | mx.array"]:
        """The optimizer's state by parameter (``step``, ``buf.KEY`` or ``m.KEY`` and ``v.KEY``), as
        a training state file stores it, on the host: one copy per moment vector (evaluated first)."""
        out: dict[str, np.ndarray | mx.array] = {"step": np.array(self.flat_state["step"])}
        for name, flat in self.flat_state.items():
            if name != "step":
                out.update({f"{name}.{k}": v for k, v in self.layout.host_unpack(flat, keep_dtype=False).items()})
        return out

    def load_state(self, state: Mapping[str, mx.array]) -> None:
        """Restore :meth:`host_state`'s arrays (a resumed run's, as read back from its file)."""
        for name in self.flat_state:
            self.flat_state[name] = (state["step"] if name == "step" else
                                     self.layout.pack({k: state[f"{name}.{k}"] for k in self.layout.keys}))

    def step(self, params: mx.array, grads: mx.array, *, max_norm: float | None = None) -> mx.array:
        """The packed parameters (``self.layout``) after one step with the packed gradients (lazy;
        evaluate them with :attr:`flat_state`); ``max_norm``: the gradients clipped first
        (:func:`clip_flat`), within the same (compiled) update."""
        hyper = mx.array([[self.lr[g], self.momentum[g], self.decay[g]] for g in GROUPS], mx.float32)
        clip = mx.array(math.inf if max_norm is None else max_norm, mx.float32)
        out, self.flat_state = self._update(params, grads, self.flat_state, hyper, self._group, clip)
        return out

    def _pure_update(self, p: mx.array, g: mx.array, state: dict, hyper: mx.array, group: mx.array,
                     max_norm: mx.array) -> tuple[mx.array, dict]:
        step = state["step"] + 1
        buffers = [k for k in state if k != "step"]

        def setting(column: int) -> mx.array:  # each element's group's value
            value = hyper[-1, column]
            for i in range(len(GROUPS) - 2, -1, -1):
                value = mx.where(group == i, hyper[i, column], value)
            return value

        g = mx.where(mx.isinf(max_norm), g, clip_flat(g, max_norm))
        out = self._rule(p, g, *(state[k] for k in buffers), lr=setting(0), mom=setting(1), wd=setting(2), step=step)
        return out[0], {"step": step, **dict(zip(buffers, out[1:]))}

    def _rule(self, p: mx.array, g: mx.array, *buffers: mx.array, lr: mx.array, mom: mx.array, wd: mx.array,
              step: mx.array) -> tuple[mx.array, ...]:
        if self.name == "sgd":
            g = g + wd * p
            buf = mom * buffers[0] + g  # the first step's buffer is g itself, as PyTorch's
            return p - lr * (g + mom * buf), buf
        t = step.astype(mx.float32)
        b1, b2, eps = mom, 0.999, 1e-8
        p = p * (1 - lr * wd)
        m = b1 * buffers[0] + (1 - b1) * g
        v = b2 * buffers[1] + (1 - b2) * g * g
        denom = mx.sqrt(v) / mx.sqrt(1 - b2 ** t) + eps
        return p - (lr / (1 - b1 ** t)) * m / denom, m, v


def clip_flat(grads: mx.array, max_norm: float | mx.array = MAX_GRAD_NORM) -> mx.array:
    """PyTorch's clip_grad_norm_ on a packed gradient vector (:class:`FlatLayout`): every
    gradient scaled by min(1, max_norm / (norm + 1e-6))."""
    norm = mx.sqrt(mx.sum(mx.square(grads)))
    return grads * mx.minimum(max_norm / (norm + 1e-6), 1.0)


def lr_factor(epoch: int, epochs: int, lrf: float) -> float:
    """ultralytics' linear schedule: 1 at epoch 0 down to ``lrf`` at ``epochs``."""
    return max(1 - epoch / epochs, 0) * (1.0 - lrf) + lrf


def warmup_iterations(warmup_epochs: float, epochs: int, batches_per_epoch: int) -> int:
    """Warm-up steps, leaving at least the last epoch to the schedule."""
    warm = min(warmup_epochs, max(epochs - 1, 0))
    return round(warm * batches_per_epoch) if warm > 0 else 0


@dataclass(frozen=True)
class StepSettings:
    """What the trainer sets before iteration ``ni``: the accumulation count and each group's lr
    and momentum."""

    accumulate: int
    lr: dict[str, float]
    momentum: dict[str, float]


def settings_at(ni: int, epoch: int, *, warmup: int, accumulate: int, lr0: float, epochs: int, lrf: float,
                momentum: float, warmup_momentum: float, warmup_bias_lr: float, sgd: bool) -> StepSettings:
    """ultralytics' per-iteration warm-up (``np.interp`` and its half-to-even rounding)."""
    scheduled = lr0 * lr_factor(epoch, epochs, lrf)
    if not warmup or ni > warmup:
        return StepSettings(accumulate, dict.fromkeys(GROUPS, scheduled), dict.fromkeys(GROUPS, momentum))
    xi = [0, warmup]
    acc = max(1, int(np.interp(ni, xi, [1, accumulate]).round()))
    lr = {g: float(np.interp(ni, xi, [warmup_bias_lr if g == "bias" else 0.0, scheduled])) for g in GROUPS}
    mom = float(np.interp(ni, xi, [warmup_momentum, momentum])) if sgd else momentum
    return StepSettings(acc, lr, dict.fromkeys(GROUPS, mom))


class EMA:
    """ultralytics' ModelEMA over named float arrays (parameters and BatchNorm statistics), kept
    packed in one vector (:class:`FlatLayout`)."""

    def __init__(self, arrays: Mapping[str, mx.array], updates: int = 0, decay: float = 0.9999,
                 tau: float = 2000.0, compiled: bool = False, lead: FlatLayout | None = None) -> None:
        # ``lead``: the optimizer's layout, whose keys come first here, so that an update can take
        # the optimizer's packed weights as they are (:meth:`update`'s ``packed``).
        first = [] if lead is None else lead.keys
        led = set(first)
        self._rest = FlatLayout({k: arrays[k] for k in arrays if k not in led})  # what ``packed`` leaves out
        self.layout = FlatLayout({**{k: arrays[k] for k in first}, **{k: arrays[k] for k in self._rest.keys}})
        self.flat = self.layout.pack(arrays)
        self.updates, self.max_decay, self.tau = updates, decay, tau
        self._blend = mx.compile(_blend) if compiled else _blend

    @property
    def arrays(self) -> dict[str, mx.array]:
        """The averaged arrays by name, in their own dtypes."""
        return self.layout.unpack(self.flat)

    def host_arrays(self) -> dict[str, "np.ndarray | mx.array"]:
        """:attr:`arrays` copied to the host in one copy (evaluated first)."""
        return self.layout.host_unpack(self.flat)

    def decay(self) -> float:
        return self.max_decay * (1 - math.exp(-self.updates / self.tau))

    def update(self, arrays: Mapping[str, mx.array], packed: mx.array | None = None) -> None:
        """One step towards ``arrays``; ``packed``: the lead layout's arrays as one float32 vector,
        which ``arrays`` then need not hold (one copy of the weights, not one per array)."""
        self.updates += 1
        if packed is None:
            model = self.layout.pack(arrays)
        else:
            model = mx.concatenate([packed, self._rest.pack(arrays)]) if self._rest.keys else packed
        self.flat = self._blend(self.flat, model, mx.array(self.decay(), mx.float32))


def _blend(ema: mx.array, model: mx.array, d: mx.array) -> mx.array:
    return d * ema + (1 - d) * model
