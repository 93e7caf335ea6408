"""The guides as a site: ``mkdocs build --strict`` (every warning an error: a broken link or
anchor, a page missing from the navigation, an API reference that does not resolve), the
README's own links, and each command's help naming its guide page."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from mlxnet.cli import app
from mlxnet.commands.guides import GUIDES

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(Path(sys.executable).parent)})
    assert done.returncode == 0, done.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("mlxnet.ops.pad2d", "mlxnet.use_device", "models.yolo.YOLO", "mlxnet.weights"):
        assert f'id="{name}"' in api, f"the API reference lacks {name}"


def _nav_pages(nav) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for v in nav.values() for p in _nav_pages(v)]
    return [p for item in nav for p in _nav_pages(item)]


def test_every_guide_is_in_the_navigation():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert sorted(_nav_pages(config["nav"])) == sorted(p.name for p in DOCS.glob("*.md"))


def _slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) gives a heading."""
    text = re.sub(r"[`*_\[\]()]", "", heading.strip().lower())
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text)).strip("-")


def test_the_readmes_links_reach_their_pages_and_headings():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert len(local) >= 15
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.exists(), f"README links to {link}: no such file"
        if anchor:
            slugs = {_slug(h) for h in re.findall(r"^#+ (.*)$", target.read_text(), re.M)}
            assert anchor in slugs, f"README links to {link}: no such heading"


def test_the_readme_stays_a_front_page():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def _commands() -> list[list[str]]:
    out = [[]]
    for command in app.registered_commands:
        out.append([command.name])
    for group in app.registered_groups:
        out.append([group.name])
        out += [[group.name, c.name] for c in group.typer_instance.registered_commands]
    return out


@pytest.mark.parametrize("command", _commands(), ids=lambda c: " ".join(c) or "mlxnet")
def test_each_help_names_its_guide_page(command):
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    found = re.search(r"Guide: docs/(\S+\.md)", result.output)
    assert found, result.output[-500:]
    assert found.group(1) == GUIDES[" ".join(command)] and (DOCS / found.group(1)).is_file()
