#!/usr/bin/env bash
# The tables of docs/benchmarks.md's "Current figures" in one run on a Hopper GPU (H100 or H200),
# each a `flashsplit bench` command in its own process: the default grids for Llama-3-8B (32/8)
# and Llama-2-7B (32/32) heads with their peers (cuDNN SDPA, and FlashAttention-3 where
# flash_attn_interface is importable) and the per-cell scorecard; B = 1 against the read floor
# with the host time of an eager call (bf16, then an e4m3 cache).
# Usage, from the repo root (flashsplit importable, cutlass-dsl for cute):
#   bash scripts/scorecard.sh
# Logs and the bench's JSON reports go to $OUT (default /tmp/out); each step runs under its own
# timeout (about 7 minutes on an H100 in all) and prints its last lines as it ends. Re-render a
# report without a GPU: python -m flashsplit bench --from-json $OUT/grid-llama-3-8b.json
set -o pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
FA3=$(python -c "import flash_attn_interface" 2>/dev/null && echo ",flash-attn3")
[ -z "$FA3" ] && echo "flash_attn_interface not importable: the grids run without FlashAttention-3"
step() {  # name, timeout in seconds, lines of the log to print, then the bench's options
  local name=$1 limit=$2 lines=$3; shift 3
  local t0=$(date +%s)
  timeout "$limit" python -m flashsplit bench "$@" --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "== $name: rc=$? in $(( $(date +%s) - t0 )) s"
  tail -n "$lines" "$OUT/$name.log"
}
contenders="auto,triton,cute,sdpa-cudnn$FA3"
step grid-llama-3-8b 200 24 --preset llama-3-8b --no-flex --contenders "$contenders"
step grid-llama-2-7b 200 23 --preset llama-2-7b --no-flex --contenders "$contenders"
step b1-bf16 60 20 --batch 1 --seqlen 4k 16k 128k --contenders auto,triton,cute,sdpa-cudnn --read-floor --no-ceiling
step b1-fp8 60 16 --batch 1 --seqlen 1k 4k 128k --kv-dtype fp8e4m3 --contenders auto,triton,cute \
  --read-floor --no-ceiling
