#!/usr/bin/env bash
# cute's two in-kernel merges timed side by side (scripts/interleaved_ab.py, one process per
# cell): the arrival counter (the default) and the merge through one thread-block cluster
# (choice.CLUSTER_MERGE), each at the split count the plan gives the cell, beside auto, Triton and
# cuDNN SDPA, in the short cells where the merge's tail weighs most.
# Usage, from the repo root on an sm_90 GPU (flashsplit importable, cutlass-dsl):
#   bash scripts/h200_cluster_merge.sh
# Logs go to $OUT (default /tmp/out); about 3 minutes.
set -o pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
cell() {  # heads head_dim batch seqlen
  local heads=$1 dim=$2 batch=$3 seqlen=$4
  local splits
  splits=$(python scripts/cute_splits.py "$heads" "$dim" "$batch" "$seqlen" 2>/dev/null)
  python scripts/interleaved_ab.py --heads "$heads" --head-dim "$dim" --batch "$batch" --seqlen "$seqlen" \
    --rounds 30 --variant auto --variant "cute:splits=$splits,cluster=0" --variant "cute:splits=$splits,cluster=1" \
    --variant triton --variant cudnn 2>&1 | tail -n 6 | tee -a "$OUT/cluster-merge.log"
}
for c in "32/8 128 1 4k" "32/8 128 1 16k" "32/8 128 1 1k" "32/8 128 1 128k" "32/8 128 2 4k" "64/8 64 1 4k"; do
  cell $c
done
