#!/usr/bin/env bash
# Device visit for the tuner: tune a profile, rerun (everything cached), bench starting vs tuned.
# Usage: bash lab/tune_check.sh PROFILE "TUNE ARGS" "BENCH ARGS"
set -uo pipefail
PROFILE=$1; TUNE_ARGS=$2; BENCH_ARGS=$3
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FLASHTUNE_CACHE_DIR=/tmp/ftcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
name=$(basename "$PROFILE" .yaml)
start=$(date +%s)
python3 -m flashtune tune --profile "$PROFILE" $TUNE_ARGS --name "$name" --out "$OUT/$name-tuned.yaml" \
  > "$OUT/tune.txt" 2>&1; echo "tune: rc=$? in $(( $(date +%s) - start )) s"
start=$(date +%s)
python3 -m flashtune tune --profile "$PROFILE" $TUNE_ARGS --name "$name" --out "$OUT/$name-rerun.yaml" \
  > "$OUT/tune_rerun.txt" 2>&1; echo "tune rerun (cached): rc=$? in $(( $(date +%s) - start )) s"
cmp -s "$OUT/$name-tuned.yaml" "$OUT/$name-rerun.yaml" && echo "rerun wrote the same profile" || echo "rerun differs"
rm -f "$OUT/$name-rerun.yaml"
for p in "$PROFILE" "$OUT/$name-tuned.yaml"; do
  tag=$([ "$p" = "$PROFILE" ] && echo starting || echo tuned)
  python3 -m flashtune bench --profile "$p" $BENCH_ARGS --out "$OUT/bench_$tag.json" > "$OUT/bench_$tag.txt" 2>&1 \
    || { echo "bench $tag failed"; tail -3 "$OUT/bench_$tag.txt"; }
done
python3 lab/compare_bench.py starting="$OUT/bench_starting.json" tuned="$OUT/bench_tuned.json"
grep -A40 "top 3" "$OUT/tune.txt" | head -60
