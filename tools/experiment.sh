#!/usr/bin/env bash
# Device experiment: build several profiles, test one, bench all on the same grid; table last.
# Usage: bash tools/experiment.sh TEST_PROFILE "BENCH ARGS" PROFILE...
set -uo pipefail
TEST_PROFILE=$1; BENCH_ARGS=$2; shift 2
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FLASHTUNE_CACHE_DIR=/tmp/ftcache FLASHTUNE_TEST_CACHE_DIR=/tmp/ftcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for p in "$@"; do
  python3 -m flashtune build --profile "$p" --dtype bfloat16 --jobs 16 > "$OUT/build_$(basename $p .yaml).txt" 2>&1 || echo "build $p failed"
done
if [ "$TEST_PROFILE" != none ]; then
  python3 -m flashtune build --profile "$TEST_PROFILE" --jobs 16 > /dev/null 2>&1
  FLASHTUNE_PROFILE=$TEST_PROFILE timeout 300 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider -x \
    > "$OUT/pytest_gpu.txt" 2>&1; echo "pytest $TEST_PROFILE: rc=$? $(tail -1 "$OUT/pytest_gpu.txt")"
  grep -E "^(FAILED|E )" "$OUT/pytest_gpu.txt" | head -10
fi
args=()
for p in "$@"; do
  n=$(basename "$p" .yaml)
  timeout 300 python3 -m flashtune bench --profile "$p" $BENCH_ARGS --json "$OUT/bench_$n.json" > "$OUT/bench_$n.txt" 2>&1 \
    || { echo "bench $p failed"; tail -5 "$OUT/bench_$n.txt"; }
  args+=("$n=$OUT/bench_$n.json")
done
python3 tools/compare_bench.py "${args[@]}"
