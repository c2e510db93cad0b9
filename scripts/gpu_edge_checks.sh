#!/usr/bin/env bash
# The GPU checks of decode's edge cases, in about 5 minutes on one Hopper GPU: batch invariance
# under every backend choice (a row alone against the row in batches of 1-64, across capacities,
# dense and paged), left padding with rotary (negative pads and pads past the row's keys) and
# rotary tables the queries would run past, on every backend, and the cache-update property suite.
# Usage, from the repo root (flashsplit's test extras installed):
#   PYTHONPATH=$PWD bash scripts/gpu_edge_checks.sh
# One log per step goes to $OUT (default /tmp/out); each names every test with its outcome (-v).
set -o pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1 COLUMNS=1000
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
P="timeout ${PYTEST_TIMEOUT:-240} python -m pytest -v -p no:cacheprovider -n 0 -rfE --tb=short --durations=5"
status=0
run() {  # run <log name> <pytest arguments...>
  local name=$1; shift
  $P "$@" > "$OUT/$name.log" 2>&1 || status=1
  tail -n 3 "$OUT/$name.log" | sed "s/^/$name: /"
}
run batch-invariant -m gpu tests/test_gpu.py -k batch_invariant
run invariance-per-backend tests/test_variants.py tests/test_cute_variants_gpu.py -k "invariance or invariant"
run selection tests/test_selection.py -k batch_invariant
run kvcache-leftpad-rotary tests/test_kvcache.py tests/test_kvcache_errors.py -k "leftpad or rotary or check_inputs"
run kvcache-properties tests/test_kvcache_properties.py
run errors-bf16 tests/test_errors.py -k bfloat16
exit $status
