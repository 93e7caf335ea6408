"""The repository speaks of the project and its users only: no build machines, borrowed GPUs,
their staging folders or the workspace outside the checkout. Its modules import each other in
one direction only."""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Written in pieces so that this file does not match itself.
FORBIDDEN = re.compile("|".join([
    r"\.\./" + "shared", "lent " + r"(CUDA|GPU|machine)", "mlx-cuda-" + "[ab]", "/root/" + "mlx-cuda",
    r"device " + r"calls?\b", "the GPU " + "machine", "GPU " + "machine's",
]))


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / p for p in out.decode().split("\0") if p and not p.startswith("tests/fixtures/")]


def test_no_tracked_file_speaks_of_build_machines():
    hits = []
    for path in _tracked():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if FORBIDDEN.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not hits, "tracked files speak of our build machines:\n" + "\n".join(hits)


def test_the_check_catches_what_it_is_for():
    for line in ["see ../" "shared/device", "on the lent " "GPU", "carry .mlx-cuda-" "a", "two device " "calls"]:
        assert FORBIDDEN.search(line), line
    assert not FORBIDDEN.search("run the GPU-marked tests on a Mac")


# --- Import cycles -----------------------------------------------------------------------------------
# Dependencies point one way (device -> ops -> nn -> models -> applications); a cycle means two
# modules each need the other, and only import order decides which one sees the other half-built.
# Every import statement counts: top-level, inside functions (where one goes to dodge a cycle)
# and under TYPE_CHECKING. The family and weight-spec registries' importlib.import_module of
# mlxnet.models is not a statement and not counted: it is how the lower layer finds its plug-ins.

PACKAGES = {"mlxnet": ROOT / "mlxnet", "mlxnet.models": ROOT / "models"}  # models/ installs as mlxnet.models


def _modules(packages: dict[str, Path]) -> dict[str, Path]:
    found = {}
    for package, folder in packages.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            found[".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path
    return found


def _imports(module: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The modules of the tree that ``module`` imports, each with the line of its first import."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: level 1 is the module's own package
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # `from package import name` imports the submodule when name is one, else the package
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:  # an attribute, or a module outside the tree
                name = name.rpartition(".")[0]
            if name and name != module:
                found.setdefault(name, node.lineno)
    return found


def import_cycles(packages: dict[str, Path]) -> list[str]:
    """One cycle per group of modules that import each other, as ``a (line) -> b (line) -> a``."""
    modules = _modules(packages)
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(m: str) -> None:  # Tarjan's strongly connected components
        order[m] = low[m] = len(order)
        stack.append(m)
        for n in graph[m]:
            if n not in order:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], order[n])
        if low[m] == order[m]:
            group = []
            while not group or group[-1] != m:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(sorted(group))

    for m in graph:
        if m not in order:
            visit(m)
    cycles = []
    for group in groups:  # the shortest way round from the group's first module
        start = group[0]
        paths = {start: [start]}
        queue = [start]
        while queue:
            m = queue.pop(0)
            for n in graph[m]:
                if n == start:
                    route = paths[m] + [start]
                    queue = []
                    break
                if n in group and n not in paths:
                    paths[n] = paths[m] + [n]
                    queue.append(n)
        steps = [f"{a} ({modules[a].relative_to(ROOT) if modules[a].is_relative_to(ROOT) else modules[a]}:"
                 f"{graph[a][b]})" for a, b in zip(route, route[1:])]
        cycles.append(" -> ".join(steps + [start]))
    return cycles


def test_no_import_cycles():
    cycles = import_cycles(PACKAGES)
    assert not cycles, "modules that import each other:\n" + "\n".join(cycles)


def test_the_cycle_check_sees_every_kind_of_import(tmp_path):
    files = {
        "pkg/__init__.py": "",
        "pkg/low.py": "import os\n",
        "pkg/a.py": "from .sub.b import thing\nfrom pkg import low\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": "def f():\n    from ..c import g\n",  # function-level, relative two up
        "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (cycle,) = import_cycles({"pkg": tmp_path / "pkg"})
    assert cycle.startswith("pkg.a (") and cycle.endswith(" -> pkg.a"), cycle
    assert "pkg.sub.b (" in cycle and "pkg/sub/b.py:2)" in cycle and "pkg.c (" in cycle and "low" not in cycle
    (tmp_path / "pkg/c.py").write_text("from . import low\n")
    assert import_cycles({"pkg": tmp_path / "pkg"}) == []
