#!/usr/bin/env bash
# On a GPU machine: record the machine, then run the GPU checks in parts, each
# bounded so that a slow or hung part cannot keep the others' logs from coming
# back. Logs go to $OUT (or ./gpu-logs).
#
#   PYCCL_CHECK_PARTS   which parts, in order (default: all of them):
#   Each part but cpu runs the GPU tests (-m gpu) of its modules:
#     cpu          the tests in host mode and without GPUs (-m "not gpu")
#     core         tests/core: registered GPU memory, semaphores, lifetime, faults on GPUs
#     channels     tests/channels/test_channels.py
#     collectives  tests/collectives (collectives, fused, graph buffers, send/recv)
#     backend      tests/torch (torch.compile: slow)
#     plans        tests/dsl and tests/channels/test_symmetric.py
#     reliability  tests/core/test_faults.py and tests/core/test_leaks_and_load.py on GPUs (PYCCL_LOAD_SECONDS
#                  sets the load's length; its progress and stacks go to $OUT)
#     sanitize     compute-sanitizer memcheck and synccheck, one run per test (scripts/sanitize_tests.py),
#                  over the GPU tests of PYCCL_SANITIZE_FILES (default: every tests/*/test_*.py) that
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

parts=(${PYCCL_CHECK_PARTS:-cpu core channels collectives backend demo channel_bench bench})
budget=${PYCCL_CHECK_BUDGET_S:-540}
t_start=$(date +%s)
# Build once, outside the parts' budgets' accounting of tests.
bash scripts/setup.sh 2>&1 | tail -3 | tee "$OUT/setup.txt"
status=0
for i in "${!parts[@]}"; do
  part=${parts[$i]}
  left=$(( budget - ($(date +%s) - t_start) ))
  share=$(( left / (${#parts[@]} - i) ))
  [ "$share" -lt 20 ] && share=20
  start=$(date +%s)
  gpu_tests=(bash scripts/test.sh -v -rfs --durations=10 -m gpu)
  case "$part" in
    cpu) cmd=(bash scripts/test.sh -rfs --durations=10 -m "not gpu" tests) ;;
    core) cmd=("${gpu_tests[@]}" tests/core) ;;
    channels) cmd=("${gpu_tests[@]}" tests/channels/test_channels.py) ;;
    collectives) cmd=("${gpu_tests[@]}" tests/collectives) ;;
    backend) cmd=("${gpu_tests[@]}" tests/torch) ;;
    plans) cmd=("${gpu_tests[@]}" tests/dsl tests/channels/test_symmetric.py) ;;
    reliability)
      export LOAD_TRACE="$OUT"
      cmd=(bash scripts/test.sh -v -rfs --durations=10 tests/core/test_faults.py tests/core/test_leaks_and_load.py) ;;
    sanitize)
      resume=(); [ "${PYCCL_SANITIZE_RESUME:-0}" = 1 ] && resume=(--resume)
      # shellcheck disable=SC2206  # the files are a word list
      files=(${PYCCL_SANITIZE_FILES:-$(ls tests/*/test_*.py)})
      cmd=(.venv/bin/python scripts/sanitize_tests.py -m gpu --out "$OUT/sanitize" --budget-s $(( share - 15 ))
           "${resume[@]}" "${files[@]}") ;;
    demo) cmd=(.venv/bin/python -m pyccl.demo) ;;
    channel_bench) cmd=(.venv/bin/python benchmarks/channel_bench.py --out "$OUT/channel_bench.json") ;;
    bench)
      # shellcheck disable=SC2206  # PYCCL_BENCH_ARGS is a word list
      cmd=(.venv/bin/python -m pyccl.bench --collectives all --csv "$OUT/bench.csv" --out "$OUT/bench.json"
           --timeout $(( share - 10 )) ${PYCCL_BENCH_ARGS:-}) ;;
    *) echo "unknown part '$part' in PYCCL_CHECK_PARTS" >&2; status=1; continue ;;
  esac
  case "$part" in cpu|core|channels|collectives|backend|plans|reliability) cmd+=("$@") ;; esac
  timeout "$share" "${cmd[@]}" 2>&1 | tee "$OUT/$part.txt"
  rc=${PIPESTATUS[0]}
  echo "[gpu_check] $part: rc=$rc in $(( $(date +%s) - start )) s (limit $share s)" | tee -a "$OUT/summary.txt"
  [ "$rc" -ne 0 ] && status=1
done
cp .venv/pyccl-build.log "$OUT/" 2>/dev/null || true
exit $status
