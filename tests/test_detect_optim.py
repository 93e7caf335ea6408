"""The optimizer side of `train detect` against PyTorch's optimizers, set up as ultralytics'
trainer sets them (three groups, Nesterov SGD or AdamW, clipping at norm 10, warm-up)."""
from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
import torch

from mlxnet.training import detect_optim as O

KEYS = {"model.0.conv.weight": (8, 3, 3, 3), "model.0.bn.weight": (8,), "model.0.bn.bias": (8,),
        "model.22.cv3.0.2.weight": (4, 1, 1, 8), "model.22.cv3.0.2.bias": (4,)}


def test_groups_follow_ultralytics_naming():
    assert [O.group_of(k) for k in KEYS] == ["weight", "bn", "bias", "weight", "bias"]


@pytest.mark.parametrize("clip_inside", [False, True])
@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_steps_equal_pytorch_with_changing_group_settings(name, compiled, clip_inside):
    rng = np.random.default_rng(0)
    params = {k: rng.normal(size=s).astype(np.float32) for k, s in KEYS.items()}
    ours = {k: mx.array(v) for k, v in params.items()}
    theirs = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    groups = {g: [theirs[k] for k in KEYS if O.group_of(k) == g] for g in O.GROUPS}
    decay = {"weight": 5e-4, "bn": 0.0, "bias": 0.0}
    if name == "sgd":
        ref = torch.optim.SGD([{"params": groups[g], "weight_decay": decay[g]} for g in O.GROUPS], lr=0.01,
                              momentum=0.9, nesterov=True)
    else:
        ref = torch.optim.AdamW([{"params": groups[g], "weight_decay": decay[g]} for g in O.GROUPS], lr=0.01,
                                betas=(0.9, 0.999))
    opt = O.GroupedOptimizer(name, ours, lr=0.01, momentum=0.9, weight_decay=5e-4, compiled=compiled)
    for step in range(6):
        grads = {k: rng.normal(size=s).astype(np.float32) * 5 for k, s in KEYS.items()}
        s = O.settings_at(step, 0, warmup=4, accumulate=4, lr0=0.01, epochs=10, lrf=0.01,
                          momentum=0.937 if name == "sgd" else 0.9,  # AdamW's beta1 stays at its own
                          warmup_momentum=0.8, warmup_bias_lr=0.1, sgd=name == "sgd")
        for g, group in zip(O.GROUPS, ref.param_groups):
            group["lr"] = s.lr[g]
            if name == "sgd":
                group["momentum"] = s.momentum[g]
        opt.lr.update(s.lr)
        opt.momentum.update(s.momentum)
        for k, t in theirs.items():
            t.grad = torch.tensor(grads[k])
        torch.nn.utils.clip_grad_norm_(list(theirs.values()), max_norm=10.0)
        ref.step()
        packed = opt.layout.pack({k: mx.array(v) for k, v in grads.items()})
        if clip_inside:  # as the trainer calls it: the clipping inside the update
            ours = opt.layout.unpack(opt.step(opt.layout.pack(ours), packed, max_norm=10.0))
        else:
            ours = opt.layout.unpack(opt.step(opt.layout.pack(ours), O.clip_flat(packed)))
        for k in KEYS:
            np.testing.assert_allclose(np.array(ours[k]), theirs[k].detach().numpy(), rtol=2e-5, atol=5e-6,
                                       err_msg=f"{name} step {step} {k}")


def test_warmup_and_schedule_follow_ultralytics():
    s0 = O.settings_at(0, 0, warmup=30, accumulate=4, lr0=0.01, epochs=10, lrf=0.01, momentum=0.937,
                       warmup_momentum=0.8, warmup_bias_lr=0.1, sgd=True)
    assert s0.accumulate == 1 and s0.lr["bias"] == 0.1 and s0.lr["weight"] == 0.0 and s0.momentum["bn"] == 0.8
    mid = O.settings_at(15, 1, warmup=30, accumulate=4, lr0=0.01, epochs=10, lrf=0.01, momentum=0.937,
                        warmup_momentum=0.8, warmup_bias_lr=0.1, sgd=True)
    assert mid.accumulate == 2  # np.interp 2.5 rounds half to even
    assert math.isclose(mid.lr["weight"], 0.5 * 0.01 * (0.9 * 0.99 + 0.01))
    after = O.settings_at(31, 3, warmup=30, accumulate=4, lr0=0.01, epochs=10, lrf=0.01, momentum=0.937,
                          warmup_momentum=0.8, warmup_bias_lr=0.1, sgd=True)
    assert after.accumulate == 4 and math.isclose(after.lr["bias"], 0.01 * (0.7 * 0.99 + 0.01))
    assert O.warmup_iterations(3.0, 2, 10) == 10  # at least the last epoch on the schedule
    assert O.warmup_iterations(3.0, 100, 10) == 30


def test_auto_picks_as_ultralytics():
    small = O.choose("auto", lr=0.01, momentum=0.937, warmup_bias_lr=0.1, nc=3, iterations=500)
    assert (small.name, small.lr, small.momentum, small.warmup_bias_lr) == ("adamw", round(0.01 / 7, 6), 0.9, 0.0)
    big = O.choose("auto", lr=0.01, momentum=0.937, warmup_bias_lr=0.1, nc=80, iterations=20_000)
    assert (big.name, big.lr, big.momentum) == ("sgd", 0.01, 0.9) and "MuSGD" in big.note
    assert O.choose("sgd", lr=0.02, momentum=0.95, warmup_bias_lr=0.1, nc=3, iterations=1).lr == 0.02


@pytest.mark.parametrize("compiled", [False, True])
def test_ema_ramp(compiled):
    ema = O.EMA({"w": mx.zeros(3)}, compiled=compiled)
    ema.update({"w": mx.ones(3)})
    d = 0.9999 * (1 - math.exp(-1 / 2000))
    np.testing.assert_allclose(np.array(ema.arrays["w"]), 1 - d, rtol=1e-6)


@pytest.mark.parametrize("compiled", [False, True])
def test_ema_led_by_the_optimizers_layout_takes_its_packed_weights(compiled):
    rng = np.random.default_rng(1)
    arrays = {"stat": mx.array(rng.normal(size=4).astype(np.float32)), **{k: mx.array(rng.normal(size=s).astype(np.float32))
                                                                        for k, s in KEYS.items()}}
    opt = O.GroupedOptimizer("sgd", {k: arrays[k] for k in KEYS}, lr=0.01, momentum=0.9, weight_decay=5e-4)
    plain, led = O.EMA(arrays, compiled=compiled), O.EMA(arrays, compiled=compiled, lead=opt.layout)
    assert led.layout.keys[:len(KEYS)] == opt.layout.keys and led.layout.keys[-1] == "stat"
    for _ in range(3):
        new = {k: v + 1 for k, v in arrays.items()}
        plain.update(new)
        led.update({"stat": new["stat"]}, packed=opt.layout.pack({k: new[k] for k in KEYS}))
    for k in arrays:
        np.testing.assert_array_equal(np.array(led.arrays[k]), np.array(plain.arrays[k]), err_msg=k)


def test_a_layouts_host_unpack_equals_its_unpack():
    """FlatLayout.host_unpack (one copy of the vector to the host) gives unpack's arrays: the
    same values, shapes and dtypes (float16 as numpy's, bfloat16 kept as MLX's, as host_copies
    keeps it), and float32 views of the one copy without keep_dtype."""
    from mlxnet.training.detect_optim import FlatLayout

    arrays = {"a.weight": mx.random.normal((3, 2, 2, 4), key=mx.random.key(1)),
              "b.bias": mx.random.normal((5,), key=mx.random.key(2)).astype(mx.float16),
              "c.running_var": mx.random.uniform(shape=(7,), key=mx.random.key(3)).astype(mx.bfloat16)}
    layout = FlatLayout(arrays)
    flat = layout.pack(arrays)
    on_device, on_host = layout.unpack(flat), layout.host_unpack(flat)
    assert list(on_host) == list(on_device)
    assert isinstance(on_host["a.weight"], np.ndarray) and isinstance(on_host["b.bias"], np.ndarray)
    assert on_host["b.bias"].dtype == np.float16 and on_host["c.running_var"].dtype == mx.bfloat16
    for k in arrays:
        want = np.array(on_device[k].astype(mx.float32))
        got = np.array(mx.array(on_host[k]).astype(mx.float32))
        assert got.shape == tuple(arrays[k].shape) and np.array_equal(got, want), k
    raw = layout.host_unpack(flat, keep_dtype=False)
    assert all(v.dtype == np.float32 for v in raw.values())
    assert raw["c.running_var"].base is raw["a.weight"].base  # views of one host copy
