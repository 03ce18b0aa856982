#!/usr/bin/env bash
# One device visit that fits a lease: named steps, each bounded by what is left of a total budget,
# logs under $OUT/<step>.txt and a one-line summary each; a failing step never stops the next.
# Usage: [PROFILE=NAME|PATH] bash tools/visit.sh SECONDS STEP... where STEP is one of the names
# below; the h200 steps use $PROFILE (default h200), e.g. a profile an earlier tune-short wrote.
set -uo pipefail
BUDGET=$1; shift
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FLASHTUNE_CACHE_DIR=/tmp/ftcache FLASHTUNE_TEST_CACHE_DIR=/tmp/ftcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; END=$(( $(date +%s) + BUDGET )); P=${PROFILE:-h200}
AB="--dtype bfloat16 --backends flashtune,sdpa-cudnn"  # tools/experiment.sh's bench arguments for an A/B
run() {  # run NAME MAX_SECONDS CMD...: bounded by MAX_SECONDS and by the visit's end
  local name=$1 max=$2; shift 2
  local left=$(( END - $(date +%s) )); [ $left -lt $max ] && max=$left
  if [ $max -le 5 ]; then echo "== $name: skipped (out of time)"; return; fi
  local start=$(date +%s); timeout $max "$@" > "$OUT/$name.txt" 2>&1; local rc=$?
  echo "== $name: rc=$rc in $(( $(date +%s) - start )) s | $(grep -v '^\s*$' "$OUT/$name.txt" | tail -1 | cut -c1-150)"
}
flag_ab() {  # flag_ab TAG PROFILE ROUNDS [HDIM [SEQLENS]]: an experiment's kernels of one head dim (default 64)
  # built, its causal GPU tests at that head dim, then against h200 on its causal cells at SEQLENS (default
  # 512-2k) in ROUNDS alternating rounds (only that head dim's kernels built)
  local tag=$1 x=$2 rounds=$3 hdim=${4:-64} seqlens=${5:-512,1024,2048}
  run build-$tag 90 python3 -m flashtune build --profile "$x" --hdim $hdim --jobs 16
  FLASHTUNE_PROFILE=$x run test-$tag 90 python3 -m pytest -q -p no:cacheprovider -m gpu -x tests/test_ops_gpu.py \
    tests/test_fp8_gpu.py -k "$hdim and causal"
  BUILD_ARGS="--dtype bfloat16 --hdim $hdim" ROUNDS=$rounds TAG=$tag run $tag-ab 150 \
    bash tools/experiment.sh none "$AB --hdims $hdim --causal --seqlens $seqlens" profiles/h200.yaml "$x"
}
ceiling_rounds() {  # ceiling_rounds MATMULS: $P's long cells against the fastest of the square products of
  # those sizes under the bench's timer (tools/power_clock.py --timer bench), two rounds a dtype
  run build-long 100 python3 -m flashtune build --profile "$P" --hdim 128 --hdim 256 --jobs 16
  for i in 1 2; do for d in bfloat16 float16; do
    run ceiling-$d-$i 60 python3 tools/power_clock.py --profile "$P" --dtype $d --timer bench \
      --matmuls "$1" --json "$OUT/ceiling_${d}_$i.json"
  done; done
}
for step in "$@"; do case $step in
  build-h200) run build-h200 120 python3 -m flashtune build --profile "$P" --jobs 16 ;;
  build-sm80) run build-sm80 120 python3 -m flashtune build --profile h200-sm80 --jobs 16 ;;
  fp8-h200) FLASHTUNE_PROFILE=h200 run fp8-h200 90 python3 -m pytest -q -p no:cacheprovider tests/test_fp8_gpu.py ;;
  fp8-sm80) FLASHTUNE_PROFILE=h200-sm80 run fp8-sm80 90 python3 -m pytest -q -p no:cacheprovider tests/test_fp8_gpu.py ;;
  gpu-h200) FLASHTUNE_PROFILE=$P run gpu-h200 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ \
              --deselect tests/test_sm90_probe_gpu.py ;;
  gpu-sm80) FLASHTUNE_PROFILE=h200-sm80 run gpu-sm80 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ \
              --deselect tests/test_sm90_probe_gpu.py --deselect tests/test_hf_gpu.py ;;
  verify-h200) run verify-h200 120 python3 -m flashtune verify --profile "$P" ;;
  verify-sm80) run verify-sm80 120 python3 -m flashtune verify --profile h200-sm80 ;;
  bench-h200|bench-h200-r2) r=${step#bench-h200}  # -r2: a second run, files of its own
               run $step 130 python3 -m flashtune bench --profile "$P" --backends flashtune,sdpa-flash,sdpa-cudnn \
               --json "$OUT/bench_h200${r/-/_}_bf16.json" --plot "$OUT/bench_h200${r/-/_}_bf16.png" ;;
  bench-h200-fp16|bench-h200-fp16-r2) r=${step#bench-h200-fp16}
               run $step 130 python3 -m flashtune bench --profile "$P" --dtype float16 \
               --backends flashtune,sdpa-flash,sdpa-cudnn --json "$OUT/bench_h200${r/-/_}_fp16.json" ;;
  bench-fp8) run bench-fp8 120 python3 -m flashtune bench --profile h200 --backends flashtune,flashtune-fp8,sdpa-cudnn \
               --json "$OUT/bench_fp8.json" ;;
  hf) FLASHTUNE_PROFILE=h200 run hf 120 python3 -m pytest -q -p no:cacheprovider tests/test_hf_gpu.py ;;
  model) run model 240 python3 -m flashtune bench --profile h200 --model llama3-8b-like --layers 4 --batch 3 \
           --prefill 1024,4096,16384 --decode-steps 128 --backends flashtune,sdpa-flash,sdpa-cudnn,sdpa-math \
           --json "$OUT/model_bench.json" --plot "$OUT/model_bench.png" ;;
  ncu) run ncu 200 ncu --clock-control none --profile-from-start off --section LaunchStats --section Occupancy \
         --section SpeedOfLight python3 tools/ncu_cells.py "$P" 64:1:512 64:0:512 256:1:512 128:1:1024 128:0:16384 ;;
  ncu-deep) run ncu-deep 150 ncu --clock-control none --profile-from-start off --section WarpStateStats \
         --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
         python3 tools/ncu_cells.py "$P" 64:1:512 256:1:512 ;;  # stall reasons, pipes, L2: ours against cuDNN
  tune) run tune 300 bash tools/tune_check.sh h200 "--max-candidates 6 --time-budget 70 --jobs 16" "--backends flashtune" ;;
  tune-short) run tune-short 330 python3 -m flashtune tune --profile h200 --tiles 128x80,128x96,128x128,128x160,128x176,192x128 \
                --jobs 16 --time-budget 240 --max-spill-bytes 140 --name h200 --out "$OUT/h200-tuned.yaml"
              cp "$OUT/h200-tuned.yaml" /tmp/h200-tuned.yaml ;;  # for a later visit.sh run: PROFILE=/tmp/h200-tuned.yaml
              # smaller tiles for the short buckets; hdim 64 192x128 (the starting tile) spills 60/72 bytes;
              # the tuner's final round (default --final-round 3) decides close calls
  tune-h128) run tune-h128 200 python3 -m flashtune tune --profile h200 --hdims 128 --tiles 192x80,192x64 \
                --jobs 16 --time-budget 150 --name h200 --out "$OUT/h200-tuned-h128.yaml" ;;
              # three consumer warpgroups at hdim 128 (80 or 64 keys fit their 160 registers beside the overlap's P)
              # against the profile's tiles, side by side in the tuner's final round; a measurement, not adopted
  tune-h256c) run tune-h256c 200 python3 -m flashtune tune --profile h200 --hdims 256 --causal --tiles 128x64,128x80 \
                --jobs 16 --time-budget 150 --name h200 --out "$OUT/h200-tuned-h256c.yaml" ;;
              # a re-tune of a bucket split by hand (hdim 256 causal at 1k): measured at 512 on its own, kept split
  tune-h128nc) run tune-h128nc 200 python3 -m flashtune tune --profile h200 --hdims 128 --no-causal \
                --tiles 128x128,128x160,128x176 --jobs 16 --time-budget 150 --name h200 --out "$OUT/h200-tuned-h128nc.yaml" ;;
              # the default buckets split at 1k: 512 and 1k measured apart (and 2k's 128x160 against 128x128)
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
  sanitize) run build-h200 120 python3 -m flashtune build --profile "$P" --jobs 16  # every kernel path once, checked
            for tool in memcheck racecheck synccheck; do
              run $tool 200 compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_case.py "$P"
            done ;;
  memcheck|racecheck|synccheck)  # one tool alone (the kernels built by an earlier step)
            run $step 200 compute-sanitizer --tool $step --error-exitcode 9 python3 tools/sanitize_case.py "$P" ;;
  softmax) E=tools/experiments  # the block maximum as a tree, and some exps off the MUFU unit (measured: no gain, a loss)
        run softmax-ladder 150 bash -c "python3 -m flashtune build --profile $E/exp-sm90-poly-exp2-2.yaml --jobs 16 >/dev/null \
          && python3 tools/kernel_ladder.py $E/exp-sm90-poly-exp2-2.yaml"
        run softmax-ab 420 bash tools/experiment.sh $E/exp-sm90-poly-exp2-2.yaml "--dtype bfloat16 --backends flashtune,sdpa-cudnn" \
          profiles/h200.yaml $E/exp-sm90-tree-max.yaml $E/exp-sm90-poly-exp2-1.yaml $E/exp-sm90-poly-exp2-2.yaml ;;
  rescale) E=tools/experiments  # the default (lazy rescaling) against eager rescaling on the same tiles; measured
        # first as h200 (then eager) against exp-sm90-lazy-rescale.yaml: benchmarks/h200/2026-12-02_lazy-rescale_ab*
        run rescale-ab 330 bash tools/experiment.sh $E/exp-sm90-eager-rescale.yaml "--dtype bfloat16 --backends flashtune,sdpa-cudnn" \
          profiles/h200.yaml $E/exp-sm90-eager-rescale.yaml ;;
  qbuf) E=tools/experiments  # the second Q buffer, against the default schedule on the same tiles
        run qbuf-ab 300 bash tools/experiment.sh $E/exp-sm90-qbuf2.yaml "--dtype bfloat16 --backends flashtune,sdpa-cudnn" \
          profiles/h200.yaml $E/exp-sm90-qbuf2.yaml ;;
  defer) E=tools/experiments  # the deferred epilogue: off, at hdim 64 only, at every head dim with room (the default);
        # measured first as benchmarks/h200/2026-12-03_defer_ab*, 2026-12-03_defer128_ab*
        run defer-ab 420 bash tools/experiment.sh none "--dtype bfloat16 --backends flashtune,sdpa-cudnn \
          --hdims 64,128 --seqlens 512,1024,2048" $E/exp-sm90-no-defer.yaml $E/exp-sm90-defer-hdim64.yaml profiles/h200.yaml ;;
  two-ctas) E=tools/experiments  # two CTAs an SM of 64x128 tiles for hdim 64 below 2k, against h200 (measured a loss:
        # benchmarks/h200/2026-12-03_two-ctas_ab*)
        run two-ctas-ab 420 bash tools/experiment.sh $E/exp-sm90-two-ctas.yaml "--dtype bfloat16 --backends flashtune,sdpa-cudnn \
          --hdims 64 --seqlens 512,1024,2048" profiles/h200.yaml $E/exp-sm90-two-ctas.yaml ;;
  trace) E=tools/experiments C="64:1:512 256:1:512 128:0:512"  # each tile's steps timed in the kernel (csrc/sm90/trace.cuh)
        run trace 150 python3 tools/tile_trace.py $C
        run trace-lse 60 python3 tools/tile_trace.py --lse $C
        run trace-skip-o 90 python3 tools/tile_trace.py --profile $E/exp-sm90-trace-skip-o.yaml $C ;;  # a bound: no O written
  wide) E=tools/experiments  # direct O stores of 16 bytes (the default) against 8 (exp-sm90-wide8.yaml, the old default);
        # measured first as h200 (then 8-byte) against exp-sm90-wide16.yaml: benchmarks/h200/2026-12-02_wide16_ab*
        run trace-wide8 90 python3 tools/tile_trace.py --flag=-DFLASHTUNE_SM90_WIDE_STORES=1 256:1:512 128:0:512 256:0:512
        run wide-ab 330 bash tools/experiment.sh $E/exp-sm90-wide8.yaml \
          "--dtype bfloat16 --backends flashtune,sdpa-cudnn --hdims 128,256" profiles/h200.yaml $E/exp-sm90-wide8.yaml ;;
  stmatrix) C="64:1:512 64:0:512 128:1:1024"  # O into shared memory by stmatrix (the default) or 32-bit stores
        run trace-stmatrix 80 python3 tools/tile_trace.py $C
        run trace-sts 80 python3 tools/tile_trace.py --flag=-DFLASHTUNE_SM90_STMATRIX=0 $C ;;
  split-tiles) E=tools/experiments  # SPLIT_S and the tiles with room for a deferred epilogue, each against h200 on
        # the cells they change (below 8k), two alternating rounds; measured: benchmarks/h200/2026-12-03_split-tiles_ab*
        ROUNDS=2 run split-tiles-ab 600 bash tools/experiment.sh $E/exp-sm90-split-s.yaml,$E/exp-sm90-defer-tiles.yaml \
          "$AB --seqlens 512,1024,2048,4096" profiles/h200.yaml $E/exp-sm90-split-s.yaml $E/exp-sm90-defer-tiles.yaml ;;
  split-long) E=tools/experiments  # SPLIT_S with halves of any multiple of 8 (hdim 128 128x176, hdim 256 128x80)
        # at 2k-16k; measured: benchmarks/h200/2026-12-03_split-long_ab*
        ROUNDS=2 run split-long-ab 500 bash tools/experiment.sh $E/exp-sm90-split-s.yaml \
          "$AB --hdims 128,256 --seqlens 2048,4096,8192,16384" profiles/h200.yaml $E/exp-sm90-split-s.yaml ;;
  q-in-regs) E=tools/experiments  # Q in registers (S reads only K from shared memory) on the cells whose tiles
        # take it (hdim 64 causal and hdim 128 128x128, below 4k); measured: benchmarks/h200/2026-12-03_q-in-regs_ab*
        ROUNDS=3 run q-in-regs-ab 500 bash tools/experiment.sh $E/exp-sm90-q-in-regs.yaml \
          "$AB --hdims 64,128 --seqlens 512,1024,2048" profiles/h200.yaml $E/exp-sm90-q-in-regs.yaml ;;
  skip-masked) E=tools/experiments  # no exps for the 8-key groups a warp does not see, in causal diagonal blocks
        # (hdim 64 and hdim 128 128x128: the causal cells below 2k / 4k); measured: benchmarks/h200/2026-12-03_skip-masked_ab*
        ROUNDS=3 run skip-masked-ab 500 bash tools/experiment.sh $E/exp-sm90-skip-masked.yaml \
          "$AB --causal --hdims 64,128 --seqlens 512,1024,2048" profiles/h200.yaml $E/exp-sm90-skip-masked.yaml
        for tool in memcheck racecheck; do run $tool-skip-masked 100 compute-sanitizer --tool $tool --error-exitcode 9 \
          python3 tools/sanitize_case.py $E/exp-sm90-skip-masked.yaml; done ;;
  counter) E=tools/experiments  # the per-stream tile counter (no memset per call, the default) against a memset
        # before every causal launch (the old way), on the causal cells below 4k
        ROUNDS=2 run counter-ab 420 bash tools/experiment.sh none "$AB --causal --seqlens 512,1024,2048" \
          profiles/h200.yaml $E/exp-sm90-counter-memset.yaml ;;
  flat-tiles) E=tools/experiments  # a tile's last P V under the next tile's first softmax, where the epilogue is
        # deferred (hdim 64, hdim 128 128x128); GPU tests on it, then against h200 below 4k
        ROUNDS=2 run flat-tiles-ab 500 bash tools/experiment.sh $E/exp-sm90-flat-tiles.yaml \
          "$AB --hdims 64,128 --seqlens 512,1024,2048" profiles/h200.yaml $E/exp-sm90-flat-tiles.yaml ;;
  mufu-turn) E=tools/experiments  # turns on the exps (and with them the flat tiles at hdim 64 causal) against h200;
        # GPU tests on the combination
        ROUNDS=2 TAG=mufu-turn run mufu-turn-ab 560 bash tools/experiment.sh $E/exp-sm90-mufu-flat.yaml \
          "$AB --seqlens 512,2048" profiles/h200.yaml $E/exp-sm90-mufu-turn.yaml $E/exp-sm90-mufu-flat.yaml
        grep -E "^(pytest|[a-z0-9_-]+: geomean vs sdpa-cudnn)" "$OUT/mufu-turn-ab.txt"
        # the winner by more than 0.5% (else h200), for a release visit right after: PROFILE=$(cat /tmp/ab-winner)
        python3 tools/ab_winner.py sdpa-cudnn 0.005 --dir $OUT/mufu-turn profiles/h200.yaml \
          $E/exp-sm90-mufu-turn.yaml $E/exp-sm90-mufu-flat.yaml > /tmp/ab-winner; echo "winner: $(cat /tmp/ab-winner)" ;;
  cudnn-like) E=tools/experiments  # cuDNN's block structure (no overlap, no GEMM turns, turns on the exps)
        # against h200; GPU tests on it first
        ROUNDS=2 run cudnn-like-ab 500 bash tools/experiment.sh $E/exp-sm90-cudnn-like.yaml \
          "$AB --seqlens 512,2048,8192" profiles/h200.yaml $E/exp-sm90-cudnn-like.yaml
        grep -E "^(pytest|[a-z0-9_-]+: geomean vs sdpa-cudnn)" "$OUT/cudnn-like-ab.txt" ;;
  stages1) E=tools/experiments  # hdim 256 with one K and one V slot: cuDNN's 128x128 without the overlap,
        # 128x80 and 128x96 with the TMA-store epilogue; and cuDNN's block structure at hdim 64
        for x in cudnn-like-256 h256-s1-80 h256-s1-96; do
          run build-$x 60 python3 -m flashtune build --profile $E/exp-sm90-$x.yaml --hdim 256 --jobs 16
        done
        for x in cudnn-like-256 h256-s1-80; do  # the new paths' hdim 256 kernels, checked first
          FLASHTUNE_PROFILE=$E/exp-sm90-$x.yaml run test-$x 100 python3 -m pytest -q -p no:cacheprovider -m gpu \
            tests/test_ops_gpu.py -x -k 256
        done
        ROUNDS=2 TAG=h256-s1 run h256-s1-ab 300 bash tools/experiment.sh none "$AB --hdims 256 --seqlens 512,1024,2048" \
          profiles/h200.yaml $E/exp-sm90-cudnn-like-256.yaml $E/exp-sm90-h256-s1-80.yaml $E/exp-sm90-h256-s1-96.yaml
        ROUNDS=2 TAG=cudnn-like run cudnn-like-ab 200 bash tools/experiment.sh none "$AB --hdims 64 --seqlens 512,1024,2048" \
          profiles/h200.yaml $E/exp-sm90-cudnn-like.yaml
        grep -h -E "^[a-z0-9_-]+: geomean vs sdpa-cudnn" "$OUT/h256-s1-ab.txt" "$OUT/cudnn-like-ab.txt" ;;
  h64-tiles) E=tools/experiments  # hdim 64 non-causal below 2k: 128-row tiles (no padded rows at 512 / 1k) against
        # 192x128; the winner by more than 0.5% (else h200) for a release right after: PROFILE=$(cat /tmp/ab-winner)
        ROUNDS=3 TAG=h64-tiles run h64-tiles-ab 200 bash tools/experiment.sh none "$AB --hdims 64 --no-causal --seqlens 512,1024" \
          profiles/h200.yaml $E/exp-sm90-h64-nc128-s2.yaml $E/exp-sm90-h64-nc128-s3.yaml
        python3 tools/ab_winner.py sdpa-cudnn 0.005 --dir $OUT/h64-tiles profiles/h200.yaml \
          $E/exp-sm90-h64-nc128-s2.yaml $E/exp-sm90-h64-nc128-s3.yaml \
          > /tmp/ab-winner 2> "$OUT/h64-tiles-scores.txt" || echo profiles/h200.yaml > /tmp/ab-winner
        echo "winner: $(cat /tmp/ab-winner)" ;;
  split-tail) E=tools/experiments  # the last wave's K/V blocks shared out over every CTA (non-causal): correctness
        # on the experiment first (its split shapes, every op and FP8 test, memcheck and racecheck on split calls),
        # then against h200 on the 18 non-causal cells in alternating rounds
        run build-split 200 python3 -m flashtune build --profile $E/exp-sm90-split-tail.yaml --jobs 16
        FLASHTUNE_PROFILE=$E/exp-sm90-split-tail.yaml run test-split 200 python3 -m pytest -q -p no:cacheprovider \
          -m gpu tests/test_split_tail_gpu.py tests/test_ops_gpu.py tests/test_fp8_gpu.py
        ROUNDS=${SPLIT_ROUNDS:-2} TAG=split run split-ab 330 bash tools/experiment.sh none "$AB --no-causal" \
          profiles/h200.yaml $E/exp-sm90-split-tail.yaml
        for tool in memcheck racecheck; do
          run $tool-split 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_case.py \
            $E/exp-sm90-split-tail.yaml
        done ;;
  split-tail-long) E=tools/experiments  # the split tail where the first A/B hinted at a gain (hdim 128 and 256 from 4k)
        ROUNDS=3 TAG=split-tail-long run split-tail-long-ab 200 bash tools/experiment.sh none \
          "$AB --no-causal --hdims 128,256 --seqlens 4096,8192,16384" profiles/h200.yaml $E/exp-sm90-split-tail.yaml ;;
  spec-max) E=tools/experiments  # speculative maxima (SPEC_MAX, the default at hdim 64 and 128) against the kernels
        # without (exp-sm90-no-spec) in alternating rounds at head dims $SPEC_HDIMS, then the experiment at every head
        # dim (exp-sm90-spec-max) through every op and FP8 test
        run build-spec 200 python3 -m flashtune build --profile $E/exp-sm90-spec-max.yaml --jobs 16
        ROUNDS=${SPEC_ROUNDS:-2} TAG=spec-max run spec-max-ab 330 bash tools/experiment.sh none \
          "$AB --hdims ${SPEC_HDIMS:-128,64}" $E/exp-sm90-no-spec.yaml profiles/h200.yaml
        FLASHTUNE_PROFILE=$E/exp-sm90-spec-max.yaml run test-spec 200 python3 -m pytest -q -p no:cacheprovider \
          -m gpu tests/test_ops_gpu.py tests/test_fp8_gpu.py ;;
  spec-rest) E=tools/experiments  # speculative maxima at hdim 256 too (exp-sm90-spec-max), against the kernels without
        run build-spec 200 python3 -m flashtune build --profile $E/exp-sm90-spec-max.yaml --jobs 16
        ROUNDS=2 TAG=spec-rest run spec-rest-ab 330 bash tools/experiment.sh none "$AB --hdims 64,256" \
          $E/exp-sm90-no-spec.yaml $E/exp-sm90-spec-max.yaml ;;
  h64-short) E=tools/experiments  # hdim 64 below 2k, where SPEC_MAX lost (non-causal 512-1k) or the 0.95x line is
        # close (causal 512): 3 or 4 K/V slots (SPEC_MAX holds K_j's longer), and the kernels without SPEC_MAX
        # (exp-sm90-no-spec), in three alternating rounds against h200 at 512 and 1k
        ROUNDS=3 TAG=h64-short run h64-short-ab 400 bash tools/experiment.sh none \
          "$AB --hdims 64 --seqlens 512,1024" profiles/h200.yaml $E/exp-sm90-h64nc-s3.yaml \
          $E/exp-sm90-h64nc-s4.yaml $E/exp-sm90-h64c-s4.yaml $E/exp-sm90-no-spec.yaml ;;
  half-diagonal) E=tools/experiments  # the half diagonal block (HALF_DIAGONAL; run when h200 had it at hdim 64 causal,
        # now an experiment): h200 against the kernels without it (no-half-diagonal) and with it in every causal kernel
        # (half-diagonal), on the causal cells at 512-2k in two alternating rounds
        ROUNDS=2 TAG=half-diagonal run half-diagonal-ab 330 bash tools/experiment.sh none \
          "$AB --causal --seqlens 512,1024,2048" profiles/h200.yaml $E/exp-sm90-no-half-diagonal.yaml \
          $E/exp-sm90-half-diagonal.yaml ;;
  s-ahead) flag_ab s-ahead tools/experiments/exp-sm90-s-ahead.yaml 2 ;;
        # S one block ahead (exp-sm90-s-ahead: hdim 64 causal below 2k)
  h64c-pingpong) flag_ab no-pingpong tools/experiments/exp-sm90-no-pingpong.yaml 3 ;;
        # h200 without the pingpong: hdim 64 causal 512-1k, the 1-4 block tiles, unmeasured without it since the ablation
  h256c-pingpong) flag_ab no-pingpong-256 tools/experiments/exp-sm90-no-pingpong.yaml 3 256 1024,2048,4096 ;;
        # h200 without the pingpong at hdim 256 causal 1k-4k (pingpong-wide: +2 / +5% at 2k), for a split of its bucket
  h256-spec-wide) E=tools/experiments  # speculative maxima at hdim 256 with 240 consumer registers (no consumer spills
        # at 128x80 non-causal), and h200 without the pingpong: hdim 256 GPU tests, then against h200 in three
        # alternating rounds at hdim 256 1k-8k (bf16), and the experiment against h200 at the long cells in fp16
        X=$E/exp-sm90-spec-wide.yaml
        run build-spec-wide 120 python3 -m flashtune build --profile $X --hdim 256 --jobs 16
        FLASHTUNE_PROFILE=$X run test-spec-wide 150 python3 -m pytest -q -p no:cacheprovider -m gpu -x \
          tests/test_ops_gpu.py tests/test_fp8_gpu.py -k 256
        BUILD_ARGS="--dtype bfloat16 --hdim 256" ROUNDS=3 TAG=spec-wide run spec-wide-ab 240 bash tools/experiment.sh none \
          "$AB --hdims 256 --seqlens 1024,2048,4096,8192" profiles/h200.yaml $X $E/exp-sm90-no-pingpong.yaml
        BUILD_ARGS="--dtype float16 --hdim 256" ROUNDS=3 TAG=spec-wide-fp16 run spec-wide-fp16-ab 100 bash tools/experiment.sh \
          none "--dtype float16 --backends flashtune,sdpa-cudnn --hdims 256 --no-causal --seqlens 4096,8192" \
          profiles/h200.yaml $X ;;
  h128-n192) E=tools/experiments  # hdim 128 non-causal in 192-key blocks with 240 consumer registers: its hdim 128 GPU
        # tests, then against h200 at the long cells in three alternating rounds a dtype; then each dtype's
        # long cells against its matrix product under the bench's timer (tools/power_clock.py --timer bench), twice
        X=$E/exp-sm90-h128-n192.yaml
        run build-n192 120 python3 -m flashtune build --profile $X --hdim 128 --jobs 16
        FLASHTUNE_PROFILE=$X run test-n192 150 python3 -m pytest -q -p no:cacheprovider -m gpu -x \
          tests/test_ops_gpu.py tests/test_fp8_gpu.py -k 128
        for d in bfloat16 float16; do
          BUILD_ARGS="--dtype $d --hdim 128" ROUNDS=3 TAG=n192-$d run n192-$d-ab 120 bash tools/experiment.sh none \
            "--dtype $d --backends flashtune,sdpa-cudnn --hdims 128 --no-causal --seqlens 8192,16384" profiles/h200.yaml $X
        done
        ceiling_rounds 8192 ;;
  ceiling)  # each dtype's long cells against the fastest of three square matrix products (cuBLAS), under the
        # bench's timer twice a dtype, then back to back with the clock and power sampled
        ceiling_rounds 4096,8192,16384
        for d in bfloat16 float16; do
          run power-clock-$d 80 python3 tools/power_clock.py --profile "$P" --dtype $d --seconds 2.5 \
            --matmuls 4096,8192,16384 --json "$OUT/power_clock_$d.json"
        done ;;
  pingpong-wide) E=tools/experiments  # h200 without the pingpong on every head dim at 512-2k (after h64c-pingpong's
        # hdim 64 causal gain below 2k): its op GPU tests, then two alternating rounds on the 18 cells at 512-2k
        run build-no-pingpong 200 python3 -m flashtune build --profile $E/exp-sm90-no-pingpong.yaml --dtype bfloat16 --jobs 16
        FLASHTUNE_PROFILE=$E/exp-sm90-no-pingpong.yaml run test-no-pingpong 150 python3 -m pytest -q -p no:cacheprovider \
          -m gpu -x tests/test_ops_gpu.py
        ROUNDS=2 TAG=pingpong-wide run pingpong-wide-ab 330 bash tools/experiment.sh none "$AB --seqlens 512,1024,2048" \
          profiles/h200.yaml $E/exp-sm90-no-pingpong.yaml
        grep -h -E "^[a-z0-9_-]+: geomean vs sdpa-cudnn" "$OUT/pingpong-wide-ab.txt" ;;
  long-cells)  # issue 9's absolute cells (hdim 128 / 256 non-causal 8k-16k): clock and power back to back
        # in each dtype, then five bench runs a dtype of those cells, alternating, to see their spread
        run build-long 150 python3 -m flashtune build --profile "$P" --hdim 128 --hdim 256 --jobs 16
        for d in bfloat16 float16; do
          run power-clock-$d 60 python3 tools/power_clock.py --profile "$P" --dtype $d --seconds 2.5 \
            --json "$OUT/power_clock_$d.json"
        done
        for i in 1 2 3 4 5; do for d in bfloat16 float16; do
          run long-$d-$i 40 python3 -m flashtune bench --profile "$P" --dtype $d --hdims 128,256 --no-causal \
            --seqlens 8192,16384 --backends flashtune,sdpa-cudnn --json "$OUT/long_${d}_$i.json"
        done; done ;;
  cluster) E=tools/experiments  # clusters of two CTAs sharing each K/V block by multicast: hdim >= 128 non-causal
        # (exp-sm90-cluster.yaml) and every non-causal kernel (-all); correctness first, then against h200 on the
        # non-causal cells; the winner by more than 0.5% (else h200) for a release right after: PROFILE=$(cat /tmp/ab-winner)
        run build-cluster 200 python3 -m flashtune build --profile $E/exp-sm90-cluster-all.yaml --jobs 16
        FLASHTUNE_PROFILE=$E/exp-sm90-cluster-all.yaml run test-cluster 200 python3 -m pytest -q -p no:cacheprovider \
          -m gpu tests/test_ops_gpu.py tests/test_fp8_gpu.py -x
        run memcheck-cluster 100 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_case.py \
          $E/exp-sm90-cluster-all.yaml
        ROUNDS=2 TAG=cluster run cluster-ab 330 bash tools/experiment.sh none "$AB --no-causal" \
          profiles/h200.yaml $E/exp-sm90-cluster.yaml $E/exp-sm90-cluster-all.yaml
        python3 tools/ab_winner.py sdpa-cudnn 0.005 --dir $OUT/cluster profiles/h200.yaml \
          $E/exp-sm90-cluster.yaml $E/exp-sm90-cluster-all.yaml \
          > /tmp/ab-winner 2> "$OUT/cluster-scores.txt" || echo profiles/h200.yaml > /tmp/ab-winner
        echo "winner: $(cat /tmp/ab-winner)"; cat "$OUT/cluster-scores.txt" ;;
  h256-n64) E=tools/experiments  # 64-key blocks where h200's do not line up with the rows (hdim 256: 80 keys) or
        # may start a short tile sooner (hdim 64 causal below 2k), each against h200 on its head dim
        for x in h256-n64 h64c-n64; do run build-$x 120 python3 -m flashtune build --profile $E/exp-sm90-$x.yaml --jobs 16; done
        FLASHTUNE_PROFILE=$E/exp-sm90-h256-n64.yaml run test-h256-n64 100 python3 -m pytest -q -p no:cacheprovider -m gpu \
          tests/test_ops_gpu.py -x -k 256
        FLASHTUNE_PROFILE=$E/exp-sm90-h64c-n64.yaml run test-h64c-n64 100 python3 -m pytest -q -p no:cacheprovider -m gpu \
          tests/test_ops_gpu.py -x -k "64 and causal"
        ROUNDS=3 TAG=h256-n64 run h256-n64-ab 300 bash tools/experiment.sh none "$AB --hdims 256" \
          profiles/h200.yaml $E/exp-sm90-h256-n64.yaml
        ROUNDS=3 TAG=h64c-n64 run h64c-n64-ab 120 bash tools/experiment.sh none "$AB --hdims 64 --causal --seqlens 512,1024,2048" \
          profiles/h200.yaml $E/exp-sm90-h64c-n64.yaml
        grep -h -E "^[a-z0-9_-]+: geomean vs sdpa-cudnn" "$OUT/h256-n64-ab.txt" "$OUT/h64c-n64-ab.txt" ;;
  ncu-sass) C=64:1:512  # per-instruction counts of our kernel and cuDNN's on one cell, and their SASS
        run ncu-sass 200 ncu --clock-control none --profile-from-start off --section SourceCounters \
          --section InstructionStats -f -o "$OUT/sass" python3 tools/ncu_cells.py "$P" $C
        run ncu-sass-csv 120 ncu -i "$OUT/sass.ncu-rep" --page source --print-source sass --csv
        run ncu-sass-details 60 ncu -i "$OUT/sass.ncu-rep" --page details ;;
  *) echo "unknown step $step" ;;
esac; done
# The device tool brings back only a few files per call: pack this run's files into one (an
# earlier run's archive in the same call stays beside it).
name=visit-$(date +%H%M%S).tgz
( cd "$OUT" && tar czf "/tmp/$name" --exclude='visit*.tgz' . && find . -mindepth 1 ! -name 'visit*.tgz' -delete \
  && mv "/tmp/$name" . )
