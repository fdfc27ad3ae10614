#!/usr/bin/env bash
# Sourced by scripts/test.sh after setup.sh: the inference engines whose
# interfaces pyccl.integrations is tested against, each in its own virtual
# environment under .venv-engines/.
#
# The current engine releases are built against a newer torch than .venv's, so
# they get a base environment of their own, .venv-engines/base: torch
# $ENGINE_TORCH and pyccl built against it for host mode alone (the engine
# checks run on CPU processes), made by setup.sh. Each engine's environment is
# layered on that base (it sees the base's torch and pyccl; pip keeps the
# engine's other dependencies apart).
#
# SGLang 0.5.23 pins torch 2.14.1 and vLLM 0.33.0 pins 2.14.0, the same minor
# release: one base serves both. An engine is installed as pip resolves it,
# except that the base's torch stands in for the one its pin names. Installed
# once; later runs reuse them and rebuild the base's pyccl only when a build
# input changed. PYCCL_NO_ENGINES=1 skips this (machines without network); the
# engine tests then skip, saying why.
set -euo pipefail

ENGINES_DIR="$PYCCL_ROOT/.venv-engines"
ENGINE_TORCH="2.14.1"
ENGINE_PINS=("vllm==0.33.0" "sglang==0.5.23")

base_setup() {  # setup.sh for the base environment; "$@": more variables (PYCCL_NO_BUILD=1)
  env "$@" PYCCL_VENV="$ENGINES_DIR/base" PYCCL_TORCH="$ENGINE_TORCH" PYCCL_HOST_ONLY=1 \
    PYCCL_BUILD_DIR="$PYCCL_ROOT/build/engines-torch$ENGINE_TORCH" bash "$PYCCL_ROOT/scripts/setup.sh"
}

engine_marker() {  # $1: pin; what an engine environment's .installed holds once it is installed and checked
  echo "$1 torch==$ENGINE_TORCH"
}

engine_install_failed() {  # $1: pin, $2: its environment; the end of pip's log and what to do
  tail -n 20 "$2/pip.log" >&2
  log "could not install $1 (no network?); PYCCL_NO_ENGINES=1 runs the tests without the engine checks"
  return 1
}

engine_install() {  # $1: pin (name==version); installs it where its marker does not name it
  local pin="$1" dir="$ENGINES_DIR/${1%%==*}" base_py="$ENGINES_DIR/base/bin/python"
  if [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$(engine_marker "$pin")" ]; then
    return 0
  fi
  log "installing $pin into $dir (once; it shares the base's torch $ENGINE_TORCH and pyccl)"
  rm -rf "$dir"
  "$BASE_PY" -m venv "$dir"
  local site base_site
  site="$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  base_site="$("$base_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  # addsitedir (not a plain path) so that the base's own .pth files (the editable pyccl) are processed too.
  echo "import site; site.addsitedir('$base_site')" > "$site/_pyccl_base_env.pth"
  # pip resolves the engine against what the base has; what it would install, less torch, is installed as
  # resolved and without further resolution, so that the base's torch stays the one the engine imports.
  with_progress "resolving $pin" "$dir/pip.log" "$dir/bin/python" -m pip install --disable-pip-version-check \
    --dry-run --quiet --report "$dir/resolved.json" "$pin" || engine_install_failed "$pin" "$dir" || return 1
  "$dir/bin/python" - "$dir/resolved.json" > "$dir/resolved.txt" <<'PY' || engine_install_failed "$pin" "$dir" || return 1
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    meta = item["metadata"]
    if meta["name"].lower() != "torch":
        print(f'{meta["name"]}=={meta["version"]}')
PY
  with_progress "installing $pin" "$dir/pip.log" "$dir/bin/python" -m pip install --disable-pip-version-check \
    --no-deps -r "$dir/resolved.txt" || engine_install_failed "$pin" "$dir" || return 1
  touch "$dir/.unchecked"
}

engine_check() {  # $1: pin; after the base's build: the engine imports with the base's torch and pyccl
  local pin="$1" name="${1%%==*}" dir="$ENGINES_DIR/${1%%==*}"
  [ -f "$dir/.unchecked" ] || return 0
  ENGINE_TORCH="$ENGINE_TORCH" TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$dir/bin/python" - "$name" <<'PY'
import importlib, os, sys
import torch, pyccl
assert torch.__version__.split("+")[0] == os.environ["ENGINE_TORCH"], torch.__version__
importlib.import_module(sys.argv[1])
PY
  engine_marker "$pin" > "$dir/.installed"
  rm -f "$dir/.unchecked"
}

if [ "${PYCCL_NO_ENGINES:-0}" != "1" ]; then
  log "the engines' base environment: torch $ENGINE_TORCH, pyccl for host mode ($ENGINES_DIR/base)"
  base_setup PYCCL_NO_BUILD=1
  # The build (CPU) runs beside the engines' installs (network and disk).
  base_setup &
  build_pid=$!
  installed=0
  for pin in "${ENGINE_PINS[@]}"; do
    engine_install "$pin" || installed=1
  done
  wait "$build_pid" || { log "the engines' base build failed"; exit 1; }
  [ "$installed" = 0 ] || exit 1
  for pin in "${ENGINE_PINS[@]}"; do
    engine_check "$pin"
  done
fi
