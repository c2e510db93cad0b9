#!/usr/bin/env bash
# One H200 call: the whole test suite (four pytest processes in parallel, to overlap kernel
# compilation on the host's cores), the SASS of one cute kernel, then the benchmark.
# Usage on the device machine, from the repo root:
#   source .gpu/cutedsl/install.sh && bash scripts/h200_check.sh [bench options...]
set -o pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
python -c "import torch, triton, cutlass; print('torch', torch.__version__, 'triton', triton.__version__, 'cutlass-dsl', cutlass.__version__)"
start=$(date +%s)
P="python -m pytest -q -p no:cacheprovider -rfEs --durations=8"
T=${PYTEST_TIMEOUT:-400}
timeout $T $P tests/test_gpu.py -k triton > "$OUT/pytest-gpu-triton.log" 2>&1 &
timeout $T $P tests/test_gpu.py -k "not triton" > "$OUT/pytest-gpu-cute.log" 2>&1 &
timeout $T $P tests/test_cute_gpu.py > "$OUT/pytest-cute.log" 2>&1 &
# The rest holds the CPU compile checks of every CuteDSL configuration: spread over 6 workers.
timeout $T $P -n 6 tests --ignore=tests/test_gpu.py --ignore=tests/test_cute_gpu.py > "$OUT/pytest-rest.log" 2>&1 &
wait
for f in "$OUT"/pytest-*.log; do echo "== $f"; grep -E "^(FAILED|ERROR)" "$f" | head -8; tail -1 "$f"; done
echo "pytest took $(( $(date +%s) - start )) s"
mkdir -p /tmp/cute && python -c "
from flashsplit.cute.configs import split_config; from flashsplit.cute.compile import compile_split
compile_split(split_config('bfloat16', 128, False, True), options='--keep-ptx --keep-cubin --dump-dir=/tmp/cute')" \
  && cuobjdump --dump-sass /tmp/cute/*.cubin > /tmp/sass.txt 2>&1; \
  grep -oE 'HGMMA\.[0-9x]+[A-Za-z0-9.]*|UTMALDG\.[0-9A-Z.]+' /tmp/sass.txt | sort | uniq -c
[ $# -gt 0 ] && timeout $(( 575 - $(date +%s) + start )) python -m flashsplit bench "$@" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | tail -60
