"""What a non-editable install ships: every subpackage of mlxnet/ is listed in pyproject.toml
(setuptools installs only the packages named there)."""
from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_mlxnet_subpackage_is_packaged():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"mlxnet." + ".".join(p.parent.relative_to(ROOT / "mlxnet").parts)
             for p in (ROOT / "mlxnet").rglob("__init__.py")} - {"mlxnet."}
    assert found | {"mlxnet"} <= listed, sorted(found - listed)
