#!/usr/bin/env bash
# compute-sanitizer memcheck, then synccheck, over pytest files, following the
# rank processes the tests start. Exits non-zero on any finding.
#   bash scripts/sanitize.sh COMPUTE_SANITIZER FILE... ; PYCCL_SANITIZE_K selects tests
#   (default: three tests of the collectives that cover LL, HB and PDL launches;
#   "all": every test of the files). Every selected test runs, so that one
#   failure does not hide the findings of the others. Tests with second-scale
#   timeouts can fail under the sanitizer for slowness alone: the ERROR SUMMARY
#   lines are the findings.
set -uo pipefail
cs=$1
shift
k=${PYCCL_SANITIZE_K:-back_to_back_without_host_sync and True or in_pieces or zeros_infinities}
select=(-k "$k")
[ "$k" = all ] && select=()
status=0
for tool in memcheck synccheck; do
  echo "== $tool"
  "$cs" --tool "$tool" --report-api-errors no --target-processes all --error-exitcode 9 \
    .venv/bin/python -m pytest -v -p no:cacheprovider "$@" "${select[@]}" || status=1
done
exit $status
