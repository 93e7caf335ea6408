"""MOT metrics (py-motmetrics: MOTA, IDF1, ID switches) of mlxnet's ByteTrack on synthetic scenes
with known ground truth (mlxnet/tracking/synthetic.py: linear motion, crossings, an occluder,
a crowd; jittered boxes, misses, low scores, false positives). The thresholds are well below what
it scores (scripts/bench/mot_synthetic.py prints the figures) and well above what a tracker with
a broken association scores, which the last test checks: this test can fail."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("scipy")
pytest.importorskip("motmetrics")

from mlxnet.tracking import ByteTracker, bytetrack  # noqa: E402
from mlxnet.tracking import synthetic as syn  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


def metrics(seeds=(0, 1)) -> dict[str, dict]:
    results = {s.name: (s, syn.track_scene(s, lambda: ByteTracker(frame_rate=30))) for s in syn.scenes(seeds)}
    return syn.mot_metrics(results)


def test_the_scenes_hold_what_they_claim():
    occluded = syn.make_scene("occlusion", 0)
    assert len(occluded.truth) == 150
    # Behind the pillar: objects in the truth without a detection on them, for several frames.
    hidden = sum(len(ids) - int((syn._iou(boxes, dets).max(axis=1, initial=0) >= 0.5).sum())
                 for (ids, boxes), (dets, _) in zip(occluded.truth, occluded.detections))
    assert hidden > 50
    low = np.concatenate([s for _, s in occluded.detections])
    assert ((low > 0.1) & (low < 0.25)).sum() > 20  # partly hidden: the second stage's boxes
    crossing = syn.make_scene("crossing", 0)
    first = crossing.truth[0][1]
    assert len(first) == 8 and np.allclose(first[:4, 2] - first[:4, 0], first[4:, 2] - first[4:, 0])
    assert syn.make_scene("crowded", 3).detections[5][0].tolist() == syn.make_scene("crowded", 3).detections[5][0].tolist()


def test_bytetrack_scores_well_on_every_kind_of_scene():
    m = metrics()
    overall = m["OVERALL"]
    assert overall["mota"] >= 0.85 and overall["idf1"] >= 0.90, overall
    assert overall["num_switches"] <= 8, overall
    assert overall["precision"] >= 0.99  # one-frame false positives never get an id
    for name, row in m.items():
        assert row["idf1"] >= 0.85 and row["mota"] >= 0.75, (name, row)
        if name.startswith(("crossing", "occlusion", "linear")):
            assert row["num_switches"] <= 1, (name, row)  # who is who survives crossings and the pillar


def test_a_broken_association_scores_worse(monkeypatch):
    """Matching each track to the first detection under the cost limit, in the detections'
    (shuffled) order instead of the optimal assignment: ids jump between neighbours."""
    good = metrics(seeds=(0,))["OVERALL"]

    def first_fit(cost: np.ndarray, limit: float):
        rows, cols = cost.shape
        pairs, used = [], set()
        for i in range(rows):
            for j in range(cols):
                if j not in used and cost[i, j] <= limit:
                    pairs.append((i, j))
                    used.add(j)
                    break
        matched = {i for i, _ in pairs}
        return pairs, [i for i in range(rows) if i not in matched], [j for j in range(cols) if j not in used]

    monkeypatch.setattr(bytetrack, "_assign", first_fit)
    broken = metrics(seeds=(0,))["OVERALL"]
    assert broken["num_switches"] > 10 * max(good["num_switches"], 5), (good, broken)
    assert broken["idf1"] < 0.85 <= good["idf1"] - 0.05, (good, broken)
