"""Multi-object tracking over a detector's per-frame boxes: :class:`ByteTracker` (ByteTrack)."""
from mlxnet.tracking.bytetrack import ByteTracker, TrackerSettings
from mlxnet.tracking.kalman import KalmanBoxFilter

__all__ = ["ByteTracker", "KalmanBoxFilter", "TrackerSettings"]
