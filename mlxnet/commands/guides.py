"""Which page of the guides (``docs/``, the documentation site's sources) each command's help
points to."""
from __future__ import annotations

GUIDES = {
    "": "index.md",
    "info": "devices.md",
    "models": "convert.md",
    "ops": "ops.md",
    "convert": "convert.md",
    "check": "check.md",
    "classify": "classify.md",
    "detect": "detect.md",
    "track": "track.md",
    "segment": "segment.md",
    "inpaint": "inpaint.md",
    "erase": "erase-and-app.md",
    "app": "erase-and-app.md",
    "bench": "bench.md",
    "train": "train.md",
    "train classify": "train.md",
    "train detect": "train-detect.md",
    "val": "val.md",
    "val classify": "val.md",
    "val detect": "val.md",
}


def epilog(command: str) -> str:
    """The help's last line for ``command`` ('' for ``mlxnet`` itself, 'train detect' for a
    sub-command)."""
    return f"Guide: docs/{GUIDES[command]} in the mlxnet repository."
