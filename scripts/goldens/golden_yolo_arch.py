"""Golden outputs for the YOLO architecture builder (YOLOv8, YOLO11, YOLO26 detection), from
ultralytics 8.4 itself: each model built by ultralytics from its own yaml, given seeded weights
(mlxnet/weights/seeded.py's seeded_yolo_state, seed 1234), run on one seeded input.

    python scripts/goldens/golden_yolo_arch.py OUTDIR

Writes OUTDIR/golden.safetensors and OUTDIR/golden.json (per model: the yaml dict ultralytics
built from, which mlxnet builds from too, and the gains):

  input                       (1, 3, 64, 96) float32 in [0, 1] (small: the fixture stays about 2 MB)
  <model>.boxes / .scores     the one-to-many head's raw outputs (1, 4·reg_max, A), (1, nc, A)
  <model>.o2o.boxes / .scores the one-to-one head's, for end-to-end models (YOLO26)
  <model>.out                 the eval forward's output as ultralytics' predictor runs it by default
                              (nms=None, so YOLO26 too decodes its one-to-many head for NMS):
                              (1, 4 + nc [+ nm mask coefficients | + K·3 decoded keypoints], A)
  <model>.mask / .kpts        a segment model's raw mask coefficients (1, nm, A), a pose model's
                              raw keypoints (1, K·3, A) (and .o2o. for the one-to-one head)
  <model>.proto               a segment model's prototypes (1, nm, H/4, W/4)
  <model>.e2e                 an end-to-end model's NMS-free output (nms=False): its one-to-one
                              head's top 300 (1, 300, 6): xyxy, score, class
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference import seeded_task_model  # noqa: E402  (also keeps ultralytics offline)

SEED = 1234
MODELS = {"yolov8n": (1.0, 20.0), "yolo11n": (1.0, 20.0), "yolo11m": (1.0, 20.0), "yolo26n": (1.0, 20.0),
          "yolo26m": (1.0, 20.0), "yolov8n-seg": (1.0, 20.0), "yolo11n-seg": (1.0, 20.0), "yolo26n-seg": (1.0, 20.0),
          "yolov8n-pose": (1.0, 20.0), "yolo11n-pose": (1.0, 20.0), "yolo26n-pose": (1.0, 20.0)}


def main(out: Path) -> None:
    import torch
    from safetensors.numpy import save_file

    # numpy's generator: what torch's would draw depends on its default dtype, which a caller may have changed
    x = torch.from_numpy(np.random.default_rng(0).random((1, 3, 64, 96), dtype=np.float32))
    arrays, meta = {"input": x.numpy()}, {}
    for name, (bn_gain, head_gain) in MODELS.items():
        model = seeded_task_model(f"{name}.yaml", SEED, bn_gain, head_gain)
        with torch.no_grad():
            y, preds = model(x)
        if isinstance(y, tuple):  # a segment model: (detections, prototypes)
            y, proto = y
            arrays[f"{name}.proto"] = proto.numpy()
        heads = {"": preds} if "one2many" not in preds else {"": preds["one2many"], "o2o.": preds["one2one"]}
        for prefix, p in heads.items():
            arrays[f"{name}.{prefix}boxes"] = p["boxes"].numpy()
            arrays[f"{name}.{prefix}scores"] = p["scores"].numpy()
            for key, short in (("mask_coefficient", "mask"), ("kpts", "kpts")):
                if key in p:
                    arrays[f"{name}.{prefix}{short}"] = p[key].numpy()
        arrays[f"{name}.out"] = y.numpy()
        if "one2one" in preds:
            model.end2end = True
            with torch.no_grad():
                e2e = model(x)[0]
            arrays[f"{name}.e2e"] = (e2e[0] if isinstance(e2e, tuple) else e2e).numpy()
            model.end2end = False
        meta[name] = {"yaml": model.yaml, "gains": [bn_gain, head_gain],
                      # YOLO26-pose's RealNVP flow model only trains: mlxnet leaves it out
                      "parameters": int(sum(v.numel() for k, v in model.named_parameters() if ".flow_model." not in k))}
        top = np.sort(arrays[f"{name}.out"][0, 4:84].max(0))
        print(name, tuple(y.shape), "top scores", top[-5:], file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in arrays.items()}, str(out / "golden.safetensors"))
    (out / "golden.safetensors").chmod(0o644)
    (out / "golden.json").write_text(json.dumps(meta, indent=1, default=str))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
