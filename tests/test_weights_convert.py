"""Weight specs, PyTorch -> MLX conversion (checked against torch's outputs), BN folding,
hub resolution from a local cache, and the `mlxnet convert` command."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import torch

from fixtures.weights_models import SPEC, TinyNet
from fixtures.weights_torch_models import trained_tiny_net
from mlxnet import MlxnetError
from hubcache import prepare_hub_cache
from mlxnet.cli import run as cli_run
from mlxnet.weights import (FORMAT, WeightSpec, convert_state_dict, from_torch_layout, get_spec,
                            load_into, load_pretrained, load_safetensors,
                            read_safetensors_header, register_spec, resolve_weights, save_safetensors)

TESTS = Path(__file__).resolve().parent


def torch_and_input(seed: int = 0):
    net = trained_tiny_net(seed)
    x = np.random.default_rng(seed).standard_normal((2, 3, 6, 6)).astype(np.float32)
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    return net, mx.array(x.transpose(0, 2, 3, 1)), want


def mlx_state(net) -> dict[str, mx.array]:
    return {k: mx.array(v.numpy()) for k, v in net.state_dict().items()}


@pytest.mark.parametrize("fold_bn", [False, True], ids=["bn", "folded"])
def test_converted_model_matches_torch(fold_bn):
    net, x, want = torch_and_input()
    weights = convert_state_dict(mlx_state(net), "tinynet", fold_bn=fold_bn)
    assert ("stem_bn.weight" in weights) != fold_bn and ("dw.bias" in weights) == fold_bn
    model = load_into(TinyNet(fold_bn), weights)
    model.eval()
    np.testing.assert_allclose(np.array(model(x)), want, rtol=1e-4, atol=1e-5)


def test_cast_and_integer_buffers():
    net, _, _ = torch_and_input()
    state = mlx_state(net)
    state["stem.1.num_batches_tracked"] = mx.array(7, dtype=mx.int64)
    weights = convert_state_dict(state, "tinynet", dtype="float16")
    assert {v.dtype for v in weights.values()} == {mx.float16}  # the int buffer was dropped by the spec
    assert weights["up.weight"].shape == (4, 2, 2, 8)  # ConvT (I, O, kh, kw) -> (O, kh, kw, I)


@pytest.mark.parametrize("groups", [1, 2])
def test_grouped_conv_transpose_layout_matches_torch(groups):
    torch.manual_seed(1)
    ct = torch.nn.ConvTranspose2d(4, 6, 3, stride=2, groups=groups, bias=False)
    x = torch.randn(1, 4, 5, 5)
    with torch.no_grad():
        want = ct(x).permute(0, 2, 3, 1).numpy()
    w = from_torch_layout(mx.array(ct.weight.detach().numpy()), "conv_transpose2d", groups)
    assert isinstance(w, mx.array) and w.shape == (6, 3, 3, 4 // groups)
    xs = mx.array(x.permute(0, 2, 3, 1).numpy())
    # MLX has no grouped transposed conv: run each group alone (outputs come in blocks of O/g)
    cin, cout = 4 // groups, 6 // groups
    outs = [mx.conv_transpose2d(xs[..., g * cin:(g + 1) * cin], w[g * cout:(g + 1) * cout], stride=2)
            for g in range(groups)]
    np.testing.assert_allclose(np.array(mx.concatenate(outs, axis=-1)), want, rtol=1e-5, atol=1e-5)


def test_spec_reports_all_unmapped_keys_and_clashes_at_once():
    spec = WeightSpec(id="t-map", keys=[(r"a\.(.*)", r"x.\1"), (r"b\.(.*)", r"x.\1")], drop=[r"skip\..*"])
    assert spec.map_keys(["a.w", "skip.me"]) == {"a.w": "x.w"}
    with pytest.raises(MlxnetError) as err:
        spec.map_keys(["a.w", "b.w", "c.w", "d"])
    assert str(err.value) == ("spec 't-map' cannot map 3 checkpoint key(s): "
                              "unmapped key c.w (no rule in spec 't-map' maps or drops it); "
                              "unmapped key d (no rule in spec 't-map' maps or drops it); "
                              "key clash: a.w and b.w both map to x.w")
    # a long list: one line naming the file, the first few problems and the count of the rest
    with pytest.raises(MlxnetError) as err:
        spec.map_keys([f"k{i}" for i in range(50)], source="big.pt")
    assert str(err.value).startswith("spec 't-map' cannot map 50 checkpoint key(s) of big.pt: unmapped key k0 ")
    assert str(err.value).endswith("; ... and 47 more") and "\n" not in str(err.value)


def test_spec_never_guesses_a_layout():
    spec = WeightSpec(id="t-layout", layouts=[(r"conv\.weight", "conv2d"), (r"up\.weight", "conv_transpose2d", 2)])
    assert spec.layout_of("conv.weight", (8, 3, 3, 3)) == ("conv2d", 1)
    assert spec.layout_of("up.weight", (8, 2, 2, 2)) == ("conv_transpose2d", 2)
    assert spec.layout_of("fc.weight", (5, 4)) == ("plain", 1)
    with pytest.raises(MlxnetError, match=r"no layout rule for other.weight with shape \(8, 3, 3, 3\)"):
        spec.layout_of("other.weight", (8, 3, 3, 3))
    with pytest.raises(MlxnetError, match=r"layout conv2d for conv.weight expects 4 dims, found shape \(8,\)"):
        spec.layout_of("conv.weight", (8,))
    fn_spec = WeightSpec(id="t-fn", layouts=lambda key, shape: "conv1d" if len(shape) == 3 else None)
    assert fn_spec.layout_of("any", (2, 3, 4)) == ("conv1d", 1)


def test_registry():
    assert get_spec("tinynet") is SPEC and get_spec(SPEC) is SPEC
    register_spec(SPEC)  # the same spec again is fine
    with pytest.raises(MlxnetError, match="'tinynet' is already registered"):
        register_spec(WeightSpec(id="tinynet"))
    with pytest.raises(MlxnetError, match=r"unknown model 'nope': registered weight specs are .*tinynet"):
        get_spec("nope")


def test_conversion_checks_against_the_built_model():
    net, _, _ = torch_and_input()
    state = mlx_state(net)
    state["fc.weight"] = mx.zeros((5, 3))
    with pytest.raises(MlxnetError, match=r"^converted weights of x.pt do not fit model 'tinynet': 1 problem\(s\): "
                                          r"shape mismatch for head.weight: expected \(5, 4\), found \(5, 3\)$"):
        convert_state_dict(state, "tinynet", source="x.pt")
    del state["fc.bias"]
    with pytest.raises(MlxnetError, match=r"missing key head.bias: expected shape \(5,\)"):
        convert_state_dict(state, "tinynet")


def test_load_pretrained_from_torch_file_and_converted_file(tmp_path):
    net, x, want = torch_and_input()
    pt = tmp_path / "tiny.pt"
    torch.save(net, pt)  # the whole module object, as ultralytics does
    model = load_pretrained(TinyNet(), "tinynet", pt)
    model.eval()
    np.testing.assert_allclose(np.array(model(x)), want, rtol=1e-4, atol=1e-5)

    from mlxnet.weights import convert_checkpoint

    out = convert_checkpoint(pt, tmp_path / "tiny.safetensors", "tinynet", fold_bn=True)
    assert read_safetensors_header(out)[1]["format"] == FORMAT
    fused = load_pretrained(TinyNet(fold_bn=True), "tinynet", out, fold_bn=True)
    np.testing.assert_allclose(np.array(fused(x)), want, rtol=1e-4, atol=1e-5)
    with pytest.raises(MlxnetError, match=r"was converted for model 'tinynet' \(fold_bn=1\), not 'tinynet' \(fold_bn=0\)"):
        load_pretrained(TinyNet(), "tinynet", out)


# --- hub ------------------------------------------------------------------------------------------

def test_resolve_local_paths_and_unknown_ids(tmp_path):
    f = tmp_path / "w.pt"
    f.write_bytes(b"x")
    assert resolve_weights(f) == f and resolve_weights(str(f)) == f
    with pytest.raises(MlxnetError, match=r"weights file not found: .*missing\.safetensors"):
        resolve_weights(tmp_path / "missing.safetensors")
    with pytest.raises(MlxnetError, match="is a directory"):
        resolve_weights(tmp_path)
    with pytest.raises(MlxnetError, match=r"'no-such-model' is neither a weights file nor a model id; give a "
                                          r"weights file .*, a model id \(.*tinynet.*\) or 'random'"):
        resolve_weights("no-such-model")
    with pytest.raises(MlxnetError, match=r"'tinynet' names the weights of another model; .*a model id \(resnet50: "):
        resolve_weights("tinynet", ids=("resnet50",))


def run_py(code: str, env_extra: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "MLXNET_"))}
    env.update(env_extra, PYTHONPATH=str(TESTS))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_hub_ids_resolve_from_the_cache_offline(tmp_path):
    net, x, want = torch_and_input()
    pt = tmp_path / "src.pt"
    torch.save(net.state_dict(), pt)
    cache = tmp_path / "hf" / "hub"
    snap = prepare_hub_cache(cache, "mlxnet-test/tinynet", "tinynet.pt", pt)
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    code = (
        "import sys, fixtures.weights_models\n"
        "from mlxnet.weights import resolve_weights\n"
        "from mlxnet import MlxnetError\n"
        "print(resolve_weights('tinynet'))\n"
        "try:\n    resolve_weights('tinynet-uncached')\n"
        "except MlxnetError as e:\n    print('ERR', e)\n"
        "from mlxnet.cli import run\n"
        f"sys.argv = ['mlxnet', 'convert', 'tinynet', {str(tmp_path / 'out.safetensors')!r}, '--model', 'tinynet']\n"
        "run()\n"
    )
    out = run_py(code, env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert Path(lines[0]) == snap
    assert lines[1] == (f"ERR weights for 'tinynet-uncached' (mlxnet-test/not-cached/weights.pt) are not in the cache "
                        f"{cache} and HF_HUB_OFFLINE=1 forbids downloading; download them once online, "
                        "or give the path of a local copy of the file instead of the id 'tinynet-uncached' "
                        "(or 'random': seeded random weights, nothing to download)")
    model = load_into(TinyNet(), load_safetensors(tmp_path / "out.safetensors"))
    model.eval()
    np.testing.assert_allclose(np.array(model(x)), want, rtol=1e-4, atol=1e-5)


# --- the CLI --------------------------------------------------------------------------------------

def cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run `mlxnet ...` through the real entry point, in this process (the test spec is registered)."""
    monkeypatch.setattr(sys, "argv", ["mlxnet", *args])
    try:
        cli_run()
        code = 0
    except SystemExit as e:
        code = e.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_convert_writes_and_never_touches_src(tmp_path, monkeypatch, capsys):
    net, x, want = torch_and_input()
    src = tmp_path / "best.ckpt"
    torch.save({"state_dict": net.state_dict(), "epoch": 3}, src, _use_new_zipfile_serialization=False)
    digest, mtime = hashlib.sha256(src.read_bytes()).hexdigest(), src.stat().st_mtime_ns
    dst = tmp_path / "tiny.safetensors"
    code, out, err = cli(monkeypatch, capsys, "convert", str(src), str(dst), "--model", "tinynet", "--dtype", "bfloat16")
    assert code == 0, err
    assert f"wrote {dst}" in out and "tensors" in out
    w = load_safetensors(dst)
    assert w["up.weight"].dtype == mx.bfloat16 and w["up.weight"].shape == (4, 2, 2, 8)
    assert read_safetensors_header(dst)[1] == {"format": FORMAT, "model": "tinynet", "fold_bn": "0", "source": src.name,
                                               "config": "{}"}
    model = load_into(TinyNet(), {k: v.astype(mx.float32) for k, v in w.items()})
    model.eval()
    np.testing.assert_allclose(np.array(model(x)), want, rtol=5e-2, atol=5e-2)
    assert hashlib.sha256(src.read_bytes()).hexdigest() == digest and src.stat().st_mtime_ns == mtime

    # an existing DST is kept unless --force
    before = dst.read_bytes()
    code, _, err = cli(monkeypatch, capsys, "convert", str(src), str(dst), "--model", "tinynet")
    assert code == 1 and err.strip() == f"error: {dst}: exists; pass --force to overwrite"
    assert dst.read_bytes() == before
    code, _, err = cli(monkeypatch, capsys, "convert", str(src), str(dst), "--model", "tinynet", "--force", "--fold-bn")
    assert code == 0, err
    assert "stem_bn.weight" not in load_safetensors(dst) and sorted(p.name for p in tmp_path.iterdir()) == [src.name, dst.name]


def test_cli_convert_errors_are_one_line(tmp_path, monkeypatch, capsys):
    good = tmp_path / "good.safetensors"
    save_safetensors(good, {"a": mx.zeros(2)})
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"\x80\x02garbage")
    dst = str(tmp_path / "o.safetensors")
    cases = [
        ((str(tmp_path / "missing.pt"), "--model", "tinynet"), f"weights file not found: {tmp_path / 'missing.pt'}"),
        ((str(good), "--model", "nope"), "unknown model 'nope': registered weight specs are"),
        ((str(corrupt), "--model", "tinynet"), f"{corrupt}: truncated or corrupt PyTorch checkpoint"),
        ((str(good), "--model", "tinynet", "--dtype", "int8"), "unsupported dtype 'int8'"),
        ((str(good), "--model", "tinynet-uncached", "--fold-bn"), "declares no conv+BN pairs to fold"),
    ]
    for (src, *opts), msg in cases:
        code, _, err = cli(monkeypatch, capsys, "convert", src, dst, *opts)
        assert code == 1 and err.startswith("error: ") and msg in err and len(err.strip().splitlines()) == 1, err
    # a key the spec does not know: one line naming the file and the problem
    code, _, err = cli(monkeypatch, capsys, "convert", str(good), dst, "--model", "tinynet")
    assert code == 1 and err.splitlines() == [f"error: spec 'tinynet' cannot map 1 checkpoint key(s) of {good}: "
                                              "unmapped key a (no rule in spec 'tinynet' maps or drops it)"]
    assert not Path(dst).exists() and sorted(p.name for p in tmp_path.iterdir()) == ["corrupt.pt", "good.safetensors"]
    # the same file as SRC and DST is refused even with --force
    code, _, err = cli(monkeypatch, capsys, "convert", str(good), str(good), "--model", "tinynet", "--force")
    assert code == 1 and "output would overwrite the input" in err


def test_cli_convert_as_a_subprocess():
    out = subprocess.run([sys.executable, "-m", "mlxnet", "convert", "a.pt", "b.safetensors", "--model", "no-such"],
                         capture_output=True, text=True)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown model 'no-such': registered weight specs are ")
    help_out = subprocess.run([sys.executable, "-m", "mlxnet", "convert", "--help"], capture_output=True, text=True)
    assert help_out.returncode == 0 and "--fold-bn" in help_out.stdout and "--force" in help_out.stdout
