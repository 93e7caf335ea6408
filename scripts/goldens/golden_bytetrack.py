"""Store ultralytics' BYTETracker ids on the tracker tests' synthetic scenes.

    python scripts/goldens/golden_bytetrack.py   # with ultralytics installed

Writes tests/fixtures/track/bytetrack_golden.json: for each scene seed, per frame, the
[detection index, track id] pairs ultralytics assigns with its bytetrack.yaml settings, which
tests/test_track_reference.py compares mlxnet's ByteTrack with on every run.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # the scenes and the ultralytics driver live with the tests

import ultralytics  # noqa: E402
from track_scenes import ultralytics_ids  # noqa: E402


def main() -> None:
    scenes = {str(seed): [sorted(frame.items()) for frame in ultralytics_ids(seed)] for seed in range(8)}
    out = ROOT / "tests" / "fixtures" / "track" / "bytetrack_golden.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"ultralytics": ultralytics.__version__, "settings": "bytetrack.yaml defaults",
                               "scenes": scenes}, separators=(",", ":")) + "\n")
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
