"""ByteTrack (mlxnet.tracking) on synthetic detections with known identities: objects moving
linearly, crossing, missed for a few frames, scored low while occluded."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("scipy")

from mlxnet.tracking import ByteTracker, KalmanBoxFilter, TrackerSettings  # noqa: E402
from mlxnet.tracking.bytetrack import iou_matrix  # noqa: E402


def box(cx: float, cy: float, w: float = 40, h: float = 80) -> list[float]:
    return [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]


def run(frames: list[list[tuple[int, list[float], float]]], **settings) -> list[dict[int, int]]:
    """Each frame: (true object, box, score) rows; returns, per frame, true object -> track id."""
    tracker = ByteTracker(frame_rate=30, settings=TrackerSettings(**settings))
    out = []
    for rows in frames:
        boxes = np.array([b for _, b, _ in rows], np.float64).reshape(-1, 4)
        scores = np.array([s for _, _, s in rows], np.float64)
        kept, ids = tracker.update(boxes, scores, np.zeros(len(rows), np.int64))
        assert len(kept) == len(ids) and len(set(ids.tolist())) == len(ids), "one id per box"
        out.append({rows[k][0]: int(i) for k, i in zip(kept, ids)})
    return out


def ids_of(seen: list[dict[int, int]], obj: int) -> set[int]:
    return {frame[obj] for frame in seen if obj in frame}


def test_linear_motion_keeps_one_id_each():
    frames = [[(a, box(20 + 5 * t, 100 + 60 * a), 0.9) for a in range(3)] for t in range(40)]
    seen = run(frames)
    assert all(len(f) == 3 for f in seen)  # confirmed on the first frame
    assert [ids_of(seen, a) for a in range(3)] == [{1}, {2}, {3}]


def test_crossing_objects_keep_their_ids():
    # Two boxes on one row, moving towards each other and through each other.
    frames = []
    for t in range(50):
        frames.append([(0, box(20 + 6 * t, 100), 0.9), (1, box(320 - 6 * t, 110), 0.85)])
    seen = run(frames)
    assert len(ids_of(seen, 0)) == 1 and len(ids_of(seen, 1)) == 1
    assert ids_of(seen, 0) != ids_of(seen, 1)


def test_missed_for_a_few_frames_comes_back_with_its_id():
    frames = []
    for t in range(40):
        rows = [(1, box(200, 300 - 2 * t), 0.8)]
        if not 15 <= t < 21:  # object 0 is not detected for 6 frames, moving on meanwhile
            rows.append((0, box(20 + 5 * t, 100), 0.9))
        frames.append(rows)
    seen = run(frames)
    assert ids_of(seen, 0) == {seen[0][0]}
    assert all(0 not in seen[t] for t in range(15, 21))
    assert 0 in seen[21], "found again on its first frame back"
    assert ids_of(seen, 1) == {seen[0][1]}


def test_low_scores_continue_a_track_but_start_none():
    # ByteTrack's second stage: an occluded object's low-scoring box keeps its track alive.
    frames = [[(0, box(20 + 5 * t, 100), 0.15 if 10 <= t < 20 else 0.9)] for t in range(30)]
    seen = run(frames)
    assert all(0 in f for f in seen) and ids_of(seen, 0) == {1}
    born_low = run([[(0, box(50, 50), 0.15)]] * 5)
    assert born_low == [{}] * 5


def test_one_frame_false_positive_gets_no_id_and_later_tracks_confirm_on_their_second_frame():
    frames = [[(0, box(50 + 5 * t, 100), 0.9)] for t in range(6)]
    frames[2].append((9, box(400, 400), 0.9))  # a flash: one frame only
    frames[3].append((5, box(300, 50), 0.9))  # a newcomer from frame 3 on
    frames[4].append((5, box(305, 50), 0.9))
    frames[5].append((5, box(310, 50), 0.9))
    seen = run(frames)
    assert 9 not in seen[2]
    assert 5 not in seen[3] and 5 in seen[4] and 5 in seen[5]
    assert ids_of(seen, 5) == {seen[4][5]} and ids_of(seen, 0) == {1}


def test_lost_longer_than_the_buffer_starts_a_new_id():
    frames = [[(0, box(100, 100), 0.9)] for _ in range(5)] + [[] for _ in range(12)] + \
             [[(0, box(100, 100), 0.9)] for _ in range(3)]
    short = run(frames, buffer=10)
    assert short[0][0] != short[-1][0]
    long = run(frames, buffer=30)
    assert long[0][0] == long[-1][0]


def test_no_detections_and_degenerate_boxes():
    tracker = ByteTracker()
    kept, ids = tracker.update(np.zeros((0, 4)), np.zeros(0))
    assert kept.shape == ids.shape == (0,)
    kept, ids = tracker.update(np.array([[10, 10, 10, 10], [5, 5, 50, 50]], np.float64), np.array([0.9, 0.9]))
    assert len(kept) == len(ids) <= 2


def test_kalman_follows_constant_velocity():
    kf = KalmanBoxFilter()
    mean, cov = kf.initiate(np.array([0.0, 0.0, 0.5, 80.0]))
    for t in range(1, 30):
        mean, cov = kf.predict(mean, cov)
        mean, cov = kf.update(mean, cov, np.array([4.0 * t, -2.0 * t, 0.5, 80.0]))
    np.testing.assert_allclose(mean[4:6], [4.0, -2.0], atol=0.2)
    predicted, _ = kf.predict(mean, cov)
    np.testing.assert_allclose(predicted[:2], [4.0 * 30, -2.0 * 30], atol=1.0)


def test_iou_matrix():
    a = np.array([[0, 0, 10, 10], [0, 0, 0, 0]], np.float64)
    b = np.array([[0, 0, 10, 10], [5, 0, 15, 10]], np.float64)
    np.testing.assert_allclose(iou_matrix(a, b), [[1.0, 1 / 3], [0.0, 0.0]])


def test_assignment_is_gated_by_the_limit_as_lapjv_cost_limit_is():
    # ByteTrack's reference (lapjv with cost_limit) makes a pair only when it costs less than
    # leaving both unmatched: here A-X alone (0.0 - 0.8) beats A-Y + B-X (-0.05 - 0.1), though
    # the ungated Hungarian optimum over all four (A-Y, B-X) would pass the limit pair by pair.
    from mlxnet.tracking.bytetrack import _assign

    cost = np.array([[0.0, 0.75], [0.7, 2.0]])
    assert _assign(cost, 0.8) == ([(0, 0)], [1], [1])
    assert _assign(np.zeros((0, 3)), 0.8) == ([], [], [0, 1, 2])
