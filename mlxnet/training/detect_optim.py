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


class GroupedOptimizer:
    """PyTorch's SGD (Nesterov) or AdamW over flat ``{key: array}`` parameters, with a learning
    rate, momentum and weight decay per group (:data:`GROUPS`), set by the trainer every step.
    ``compiled``: the update runs as one compiled function (the hyperparameters enter as arrays,
    so changing them does not trace it again)."""

    def __init__(self, name: str, params: Mapping[str, mx.array], *, lr: float, momentum: float,
                 weight_decay: float, compiled: bool = False) -> None:
        self.name = name
        self.keys = list(params)
        self.group_index = {k: GROUPS.index(group_of(k)) for k in params}
        self.lr = dict.fromkeys(GROUPS, lr)
        self.momentum = dict.fromkeys(GROUPS, momentum)
        self.decay = {"weight": weight_decay, "bn": 0.0, "bias": 0.0}
        self.state: dict[str, mx.array] = {"step": mx.array(0, mx.int32)}
        for k, p in params.items():
            if name == "sgd":
                self.state[f"buf.{k}"] = mx.zeros_like(p)
            else:
                self.state[f"m.{k}"] = mx.zeros_like(p)
                self.state[f"v.{k}"] = mx.zeros_like(p)
        self._update = mx.compile(self._pure_update) if compiled else self._pure_update

    def step(self, params: dict[str, mx.array], grads: Mapping[str, mx.array]) -> dict[str, mx.array]:
        """The parameters after one step (lazy; evaluate them with :attr:`state`)."""
        hyper = mx.array([[self.lr[g], self.momentum[g], self.decay[g]] for g in GROUPS], mx.float32)
        out, self.state = self._update(params, dict(grads), self.state, hyper)
        return out

    def _pure_update(self, params: dict, grads: dict, state: dict, hyper: mx.array) -> tuple[dict, dict]:
        step = state["step"] + 1
        new_state, out = {"step": step}, {}
        t = step.astype(mx.float32)
        for k in self.keys:
            p, g = params[k], grads[k]
            lr, mom, wd = (hyper[self.group_index[k], i] for i in range(3))
            if self.name == "sgd":
                g = g + wd * p
                buf = mom * state[f"buf.{k}"] + g  # the first step's buffer is g itself, as PyTorch's
                new_state[f"buf.{k}"] = buf
                out[k] = p - lr * (g + mom * buf)
            else:
                b1, b2, eps = mom, 0.999, 1e-8
                p = p * (1 - lr * wd)
                m = b1 * state[f"m.{k}"] + (1 - b1) * g
                v = b2 * state[f"v.{k}"] + (1 - b2) * g * g
                new_state[f"m.{k}"], new_state[f"v.{k}"] = m, v
                denom = mx.sqrt(v) / mx.sqrt(1 - b2 ** t) + eps
                out[k] = p - (lr / (1 - b1 ** t)) * m / denom
        return out, new_state


def clip_by_global_norm(grads: Mapping[str, mx.array], max_norm: float = MAX_GRAD_NORM) -> dict[str, mx.array]:
    """PyTorch's clip_grad_norm_: every gradient scaled by min(1, max_norm / (norm + 1e-6))."""
    norm = mx.sqrt(sum(mx.sum(mx.square(g.astype(mx.float32))) for g in grads.values()))
    scale = mx.minimum(max_norm / (norm + 1e-6), 1.0)
    return {k: g * scale for k, g in grads.items()}


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
    """ultralytics' ModelEMA over flat float arrays (parameters and BatchNorm statistics)."""

    def __init__(self, arrays: Mapping[str, mx.array], updates: int = 0, decay: float = 0.9999,
                 tau: float = 2000.0, compiled: bool = False) -> None:
        self.arrays = {k: mx.array(v) for k, v in arrays.items()}
        self.updates, self.max_decay, self.tau = updates, decay, tau
        self._blend = mx.compile(_blend) if compiled else _blend

    def decay(self) -> float:
        return self.max_decay * (1 - math.exp(-self.updates / self.tau))

    def update(self, arrays: Mapping[str, mx.array]) -> None:
        self.updates += 1
        self.arrays = self._blend(self.arrays, {k: arrays[k] for k in self.arrays}, mx.array(self.decay(), mx.float32))


def _blend(ema: dict, model: dict, d: mx.array) -> dict:
    return {k: (d * v + (1 - d) * model[k].astype(v.dtype)).astype(v.dtype) for k, v in ema.items()}
