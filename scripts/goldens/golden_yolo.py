"""Golden outputs for the YOLOv8 port, from ultralytics itself (DetectionModel, predictor, NMS).

Runs where ultralytics imports (it needs a torchvision that matches the installed torch):

    python scripts/goldens/golden_yolo.py OUTDIR

Weights: mlxnet/weights/seeded.py tensors for every state-dict key (seed 1234), the DFL conv at
its 0..15 ramp, BatchNorm scales x bn_gain, the head's output convs x head_gain -- the same as
mlxnet.models.yolo.seeded_torch_state. Small-input heads use gains (1, 20); the real images use
(2.5, 5) on yolov8n, which spreads the top scores so that no two candidates tie in float32.
Writes OUTDIR/yolo_golden.safetensors and OUTDIR/yolo_golden.json:

  input                      (1, 3, 64, 96) float32 in [0, 1]
  {n,s,m,l,x}.head           DetectionModel(x)[0]: (1, 4 + 80, 126) decoded xywh + scores (unfused)
  n.p3 / n.p4 / n.p5         yolov8n's neck outputs (layers 15, 18, 21), for debugging
  nms.<case>                 non_max_suppression on a synthetic prediction made from a seed (see
                             synthetic_prediction; the tests rebuild it and check its checksum)
  {bus,zidane}.input         uint8 HWC RGB: what ultralytics' predictor fed yolov8n (imgsz 320)
  {bus,zidane}.cand_idx/rows anchors whose best score > CONF and their head-output rows
  {bus,zidane}.det_input     NMS output on the network input (K, 6): xyxy, score, class
  {bus,zidane}.det           the predictor's final boxes on the original image (K, 6)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference import load_seeded  # noqa: E402  (also keeps ultralytics offline)

SEED = 1234
GAINS = (1.0, 20.0)  # (bn_gain, head_gain) for the small-input heads of every scale
IMAGE_GAINS = (2.5, 5.0)  # for yolov8n on the real images
IMGSZ = 320
CONF = 0.94  # keeps ~150 candidates per image
IOU = 0.7
IMAGES = ("bus", "zidane")


def seeded_model(scale: str, bn_gain: float, head_gain: float):
    from ultralytics import YOLO

    yolo = YOLO(f"yolov8{scale}.yaml", task="detect")
    load_seeded(yolo.model, SEED, bn_gain, head_gain).eval()
    return yolo


def synthetic_prediction(n: int = 500, nc: int = 80) -> np.ndarray:
    """(1, 4 + nc, n): clustered xywh boxes (many overlaps), one strong class per box."""
    rng = np.random.default_rng(11)
    xy = rng.uniform(20, 300, (n, 2))
    wh = rng.uniform(8, 90, (n, 2))
    scores = rng.uniform(0, 0.3, (n, nc))
    scores[np.arange(n), rng.integers(0, 6, n)] = rng.uniform(0, 1, n)
    return np.concatenate([xy, wh, scores], axis=1).T[None].astype(np.float32)


def main(out: Path) -> None:  # heavy imports here: the tests import synthetic_prediction alone
    import cv2
    import torch
    import ultralytics
    from PIL import Image
    from safetensors.numpy import save_file
    from ultralytics.utils.nms import non_max_suppression

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    x = np.random.default_rng(7).random((1, 3, 64, 96)).astype(np.float32)
    t: dict[str, np.ndarray] = {"input": x}
    meta: dict = {"seed": SEED, "gains": GAINS, "image_gains": IMAGE_GAINS, "imgsz": IMGSZ, "conf": CONF, "iou": IOU}

    for scale in "nsmlx":
        model = seeded_model(scale, *GAINS).model
        feats = {}
        hooks = [model.model[i].register_forward_hook(lambda m, a, o, i=i: feats.__setitem__(i, o)) for i in (15, 18, 21)]
        with torch.no_grad():
            y = model(torch.from_numpy(x))[0].numpy()
        for h in hooks:
            h.remove()
        t[f"{scale}.head"] = y
        if scale == "n":
            for name, i in (("p3", 15), ("p4", 18), ("p5", 21)):
                t[f"n.{name}"] = feats[i].numpy()
        print(scale, y.shape, "scores", float(y[0, 4:].min()), float(y[0, 4:].max()), flush=True)

    pred = synthetic_prediction()
    meta["nms_input_sum"] = float(pred.astype(np.float64).sum())
    cases = {"default": dict(conf_thres=0.25, iou_thres=0.7, max_det=300),
             "iou045": dict(conf_thres=0.5, iou_thres=0.45, max_det=300),
             "agnostic": dict(conf_thres=0.25, iou_thres=0.5, agnostic=True, max_det=300),
             "maxdet": dict(conf_thres=0.25, iou_thres=0.7, max_det=7)}
    meta["nms_cases"] = cases
    for name, kw in cases.items():
        t[f"nms.{name}"] = non_max_suppression(torch.from_numpy(pred), **kw)[0].numpy()
        print("nms", name, t[f"nms.{name}"].shape)

    yolo = seeded_model("n", *IMAGE_GAINS)
    net = yolo.model
    seen: dict[str, torch.Tensor] = {}
    net.register_forward_pre_hook(lambda m, a: seen.__setitem__("input", a[0].detach().clone()))
    net.model[-1].register_forward_hook(lambda m, a, o: seen.__setitem__("head", o[0].detach().clone()))
    assets = Path(ultralytics.__file__).parent / "assets"
    for name in IMAGES:
        path = assets / f"{name}.jpg"
        rgb = np.asarray(Image.open(path).convert("RGB"))
        meta[f"{name}.pil_equals_cv2_decode"] = bool((cv2.imread(str(path))[..., ::-1] == rgb).all())
        res = yolo.predict(source=np.ascontiguousarray(rgb[..., ::-1]), imgsz=IMGSZ, conf=CONF, iou=IOU,
                           max_det=300, device="cpu", verbose=False)[0]
        im = seen["input"][0].permute(1, 2, 0).numpy()
        t[f"{name}.input"] = np.rint(im * 255).astype(np.uint8)
        head = seen["head"]  # (1, 84, A)
        cand = (head[0, 4:].amax(0) > CONF).nonzero().view(-1)
        t[f"{name}.cand_idx"] = cand.numpy().astype(np.int32)
        t[f"{name}.cand_rows"] = head[0, :, cand].T.numpy()
        det_in = non_max_suppression(head, CONF, IOU, max_det=300)[0]
        t[f"{name}.det_input"] = det_in.numpy()
        b = res.boxes
        t[f"{name}.det"] = torch.cat([b.xyxy, b.conf[:, None], b.cls[:, None]], 1).numpy()
        meta[f"{name}.anchors"] = int(head.shape[-1])
        print(name, "input", t[f"{name}.input"].shape, "candidates", len(cand), "detections", len(b), flush=True)

    meta["versions"] = {"ultralytics": ultralytics.__version__, "torch": torch.__version__,
                        "cv2": cv2.__version__, "numpy": np.__version__}
    try:
        import torchvision
        meta["versions"]["torchvision"] = torchvision.__version__
    except ImportError:
        pass
    save_file({k: np.ascontiguousarray(v) for k, v in t.items()}, str(out / "yolo_golden.safetensors"))
    (out / "yolo_golden.json").write_text(json.dumps(meta, indent=1))
    print(json.dumps(meta["versions"]))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
