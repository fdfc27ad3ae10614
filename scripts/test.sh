#!/usr/bin/env bash
# The tests: set up, then run pytest (CPU tests everywhere; GPU tests where
# GPUs are visible, skipped with the reason elsewhere). Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
source "$(dirname "${BASH_SOURCE[0]}")/engines.sh"
cd "$PYCCL_ROOT"
exec "$PY" -m pytest -q "$@"
