#!/usr/bin/env bash
# Both launch orders of the split kernels (splits first, the default, and KV heads first:
# TritonBackend.heads_first, cute's choice.HEADS_FIRST) timed side by side with cuDNN SDPA, in the
# cells of >= 1 GB of KV and the short cells where cuDNN leads (scripts/interleaved_ab.py: one
# process per cell, the graphs replayed in alternating order, each launch checked first). cute
# runs the split count its plan gives the cell.
# Usage, from the repo root on an sm_90 GPU (flashsplit importable, cutlass-dsl for cute):
#   bash scripts/h200_launch_order.sh
# Logs go to $OUT (default /tmp/out); about 6 minutes.
set -o pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
cell() {  # heads batch seqlen
  local heads=$1 batch=$2 seqlen=$3
  local splits
  splits=$(python -c "import flashsplit; from flashsplit.bench.options import parse_seqlen
h, kv = map(int, '$heads'.split('/'))
print(flashsplit.plan($batch, parse_seqlen('$seqlen'), h, kv, 128, backend='cute').num_splits)" 2>/dev/null)
  python scripts/interleaved_ab.py --heads "$heads" --batch "$batch" --seqlen "$seqlen" --rounds 20 \
    --variant auto --variant triton:heads_first=0 --variant triton:heads_first=1 \
    --variant "cute:splits=$splits,heads_first=0" --variant "cute:splits=$splits,heads_first=1" \
    --variant cudnn 2>&1 | tail -n 8 | tee -a "$OUT/launch-order.log"
}
# MHA's 8 KB key rows first: there a splits-first wave reads the fewest bytes of each row.
for c in "32/32 64 1k" "32/32 64 4k" "32/32 64 16k" "32/8 64 4k" "32/8 64 16k" "32/8 16 128k" \
         "32/8 16 64k" "32/32 16 4k" "32/8 1 128k" "32/8 16 1k" "32/32 4 1k"; do
  cell $c
done
