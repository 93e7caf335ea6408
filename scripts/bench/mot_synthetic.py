"""MOT metrics of mlxnet's ByteTrack on synthetic scenes with known ground truth: the tracking guide's (docs/track.md)
tracking figures.

    python scripts/bench/mot_synthetic.py [--seeds 0 1 2 3 4] [--frames 150] [--json FILE]

Scenes (mlxnet/tracking/synthetic.py): ``linear`` (8 objects, 5% misses), ``crossing`` (4 pairs
of same-size objects passing through each other), ``occlusion`` (8 objects crossing a pillar: low
scores at its edges, no detection behind it), ``crowded`` (20 objects, 10% misses); jittered
boxes, one-frame false positives, 1280x720 at 30 frames/s. Metrics by py-motmetrics (``pip
install motmetrics``), a match at IoU >= 0.5. With ``--reference``, the same scenes through
ultralytics' BYTETracker (where ultralytics is installed), for comparison.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mlxnet.tracking import ByteTracker  # noqa: E402
from mlxnet.tracking import synthetic as syn  # noqa: E402

COLUMNS = [("MOTA", "mota", "{:.3f}"), ("IDF1", "idf1", "{:.3f}"), ("ID sw", "num_switches", "{:.0f}"),
           ("FP", "num_false_positives", "{:.0f}"), ("FN", "num_misses", "{:.0f}"), ("prec", "precision", "{:.3f}"),
           ("recall", "recall", "{:.3f}"), ("MT/GT", None, None)]


class _UltralyticsTracker:
    """ultralytics' BYTETracker behind ByteTracker's update(boxes, scores) -> (kept, ids)."""

    def __init__(self) -> None:
        from types import SimpleNamespace

        from ultralytics.trackers.byte_tracker import BYTETracker

        self._t = BYTETracker(SimpleNamespace(tracker_type="bytetrack", track_high_thresh=0.25,
                                              track_low_thresh=0.1, new_track_thresh=0.25, track_buffer=30,
                                              match_thresh=0.8, fuse_score=True))

    def update(self, boxes: np.ndarray, scores: np.ndarray):
        class Boxes:
            def __init__(self, xyxy, conf):
                self.xyxy, self.conf, self.cls = xyxy, conf, np.zeros(len(conf), np.float32)

            @property
            def xywh(self):
                x1, y1, x2, y2 = self.xyxy.T
                return np.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], axis=1)

            def __getitem__(self, mask):
                return Boxes(self.xyxy[mask], self.conf[mask])

            def __len__(self):
                return len(self.conf)

        rows = self._t.update(Boxes(boxes.astype(np.float32), scores.astype(np.float32)))
        return rows[:, 7].astype(np.int64), rows[:, 4].astype(np.int64)


def table(summary: dict[str, dict], title: str) -> str:
    head = f"{'scene':14s}" + "".join(f"{name:>8s}" for name, _, _ in COLUMNS)
    lines = [title, head]
    for scene, row in summary.items():
        cells = [fmt.format(row[key]) if key else f"{row['mostly_tracked']:.0f}/{row['num_unique_objects']:.0f}"
                 for _, key, fmt in COLUMNS]
        lines.append(f"{scene:14s}" + "".join(f"{c:>8s}" for c in cells))
    return "\n".join(lines)


def by_kind(results: dict, make) -> dict[str, dict]:
    """Metrics per kind (its seeds' events together) and overall."""
    tracked = {name: (scene, syn.track_scene(scene, make)) for name, scene in results.items()}
    per_scene = syn.mot_metrics(tracked)
    out = {}
    for kind in syn.KINDS:
        mine = {n: v for n, v in tracked.items() if n.startswith(kind + "-")}
        out[kind] = syn.mot_metrics(mine)["OVERALL"]
    out["all"] = per_scene["OVERALL"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--frames", type=int, default=150)
    ap.add_argument("--reference", action="store_true", help="Also ultralytics' BYTETracker (if installed).")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    warnings.simplefilter("ignore", FutureWarning)  # pandas' notes on motmetrics' calls
    warnings.simplefilter("ignore", DeprecationWarning)

    scenes = {s.name: s for s in syn.scenes(args.seeds, args.frames)}
    report = {"seeds": args.seeds, "frames": args.frames, "scenes": len(scenes),
              "mlxnet": by_kind(scenes, lambda: ByteTracker(frame_rate=30))}
    print(table(report["mlxnet"], f"mlxnet ByteTrack: {len(scenes)} scenes of {args.frames} frames "
                                  f"(seeds {' '.join(map(str, args.seeds))})"))
    if args.reference:
        os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp(prefix="ultralytics-"))
        try:
            report["ultralytics"] = by_kind(scenes, _UltralyticsTracker)
        except ImportError:
            print("ultralytics is not installed: no reference column", file=sys.stderr)
        else:
            print()
            print(table(report["ultralytics"], "ultralytics BYTETracker, same scenes"))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
