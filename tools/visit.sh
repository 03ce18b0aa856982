#!/usr/bin/env bash
# One device visit that fits a lease: named steps, each bounded by what is left of a total budget,
# logs under $OUT/<step>.txt and a one-line summary each; a failing step never stops the next.
# Usage: bash tools/visit.sh SECONDS STEP... where STEP is one of the names below.
set -uo pipefail
BUDGET=$1; shift
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FLASHTUNE_CACHE_DIR=/tmp/ftcache FLASHTUNE_TEST_CACHE_DIR=/tmp/ftcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; END=$(( $(date +%s) + BUDGET ))
run() {  # run NAME MAX_SECONDS CMD...: bounded by MAX_SECONDS and by the visit's end
  local name=$1 max=$2; shift 2
  local left=$(( END - $(date +%s) )); [ $left -lt $max ] && max=$left
  if [ $max -le 5 ]; then echo "== $name: skipped (out of time)"; return; fi
  local start=$(date +%s); timeout $max "$@" > "$OUT/$name.txt" 2>&1; local rc=$?
  echo "== $name: rc=$rc in $(( $(date +%s) - start )) s | $(grep -v '^\s*$' "$OUT/$name.txt" | tail -1 | cut -c1-150)"
}
for step in "$@"; do case $step in
  build-h200) run build-h200 120 python3 -m flashtune build --profile h200 --jobs 16 ;;
  build-sm80) run build-sm80 120 python3 -m flashtune build --profile h200-sm80 --jobs 16 ;;
  fp8-h200) FLASHTUNE_PROFILE=h200 run fp8-h200 90 python3 -m pytest -q -p no:cacheprovider tests/test_fp8_gpu.py ;;
  fp8-sm80) FLASHTUNE_PROFILE=h200-sm80 run fp8-sm80 90 python3 -m pytest -q -p no:cacheprovider tests/test_fp8_gpu.py ;;
  gpu-h200) FLASHTUNE_PROFILE=h200 run gpu-h200 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ \
              --deselect tests/test_sm90_probe_gpu.py ;;
  gpu-sm80) FLASHTUNE_PROFILE=h200-sm80 run gpu-sm80 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ \
              --deselect tests/test_sm90_probe_gpu.py --deselect tests/test_hf_gpu.py ;;
  verify-h200) run verify-h200 120 python3 -m flashtune verify --profile h200 ;;
  verify-sm80) run verify-sm80 120 python3 -m flashtune verify --profile h200-sm80 ;;
  bench-h200) run bench-h200 130 python3 -m flashtune bench --profile h200 --backends flashtune,sdpa-flash,sdpa-cudnn \
               --json "$OUT/bench_h200_bf16.json" --plot "$OUT/bench_h200_bf16.png" ;;
  bench-h200-fp16) run bench-h200-fp16 130 python3 -m flashtune bench --profile h200 --dtype float16 \
               --backends flashtune,sdpa-flash,sdpa-cudnn --json "$OUT/bench_h200_fp16.json" ;;
  bench-fp8) run bench-fp8 120 python3 -m flashtune bench --profile h200 --backends flashtune,flashtune-fp8,sdpa-cudnn \
               --json "$OUT/bench_fp8.json" ;;
  hf) FLASHTUNE_PROFILE=h200 run hf 120 python3 -m pytest -q -p no:cacheprovider tests/test_hf_gpu.py ;;
  model) run model 240 python3 -m flashtune bench --profile h200 --model llama3-8b-like --layers 4 --batch 3 \
           --prefill 1024,4096,16384 --decode-steps 128 --backends flashtune,sdpa-flash,sdpa-cudnn,sdpa-math \
           --json "$OUT/model_bench.json" --plot "$OUT/model_bench.png" ;;
  tune) run tune 300 bash tools/tune_check.sh h200 "--max-candidates 6 --time-budget 70 --jobs 16" "--backends flashtune" ;;
  tune-short) run tune-short 400 bash tools/tune_check.sh h200 \
                "--tiles 128x64,128x80,128x128,128x176,192x128 --jobs 16" "--backends flashtune,sdpa-cudnn" ;;
              # next: smaller tiles for the short buckets (causal 512-1k computes up to 40% masked or padded work)
  tune-fp8) run tune-fp8 300 python3 -m flashtune tune --profile h200 --fp8 --hdims 128 --max-candidates 8 \
              --time-budget 150 --jobs 16 --name h200 --out "$OUT/h200-fp8-tuned.yaml" ;;
  bench-fp8-tuned) run bench-fp8-tuned 150 python3 -m flashtune bench --profile "$OUT/h200-fp8-tuned.yaml" --hdims 128 \
              --backends flashtune,flashtune-fp8,sdpa-cudnn --json "$OUT/bench_fp8_tuned.json" ;;
  ladders) E=tools/experiments  # the schedule with every step off (control) and with all three on
           run build-exp 150 bash -c "python3 -m flashtune build --profile $E/exp-sm90-control.yaml --jobs 16 \
             && python3 -m flashtune build --profile $E/exp-sm90-persistent.yaml --jobs 16"
           run control-ladder 100 python3 tools/kernel_ladder.py $E/exp-sm90-control.yaml
           run persistent-ladder 100 python3 tools/kernel_ladder.py $E/exp-sm90-persistent.yaml ;;
  gpu-control) E=tools/experiments; FLASHTUNE_PROFILE=$E/exp-sm90-control.yaml run gpu-control 200 \
           bash -c "python3 -m flashtune build --profile $E/exp-sm90-control.yaml --jobs 16 >/dev/null && \
           python3 -m pytest -q -p no:cacheprovider -m gpu tests/ --deselect tests/test_sm90_probe_gpu.py \
           --deselect tests/test_hf_gpu.py" ;;
  ab) E=tools/experiments; run ab 420 bash tools/experiment.sh $E/exp-sm90-persistent.yaml \
        "--dtype bfloat16 --backends flashtune,flashtune-fp8,sdpa-cudnn" $E/exp-sm90-control.yaml \
        $E/exp-sm90-persistent-only.yaml $E/exp-sm90-overlap.yaml $E/exp-sm90-pingpong.yaml $E/exp-sm90-persistent.yaml ;;
  sanitize) run build-h200 120 python3 -m flashtune build --profile h200 --jobs 16  # every kernel path once, checked
            run memcheck 150 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_case.py h200
            run racecheck 200 compute-sanitizer --tool racecheck --error-exitcode 9 python3 tools/sanitize_case.py h200
            run synccheck 150 compute-sanitizer --tool synccheck --error-exitcode 9 python3 tools/sanitize_case.py h200 ;;
  wide) E=tools/experiments  # next: 8-byte direct O stores (written, compile-checked), against the default
        run wide-ladder 150 bash -c "python3 -m flashtune build --profile $E/exp-sm90-wide-stores.yaml --jobs 16 >/dev/null \
          && python3 tools/kernel_ladder.py $E/exp-sm90-wide-stores.yaml"
        run wide-ab 330 bash tools/experiment.sh $E/exp-sm90-wide-stores.yaml "--dtype bfloat16 --backends flashtune,sdpa-cudnn" \
          profiles/h200.yaml $E/exp-sm90-wide-stores.yaml ;;
  qbuf) E=tools/experiments  # next: the second Q buffer, against the default schedule on the same tiles
        run qbuf-ladder 150 bash -c "python3 -m flashtune build --profile $E/exp-sm90-qbuf2.yaml --jobs 16 >/dev/null \
          && python3 tools/kernel_ladder.py $E/exp-sm90-qbuf2.yaml"
        run qbuf-ab 300 bash tools/experiment.sh $E/exp-sm90-qbuf2.yaml "--dtype bfloat16 --backends flashtune,sdpa-cudnn" \
          $E/exp-sm90-persistent.yaml $E/exp-sm90-qbuf2.yaml ;;
  *) echo "unknown step $step" ;;
esac; done
# The device tool brings back only a few files per call: pack everything into one.
( cd "$OUT" && tar czf /tmp/visit.tgz --exclude=visit.tgz . && find . -mindepth 1 -delete && mv /tmp/visit.tgz . )
