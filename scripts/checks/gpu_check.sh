#!/usr/bin/env bash
# The GPU checks in the current environment (a Mac, or Linux with MLX's CUDA build:
# pip install -e ".[test,cuda]"):
#
#   bash scripts/checks/gpu_check.sh [PYTEST ARGS]      every GPU-marked test (GPU faces == definitions)
#   bash scripts/checks/gpu_check.sh --bench [ARGS]     mlxnet bench on the GPU against PyTorch, batch 1 and 8,
#                                                float32 and float16 (JSON to $BENCH_JSON, default bench.json)
#   bash scripts/checks/gpu_check.sh --profile ARGS     scripts/bench/profile_gpu.py ARGS (per-kernel times)
#
# With pytest-xdist installed, PYTEST_WORKERS=N spreads the tests over N processes. An installed
# MobileSAM (pip install git+https://github.com/ChaoningZhang/MobileSAM) gives the SAM benchmark
# rows their PyTorch reference; without it those rows are timed alone.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
case "${1:-}" in
  --profile)
    shift
    exec python scripts/bench/profile_gpu.py "$@" ;;
  --bench)
    shift
    exec python -m mlxnet --device gpu bench --batch 1 8 --dtype float32 float16 --compare torch \
      --json "${BENCH_JSON:-bench.json}" "$@" ;;
esac
workers=()
[[ -n "${PYTEST_WORKERS:-}" ]] && workers=(-n "$PYTEST_WORKERS")
exec python -m pytest -q -m gpu "${workers[@]}" -p no:cacheprovider tests "$@"
