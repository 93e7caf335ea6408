"""LaMa port vs the reference (advimman/lama) goldens: generator, pipeline, dtypes, weights, CLI.

Fixtures come from scripts/goldens/golden_lama.py: seeded weights (mlxnet/weights/seeded.py, same seed
here), a 2×4×64×64 generator input, and a 60×52 image + grey-level mask run through the
reference's predict path (pad to 8 with 'symmetric', binarise, blend, crop). Tolerances,
relative to the largest magnitude: float32 1e-4 (5e-3 on CUDA: TF32), float16 2e-3,
bfloat16 2e-2 (testutil).
"""
from __future__ import annotations

import contextlib

import json
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import mlxnet  # noqa: F401  (gives MLX OpenBLAS on Linux)
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from safetensors.numpy import load_file
from testutil import assert_close, to_numpy

from mlxnet import ops
from mlxnet.errors import MlxnetError
from mlxnet.models import lama
from mlxnet.weights import convert_state_dict, load_into, save_safetensors
from mlxnet.weights.seeded import seeded_state_dict

FIXTURES = Path(__file__).parent / "fixtures" / "lama"
FP32 = 10.0  # scale on testutil's float32 tolerance: 1e-4 relative to the largest magnitude


def fp32_tolerance() -> tuple[mx.Dtype, float]:
    """(dtype, scale) for assert_close of a float32 run: 1e-4 relative, but 5e-3 on CUDA, where
    MLX runs float32 gemms and convolutions as TF32 (float16's 10-bit mantissa)."""
    return (mx.float16, 2.5) if mlxnet.backend() == "cuda" else (mx.float32, FP32)


@lru_cache(maxsize=1)
def golden() -> tuple[dict, dict[str, np.ndarray]]:
    meta = json.loads((FIXTURES / "lama_golden.json").read_text())
    return meta, load_file(str(FIXTURES / "lama_golden.safetensors"))


def nhwc(a: np.ndarray) -> np.ndarray:
    return a.transpose(0, 2, 3, 1)


@lru_cache(maxsize=2)
def torch_state(name: str) -> dict[str, np.ndarray]:
    """The golden's seeded weights, keyed as the reference generator's state dict."""
    meta, _ = golden()
    return seeded_state_dict([(k, tuple(s)) for k, s in meta["variants"][name]["shapes"]], meta["seed"])


@lru_cache(maxsize=2)
def converted(name: str) -> dict[str, mx.array]:
    state = {f"generator.{k}": mx.array(v) for k, v in torch_state(name).items()}
    return convert_state_dict(state, name)


def build(name: str, dtype: mx.Dtype | None = None, fused: bool = False) -> lama.LaMa:
    net = load_into(lama.LaMa(lama.CONFIGS[name]), converted(name))
    if fused:
        net.fuse()
    if dtype is not None:
        net.set_dtype(dtype)
    return net


def forward_with_taps(net: lama.LaMa, x: mx.array) -> dict[str, mx.array]:
    """Run ``net.model`` layer by layer, keeping the tensors the golden script recorded."""
    n = net.n_blocks
    taps: dict[str, mx.array] = {}
    h = x.astype(net.dtype)
    for i, layer in enumerate(net.model):
        if i == 5:  # the first block's FourierUnit input: its spectral transform's conv1
            st = layer.conv1.ffc.convg2g
            g = layer.conv1.ffc.unpadded(h)[1]
            for sub in st.conv1:
                g = sub(g)
            taps["block0_fu"] = st.fu(g)
        h = layer(h)
        if i in (4, 5):
            name = "down3" if i == 4 else "block0"
            # a fused model hands the next block its input reflect-padded: the tap is the interior
            taps[f"{name}.l"], taps[f"{name}.g"] = net.model[i + 1].conv1.ffc.unpadded(h)
        elif i == 5 + n:
            taps["bottleneck"] = h
        elif i == len(net.model) - 2:
            taps["logits"] = h
    taps["out"] = h
    return taps


def check_generator(name: str, dtype=mx.float32, batch: slice = slice(None), fused: bool = False) -> None:
    _, g = golden()
    net = build(name, None if dtype == mx.float32 else dtype, fused)
    x = mx.array(nhwc(g["input_nchw"])[batch])
    taps = forward_with_taps(net, x)
    mx.eval(taps)
    tol = fp32_tolerance() if dtype == mx.float32 else (dtype, 1.0)
    for key in ("logits", "out"):
        assert_close(taps[key], nhwc(g[f"{name}.{key}"])[batch], *tol)
    if dtype == mx.float32 and name == "lama":  # intermediate tensors (first batch element)
        for key in ("down3.l", "down3.g", "block0.l", "block0.g", "block0_fu", "bottleneck"):
            assert_close(taps[key][:1], nhwc(g[f"lama.{key}"]), *tol)
    if dtype != mx.float32:
        out, ref = to_numpy(taps["out"]), nhwc(g[f"{name}.out"])[batch]
        assert np.isfinite(out).all()
        assert out.std() > 0.5 * ref.std(), "half-precision output is (nearly) constant"
        assert np.corrcoef(out.ravel(), ref.ravel())[0, 1] > 0.98


# --- generator vs reference ------------------------------------------------------------------------

@pytest.mark.parametrize("fused", [False, True], ids=["as-loaded", "fused"])
@pytest.mark.parametrize("name", ["lama", "lama-fourier"])
def test_generator_matches_reference_fp32(name, fused):
    """Also with the BatchNorms folded and the FourierUnits' weights in planes (LaMa.fuse, what
    from_pretrained runs): the reference's intermediate tensors at every tap."""
    check_generator(name, fused=fused)


@pytest.mark.parametrize("fused", [False, True], ids=["as-loaded", "fused"])
@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16], ids=["float16", "bfloat16"])
def test_half_precision_is_close_to_fp32_and_not_constant(dtype, fused):
    net = build("lama", dtype, fused)
    assert net.dtype == dtype
    check_generator("lama", dtype, batch=slice(0, 1), fused=fused)


def test_fuse_folds_every_ffc_batchnorm_once_and_keeps_the_upsampling_ones():
    from mlx.utils import tree_flatten

    net = build("lama-fourier", fused=True)
    keys = [k for k, _ in tree_flatten(net.parameters())]
    bns = {k.rsplit(".", 1)[0] for k in keys if k.endswith("running_var")}
    assert bns == {f"model.{i + 1}" for i in lama.transposed_conv_indices(lama.CONFIGS["lama-fourier"])}
    fu = net.model[5].conv1.ffc.convg2g.fu
    assert fu.planar and fu.conv_layer.bias.dtype == mx.float32
    before = {k: np.array(v) for k, v in tree_flatten(net.parameters())}
    net.fuse()  # a second call changes nothing
    assert all(np.array_equal(before[k], np.array(v)) for k, v in tree_flatten(net.parameters()))
    net.set_dtype(mx.float16)
    params = dict(tree_flatten(net.parameters()))
    assert all((v.dtype == mx.float32) == (".fu." in k) for k, v in params.items())


def test_set_dtype_keeps_fourier_units_float32():
    from mlx.utils import tree_flatten

    net = lama.LaMa(n_blocks=2)
    net.set_dtype(mx.float16)
    params = dict(tree_flatten(net.parameters()))
    fu = [k for k in params if ".fu." in k]
    assert len(fu) == 2 * 2 * 5  # 2 blocks × 2 FFCs × (conv_layer + 4 BN tensors)
    assert all(params[k].dtype == mx.float32 for k in fu)
    assert all(v.dtype == mx.float16 for k, v in params.items() if ".fu." not in k)


def test_fourier_unit_spectrum_stays_finite_where_float16_would_overflow():
    # ortho-normalised DC term = mean · sqrt(H·W) = 300 · 256 > 65504 (float16's max)
    fu = lama.FourierUnit(4)
    fu.conv_layer.weight = mx.eye(8).reshape(8, 1, 1, 8) * 0.5
    fu.bn.running_var = mx.ones((8,))
    x = (300 + mx.random.normal((1, 256, 256, 4), key=mx.random.key(0))).astype(mx.float16)
    ref = fu(x.astype(mx.float32))
    half = fu(x)
    assert half.dtype == mx.float16
    assert float(mx.abs(mx.fft.rfft2(x, axes=(1, 2), norm="ortho")).max()) > 65504
    assert bool(mx.isfinite(half).all())
    assert_close(half, ref, mx.float16)


@pytest.mark.parametrize("mode", ["reflect", "symmetric"])
def test_pad2d_matches_numpy(mode):
    x = np.random.default_rng(0).random((2, 9, 11, 3)).astype(np.float32)
    for pads in [(3, 3, 3, 3), (0, 7, 0, 5), (1, 0, 2, 0)]:
        t, b, l, r = pads
        got = np.array(ops.pad2d(mx.array(x), (t, b, l, r), mode))
        np.testing.assert_array_equal(got, np.pad(x, [(0, 0), (t, b), (l, r), (0, 0)], mode=mode))
        np.testing.assert_array_equal(np.array(ops.pad2d(mx.array(x[0]), (t, b, l, r), mode)),
                                      np.pad(x[0], [(t, b), (l, r), (0, 0)], mode=mode))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(3, 9, 11, 5), (70000, 3, 3, 1)])
def test_pad2d_kernel_matches_numpy_and_falls_back_past_its_grid(gpu, shape):
    """The GPU kernel, and past CUDA's 65535 blocks along z (batch), the gather definition."""
    x = np.random.default_rng(1).random(shape).astype(np.float32)
    for mode in ("reflect", "symmetric"):
        got = np.array(ops.pad2d(mx.array(x), (2, 1, 1, 2), mode))
        np.testing.assert_array_equal(got, np.pad(x, [(0, 0), (2, 1), (1, 2), (0, 0)], mode=mode))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, channels", [(np.float32, 6), (np.float32, 3), (np.float16, 2), (np.float16, 4),
                                             (np.float16, 3), (np.uint8, 3), (np.uint8, 8)])
def test_pad2d_kernel_copies_every_dtype_bit_for_bit(gpu, dtype, channels):
    """The kernel moves 8- or 4-byte words where they tile a pixel's channels, else elements."""
    x = (np.random.default_rng(2).random((2, 7, 6, channels)) * 200).astype(dtype)
    for mode in ("reflect", "symmetric"):
        got = np.array(ops.pad2d(mx.array(x), (2, 3, 1, 4), mode))
        assert got.dtype == x.dtype
        np.testing.assert_array_equal(got, np.pad(x, [(0, 0), (2, 3), (1, 4), (0, 0)], mode=mode))


@pytest.mark.parametrize("padding", [0, 1, 3])
def test_cpu_conv_in_bands_equals_one_conv(monkeypatch, padding):
    from mlxnet.ops.conv import cpu as conv

    x = mx.random.normal((1, 37, 20, 6), key=mx.random.key(1))
    w = mx.random.normal((5, 3, 3, 6), key=mx.random.key(2))
    with mlxnet.use_device("cpu"):
        whole = [ops.conv2d(x, w, stride=s, padding=padding) for s in (1, 2)]
        ow = 18 + 2 * padding
        monkeypatch.setattr(conv, "UNFOLD_BUDGET", 4 * ow * 9 * 6 * 4)  # 4 output rows per band
        calls = []
        band = conv._conv2d_cpu_band
        monkeypatch.setattr(conv, "_conv2d_cpu_band", lambda *a, **k: calls.append(1) or band(*a, **k))
        for s, ref in zip((1, 2), whole):
            assert_close(ops.conv2d(x, w, stride=s, padding=padding), ref, mx.float32)
            assert_close(ref, mx.conv2d(x, w, stride=s, padding=padding), mx.float32)
        rows = [(37 + 2 * padding - 3) // s + 1 for s in (1, 2)]
        per_band = [4, 4 * ow // ((20 + 2 * padding - 3) // 2 + 1)]
        assert len(calls) == sum(-(-r // b) for r, b in zip(rows, per_band))


# --- pre/post-processing (bin/predict.py) ------------------------------------------------------------

def test_inpaint_pads_binarises_blends_and_crops_like_reference():
    _, g = golden()
    net = build("lama")
    result = net.inpaint_float(g["pipeline.image_u8"], g["pipeline.mask_u8"])
    assert result.shape == (60, 52, 3)
    assert_close(result, g["pipeline.inpainted"], *fp32_tolerance())
    u8 = net.inpaint(g["pipeline.image_u8"], g["pipeline.mask_u8"])
    ref = g["pipeline.inpainted_u8"]
    diff = np.abs(u8.astype(int) - ref)
    # uint8 truncation: a 1-step difference only where the float result sits on a boundary
    near = 1e-3 if mlxnet.backend() != "cuda" else 2.0  # TF32 on CUDA: any pixel may step
    boundary = np.abs(g["pipeline.inpainted"] * 255 - np.round(g["pipeline.inpainted"] * 255)) < near
    assert diff.max() <= 1 and not (diff & ~boundary).any()
    keep = g["pipeline.mask_u8"] == 0
    assert np.abs(u8[keep].astype(int) - g["pipeline.image_u8"][keep]).max() <= 1
    assert (u8[~keep] != g["pipeline.image_u8"][~keep]).any()


@pytest.mark.parametrize("name", ["lama", "lama-fourier"])
def test_large_image_stages_give_the_same_result(monkeypatch, name):
    """From LARGE_STAGE_BYTES the forward runs in finer stages, each evaluated before the next
    (less peak memory at 2048²): the same layers, bit for bit the same output."""
    _, g = golden()
    net = build(name)
    x = mx.array(nhwc(g["input_nchw"]))
    normal = np.array(net(x))
    assert net._stages(True) != net._stages() and net._stages(True)[0] == (0, 2)
    # one resnet block a stage (the small test nets have a few)
    blocks = [b for b in net._stages(True) if b[1] - b[0] == 1 and isinstance(net.model[b[0]], lama.FFCResnetBlock)]
    assert len(blocks) == net.n_blocks
    stages, original = [], lama.LaMa._stages
    monkeypatch.setattr(lama, "LARGE_STAGE_BYTES", 0)  # this 64² input counts as large
    monkeypatch.setattr(lama.LaMa, "_stages", lambda self, large=False: stages.append(large) or original(self, large))
    staged = np.array(net(x))
    assert stages == [True]
    np.testing.assert_array_equal(staged, normal)


def test_bad_inputs_raise_one_line_errors():
    net = lama.LaMa(n_blocks=1)
    image = np.zeros((32, 40, 3), np.uint8)
    cases = [
        (lambda: net.inpaint(image, np.zeros((32, 41), np.uint8)), "mask is 41×32 but the image is 40×32"),
        (lambda: net.inpaint(image[:8, :8], np.zeros((8, 8))), "too small"),
        (lambda: net.inpaint(image[..., :2], np.zeros((32, 40))), "RGB image"),
        (lambda: net(mx.zeros((1, 30, 40, 4))), "multiples of 8"),
        (lambda: net(mx.zeros((1, 32, 40, 3))), "(N, H, W, 4)"),
    ]
    for call, text in cases:
        with pytest.raises(MlxnetError) as e:
            call()
        assert text in str(e.value) and "\n" not in str(e.value)


# --- weights -------------------------------------------------------------------------------------------

def _lightning_checkpoint(path: Path, name: str, extra: dict | None = None) -> None:
    import torch

    state = {f"generator.{k}": torch.from_numpy(v) for k, v in torch_state(name).items()}
    state["generator.model.1.bn_l.num_batches_tracked"] = torch.tensor(7)
    state["discriminator.model0.0.weight"] = torch.zeros(64, 3, 4, 4)  # dropped: training only
    state["loss_resnet_pl.impl.conv1.weight"] = torch.zeros(8, 3, 3, 3)
    state["val_evaluator.scores.ssim.window"] = torch.zeros(1, 1, 11, 11)
    state.update(extra or {})
    torch.save({"epoch": 3, "global_step": 100, "pytorch-lightning_version": "1.2.9",
                "state_dict": state, "hyper_parameters": {"generator": {"n_blocks": 9}}}, path)


def test_lightning_checkpoint_loads_through_the_safe_reader(tmp_path):
    _, g = golden()
    ckpt = tmp_path / "best.ckpt"
    _lightning_checkpoint(ckpt, "lama-fourier")
    net = lama.LaMa.from_pretrained(ckpt, model="lama-fourier")
    assert net.n_blocks == 9
    assert_close(net(mx.array(nhwc(g["input_nchw"]))), nhwc(g["lama-fourier.out"]), *fp32_tolerance())
    # a converted (mlxnet-format) safetensors file names its variant itself
    out = tmp_path / "lama-fourier.safetensors"
    save_safetensors(out, converted("lama-fourier"), metadata={"format": "mlxnet", "model": "lama-fourier",
                                                               "fold_bn": "0"})
    # half precision where the device has fast kernels; on the CPU float32, with a warning
    from mlxnet.dtypes import HalfPrecisionOnCPU, has_fast_half

    with pytest.warns(HalfPrecisionOnCPU) if not has_fast_half() else contextlib.nullcontext():
        half = lama.LaMa.from_pretrained(out, dtype="float16")
    assert half.n_blocks == 9 and half.dtype == (mx.float16 if has_fast_half() else mx.float32)


def test_a_float16_file_loads_with_float32_fourier_units(tmp_path):
    """A converted file stored in float16 loads as a float16 model whose FourierUnits, folded at
    load, still hold float32 weights, and it gives the reference's output."""
    from mlx.utils import tree_flatten

    _, g = golden()
    out = tmp_path / "lama-fourier-fp16.safetensors"
    save_safetensors(out, {k: v.astype(mx.float16) for k, v in converted("lama-fourier").items()},
                     metadata={"format": "mlxnet", "model": "lama-fourier", "fold_bn": "0"})
    net = lama.LaMa.from_pretrained(out)
    params = dict(tree_flatten(net.parameters()))
    assert net.dtype == mx.float16
    assert all((v.dtype == mx.float32) == (".fu." in k) for k, v in params.items())
    assert_close(net(mx.array(nhwc(g["input_nchw"]))), nhwc(g["lama-fourier.out"]), mx.float16, 1.0)


def test_unknown_and_missing_generator_keys_are_errors():
    state = {f"generator.{k}": mx.array(v) for k, v in torch_state("lama-fourier").items()}
    with pytest.raises(MlxnetError, match=r"unmapped key generator_ema\.model\.1"):
        convert_state_dict(state | {"generator_ema.model.1.weight": mx.zeros((1,))}, "lama-fourier")
    with pytest.raises(MlxnetError, match=r"unexpected key model\.99\.weight"):
        convert_state_dict(state | {"generator.model.99.weight": mx.zeros((1,))}, "lama-fourier")
    missing = {k: v for k, v in state.items() if "model.5.conv1.ffc.convg2g.fu" not in k}
    with pytest.raises(MlxnetError, match=r"missing key model\.5\.conv1\.ffc\.convg2g\.fu\.conv_layer\.weight"):
        convert_state_dict(missing, "lama-fourier")


def test_spec_layouts_and_hub_id(monkeypatch):
    spec = lama.weight_spec("lama")
    assert lama.transposed_conv_indices(18) == [24, 27, 30]
    assert spec.layout_of("model.24.weight", (512, 256, 3, 3)) == ("conv_transpose2d", 1)
    assert spec.layout_of("model.34.weight", (3, 64, 7, 7)) == ("conv2d", 1)
    assert spec.map_keys(["generator.model.34.bias", "model.34.weight", "discriminator.model4.0.bias"]) == {
        "generator.model.34.bias": "model.34.bias", "model.34.weight": "model.34.weight"}
    # the "lama" id downloads big-lama's checkpoint from the hub (intercepted here: no network)
    import mlxnet.weights.hub as hub

    asked = []

    def fake_download(repo, filename, revision, spec_id):
        asked.append((repo, filename, spec_id))
        raise MlxnetError("offline")
    monkeypatch.setattr(hub, "_download", fake_download)
    with pytest.raises(MlxnetError, match="offline"):
        lama.LaMa.from_pretrained("lama")
    assert asked == [("lllyasviel/Annotators", "lama.ckpt", "lama")]


# --- CLI -----------------------------------------------------------------------------------------------

def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlxnet", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory):
    from mlxnet.image import save_image

    d = tmp_path_factory.mktemp("lama_cli")
    rng = np.random.default_rng(3)
    image = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
    mask = np.zeros((40, 48), np.uint8)
    mask[10:25, 12:30] = 255
    save_image(image, d / "image.png")
    save_image(mask, d / "mask.png")
    save_image(np.kron(mask, np.ones((2, 2), np.uint8)), d / "mask_2x.png")
    save_safetensors(d / "w.safetensors", converted("lama-fourier"),
                     metadata={"format": "mlxnet", "model": "lama-fourier", "fold_bn": "0"})
    return d, image, mask


def test_cli_inpaints_with_resized_mask_and_json(cli_files):
    d, image, mask = cli_files
    out = run_cli("inpaint", str(d / "image.png"), str(d / "mask_2x.png"), "-o", str(d / "out.png"),
                  "--weights", str(d / "w.safetensors"), "--dtype", "float16", "--resize-mask", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    computed = "float16" if mlxnet.backend() != "cpu" else "float32"  # CPU: half computes in float32
    assert (info["width"], info["height"], info["filled_pixels"], info["dtype"]) == (48, 40, 15 * 18, computed)
    assert (computed == "float16") or "note: float16 on the CPU computes in float32" in out.stderr
    from mlxnet.image import load_image

    result = load_image(d / "out.png")
    assert result.shape == image.shape
    keep = mask == 0
    assert np.abs(result[keep].astype(int) - image[keep]).max() <= 1
    assert np.abs(result[~keep].astype(int) - image[~keep]).mean() > 10


def test_cli_errors_are_one_line(cli_files, tmp_path):
    d, _, _ = cli_files
    base = [str(d / "image.png"), str(d / "mask_2x.png"), "-o", str(tmp_path / "o.png"),
            "--weights", str(d / "w.safetensors")]
    out = run_cli("inpaint", *base)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"error: {d / 'image.png'}: mask {d / 'mask_2x.png'} is 96×80 but the image is 48×40; "
        "pass --resize-mask to resize it"]
    (tmp_path / "bad.png").write_bytes(b"not an image")
    out = run_cli("inpaint", str(tmp_path / "bad.png"), *base[1:])
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1
    assert "not a readable image" in out.stderr
    other = tmp_path / "resnet.safetensors"  # weights converted for another model
    save_safetensors(other, {"fc.bias": mx.zeros((10,))}, metadata={"format": "mlxnet", "model": "resnet18"})
    out = run_cli("inpaint", str(d / "image.png"), str(d / "mask.png"), "-o", str(tmp_path / "o.png"),
                  "--weights", str(other))
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1
    assert "resnet18" in out.stderr
    out = run_cli("inpaint", "--help")
    assert out.returncode == 0 and "--resize-mask" in out.stdout


# --- the same goldens on the GPU, kernels on ------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True], ids=["as-loaded", "fused"])
@pytest.mark.parametrize("name", ["lama", "lama-fourier"])
def test_gpu_generator_matches_reference_fp32(gpu, name, fused):
    assert mlxnet.kernels_enabled()
    check_generator(name, fused=fused)


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True], ids=["as-loaded", "fused"])
@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16], ids=["float16", "bfloat16"])
def test_gpu_half_precision(gpu, dtype, fused):
    check_generator("lama", dtype, batch=slice(0, 1), fused=fused)


@pytest.mark.gpu
def test_gpu_inpaint_pipeline(gpu):
    _, g = golden()
    result = build("lama", fused=True).inpaint_float(g["pipeline.image_u8"], g["pipeline.mask_u8"])
    assert_close(result, g["pipeline.inpainted"], *fp32_tolerance())


@pytest.mark.parametrize("dtype,tol", [(mx.float32, 2e-6), (mx.float16, 2e-3)])
def test_batch_norm_relu_matches_layer_then_relu(dtype, tol):
    """The fused inference BatchNorm+ReLU that LaMa's FFCs and upsamplers use equals the MLX
    layer followed by ReLU, with non-trivial statistics, and keeps the input's dtype."""
    from mlxnet.nn import batch_norm_relu

    bn = nn.BatchNorm(24)
    bn.update({"weight": mx.random.normal((24,)), "bias": mx.random.normal((24,)),
               "running_mean": mx.random.normal((24,)), "running_var": mx.random.uniform(0.1, 3.0, (24,))})
    bn.eval()
    x = (3 * mx.random.normal((2, 9, 7, 24))).astype(dtype)
    got, want = batch_norm_relu(bn, x), nn.relu(bn(x))
    assert got.dtype == dtype and got.shape == x.shape
    assert (got >= 0).all().item() and (got == 0).any().item() and (got > 0).any().item()
    assert mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max().item() <= tol * max(1.0, mx.abs(want).max().item())
    bn.train()  # training mode normalises by the batch's statistics: the layer's own path
    assert mx.allclose(batch_norm_relu(bn, x.astype(mx.float32)), nn.relu(bn(x.astype(mx.float32))), atol=1e-6).item()


def test_fold_bn_conversion_refused_with_where_folding_happens():
    with pytest.raises(MlxnetError, match=r"--fold-bn does not apply.*from_pretrained folds"):
        lama.weight_spec("lama").build(fold_bn=True)
