"""Golden outputs for the SAM-tiny port, from MobileSAM's own code (github ChaoningZhang/MobileSAM).

Runs where torch and torchvision import, with MobileSAM's ``mobile_sam``
package copied into ``.ref-sam/`` (git-ignored; never committed; see scripts/goldens/sam_reference.py):

    python scripts/goldens/golden_sam.py OUTDIR

Weights come from mlxnet/weights/seeded.py (seed below, same in the tests), so the fixtures hold
only inputs, outputs and a few intermediates:
  encoder:   TinyViT at 256×256 (same parameters as at 1024) on a seeded random input: per-stage
             outputs and the 16×16 embedding (every other channel).
  decoder:   prompt encoder + mask decoder on a seeded random 64×64 embedding for points, boxes,
             points+boxes, a mask prompt, and no prompt; multimask on and off.
  predictor: SamPredictor on a real 128×96 photo (1024 encoder, resize/normalise/pad, masks at the
             original size) for five prompts; SamAutomaticMaskGenerator on a 2×2 point grid, and on a
             4×4 grid with synthetic disc-shaped mask logits in place of the model.
Large tensors are stored on strided grids (noted per key) to keep the fixtures small.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("seeded", ROOT / "mlxnet/weights/seeded.py")
seeded = importlib.util.module_from_spec(spec)
spec.loader.exec_module(seeded)

SEED = 2024
LOWRES_STRIDE = (5, 3)  # rows, cols of 256×256 logits kept (coprime with the ×4 upscaling)

sys.path.insert(0, str(ROOT / "scripts" / "goldens"))
import sam_reference  # noqa: E402

mobile_sam = sam_reference.package()
SamAutomaticMaskGenerator, SamPredictor = mobile_sam.SamAutomaticMaskGenerator, mobile_sam.SamPredictor
sam_model_registry, TinyViT = mobile_sam.sam_model_registry, mobile_sam.modeling.TinyViT


def f32(t) -> np.ndarray:
    return np.ascontiguousarray(t.detach().cpu().numpy().astype(np.float32))


def lowres(t) -> np.ndarray:
    return f32(t[..., ::LOWRES_STRIDE[0], ::LOWRES_STRIDE[1]])


def build_sam() -> tuple[torch.nn.Module, list, dict]:
    sam = sam_model_registry["vit_t"]()
    shapes = [(k, tuple(v.shape)) for k, v in sam.state_dict().items() if v.dtype.is_floating_point]
    weights = seeded.seeded_state_dict(shapes, SEED)
    missing, unexpected = sam.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing), (missing, unexpected)
    # eval() again: TinyViT's Attention caches its bias table (`ab`) in train(False), so a model put in
    # eval mode before loading (as build_sam_vit_t does) would keep the initial zeros.
    sam.eval()
    return sam, shapes, weights


def encoder_goldens(weights: dict, out: dict) -> None:
    enc = TinyViT(img_size=256, in_chans=3, num_classes=1000, embed_dims=[64, 128, 160, 320],
                  depths=[2, 2, 6, 2], num_heads=[2, 4, 5, 10], window_sizes=[7, 7, 14, 7], mlp_ratio=4.0,
                  drop_rate=0.0, drop_path_rate=0.0, use_checkpoint=False, mbconv_expand_ratio=4.0,
                  local_conv_size=3, layer_lr_decay=0.8)
    p = "image_encoder."
    enc.load_state_dict({k[len(p):]: torch.from_numpy(v) for k, v in weights.items() if k.startswith(p)},
                        strict=False)
    enc.eval()
    x = np.random.default_rng(5).standard_normal((1, 3, 256, 256)).astype(np.float32)
    with torch.no_grad():
        # TinyViT.forward_features with the 64×64 of the 1024 model replaced by this input's 16×16.
        h = enc.patch_embed(torch.from_numpy(x))
        sizes = [32, 16, 16, 16]
        for i, layer in enumerate(enc.layers):
            h = layer(h)
            s = sizes[i]
            nhwc = h.view(1, s, s, -1)
            out[f"encoder.stage{i}_nhwc_s2c4"] = f32(nhwc[:, ::2, ::2, ::4])
        emb = enc.neck(h.view(1, 16, 16, -1).permute(0, 3, 1, 2))
    out["encoder.embedding_nchw_c2"] = f32(emb[:, ::2])


def decoder_goldens(sam, out: dict, meta: dict) -> None:
    rng = np.random.default_rng(11)
    emb = torch.from_numpy(rng.standard_normal((1, 256, 64, 64)).astype(np.float32))
    mask_small = rng.standard_normal((1, 1, 64, 64)).astype(np.float32) * 4
    coords = (rng.uniform(0, 1024, (2, 3, 2))).astype(np.float32)
    boxes = np.sort(rng.uniform(0, 1024, (2, 2, 2)), axis=1).reshape(2, 4).astype(np.float32)
    out.update({"decoder.in.coords": coords, "decoder.in.boxes": boxes, "decoder.in.mask_64": mask_small})
    mask = torch.from_numpy(np.repeat(np.repeat(mask_small, 4, axis=2), 4, axis=3))
    c = torch.from_numpy(coords)
    cases = {
        "points_multi": ((c, torch.tensor([[1, 0, 1], [1, 1, -1]])), None, None, True),
        "box_single": (None, torch.from_numpy(boxes[:1]), None, False),
        "points_box_multi": ((c[:, :1], torch.tensor([[1], [0]])), torch.from_numpy(boxes), None, True),
        "mask_point_single": ((c[:1, :1], torch.tensor([[1]])), None, mask, False),
        "no_prompt_multi": (None, None, None, True),
    }
    meta["decoder_cases"] = {}
    with torch.no_grad():
        pe = sam.prompt_encoder.get_dense_pe()
        out["decoder.dense_pe_nchw_c4s4"] = f32(pe[:, ::4, ::4, ::4])
        for name, (points, bx, m, multi) in cases.items():
            sparse, dense = sam.prompt_encoder(points=points, boxes=bx, masks=m)
            masks, iou = sam.mask_decoder(image_embeddings=emb, image_pe=pe, sparse_prompt_embeddings=sparse,
                                          dense_prompt_embeddings=dense, multimask_output=multi)
            out[f"decoder.{name}.sparse"] = f32(sparse)
            if m is not None:  # otherwise dense is no_mask_embed broadcast
                out[f"decoder.{name}.dense_nchw_c8s4"] = f32(dense[:, ::8, ::4, ::4])
            out[f"decoder.{name}.lowres"] = lowres(masks)
            out[f"decoder.{name}.iou"] = f32(iou)
            meta["decoder_cases"][name] = {
                "points": None if points is None else {"coords": [int(points[0].shape[0]), int(points[0].shape[1])],
                                                       "labels": points[1].tolist()},
                "boxes": None if bx is None else int(bx.shape[0]),
                "mask": m is not None, "multimask": multi}
            print("decoder", name, tuple(masks.shape), float(masks.abs().max()))


PROMPTS = {
    "point_multi": dict(point_coords=[[64, 48]], point_labels=[1], multimask_output=True),
    "two_points_single": dict(point_coords=[[64, 48], [20, 80]], point_labels=[1, 0], multimask_output=False),
    "box_single": dict(box=[30, 20, 100, 70], multimask_output=False),
    "point_box_multi": dict(point_coords=[[40, 30]], point_labels=[1], box=[10, 10, 90, 60], multimask_output=True),
    # mask_input = the best low-res logits of point_multi (the interactive refinement loop)
    "point_mask_single": dict(point_coords=[[64, 48]], point_labels=[1], multimask_output=False),
}


def predictor_goldens(sam, image: np.ndarray, out: dict, meta: dict) -> None:
    pred = SamPredictor(sam)
    pred.set_image(image)
    resized = pred.transform.apply_image(image)
    out["predictor.resized_s8"] = np.ascontiguousarray(resized[::8, ::8])
    feats = pred.features
    out["predictor.embedding_nchw_c2s4"] = f32(feats[:, ::2, ::4, ::4])
    out["predictor.embedding_channel_mean"] = f32(feats.mean(dim=(2, 3)))
    meta["predictor"] = {"input_size": list(pred.input_size), "original_size": list(pred.original_size),
                         "prompts": PROMPTS}
    best = None
    for name, kw in PROMPTS.items():
        kw = {k: (np.array(v) if isinstance(v, list) else v) for k, v in kw.items()}
        if name == "point_mask_single":
            kw["mask_input"] = best
        logits, scores, low = pred.predict(**kw, return_logits=True)
        masks, scores_b, _ = pred.predict(**kw)
        assert np.array_equal(masks, logits > 0) and np.array_equal(scores, scores_b)
        if name == "point_multi":
            best = low[np.argmax(scores)][None]
        out[f"predictor.{name}.logits"] = logits.astype(np.float32)
        out[f"predictor.{name}.scores"] = scores.astype(np.float32)
        out[f"predictor.{name}.lowres"] = np.ascontiguousarray(low[..., ::LOWRES_STRIDE[0], ::LOWRES_STRIDE[1]])
        print("predictor", name, logits.shape, scores)


def synthetic_prediction(points: np.ndarray, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Disc-shaped mask logits (radius 8/16/28 px, slope 2/0.25/1 per px) around each point and
    made-up IoU predictions: AMG's filtering, stability, boxes and NMS on masks that, unlike those
    of a randomly initialised SAM, differ from point to point. The tests use the same formula."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    radii, slopes = np.array([8.0, 16.0, 28.0]), np.array([2.0, 0.25, 1.0])
    d = np.sqrt((xx[None] - points[:, 0, None, None]) ** 2 + (yy[None] - points[:, 1, None, None]) ** 2)
    logits = slopes[None, :, None, None] * (radii[None, :, None, None] - d[:, None])
    idx = np.rint(points[:, 0] * 3 + points[:, 1] * 7).astype(np.int64)[:, None] + np.arange(3)[None] * 7
    unique = 1e-4 * (points[:, 0] + w * points[:, 1])[:, None] / (w * h) + 1e-6 * np.arange(3)[None]  # no ties
    iou = (idx % 10) / 10.0 + 0.05 + unique
    return logits.astype(np.float32), iou.astype(np.float32)


AMG_MODEL = dict(points_per_side=2, points_per_batch=3, pred_iou_thresh=0.3, stability_score_thresh=0.5,
                 stability_score_offset=0.25, box_nms_thresh=0.99)
AMG_SYNTHETIC = dict(points_per_side=4, points_per_batch=6, pred_iou_thresh=0.3, stability_score_thresh=0.6,
                     stability_score_offset=1.0, box_nms_thresh=0.2)


def _records(anns: list) -> list:
    return [{k: a[k] for k in ("bbox", "area", "predicted_iou", "point_coords", "stability_score", "crop_box")}
            for a in anns]


def amg_goldens(sam, image: np.ndarray, out: dict, meta: dict) -> None:
    """SamAutomaticMaskGenerator twice: with the seeded model (its masks hardly depend on the point
    and span the image, so few survive; thresholds sit in wide gaps of its scores: IoU preds are
    < 0.13 or > 0.55, stabilities 0 or > 0.74), and with synthetic_prediction in place of the model."""
    h, w = image.shape[:2]
    amg = SamAutomaticMaskGenerator(sam, **AMG_MODEL)
    anns = amg.generate(image)
    meta["amg_model"] = {"settings": AMG_MODEL, "masks": _records(anns)}
    out["amg_model.segmentations_packed"] = np.packbits(np.stack([a["segmentation"] for a in anns]), axis=-1)
    print("amg model:", len(anns), "masks")

    amg = SamAutomaticMaskGenerator(sam, **AMG_SYNTHETIC)
    pred = amg.predictor

    def fake_predict_torch(point_coords, point_labels, boxes=None, mask_input=None, multimask_output=True,
                           return_logits=False):
        pts = point_coords[:, 0].double().numpy() / np.array([[pred.input_size[1] / w, pred.input_size[0] / h]])
        logits, iou = synthetic_prediction(pts, h, w)
        return torch.from_numpy(logits), torch.from_numpy(iou), None

    pred.predict_torch = fake_predict_torch
    anns = amg.generate(image)
    meta["amg_synthetic"] = {"settings": AMG_SYNTHETIC, "masks": _records(anns)}
    out["amg_synthetic.segmentations_packed"] = np.packbits(np.stack([a["segmentation"] for a in anns]), axis=-1)
    print("amg synthetic:", len(anns), "masks")


def main(outdir: Path) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    sam, shapes, weights = build_sam()
    out: dict[str, np.ndarray] = {}
    meta: dict = {"seed": SEED, "lowres_stride": LOWRES_STRIDE, "torch": torch.__version__,
                  "state_dict_shapes": [[k, list(s)] for k, s in shapes]}
    image = np.asarray(Image.open(ROOT / "tests/fixtures/sam/stage_128x96.png").convert("RGB"))
    encoder_goldens(weights, out)
    decoder_goldens(sam, out, meta)
    predictor_goldens(sam, image, out, meta)
    amg_goldens(sam, image, out, meta)
    try:
        import torchvision
        meta["torchvision"] = torchvision.__version__
    except Exception:  # noqa: BLE001
        pass
    save_file(out, str(outdir / "sam_golden.safetensors"))
    (outdir / "sam_golden.json").write_text(json.dumps(meta, indent=1))
    print("saved", len(out), "tensors,", sum(v.nbytes for v in out.values()) // 1024, "KiB")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
