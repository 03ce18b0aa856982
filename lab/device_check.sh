#!/usr/bin/env bash
# One device visit: detect, build, GPU tests, sanitizers, verify, and the full FA-grid bench.
# Usage on the device machine: bash lab/device_check.sh [PROFILE] [BENCH_ARGS...]
#   the sm90 family: bash lab/device_check.sh h200
# Results in $OUT: bench.json/.png/.txt, verify.txt, summary.txt, and logs.tar.gz with the rest.
set -uo pipefail
PROFILE=${1:-h200-sm80}; shift || true
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export FLASHTUNE_CACHE_DIR=${FLASHTUNE_CACHE_DIR:-/tmp/ftcache} FLASHTUNE_TEST_CACHE_DIR=${FLASHTUNE_CACHE_DIR:-/tmp/ftcache}
OUT=${OUT:-/tmp/out}; LOGS=$OUT/logs; mkdir -p "$LOGS"
step() { echo "== $1: $2" | tee -a "$OUT/summary.txt"; }

python3 -m flashtune detect > "$LOGS/detect.txt" 2>&1; step detect "rc=$?"
python3 -m flashtune detect --json > "$LOGS/detect.json" 2>&1
python3 -m flashtune build --profile "$PROFILE" --jobs 16 > "$LOGS/build.txt" 2>&1; step build "rc=$?"
# The sm90 probes, then a ladder of calls from the simplest up, each under its own time limit:
# they bisect the operand layouts if the kernel is wrong, and a kernel waiting on an mbarrier
# forever must not eat the lease. A failing ladder stops the visit here.
if [ "$(python3 -c "from flashtune.kernels.profiles import find_profile; print(find_profile('$PROFILE').family)")" = sm90 ]; then
  for probe in test_probe_qk_matches_torch test_probe_attention_matches_the_reference; do
    timeout 90 python3 -m pytest -q -p no:cacheprovider "tests/test_sm90_probe_gpu.py::$probe" \
      > "$LOGS/$probe.txt" 2>&1; step "$probe" "rc=$? $(tail -1 "$LOGS/$probe.txt")"
  done
fi
timeout 240 python3 tools/kernel_ladder.py "$PROFILE" > "$OUT/ladder.txt" 2>&1; ladder=$?
step ladder "rc=$ladder $(grep -c '^ok' "$OUT/ladder.txt") ok, $(grep -c '^FAIL' "$OUT/ladder.txt") failed"
if [ $ladder != 0 ]; then cat "$OUT/ladder.txt"; tar czf "$OUT/logs.tar.gz" -C "$OUT" logs; cat "$OUT/summary.txt"; exit 1; fi
FLASHTUNE_PROFILE=$PROFILE timeout 300 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider \
  --deselect tests/test_sm90_probe_gpu.py > "$LOGS/pytest_gpu.txt" 2>&1
step pytest-gpu "rc=$? (124: timed out, a hang) $(tail -1 "$LOGS/pytest_gpu.txt")"
grep -E "^(FAILED|ERROR)" "$LOGS/pytest_gpu.txt" > "$OUT/logs_pytest_failures.txt"
for tool in memcheck racecheck; do
  timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_case.py "$PROFILE" \
    > "$LOGS/sanitizer_$tool.txt" 2>&1; step "sanitizer-$tool" "rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOGS/sanitizer_$tool.txt" | tail -1)"
done
timeout 120 python3 -m flashtune verify --profile "$PROFILE" > "$OUT/verify.txt" 2>&1; step verify "rc=$? $(tail -1 "$OUT/verify.txt")"
python3 -m flashtune verify --sdpa --hdim 128 --seqlen 4096 --causal >> "$OUT/verify.txt" 2>&1
if [ "${1:-}" != "--no-bench" ]; then
  start=$(date +%s)
  timeout 420 python3 -m flashtune bench --profile "$PROFILE" "$@" --out "$OUT/bench.json" \
    --plot "$OUT/bench.png" > "$OUT/bench.txt" 2>&1
  step bench "rc=$? in $(( $(date +%s) - start )) s"
fi
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOGS"
echo; grep -E "^FAILED" "$OUT/logs_pytest_failures.txt" 2>/dev/null | head -20; tail -4 "$OUT/bench.txt" 2>/dev/null; tail -3 "$OUT/verify.txt"; echo; cat "$OUT/summary.txt"
