#!/usr/bin/env bash
# The transformers integration on one Hopper GPU: compiled decode at long caches (B = 1 x 32k, then
# B = 16 x 4k, a recompile with symbolic sizes), FlexAttention prefill of softcap and sink layers
# (gpt-oss-20b shape 1 x 128k, Gemma-2-9B shape 8 x 8k), and two cells of `flashsplit models`.
# Usage, from the repo root:  bash scripts/transformers_gpu_check.sh [tests|bench|all]   (default all)
# Logs go to $OUT (default /tmp/out). Time on an H100: tests up to 170 s, bench up to 130 s; each
# part is cut by its timeout (the bench's JSON keeps the cells it finished).
set -o pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1 COLUMNS=1000
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
what=${1:-all}
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
if [ "$what" = tests ] || [ "$what" = all ]; then
  timeout 170 python -m pytest -v -n 0 -p no:cacheprovider -rfE --tb=short --durations=8 \
    tests/test_transformers_compile.py tests/test_transformers_gpu.py \
    -k "long_caches or long_prompt" 2>&1 | tee "$OUT/pytest-transformers-long.log" | tail -25
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  timeout 80 python -m flashsplit models --models llama3-8b --cells 1x32k --modes compiled --steps 8 \
    --warmup 2 --json "$OUT/models-llama-compiled.json" 2>&1 | tee "$OUT/models-llama-compiled.log" | tail -8
  timeout 50 python -m flashsplit models --models gpt-oss-20b --cells 1x32k --modes eager --steps 8 \
    --warmup 2 --json "$OUT/models-gpt-oss-eager.json" 2>&1 | tee "$OUT/models-gpt-oss-eager.log" | tail -8
fi
