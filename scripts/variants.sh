#!/usr/bin/env bash
# The attention-variant and cache-update tables of docs/benchmarks.md in one run, each bench in its
# own process (a variant is compared with the plain decode of the same process), with
# FlashAttention-3 (flash_attn_interface) as the peer where it is importable.
# Usage, from the repo root on a Hopper GPU (flashsplit importable, cutlass-dsl for cute):
#   bash scripts/variants.sh
# Logs and JSON reports go to $OUT (default /tmp/out); the whole run takes about 5 minutes.
set -o pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
FA3=$(python -c "import flash_attn_interface" 2>/dev/null && echo ",flash-attn3")
run() {  # name, then the bench's options
  local name=$1; shift
  python -m flashsplit bench --no-ceiling "$@" --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "$name: rc=$?"; tail -n 14 "$OUT/$name.log"
}
run append --append 1 --rotary off on --compare-variants --batch 1 16 --seqlen 16k 128k --contenders "triton$FA3"
run gpt-oss --preset gpt-oss-20b --window 128 --sinks --batch 1 16 --seqlen 16k 128k --contenders "auto,triton$FA3"
run sinks --sinks off on --compare-variants --batch 1 16 --seqlen 16k 128k --contenders triton,cute
run softcap --softcap 50 --compare-variants --batch 1 16 --seqlen 16k 128k --contenders triton,cute
run batch-invariant --batch-invariant off on --compare-variants --batch 1 4 16 --seqlen 16k 32k 128k \
  --contenders triton,cute
run windows --window 4096 128 --compare-variants --batch 1 16 --seqlen 129 4097 16k 128k \
  --contenders "triton,cute,auto$FA3"
