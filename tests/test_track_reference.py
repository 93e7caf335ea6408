"""mlxnet's ByteTrack against ultralytics' BYTETracker (the reference its users know) on the same
synthetic detections: the same ids on the same boxes, frame by frame, with ultralytics'
``bytetrack.yaml`` settings. Always against the ids ultralytics gave, stored by
scripts/goldens/golden_bytetrack.py (tests/fixtures/track/bytetrack_golden.json); also live
where ultralytics is installed (it is no dependency)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlxnet.tracking import ByteTracker
from track_scenes import scene, ultralytics_ids

GOLDEN = Path(__file__).parent / "fixtures" / "track" / "bytetrack_golden.json"


def _ours(seed: int) -> list[dict[int, int]]:
    tracker = ByteTracker(frame_rate=30)
    out = []
    for boxes, scores, classes in scene(seed):
        kept, ids = tracker.update(boxes, scores, classes)
        out.append(dict(zip(kept.tolist(), ids.tolist())))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_same_ids_as_ultralytics_stored(seed):
    stored = json.loads(GOLDEN.read_text())["scenes"][str(seed)]
    expected = [{int(i): int(t) for i, t in frame} for frame in stored]
    ours = _ours(seed)
    assert len(ours) == len(expected)
    for t, (got, want) in enumerate(zip(ours, expected)):
        assert got == want, f"seed {seed}, frame {t}"


@pytest.mark.parametrize("seed", range(8))
def test_same_ids_as_ultralytics_live(seed):
    pytest.importorskip("ultralytics.trackers.byte_tracker")
    for t, (got, want) in enumerate(zip(_ours(seed), ultralytics_ids(seed))):
        assert got == want, f"seed {seed}, frame {t}"
