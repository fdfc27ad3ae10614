#!/usr/bin/env bash
# The release build: an sdist, and from it a wheel built by pip with its defaults (an isolated build, which
# installs the torch release pyproject.toml pins), with machine code for sm_80, sm_90a and sm_100a and PTX for
# compute_100. Fails unless the wheel's extension holds every one of them for every CUDA source.
#
#   bash scripts/build_wheel.sh [OUT_DIR]      # default dist/; about four times a development build's time
#
# PYCCL_CUDA_ARCHS overrides the list (CMake's form, e.g. "90a-real;100a-real"); the check then follows it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(mkdir -p "${1:-$ROOT/dist}" && cd "${1:-$ROOT/dist}" && pwd)"
export PYCCL_CUDA_ARCHS="${PYCCL_CUDA_ARCHS:-80-real;90a-real;100a-real;100-virtual}"
log() { echo "[build_wheel] $*" >&2; }

# pypa/build makes the sdist (pip makes wheels only); it lives in a throw-away environment.
tools="$(mktemp -d)"
trap 'rm -rf "$tools"' EXIT
"${PYTHON:-python3}" -m venv "$tools"
"$tools/bin/python" -m pip install -q build
log "sdist into $OUT"
(cd "$ROOT" && "$tools/bin/python" -m build --sdist --outdir "$OUT" .)
sdist="$(ls -t "$OUT"/pyccl_gpu-*.tar.gz | head -n 1)"
log "wheel from $sdist for $PYCCL_CUDA_ARCHS (pip's defaults: an isolated build)"
start=$(date +%s)
"$tools/bin/python" -m pip wheel --no-deps -w "$OUT" "$sdist"
log "built in $(( $(date +%s) - start )) s"
wheel="$(ls -t "$OUT"/pyccl_gpu-*.whl | head -n 1)"

# The check: cuobjdump lists the cubins and PTX in the extension. Where the CUDA toolkit has none, the one
# torch's triton carries (from set-up's .venv, or installed here).
find_cuobjdump() {
  local py
  command -v cuobjdump && return 0
  for py in "$ROOT/.venv/bin/python" "$tools/bin/python"; do
    [ -x "$py" ] && "$py" -c 'import os, triton.backends.nvidia as m
p = os.path.join(os.path.dirname(m.__file__), "bin", "cuobjdump"); assert os.access(p, os.X_OK); print(p)' \
      2>/dev/null && return 0
  done
  return 1
}
cuobjdump="$(find_cuobjdump || { "$tools/bin/python" -m pip install -q --no-deps triton >&2 && find_cuobjdump; })"
unpacked="$tools/wheel"
"$tools/bin/python" -m zipfile -e "$wheel" "$unpacked"
so="$(ls "$unpacked"/pyccl/_C*.so)"
elves="$("$cuobjdump" --list-elf "$so")"
ptxs="$("$cuobjdump" --list-ptx "$so")"
cubins=$(grep -c "^ELF file" <<<"$elves" || true)
status=0
IFS=';' read -r -a archs <<<"$PYCCL_CUDA_ARCHS"
expected=""
for a in "${archs[@]}"; do
  n="${a%%-*}"; n="${n%a}"; n="${n%f}"
  case "$a" in
    *-virtual) kind=PTX; found=$(grep -c "\.sm_${n}[af]\?\.ptx" <<<"$ptxs" || true) ;;
    *) kind=ELF; found=$(grep -c "\.sm_${n}[af]\?\.cubin" <<<"$elves" || true) ;;
  esac
  log "$kind sm_$n: $found"
  expected="${expected:-$found}"
  if [ "$found" -eq 0 ] || [ "$found" -ne "$expected" ]; then
    log "FAIL: $a is missing from some CUDA sources ($found of $expected)"
    status=1
  fi
done
[ "$status" -eq 0 ] && log "OK: $wheel ($cubins cubins)"
exit "$status"
