#!/usr/bin/env bash
# Sourced by scripts/test.sh after setup.sh: the inference engines whose
# interfaces pyccl.integrations is tested against, each in its own virtual
# environment under .venv-engines/ layered on .venv (it sees .venv's torch and
# pyccl; pip keeps the engine's other dependencies apart). Pinned to the
# releases built against torch 2.11. Installed once; later runs reuse them.
# PYCCL_NO_ENGINES=1 skips this (machines without network); the engine tests
# then skip, saying why.
set -euo pipefail

ENGINES_DIR="$PYCCL_ROOT/.venv-engines"
ENGINE_PINS=("vllm==0.26.0" "sglang==0.5.17")

engine_env() {  # $1: pin (name==version)
  local pin="$1" name="${1%%==*}" dir="$ENGINES_DIR/${1%%==*}"
  if [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$pin" ]; then
    return 0
  fi
  log "installing $pin into $dir (once; it shares .venv's torch)"
  rm -rf "$dir"
  "$BASE_PY" -m venv "$dir"
  local site base_site
  site="$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  base_site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  # addsitedir (not a plain path) so that .venv's own .pth files (the editable
  # pyccl, the base torch) are processed too.
  echo "import site; site.addsitedir('$base_site')" > "$site/_pyccl_base_env.pth"
  if ! with_progress "installing $pin" "$dir/pip.log" "$dir/bin/python" -m pip install --disable-pip-version-check "$pin"; then
    tail -n 20 "$dir/pip.log" >&2
    log "could not install $pin (no network?); PYCCL_NO_ENGINES=1 runs the tests without the engine checks"
    return 1
  fi
  "$dir/bin/python" -c "import torch, pyccl" >/dev/null
  echo "$pin" > "$dir/.installed"
}

if [ "${PYCCL_NO_ENGINES:-0}" != "1" ]; then
  for pin in "${ENGINE_PINS[@]}"; do
    engine_env "$pin"
  done
fi
