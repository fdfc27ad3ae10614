#!/usr/bin/env bash
# Sourced by scripts/main.sh and scripts/test.sh: makes .venv (reusing an
# installed torch >= 2.6 when there is one, else torch 2.11.0 from PyPI),
# installs the build and test tools that are missing, and builds pyccl
# (incrementally; skipped when no source changed). Works offline where torch,
# scikit-build-core, ninja and pytest are already installed (GPU machines).
#
# scripts/engines.sh runs it for another environment too, through these variables:
#   PYCCL_VENV        the environment (default .venv)
#   PYCCL_TORCH       exactly this torch release (default: any >= 2.6, else 2.11.0 from PyPI)
#   PYCCL_BUILD_DIR   the build folder (default build/<wheel tag>), one per environment
#   PYCCL_HOST_ONLY=1 host mode alone, without the CUDA kernels (CMakeLists.txt)
#   PYCCL_NO_BUILD=1  everything but the build
set -euo pipefail

PYCCL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PYCCL_VENV:-$PYCCL_ROOT/.venv}"
BASE_PY="${PYTHON:-python3}"
TORCH_PIN="${PYCCL_TORCH:-2.11.0}"

log() { echo "[setup] $*" >&2; }

# Runs "$@" with its output in $log_file, printing a line a minute while it runs: the minutes so far and,
# where the output has them, ninja's "[k/n]" steps (the build). Returns the command's status.
with_progress() {  # $1: label, $2: log file, then the command
  local label="$1" log_file="$2" start pid step
  shift 2
  start=$(date +%s)
  "$@" > "$log_file" 2>&1 &
  pid=$!
  while ! wait_for "$pid" 60; do
    step="$(grep -oE '\[[0-9]+/[0-9]+\]' "$log_file" 2>/dev/null | tail -n 1 || true)"
    log "$label: $(( ($(date +%s) - start) / 60 )) min${step:+, step ${step//[\[\]]/}}"
  done
  wait "$pid"
}

wait_for() {  # $1: pid, $2: seconds; succeeds once the process has ended
  local i
  for (( i = 0; i < $2; i++ )); do
    kill -0 "$1" 2>/dev/null || return 0
    sleep 1
  done
  ! kill -0 "$1" 2>/dev/null
}

has_torch() {  # $1: python; succeeds for torch >= 2.6, or for exactly $PYCCL_TORCH where it is set
  PYCCL_TORCH="${PYCCL_TORCH:-}" "$1" - <<'PY' 2>/dev/null
import os, sys, torch
release = torch.__version__.split("+")[0]
if os.environ["PYCCL_TORCH"]:
    sys.exit(0 if release == os.environ["PYCCL_TORCH"] else 1)
major, minor = (int(x) for x in release.split(".")[:2])
sys.exit(0 if (major, minor) >= (2, 6) else 1)
PY
}

if [ ! -x "$VENV/bin/python" ]; then
  if has_torch "$BASE_PY"; then
    log "reusing the torch installed for $BASE_PY"
    "$BASE_PY" -m venv --system-site-packages "$VENV"
    # If $BASE_PY is itself a virtual environment, its packages are not the
    # "system" ones of the new venv: point at them with a .pth file.
    site_dir="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    "$BASE_PY" -c 'import site, sys; print("\n".join(site.getsitepackages()))' > "$site_dir/_pyccl_base_env.pth"
  else
    log "creating $VENV"
    "$BASE_PY" -m venv "$VENV"
  fi
fi
PY="$VENV/bin/python"
export PATH="$VENV/bin:$PATH"

if ! has_torch "$PY"; then
  log "installing torch==$TORCH_PIN from PyPI (about 3 GB with its CUDA libraries)"
  "$PY" -m pip install -q "torch==$TORCH_PIN"
fi

missing=()
"$PY" -c "import scikit_build_core" 2>/dev/null || missing+=("scikit-build-core>=0.10")
"$PY" -c "import pytest" 2>/dev/null || missing+=("pytest>=7")
command -v ninja >/dev/null 2>&1 || "$PY" -c "import ninja" 2>/dev/null || missing+=("ninja")
"$PY" -c "import numpy" 2>/dev/null || missing+=("numpy")
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  "$PY" -m pip install -q "${missing[@]}"
fi
# Installed where the network allows; offline (GPU machines), what needs them says so and goes on:
# - tqdm, pyccl.tune's progress bar (a dependency of the package; the tune runs without the bar);
# - jsonschema, for tests/dsl/test_schemas.py (the published schemas of plans and tuning tables);
# - expecttest, which torch's own distributed test suite imports (tests/torch/torch_distributed_suite.py).
for module in tqdm jsonschema expecttest; do
  if ! "$PY" -c "import $module" 2>/dev/null; then
    "$PY" -m pip install -q --retries 1 --timeout 10 "$module" >/dev/null 2>&1 ||
      log "$module not installed (offline?): the parts that use it skip or go without"
  fi
done

# A Python extension must share libstdc++ with torch. A compiler (or wrapper
# script) that links libstdc++ statically gives the module a second copy whose
# locale is never initialized: it crashes formatting numbers. Prefer the
# system compiler then.
links_static_libstdcxx() {  # $1: C++ compiler; succeeds if it links libstdc++ statically
  local dir syms=""
  dir="$(mktemp -d)"
  if "$1" -shared -fPIC "$PYCCL_ROOT/scripts/libstdcxx_probe.cpp" -o "$dir/probe.so" 2>/dev/null; then
    syms="$(nm -C --defined-only "$dir/probe.so" 2>/dev/null || true)"
  fi
  rm -rf "$dir"
  [[ "$syms" == *"_M_insert<long>"* ]]
}
if links_static_libstdcxx "${CXX:-c++}"; then
  for candidate in /usr/bin/g++ /usr/bin/c++ g++ c++; do
    path="$(command -v "$candidate" || true)"
    if [ -n "$path" ] && [ "$path" != "${CXX:-}" ] && ! links_static_libstdcxx "$path"; then
      log "CXX=${CXX:-c++} links libstdc++ statically, which breaks Python extensions; using $path"
      export CXX="$path" CUDAHOSTCXX="$path"
      break
    fi
  done
fi

# rdma-core's headers, for the RDMA transport (libibverbs itself is loaded at
# run time, so the module imports where rdma-core is absent): installed with
# apt where that is possible, tried once per .venv; without them the build
# leaves the RDMA data path out and says so.
verbs_h=/usr/include/infiniband/verbs.h
if [ ! -f "$verbs_h" ] && [ ! -f "$VENV/.pyccl-no-verbs" ] && [ "${PYCCL_NO_APT:-0}" != 1 ] \
   && command -v apt-get >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo -n"
  apt_install() { $sudo env DEBIAN_FRONTEND=noninteractive timeout 120 apt-get install -y -q --no-install-recommends libibverbs-dev >/dev/null 2>&1; }
  if [ -z "$sudo" ] || sudo -n true 2>/dev/null; then
    log "installing libibverbs-dev (rdma-core's headers)"
    apt_install || { $sudo timeout 120 apt-get update -q >/dev/null 2>&1 && apt_install; } || true
  fi
  if [ ! -f "$verbs_h" ]; then
    log "libibverbs-dev not installed (no root or no network): building without the RDMA transport"
    touch "$VENV/.pyccl-no-verbs"
  fi
fi

# The distribution is "pyccl-gpu": "pyccl" on PyPI is another project (LSST DESC's Core Cosmology Library), which
# also imports as pyccl. A "pyccl" of this checkout (the distribution's earlier name) gives way; another one stops
# the set-up, as the two cannot share an environment.
old_dist="$("$PY" -m pip show pyccl 2>/dev/null || true)"
if [ -n "$old_dist" ]; then
  if grep -qx "Editable project location: $PYCCL_ROOT" <<<"$old_dist"; then
    log "replacing this checkout's install under its earlier name 'pyccl' with 'pyccl-gpu'"
    "$PY" -m pip uninstall -q -y pyccl
    rm -f "$VENV/.pyccl-build-stamp"
  else
    log "another distribution named 'pyccl' is installed in $VENV ($(grep -m1 '^Summary:' <<<"$old_dist")); it also"
    log "imports as pyccl, so the two cannot share an environment: pip uninstall pyccl, or set PYCCL_VENV to another"
    exit 1
  fi
fi

# PYCCL_NO_BUILD=1: the environment alone (scripts/engines.sh builds the engines' base beside their installs).
if [ "${PYCCL_NO_BUILD:-0}" = 1 ]; then
  return 0 2>/dev/null || exit 0
fi

# Rebuild only when a build input changed.
stamp="$VENV/.pyccl-build-stamp"
digest="$(cd "$PYCCL_ROOT" && find csrc src/pyccl/tuning_tables CMakeLists.txt pyproject.toml scripts/torch_build_info.py scripts/build_metadata.py -type f \
            -print0 | sort -z | xargs -0 sha1sum | sha1sum | cut -d' ' -f1)-${PYCCL_CUDA_ARCHS:-}-${PYCCL_HOST_ONLY:-}-${CXX:-}-$([ -f "$verbs_h" ] && echo verbs || true)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$digest" ] || ! TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PY" -c "import pyccl._C" 2>/dev/null; then
  log "building pyccl (log: $VENV/pyccl-build.log)"
  start=$(date +%s)
  # The build imports torch, which would import the half-built pyccl through its backend entry point.
  if ! (cd "$PYCCL_ROOT" && with_progress "building pyccl" "$VENV/pyccl-build.log" \
          env TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PY" -m pip install --no-build-isolation --no-deps -v -e . ${PYCCL_BUILD_DIR:+"-Cbuild-dir=$PYCCL_BUILD_DIR"}); then
    tail -n 60 "$VENV/pyccl-build.log" >&2
    log "build failed; full log in $VENV/pyccl-build.log"
    exit 1
  fi
  grep -E "pyccl: (building with CUDA|CPU-only build|RDMA transport|no infiniband)" "$VENV/pyccl-build.log" | sed 's/^ *-- /[setup] /' >&2 || true
  echo "$digest" > "$stamp"
  log "built in $(( $(date +%s) - start )) s"
fi
