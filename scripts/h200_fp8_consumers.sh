#!/usr/bin/env bash
# fp8 (e4m3) caches on cute's two consumers timed side by side (scripts/interleaved_ab.py, one
# process per cell): the swapped-operand consumer (what a one-wave launch of 1-8 packed rows per
# KV head runs) and the 64-row kernel, each at the split count the plan gives cute (the swapped
# one also at half of it: up to 16 splits merge in the kernel), beside auto (Triton for fp8) and
# Triton at its own plan.
# Usage, from the repo root on an sm_90 GPU (flashsplit importable, cutlass-dsl):
#   bash scripts/h200_fp8_consumers.sh                              # the default cells
#   bash scripts/h200_fp8_consumers.sh "32/8 128 1 4k" "32/8 128 16 128k"   # heads, head dim, batch, keys
# Logs go to $OUT (default /tmp/out); about 3 minutes.
set -o pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
cell() {  # heads head_dim batch seqlen
  local heads=$1 dim=$2 batch=$3 seqlen=$4
  local splits
  splits=$(python scripts/cute_splits.py "$heads" "$dim" "$batch" "$seqlen" --kv-dtype fp8e4m3 2>/dev/null)
  python scripts/interleaved_ab.py --heads "$heads" --head-dim "$dim" --batch "$batch" --seqlen "$seqlen" \
    --kv-dtype fp8e4m3 --rounds 30 --variant auto --variant triton --variant "cute:splits=$splits,swap=1" \
    --variant "cute:splits=$splits,swap=0" --variant "cute:splits=$(( (splits + 1) / 2 )),swap=1" 2>&1 \
    | tail -n 6 | tee -a "$OUT/fp8-consumers.log"
}
cells=("$@")
[ ${#cells[@]} -gt 0 ] || cells=("32/8 128 1 1k" "32/8 128 1 4k" "32/8 128 1 16k" "32/8 128 1 128k" "32/8 128 4 16k"
                                 "32/8 128 16 128k" "28/4 128 1 128k" "32/8 64 1 16k" "16/2 256 1 16k")
for c in "${cells[@]}"; do
  cell $c
done
