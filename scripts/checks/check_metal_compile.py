"""Compile every kernel launch's Metal rendering with Apple's compiler (`xcrun metal`).

The default test run type-checks the same sources with clang and a shim of Metal's standard
library (tests/test_kernel_compile.py); on a Mac this script checks that verdict with the real
compiler. Each source is what `mx.fast.metal_kernel` generates, behind a stand-in for MLX's
preamble (<metal_stdlib>, `using namespace metal`, float16_t, bfloat16_t).

    python scripts/checks/check_metal_compile.py            # needs Xcode's command-line tools
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import mlxnet  # noqa: F401
from mlxnet.ops.core import kernel_launches

PREAMBLE = """#include <metal_stdlib>
using namespace metal;
typedef half float16_t;
typedef bfloat bfloat16_t;
"""


def main() -> int:
    if shutil.which("xcrun") is None:
        print("xcrun not found: this check needs macOS with Xcode's command-line tools")
        return 2
    sources = {}
    for op, launch in kernel_launches.every_launch():
        sources.setdefault(launch.metal_source(), f"{op}/{launch.kernel.kernel}")
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (source, name) in enumerate(sources.items()):
            path = Path(tmp) / f"k{i}.metal"
            path.write_text(PREAMBLE + source)
            r = subprocess.run(["xcrun", "-sdk", "macosx", "metal", "-std=metal3.1", "-c",
                                str(path), "-o", str(path.with_suffix(".air"))],
                               capture_output=True, text=True)
            if r.returncode != 0:
                failures += 1
                print(f"FAIL {name}\n{r.stderr[-2000:]}")
    print(f"{len(sources) - failures} of {len(sources)} Metal kernel sources compile")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
