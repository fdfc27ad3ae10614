#!/usr/bin/env bash
# On a GPU machine: record the machine, then run the README's two commands
# (tests, then the demo), keeping full logs under $OUT (or ./gpu-logs).
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
  echo "CXX=${CXX:-} CUDAHOSTCXX=${CUDAHOSTCXX:-}"
  if [ -n "${CXX:-}" ] && [ "$(wc -c < "$CXX")" -lt 4096 ]; then cat "$CXX"; fi
} 2>&1 | tee "$OUT/machine.txt"
# Each part is bounded (PYCCL_CHECK_BUDGET_S, default 540 s in all) so a hung
# test cannot keep the logs of the others from coming back.
budget=${PYCCL_CHECK_BUDGET_S:-540}
t_start=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t_start) )); }
start=$(date +%s)
timeout "$(( $(left) * 2 / 5 ))" bash scripts/test.sh -v -rfs --ignore=tests/test_gpu_channels.py "$@" 2>&1 | tee "$OUT/tests.txt"
test_rc=${PIPESTATUS[0]}
echo "tests: rc=$test_rc in $(( $(date +%s) - start )) s (build included)"
start=$(date +%s)
timeout "$(( $(left) * 2 / 3 ))" bash scripts/test.sh -v -rfs --durations=20 tests/test_gpu_channels.py "$@" 2>&1 | tee "$OUT/tests_channels.txt"
channel_rc=${PIPESTATUS[0]}
echo "channel tests: rc=$channel_rc in $(( $(date +%s) - start )) s"
test_rc=$(( test_rc != 0 || channel_rc != 0 ))
start=$(date +%s)
timeout 60 bash scripts/main.sh 2>&1 | tee "$OUT/demo.txt"
demo_rc=${PIPESTATUS[0]}
echo "demo: rc=$demo_rc in $(( $(date +%s) - start )) s"
bench_rc=0
if [ "$(.venv/bin/python -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
  timeout "$(( $(left) > 30 ? $(left) : 30 ))" .venv/bin/python benchmarks/channel_bench.py \
    --out "$OUT/channel_bench.json" 2>&1 | tee "$OUT/channel_bench.txt"
  bench_rc=${PIPESTATUS[0]}
fi
cp .venv/pyccl-build.log "$OUT/" 2>/dev/null || true
exit $(( test_rc != 0 || demo_rc != 0 || bench_rc != 0 ))
