#!/usr/bin/env bash
# One timing command run against two flashsplit trees in alternating processes (base, this
# checkout, base, ...): a change timed against the code before it on the same warm GPU, where one
# process can import only one flashsplit. Each run's last lines go to the log, labelled.
# Usage, from the repo root:
#   git archive <base-rev> flashsplit | tar -x -C <base-dir>     # the base tree, once
#   bash scripts/ab_versions.sh <base-dir> <rounds> python -m flashsplit bench --batch 1 --seqlen 4k \
#       --contenders cute --no-ceiling
# Logs go to $OUT/ab-versions.log (default /tmp/out).
set -o pipefail
base=$1 rounds=$2; shift 2
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for ((i = 1; i <= rounds; i++)); do
  for tree in "$base" .; do
    echo "== round $i, flashsplit from $tree: $*" | tee -a "$OUT/ab-versions.log"
    PYTHONPATH="$tree:.:${PYTHONPATH:-}" "$@" 2>&1 | tail -n 12 | tee -a "$OUT/ab-versions.log"
  done
done
