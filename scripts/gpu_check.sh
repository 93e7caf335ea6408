#!/usr/bin/env bash
# Every GPU-marked test (and, with --bench, the GPU benchmark) on the lent CUDA machine, in the
# second of the two device calls (../shared/device/README.md; README "Development"):
#
#   call 1, carry [".mlx-cuda-a"]:             bash scripts/gpu_check.sh --stage
#   call 2, carry [".mlx-cuda-b", ".ref-sam"]:  bash scripts/gpu_check.sh [--bench | --profile ARGS | --script NAME.py ARGS]
#
# Call 2 installs MLX's CUDA build and this checkout (into /tmp/proj, not the machine's Python),
# then runs `pytest -m gpu` on 15 workers (about 5 minutes; further arguments go to pytest, e.g.
# `-k pad2d`); --bench runs
# scripts/bench_models.py --device gpu at batch 1 and 8, float32 and float16, instead, writing
# $OUT/bench.json; --profile ARGS runs scripts/profile_gpu.py ARGS (per-kernel times). Carrying .ref-sam (MobileSAM's modules, see scripts/sam_reference.py) gives
# the SAM entries their PyTorch reference; without it they are timed alone.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if [[ "${1:-}" == "--stage" ]]; then
  mkdir -p /root/mlx-cuda-stage && cp .mlx-cuda-a/part.aa /root/mlx-cuda-stage/
  echo "staged part A; run call 2 within 30 s"
  exit 0
fi
source .mlx-cuda-b/env.sh
bash .mlx-cuda-b/install.sh >/dev/null 2>&1 || { echo "MLX CUDA install failed (was call 1 run first?)"; exit 1; }
python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/proj . >/dev/null 2>&1
export PYTHONPATH=/tmp/proj:${PYTHONPATH:-}
# One script of scripts/ under the call's time limit, warnings dropped, its output also kept
# in $OUT/LOG: run_logged LOG SCRIPT.py ARGS
run_logged() {
  local log=$1
  shift
  timeout 560 python3 "scripts/$1" "${@:2}" 2>&1 | grep -v -i warn | tee -a "${OUT:-/tmp}/$log"
  return "${PIPESTATUS[0]}"
}
case "${1:-}" in
  --profile)  # per-kernel profile, scripts/profile_gpu.py ARGS
    shift
    run_logged profile.txt profile_gpu.py --out /tmp/profile "$@"
    exit ;;
  --script)  # any script of scripts/ on the GPU: --script NAME.py ARGS
    shift
    run_logged script.txt "$@"
    exit ;;
  --bench)
    shift
    run_logged bench.txt bench_models.py --device gpu --batch 1 8 --dtype float32 float16 \
      --json "${OUT:-/tmp}/bench.json" "$@"
    exit ;;
esac
# Outside the checkout, so that tests import the installed copy (with its built files).
cd /tmp
timeout 560 python3 -m pytest -q -m gpu -n 15 -p no:cacheprovider -p no:benchmark "$root/tests" "$@"
