#!/usr/bin/env bash
# The main job: set up, then run the demo (all local GPUs, or 4 host-mode
# processes when there is none). Extra arguments go to `python -m pyccl.demo`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$PYCCL_ROOT"
exec "$PY" -m pyccl.demo "$@"
