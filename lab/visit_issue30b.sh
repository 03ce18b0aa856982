#!/usr/bin/env bash
# Issue 30's second visit: the LSE fix (one FMA, +inf for rows without a key) on both families:
# the probe again, then every GPU test under h200 and under h200-sm80.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FLASHTUNE_CACHE_DIR=/tmp/ftc FLASHTUNE_TEST_CACHE_DIR=/tmp/ftc
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s)
python3 -m flashtune build --profile h200 --jobs 16 > "$OUT/build_h200.txt" 2>&1; echo "build h200 rc=$? $(( $(date +%s) - t0 )) s"
python3 -m flashtune build --profile h200-sm80 --jobs 16 > "$OUT/build_sm80.txt" 2>&1; echo "build sm80 rc=$? $(( $(date +%s) - t0 )) s"
grep -il "C75\|serializ" "$OUT"/build_*.txt; grep -h "spill" "$OUT/build_h200.txt" | grep -v " 0 bytes spill" | head -5
python3 lab/lse_probe.py h200 h200-sm80 > "$OUT/probe.txt" 2>&1; echo "probe rc=$? $(( $(date +%s) - t0 )) s"
FLASHTUNE_PROFILE=h200 timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ --deselect tests/test_sm90_probe_gpu.py > "$OUT/gpu_h200.txt" 2>&1
echo "gpu h200 rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/gpu_h200.txt")"
FLASHTUNE_PROFILE=h200-sm80 timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ --deselect tests/test_sm90_probe_gpu.py --deselect tests/test_hf_gpu.py > "$OUT/gpu_sm80.txt" 2>&1
echo "gpu sm80 rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/gpu_sm80.txt")"
grep -h "^BAD\|ERROR\|^==" "$OUT"/probe.txt | cut -c1-200 | head -20
grep -h "^FAILED\|^ERROR" "$OUT"/gpu_*.txt | cut -c1-200 | head -20
