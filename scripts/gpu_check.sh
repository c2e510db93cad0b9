#!/usr/bin/env bash
# Check a Hopper GPU machine (H100, H200): the GPU test suite (pytest processes in parallel, to
# overlap kernel compilation on the host's cores; each under its own timeout), the SASS of one cute
# kernel, then the benchmark with the given options (none: no benchmark).
# The suite comes in two parts of under 10 minutes each on an H100, for machines lent by the call:
#   matrix: tests/test_gpu.py (four processes), tests/test_cute_gpu.py, the property suites;
#   rest:   every other test, eight xdist workers.
# The transformers tests at long contexts (tens of GiB each) run alone in
# scripts/transformers_gpu_check.sh; the compile-only checks (tests/test_cute_compile.py,
# tests/test_triton_compile.py) are left to CPU runs, where CI runs them on every change.
# Prerequisites: an sm_90 GPU (H100/H200), a CUDA build of torch, flashsplit installed with its
# test extras (pip install -e ".[dev,hopper]"), pytest-xdist (for -n); cuobjdump from the CUDA
# toolkit, else the one triton's wheel ships.
# Usage, from the repo root:
#   bash scripts/gpu_check.sh [matrix|rest|all] [bench options...]     (default all)
# Logs and bench.json go to $OUT (default /tmp/out); each log names every test with its outcome as
# it finishes (pytest -v), so a process stopped by its timeout still says what failed. Tests that
# ran out of device memory beside the others run again alone at the end. Time: each process up to
# PYTEST_TIMEOUT (default 500 s), SASS ~10 s, the bench until 575 s from the start.
set -o pipefail
# Full node ids in the short summary (the out-of-memory reruns below read them from it).
export COLUMNS=1000
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
part=all
case "${1:-}" in matrix|rest|all) part=$1; shift ;; esac
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
python -c "import torch, triton, cutlass; print('torch', torch.__version__, 'triton', triton.__version__, 'cutlass-dsl', cutlass.__version__)"
start=$(date +%s)
P="python -m pytest -v --full -p no:cacheprovider -n 0 -rfE --tb=short --durations=5"  # (-n: the lines that want workers)
T=${PYTEST_TIMEOUT:-500}
# At its time limit a pytest process gets SIGINT, so it still prints its failures and summary
# (then SIGKILL 20 s later if it hangs).
STOP="timeout -s INT -k 20"
if [ "$part" != rest ]; then
  # The GPU matrix is the long part: each backend's half again split by dtype.
  $STOP "$T" $P tests/test_gpu.py -k "triton and bfloat16" > "$OUT/pytest-gpu-triton-bf16.log" 2>&1 &
  $STOP "$T" $P tests/test_gpu.py -k "triton and not bfloat16" > "$OUT/pytest-gpu-triton-rest.log" 2>&1 &
  $STOP "$T" $P tests/test_gpu.py -k "not triton and bfloat16" > "$OUT/pytest-gpu-cute-bf16.log" 2>&1 &
  $STOP "$T" $P tests/test_gpu.py -k "not triton and not bfloat16" > "$OUT/pytest-gpu-cute-rest.log" 2>&1 &
  $STOP "$T" $P -n 2 tests/test_cute_gpu.py > "$OUT/pytest-cute.log" 2>&1 &
  # Property tests on their own, each drawn example printed as it runs (-s, verbose): a failure,
  # or a sticky CUDA error it leaves behind, names its example even if the timeout stops the run.
  # Their default example counts here (--full draws 300 per test, several minutes with cute's
  # compiles: run those alone, PROPERTY_FULL=1).
  PP=${P/ --full/}; [ -n "${PROPERTY_FULL:-}" ] && PP=$P
  for f in kvcache_properties properties; do
    $STOP "$T" $PP -s --hypothesis-verbosity=verbose tests/test_$f.py > "$OUT/pytest-$f.log" 2>&1 &
  done
fi
if [ "$part" != matrix ]; then
  # pyproject caps xdist at 4 processes (--maxprocesses): lifted here, where the host has the cores.
  # The transformers tests at long contexts (tens of GiB each) are left to
  # scripts/transformers_gpu_check.sh, which runs them alone.
  $STOP "$T" $P -n ${REST_WORKERS:-8} --maxprocesses=${REST_WORKERS:-8} tests --ignore=tests/test_gpu.py --ignore=tests/test_cute_gpu.py \
    --ignore=tests/test_cute_compile.py --ignore=tests/test_triton_compile.py \
    --ignore=tests/test_kvcache_properties.py --ignore=tests/test_properties.py \
    -k "not long_caches and not long_prompt" > "$OUT/pytest-rest.log" 2>&1 &
fi
wait
for f in "$OUT"/pytest-*.log; do
  echo "== $f: $(grep -c ' PASSED' "$f") passed, $(grep -c ' FAILED\| ERROR' "$f") lines with FAILED or ERROR"
  grep -E "(^| )(FAILED|ERROR)( |$)" "$f" | sed -E 's/\[gw[0-9]+\] \[ *[0-9]+%\] //; s/ +\[ *[0-9]+%\]$//' \
    | sort -u | head -8
  # pytest's summary line, and the timeout's mark: a process it stopped ran only part of its tests.
  grep -E "^=+ .* in [0-9.]+s( \([0-9:]+\))? =+$" "$f" | tail -1
  if grep -q "KeyboardInterrupt" "$f" || ! grep -qE "^=+ .* in [0-9.]+s" "$f"; then
    echo "   STOPPED by the $T s timeout: the tests after the last PASSED line did not run"
  fi
done
# The first drawn example whose run raised: the lines from its "Test case" header to the error.
for f in "$OUT"/pytest-kvcache_properties.log "$OUT"/pytest-properties.log; do
  [ -f "$f" ] || continue
  awk '/Test case:/ { block = ""; inside = 1 } inside { block = block $0 "\n" }
       /Error|error:/ && inside { printf "%s: first failing example:\n%s", FILENAME, block; exit }' "$f" | head -40
done
# Tests that ran out of device memory beside the others (the processes share the card: on an 80 GB
# H100 the largest cells do not fit side by side), each run again in one process on its own.
# (a node id may hold spaces: the id is what precedes " - <ExceptionType>: ... out of memory")
mapfile -t oom < <(grep -h -E "^FAILED " "$OUT"/pytest-*.log \
  | sed -nE 's/^FAILED (.*) - [A-Za-z_.]+: .*([Oo]ut of memory|OUT_OF_MEMORY).*/\1/p' | sort -u)
if [ ${#oom[@]} -gt 0 ]; then
  echo "== ${#oom[@]} tests ran out of device memory beside the others: again, alone"
  $STOP "${OOM_RERUN_TIMEOUT:-240}" ${P/ -v/ -q} "${oom[@]}" > "$OUT/pytest-oom-rerun.log" 2>&1
  grep -E "^FAILED|^ERROR" "$OUT/pytest-oom-rerun.log" | head -8
  grep -E "^=*.* in [0-9.]+s" "$OUT/pytest-oom-rerun.log" | tail -1 | grep . || echo "   STOPPED by its timeout"
fi
echo "pytest took $(( $(date +%s) - start )) s"
mkdir -p /tmp/cute && python -c "
from flashsplit.cute.configs import split_config; from flashsplit.cute.compile import compile_split
compile_split(split_config('bfloat16', 128, False, True), options='--keep-ptx --keep-cubin --dump-dir=/tmp/cute')" \
  && "$(command -v cuobjdump || python -c "import os, triton; print(os.path.join(os.path.dirname(triton.__file__), \
     'backends', 'nvidia', 'bin', 'cuobjdump'))")" --dump-sass /tmp/cute/*.cubin > /tmp/sass.txt 2>&1; \
  grep -oE 'HGMMA\.[0-9x]+[A-Za-z0-9.]*|UTMALDG\.[0-9A-Z.]+' /tmp/sass.txt | sort | uniq -c
if [ $# -gt 0 ]; then
  left=$(( 575 - $(date +%s) + start ))
  if [ "$left" -lt 30 ]; then
    echo "bench skipped: $left s left of the 575 s (set PYTEST_TIMEOUT lower, or run the bench alone)"
  else
    timeout "$left" python -m flashsplit bench "$@" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | tail -60
  fi
fi
