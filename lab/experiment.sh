#!/usr/bin/env bash
# Device experiment: build several profiles, test some, bench all on the same grid; table last.
# Usage: [ROUNDS=N] [TAG=NAME] bash lab/experiment.sh TEST_PROFILES "BENCH ARGS" PROFILE...
# TEST_PROFILES: comma-separated profiles whose GPU tests run first, or none. ROUNDS (default 1):
# the profiles are benched in turn that many times (A B, A B, ...), so a drift of the GPU's clock
# between runs falls on each alike; every run is a column of the table. Files go to $OUT/TAG/
# (default: the profiles' names joined by +), so two experiments of one visit keep their own.
# BUILD_ARGS (default --dtype bfloat16): what is built before the bench, e.g. "--dtype bfloat16 --hdim 64".
set -uo pipefail
TEST_PROFILES=$1; BENCH_ARGS=$2; shift 2; ROUNDS=${ROUNDS:-1}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FLASHTUNE_CACHE_DIR=/tmp/ftcache FLASHTUNE_TEST_CACHE_DIR=/tmp/ftcache
TAG=${TAG:-$(for p in "$@"; do basename "$p" .yaml; done | paste -sd+)}
OUT=${OUT:-/tmp/out}/$TAG; mkdir -p "$OUT"
for p in "$@"; do
  python3 -m flashtune build --profile "$p" ${BUILD_ARGS:---dtype bfloat16} --jobs 16 > "$OUT/build_$(basename $p .yaml).txt" 2>&1 \
    || echo "build $p failed"
done
if [ "$TEST_PROFILES" != none ]; then
  for t in ${TEST_PROFILES//,/ }; do
    n=$(basename "$t" .yaml)
    python3 -m flashtune build --profile "$t" --jobs 16 > /dev/null 2>&1
    FLASHTUNE_PROFILE=$t timeout 300 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider -x \
      > "$OUT/pytest_gpu_$n.txt" 2>&1; echo "pytest $t: rc=$? $(tail -1 "$OUT/pytest_gpu_$n.txt")"
    grep -E "^(FAILED|E )" "$OUT/pytest_gpu_$n.txt" | head -10
  done
fi
args=()
for round in $(seq "$ROUNDS"); do
  for p in "$@"; do
    n=$(basename "$p" .yaml); [ "$ROUNDS" -gt 1 ] && n=${n}_$round
    timeout 300 python3 -m flashtune bench --profile "$p" $BENCH_ARGS --out "$OUT/bench_$n.json" > "$OUT/bench_$n.txt" 2>&1 \
      || { echo "bench $p failed"; tail -5 "$OUT/bench_$n.txt"; }
    args+=("$n=$OUT/bench_$n.json")
  done
done
python3 lab/compare_bench.py "${args[@]}"
