#!/usr/bin/env bash
# Device visit for issue 8: the transformers GPU tests, then `bench --model` on a Llama-3-8B-like
# model (layers reduced), three prompts, prefill 1k/4k/16k and 128 greedy decode steps per backend.
# Usage: bash tools/model_check.sh [PROFILE] [LAYERS]
set -uo pipefail
PROFILE=${1:-h200}; LAYERS=${2:-8}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FLASHTUNE_CACHE_DIR=/tmp/ftcache FLASHTUNE_TEST_CACHE_DIR=/tmp/ftcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m flashtune build --profile "$PROFILE" --dtype bfloat16 --jobs 16 > "$OUT/build.txt" 2>&1; echo "build: rc=$?"
FLASHTUNE_PROFILE=$PROFILE timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_hf_gpu.py \
  > "$OUT/pytest_hf.txt" 2>&1; echo "hf tests: rc=$? $(tail -1 "$OUT/pytest_hf.txt")"
start=$(date +%s)
timeout 360 python3 -m flashtune bench --profile "$PROFILE" --model llama3-8b-like --layers "$LAYERS" --batch 3 \
  --prefill 1024,4096,16384 --decode-steps 128 --backends flashtune,sdpa-flash,sdpa-cudnn,sdpa-math \
  --json "$OUT/model_bench.json" --plot "$OUT/model_bench.png" > "$OUT/model_bench.txt" 2>&1
echo "bench --model: rc=$? in $(( $(date +%s) - start )) s"
python3 -m flashtune memory --model llama3-8b-like --layers "$LAYERS" --batch 3 --seqlen 16384 --json \
  > "$OUT/memory_16k.json" 2>&1
tail -40 "$OUT/model_bench.txt"
