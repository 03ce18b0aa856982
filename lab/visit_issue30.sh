#!/usr/bin/env bash
# Issue 30's first device visit: build h200 and h200-sm80, probe unwritten / non-deterministic
# outputs on both, then bisect the sm90 schedule at hdim 128 fp16 with one flag off at a time.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FLASHTUNE_CACHE_DIR=/tmp/ftc
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s)
python3 -m flashtune build --profile h200 --jobs 16 > "$OUT/build_h200.txt" 2>&1; echo "build h200 rc=$? $(( $(date +%s) - t0 )) s"
python3 -m flashtune build --profile h200-sm80 --jobs 16 > "$OUT/build_sm80.txt" 2>&1; echo "build sm80 rc=$? $(( $(date +%s) - t0 )) s"
python3 lab/lse_probe.py h200 h200-sm80 > "$OUT/probe.txt" 2>&1; echo "probe rc=$? $(( $(date +%s) - t0 )) s"
for v in no-defer no-persistent no-tma-store no-spec; do
  python3 -m flashtune build --profile lab/profiles/probe-$v.yaml --hdim 128 --dtype float16 --jobs 16 > "$OUT/build_$v.txt" 2>&1
  PROBE_HDIMS=128 PROBE_DTYPES=float16 python3 lab/lse_probe.py lab/profiles/probe-$v.yaml > "$OUT/probe_$v.txt" 2>&1
  echo "$v rc=$? $(( $(date +%s) - t0 )) s"
done
grep -h "^BAD\|ERROR\|^==" "$OUT"/probe*.txt | cut -c1-260 | head -80
