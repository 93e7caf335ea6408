"""A constant-velocity Kalman filter over boxes as (centre x, centre y, aspect w/h, height), the
motion model of SORT / DeepSORT that ByteTrack keeps.

The state is the box and its velocity (8 values). Noise scales with the box height, so a large
(near) object may move more pixels per frame than a small (far) one; the aspect ratio is nearly
constant. The filter works in pixels per frame: one :meth:`predict` per frame.
"""
from __future__ import annotations

import numpy as np
from scipy.linalg import cho_factor, cho_solve

_POSITION_WEIGHT = 1.0 / 20  # standard deviation of position noise, as a fraction of the height
_VELOCITY_WEIGHT = 1.0 / 160  # likewise for the velocity


class KalmanBoxFilter:
    """The filter's matrices; each track keeps its own (mean, covariance)."""

    def __init__(self) -> None:
        self.motion = np.eye(8)
        self.motion[:4, 4:] = np.eye(4)  # x_{t+1} = x_t + v_t (one frame)
        self.observe = np.eye(4, 8)  # a detection measures the box, not its velocity

    def initiate(self, xyah: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A new track's state from its first box: unknown velocity, so a wide velocity prior."""
        h = xyah[3]
        mean = np.concatenate([xyah, np.zeros(4)])
        std = np.array([2 * _POSITION_WEIGHT * h, 2 * _POSITION_WEIGHT * h, 1e-2, 2 * _POSITION_WEIGHT * h,
                        10 * _VELOCITY_WEIGHT * h, 10 * _VELOCITY_WEIGHT * h, 1e-5, 10 * _VELOCITY_WEIGHT * h])
        return mean, np.diag(std ** 2)

    def _process_noise(self, h: float) -> np.ndarray:
        std = np.array([_POSITION_WEIGHT * h, _POSITION_WEIGHT * h, 1e-2, _POSITION_WEIGHT * h,
                        _VELOCITY_WEIGHT * h, _VELOCITY_WEIGHT * h, 1e-5, _VELOCITY_WEIGHT * h])
        return np.diag(std ** 2)

    def predict(self, mean: np.ndarray, cov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The state one frame later."""
        mean = self.motion @ mean
        cov = self.motion @ cov @ self.motion.T + self._process_noise(mean[3])
        return mean, cov

    def project(self, mean: np.ndarray, cov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The state as a measurement: the box and its uncertainty, detector noise included."""
        h = mean[3]
        noise = np.diag(np.array([_POSITION_WEIGHT * h, _POSITION_WEIGHT * h, 1e-1, _POSITION_WEIGHT * h]) ** 2)
        return self.observe @ mean, self.observe @ cov @ self.observe.T + noise

    def update(self, mean: np.ndarray, cov: np.ndarray, xyah: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The state corrected by a matched detection's box."""
        projected, s = self.project(mean, cov)
        # Kalman gain K = P H^T S^-1, solved through S's Cholesky factor (S is symmetric positive).
        gain = cho_solve(cho_factor(s, lower=True, check_finite=False), (cov @ self.observe.T).T,
                         check_finite=False).T
        mean = mean + gain @ (xyah - projected)
        cov = cov - gain @ s @ gain.T
        return mean, cov


def xyxy_to_xyah(boxes: np.ndarray) -> np.ndarray:
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    h_safe = np.maximum(h, 1e-6)  # a degenerate box must not make the aspect infinite
    return np.stack([boxes[:, 0] + w / 2, boxes[:, 1] + h / 2, w / h_safe, h_safe], axis=1)


def xyah_to_xyxy(xyah: np.ndarray) -> np.ndarray:
    xyah = np.asarray(xyah, dtype=np.float64).reshape(-1, 4)
    w = xyah[:, 2] * xyah[:, 3]
    return np.stack([xyah[:, 0] - w / 2, xyah[:, 1] - xyah[:, 3] / 2,
                     xyah[:, 0] + w / 2, xyah[:, 1] + xyah[:, 3] / 2], axis=1)
