#!/usr/bin/env bash
# On a GPU machine: record the machine, then run the GPU checks in parts, each
# bounded so that a slow or hung part cannot keep the others' logs from coming
# back. Logs go to $OUT (or ./gpu-logs).
#
#   PYCCL_CHECK_PARTS   which parts, in order (default: all of them):
#     cpu          the CPU tests (host mode) and the GPU runtime-core tests (tests/core/test_gpu.py)
#     channels     tests/channels/test_gpu_channels.py
#     collectives  tests/collectives/test_gpu_collectives.py
#     backend      tests/torch/test_gpu_backend.py and tests/torch/test_gpu_ops.py (torch.compile: slow)
#     plans        tests/dsl/test_gpu_plans.py and tests/channels/test_gpu_symmetric.py
#     reliability  tests/core/test_faults.py and tests/core/test_leaks_and_load.py on GPUs (PYCCL_LOAD_SECONDS
#                  sets the load's length; its progress and stacks go to $OUT)
#     sanitize     compute-sanitizer memcheck and synccheck, one run per test (scripts/sanitize_tests.py),
#                  over PYCCL_SANITIZE_FILES (default: every tests/*/test_gpu*.py) and the tests that
#                  PYCCL_SANITIZE_K selects (default: all but the million-round signal test); logs in
#                  $OUT/sanitize, and PYCCL_SANITIZE_RESUME=1 goes on from an earlier bounded run there
#     demo         the README's main command without the benchmark
#     channel_bench benchmarks/channel_bench.py
#     bench        python -m pyccl.bench --collectives all (PYCCL_BENCH_ARGS appended)
#   PYCCL_CHECK_BUDGET_S  seconds for all parts together (default 540); each part
#                         gets what is left, split evenly over the parts still to run.
# Extra arguments go to every pytest run.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
OUT="${OUT:-$(pwd)/gpu-logs}"
mkdir -p "$OUT"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
{
  date -u
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
  nvidia-smi topo -m
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
  cmake --version | head -1; nvcc --version | tail -1
} 2>&1 | tee "$OUT/machine.txt"

parts=(${PYCCL_CHECK_PARTS:-cpu channels collectives backend demo channel_bench bench})
budget=${PYCCL_CHECK_BUDGET_S:-540}
t_start=$(date +%s)
# Build once, outside the parts' budgets' accounting of tests.
bash scripts/setup.sh 2>&1 | tail -3 | tee "$OUT/setup.txt"
gpu_tests=$(ls tests/*/test_gpu_*.py | sed 's/^/--ignore=/' | tr '\n' ' ')
status=0
for i in "${!parts[@]}"; do
  part=${parts[$i]}
  left=$(( budget - ($(date +%s) - t_start) ))
  share=$(( left / (${#parts[@]} - i) ))
  [ "$share" -lt 20 ] && share=20
  start=$(date +%s)
  case "$part" in
    cpu) cmd="bash scripts/test.sh -rfs --durations=10 $gpu_tests tests $*" ;;
    channels) cmd="bash scripts/test.sh -v -rfs --durations=10 tests/channels/test_gpu_channels.py $*" ;;
    collectives) cmd="bash scripts/test.sh -v -rfs --durations=10 tests/collectives/test_gpu_collectives.py $*" ;;
    backend) cmd="bash scripts/test.sh -v -rfs --durations=10 tests/torch/test_gpu_backend.py tests/torch/test_gpu_ops.py $*" ;;
    plans) cmd="bash scripts/test.sh -v -rfs --durations=10 tests/dsl/test_gpu_plans.py tests/channels/test_gpu_symmetric.py $*" ;;
    reliability)
      export LOAD_TRACE="$OUT"
      cmd="bash scripts/test.sh -v -rfs --durations=10 tests/core/test_faults.py tests/core/test_leaks_and_load.py $*" ;;
    sanitize)
      resume=""; [ "${PYCCL_SANITIZE_RESUME:-0}" = 1 ] && resume=--resume
      cmd=".venv/bin/python scripts/sanitize_tests.py --out $OUT/sanitize --budget-s $(( share - 15 )) $resume
           ${PYCCL_SANITIZE_FILES:-$(ls tests/*/test_gpu*.py)}" ;;
    demo) cmd=".venv/bin/python -m pyccl.demo" ;;
    channel_bench) cmd=".venv/bin/python benchmarks/channel_bench.py --out $OUT/channel_bench.json" ;;
    bench) cmd=".venv/bin/python -m pyccl.bench --collectives all --csv $OUT/bench.csv --out $OUT/bench.json --timeout $(( share - 10 )) ${PYCCL_BENCH_ARGS:-}" ;;
    *) echo "unknown part '$part' in PYCCL_CHECK_PARTS" >&2; status=1; continue ;;
  esac
  # shellcheck disable=SC2086  # cmd is a word list
  timeout "$share" $cmd 2>&1 | tee "$OUT/$part.txt"
  rc=${PIPESTATUS[0]}
  echo "[gpu_check] $part: rc=$rc in $(( $(date +%s) - start )) s (limit $share s)" | tee -a "$OUT/summary.txt"
  [ "$rc" -ne 0 ] && status=1
done
cp .venv/pyccl-build.log "$OUT/" 2>/dev/null || true
exit $status
