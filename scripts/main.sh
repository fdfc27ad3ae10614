#!/usr/bin/env bash
# The main job: set up, then run the demo (all local GPUs, or 4 host-mode
# processes where fewer than two are visible), and on 2 or more GPUs the
# collective benchmark (python -m pyccl.bench: every collective against NCCL
# and torch symmetric memory; its CSV and JSON go to $PYCCL_BENCH_OUT, default
# ./bench-results).
# Extra arguments go to `python -m pyccl.demo`; PYCCL_BENCH_ARGS to the benchmark.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$PYCCL_ROOT"
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}" TORCH_SYMM_MEM_DISABLE_MULTICAST="${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}"
export NVSHMEM_DISABLE_NVLS="${NVSHMEM_DISABLE_NVLS:-1}"
"$PY" -m pyccl.demo "$@"
gpus=$("$PY" -c 'import pyccl; print(pyccl._C.device_count() if pyccl.cuda_available() else 0)')
if [ "$gpus" -ge 2 ]; then
  out="${PYCCL_BENCH_OUT:-$PYCCL_ROOT/bench-results}"
  mkdir -p "$out"
  # shellcheck disable=SC2086  # PYCCL_BENCH_ARGS is a list of arguments
  "$PY" -m pyccl.bench --collectives all --csv "$out/bench.csv" --out "$out/bench.json" ${PYCCL_BENCH_ARGS:-}
fi
