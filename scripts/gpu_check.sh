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
start=$(date +%s)
bash scripts/test.sh -rs "$@" 2>&1 | tee "$OUT/tests.txt"
test_rc=${PIPESTATUS[0]}
echo "tests: rc=$test_rc in $(( $(date +%s) - start )) s (build included)"
start=$(date +%s)
bash scripts/main.sh 2>&1 | tee "$OUT/demo.txt"
demo_rc=${PIPESTATUS[0]}
echo "demo: rc=$demo_rc in $(( $(date +%s) - start )) s"
bench_rc=0
if [ "$(.venv/bin/python -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
  .venv/bin/python benchmarks/channel_bench.py --out "$OUT/channel_bench.json" 2>&1 | tee "$OUT/channel_bench.txt"
  bench_rc=${PIPESTATUS[0]}
fi
cp .venv/pyccl-build.log "$OUT/" 2>/dev/null || true
exit $(( test_rc != 0 || demo_rc != 0 || bench_rc != 0 ))
