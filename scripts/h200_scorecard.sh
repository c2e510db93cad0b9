#!/usr/bin/env bash
# The figures the README's performance section and docs/benchmarks.md quote, in one run on a
# Hopper GPU: the bench's default grids for Llama-3-8B (32/8) and Llama-2-7B (32/32) heads with
# their peers (cuDNN SDPA, and FlashAttention-3 where flash_attn_interface is importable) and the
# per-cell scorecard (auto against the faster backend, cuDNN, FlashAttention-3 and the floor);
# B = 1 against the best streaming read of the same bytes (bf16, then an e4m3 cache, each with
# auto, cute and Triton); the host time of an eager call.
# Usage, from the repo root on an sm_90 GPU (flashsplit importable, cutlass-dsl for cute):
#   bash scripts/h200_scorecard.sh
# Logs and the bench's JSON reports go to $OUT (default /tmp/out); each step runs under its own
# timeout (the whole run stays under 10 minutes) and prints its last lines as it ends.
set -o pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
FA3=$(python -c "import flash_attn_interface" 2>/dev/null && echo ",flash-attn3")
[ -z "$FA3" ] && echo "flash_attn_interface not importable: the grids run without FlashAttention-3"
step() {  # name, timeout in seconds, then the command
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: rc=$? in $(( $(date +%s) - t0 )) s"
}
contenders="auto,triton,cute,sdpa-cudnn$FA3"
step grid-llama-3-8b 200 python -m flashsplit bench --preset llama-3-8b --no-flex --contenders "$contenders" \
  --json "$OUT/grid-llama-3-8b.json"
tail -n 24 "$OUT/grid-llama-3-8b.log"
step grid-llama-2-7b 200 python -m flashsplit bench --preset llama-2-7b --no-flex --contenders "$contenders" \
  --json "$OUT/grid-llama-2-7b.json"
tail -n 23 "$OUT/grid-llama-2-7b.log"
step b1-bf16 70 python scripts/b1_latency.py --keys 4k 16k 128k --variants auto cute triton
cat "$OUT/b1-bf16.log"
step b1-fp8 60 python scripts/b1_latency.py --fp8 --keys 4k 128k --variants auto cute triton
cat "$OUT/b1-fp8.log"
step host 50 python scripts/host_overhead.py
tail -n 8 "$OUT/host.log"
