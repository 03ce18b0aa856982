#!/usr/bin/env bash
# One device visit (see tools/README): detect, build, GPU tests, sanitizers, a bench.
# Usage on the device machine: bash tools/device_check.sh [PROFILE] [BENCH_ARGS...]
# Logs land in $OUT; a short table prints last.
set -uo pipefail
PROFILE=${1:-h200-sm80}; shift || true
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export FLASHTUNE_CACHE_DIR=${FLASHTUNE_CACHE_DIR:-/tmp/ftcache} FLASHTUNE_TEST_CACHE_DIR=${FLASHTUNE_CACHE_DIR:-/tmp/ftcache}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
step() { echo "== $1: $2" | tee -a "$OUT/summary.txt"; }

python3 -m flashtune detect > "$OUT/detect.txt" 2>&1; step detect "rc=$?"
python3 -m flashtune detect --json > "$OUT/detect.json" 2>&1
python3 -m flashtune build --profile "$PROFILE" --jobs 16 > "$OUT/build.txt" 2>&1; step build "rc=$?"
FLASHTUNE_PROFILE=$PROFILE timeout 420 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider \
  > "$OUT/pytest_gpu.txt" 2>&1; step pytest-gpu "rc=$? $(tail -1 "$OUT/pytest_gpu.txt")"
for tool in memcheck racecheck; do
  timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_case.py "$PROFILE" \
    > "$OUT/sanitizer_$tool.txt" 2>&1; step "sanitizer-$tool" "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.txt" | tail -1)"
done
if [ $# -gt 0 ]; then
  timeout 400 python3 -m flashtune bench --profile "$PROFILE" "$@" --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
  step bench "rc=$?"
fi
echo; cat "$OUT/build.txt" | tail -25; grep -E "FAILED|Error|error" "$OUT/pytest_gpu.txt" | head -20
tail -8 "$OUT/bench.txt" 2>/dev/null; echo; cat "$OUT/summary.txt"
