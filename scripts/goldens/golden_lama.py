"""Golden outputs for the LaMa port, from the reference implementation (advimman/lama).

The reference modules are copied, unmodified, from github.com/advimman/lama into the git-ignored
folder ``.ref-lama/`` (saicinpainting/{utils,training/modules/*,evaluation/data}.py and
configs/training/big-lama.yaml; the commit is in .ref-lama/COMMIT). Needs torch, PyYAML and
kornia (imported by ffc.py's module header only)::

    python scripts/goldens/golden_lama.py tests/fixtures/lama

Two modules that the reference imports at module level but that these code paths never call are
stubbed: ``pytorch_lightning`` (saicinpainting/utils.py imports ``seed_everything``) and ``cv2``
(evaluation/data.py uses it only in ``scale_image``). The stubs raise if anything is called.

Weights come from mlxnet/weights/seeded.py (same seed in the tests), so the fixture holds the
inputs, the outputs, a few intermediate tensors and the key -> shape table of each generator.
Generators: big-lama (configs/training/big-lama.yaml, 18 FFC blocks) and lama-fourier (the
same generator with ffc_resnet_075's 9 blocks).
"""
from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import torch
import yaml
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parents[2]
REF = ROOT / ".ref-lama"
SEED = 2024


def _stub(name: str, *attrs: str) -> None:
    def refuse(*_a, **_k):
        raise RuntimeError(f"stub {name} called: the golden path must not need it")

    mod = types.ModuleType(name)
    for a in attrs:
        setattr(mod, a, refuse)
    sys.modules[name] = mod


def _load_seeded():
    spec = importlib.util.spec_from_file_location("seeded", ROOT / "mlxnet/weights/seeded.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_stub("pytorch_lightning", "seed_everything")
_stub("cv2", "resize")
sys.modules["cv2"].INTER_AREA = sys.modules["cv2"].INTER_NEAREST = None  # default-argument values only
sys.path.insert(0, str(REF))
from saicinpainting.evaluation.data import pad_img_to_modulo  # noqa: E402
from saicinpainting.training.modules import make_generator  # noqa: E402

seeded = _load_seeded()


def generator_kwargs(n_blocks: int | None = None) -> dict:
    """big-lama.yaml's generator section with its ${...} interpolations resolved by hand."""
    cfg = yaml.safe_load((REF / "configs/training/big-lama.yaml").read_text())["generator"]
    cfg = dict(cfg)
    init = cfg["init_conv_kwargs"]
    cfg["downsample_conv_kwargs"] = dict(ratio_gin=init["ratio_gout"], ratio_gout=init["ratio_gout"],
                                         enable_lfu=cfg["downsample_conv_kwargs"]["enable_lfu"])
    res = cfg["resnet_conv_kwargs"]
    cfg["resnet_conv_kwargs"] = dict(ratio_gin=res["ratio_gin"], ratio_gout=res["ratio_gin"],
                                     enable_lfu=res["enable_lfu"])
    if n_blocks is not None:
        cfg["n_blocks"] = n_blocks
    return cfg


def build(n_blocks: int | None) -> tuple[torch.nn.Module, list]:
    kwargs = generator_kwargs(n_blocks)
    kind = kwargs.pop("kind")
    gen = make_generator(None, kind, **kwargs).eval()
    sd = gen.state_dict()
    shapes = [(k, list(v.shape)) for k, v in sd.items() if v.dtype.is_floating_point]
    weights = seeded.seeded_state_dict([(k, tuple(s)) for k, s in shapes], SEED)
    missing, unexpected = gen.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()},
                                              strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing), (missing, unexpected)
    return gen, shapes


def run_with_taps(gen: torch.nn.Module, x: np.ndarray, prefix: str, tensors: dict, taps: bool) -> np.ndarray:
    """Forward pass recording the pre-sigmoid logits and, with ``taps``, a few intermediate
    tensors of the first batch element (NCHW) for debugging the port."""
    n_blocks = sum(type(m).__name__ == "FFCResnetBlock" for m in gen.model)
    points = {"logits": len(gen.model) - 2}
    if taps:
        points.update({"down3": 4, "block0": 5, "bottleneck": 5 + n_blocks})
    hooks = []

    def keep(name):
        def hook(_m, _inp, out):
            first = name != "logits"
            if isinstance(out, tuple):
                for i, o in enumerate(out):
                    tensors[f"{prefix}.{name}.{'lg'[i]}"] = o.detach().numpy()[:1 if first else None].copy()
            else:
                tensors[f"{prefix}.{name}"] = out.detach().numpy()[:1 if first else None].copy()
        return hook

    for name, idx in points.items():
        hooks.append(gen.model[idx].register_forward_hook(keep(name)))
    if taps:
        hooks.append(gen.model[5].conv1.ffc.convg2g.fu.register_forward_hook(keep("block0_fu")))
    with torch.no_grad():
        out = gen(torch.from_numpy(x)).numpy()
    for h in hooks:
        h.remove()
    tensors[f"{prefix}.out"] = out
    return out


def predict_like_reference(gen: torch.nn.Module, image_u8: np.ndarray, mask_u8: np.ndarray) -> dict:
    """bin/predict.py + InpaintingDataset + DefaultInpaintingTrainingModule.forward, for one image."""
    image = np.transpose(image_u8, (2, 0, 1)).astype("float32") / 255  # evaluation/data.load_image
    mask = mask_u8.astype("float32")[None] / 255
    unpad = image.shape[1:]
    image = pad_img_to_modulo(image, 8)   # pad_out_to_modulo: 8 (configs/prediction/default.yaml)
    mask = pad_img_to_modulo(mask, 8)
    img_t = torch.from_numpy(image)[None]
    mask_t = (torch.from_numpy(mask)[None] > 0) * 1    # bin/predict.py binarises the mask
    with torch.no_grad():
        masked = img_t * (1 - mask_t)                  # trainers/default.py forward
        masked = torch.cat([masked, mask_t], dim=1)
        predicted = gen(masked)
        inpainted = mask_t * predicted + (1 - mask_t) * img_t
    res = inpainted[0].permute(1, 2, 0).numpy()[: unpad[0], : unpad[1]]
    return {"generator_input": masked.float().numpy(), "predicted": predicted.numpy(),
            "inpainted": res.astype(np.float32),
            "inpainted_u8": np.clip(res * 255, 0, 255).astype("uint8")}


def check_plain_torch_copy(gen: torch.nn.Module, n_blocks: int, x: np.ndarray, out: np.ndarray) -> None:
    """mlxnet/benchmark/torch_twins/lama.py (the benchmarks' torch-only generator) must load the reference's
    state dict strictly and reproduce its output."""
    spec = importlib.util.spec_from_file_location("lama_torch", ROOT / "mlxnet/benchmark/torch_twins/lama.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    copy = mod.Generator(n_blocks).eval()
    copy.load_state_dict(gen.state_dict(), strict=True)
    with torch.no_grad():
        diff = float(np.abs(copy(torch.from_numpy(x)).numpy() - out).max())
    assert diff < 1e-6, f"torch_twins/lama.py differs from the reference by {diff}"
    print("torch_twins/lama.py matches the reference: max |diff|", diff)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    rng = np.random.default_rng(11)
    x = rng.uniform(0, 1, (2, 4, 64, 64)).astype(np.float32)
    x[:, 3] = (x[:, 3] > 0.6).astype(np.float32)  # the mask channel is binary in use
    tensors: dict[str, np.ndarray] = {"input_nchw": x}
    meta: dict = {"seed": SEED, "torch": torch.__version__,
                  "reference_commit": (REF / "COMMIT").read_text().strip(), "variants": {}}

    # A non-multiple-of-8 image with a mask of grey levels: exercises padding, binarising, cropping.
    yy, xx = np.mgrid[0:60, 0:52]
    image_u8 = np.stack([(yy * 4) % 256, (xx * 5) % 256, ((yy + xx) * 3) % 256], -1).astype(np.uint8)
    image_u8 = np.clip(image_u8.astype(int) + rng.integers(-20, 20, image_u8.shape), 0, 255).astype(np.uint8)
    mask_u8 = np.zeros((60, 52), np.uint8)
    mask_u8[18:40, 10:30] = 255
    mask_u8[45:50, 30:51] = 128  # grey counts as "fill" (> 0), as in bin/predict.py
    mask_u8[5, 5] = 1
    tensors["pipeline.image_u8"] = image_u8
    tensors["pipeline.mask_u8"] = mask_u8

    for name, n_blocks in (("lama", None), ("lama-fourier", 9)):
        gen, shapes = build(n_blocks)
        run_with_taps(gen, x, name, tensors, taps=name == "lama")
        meta["variants"][name] = {"n_blocks": sum(type(m).__name__ == "FFCResnetBlock" for m in gen.model),
                                  "shapes": shapes,
                                  "parameters": int(sum(p.numel() for p in gen.parameters()))}
        print(name, "out range", float(tensors[f"{name}.out"].min()), float(tensors[f"{name}.out"].max()),
              "logits |max|", float(np.abs(tensors[f"{name}.logits"]).max()))
        check_plain_torch_copy(gen, meta["variants"][name]["n_blocks"], x, tensors[f"{name}.out"])
        if name == "lama":
            for k, v in predict_like_reference(gen, image_u8, mask_u8).items():
                tensors[f"pipeline.{k}"] = v
    # safetensors writes an array's memory as is: strided views (permute) must be made C-ordered
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(out / "lama_golden.safetensors"))
    (out / "lama_golden.json").write_text(json.dumps(meta))
    total = sum(v.nbytes for v in tensors.values())
    print("saved", len(tensors), "tensors,", total // 1024, "KiB")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
