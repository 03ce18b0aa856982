#!/usr/bin/env bash
# A device visit in named steps, each bounded by what is left of a total budget; logs under
# $OUT/<step>.txt and a one-line summary each; a failing step never stops the next.
# Usage: bash lab/visit.sh SECONDS STEP...   (from the repository root, on the device)
#   build         kernels of h200 and h200-sm80 (16 parallel compiles); build-h200, build-sm80: one of them;
#                 build-bf16: h200's bf16 forward and decode kernels (what tools/sanitize_case.py calls)
#   build-release the kernels of lab/release-src (lab/make_release.sh COMMIT made it)
#   gpu-h200, gpu-sm80   every GPU test under that profile, 16 pytest-xdist workers (the kernels they JIT build in parallel)
#   verify-h200   flashtune verify --profile h200
#   sanitize      compute-sanitizer memcheck, racecheck and synccheck on tools/sanitize_case.py h200
#   ab-bf16, ab-fp16     the FA grid: today's kernels, the release's and SDPA's cuDNN in one
#                 process (lab/release_ab.py), JSON in $OUT; ab-bf16-2 etc.: another round, files of its own;
#                 AB_PROFILE (h200) the profile, AB_ARGS more bench options (e.g. "--hdims 128")
#   decode-smoke  lab/decode_smoke.py under h200 (a minute: a few decode kernels and cases)
#   decode-64, decode-128, decode-256   flashtune bench --decode for that head dim (h200), JSON and plot
#   fa-grid       issue 35's prefill grid: bench --profile h200 beside cuDNN, bf16, two runs; fa-grid-more: fp16
#                 beside cuDNN, and h200-sm80 beside SDPA flash
#   decode-splits lab/decode_splits.py: every split count on 45 cells, short calls to large ones, beside SDPA (builds its kernels)
#   ncu-decode    Nsight Compute on the short decode calls (lab/ncu_cells.py decode:...): each kernel's duration,
#                 launch and warp stalls, flashtune beside SDPA cuDNN
#   ncu-bwd       Nsight Compute on the backward's weakest cells (hdim 64 x 512 and 1k tokens, hdim 128 causal
#                 16k): flashtune's passes and kernel beside cuDNN's, durations, launch, warp stalls
#   bwd-ab-wg     lab/bwd_ab.py with today's wgmma backward beside the release's (make_release.sh) and cuDNN;
#                 bwd-ab-wg-short: the FA grid's hdim 64/128 cells alone (no GQA); bwd-ab-trees: those cells
#                 with every other lab/NAME-src tree's wgmma backward too (make_release.sh COMMIT NAME)
#   bwd-tests-h200  tests/test_backward_gpu.py under h200 alone (bwd-tests: under h200 and h200-sm80)
#   bench-bwd-h200  bench --pass bwd under h200, hdim 64/128, beside SDPA cuDNN and flash (JSON in $OUT)
#   ncu-fp8all    Nsight Compute on the h100 profile's (FP8_PROFILE) bf16 and all-FP8 kernels at hdim 128 non-causal 16k (NCU_CELL
#                 another): pipe utilisation (tensor, XU for the exps, FMA), warp stalls, the all-FP8 kernel's SASS
#                 page with per-instruction stalls (issue 36: by its SASS, a warp's iteration is 8 QGMMA, 64 MUFU.EX2
#                 and about 420 instructions, and the kernel takes about twice the time of its tensor or MUFU work
#                 alone; poly-exp, which eased MUFU, lost 10%)
#   ncu-bwd-l2    Nsight Compute's L2 hit rates of the wgmma backward's dQ reduce-adds and loads, and its DRAM
#                 bytes, at hdim 64 x 512 and 16k tokens (does a short sequence's first add to each dQ line miss?)
#   ncu-bwd-wg    Nsight Compute on the wgmma backward (h200, hdim 128, non-causal 4k; NCU_CELL=bwd:D:CAUSAL:N
#                 another) beside cuDNN's: details
#                 page of both, our kernel's SASS page with per-instruction stalls (lab/ncu_sass_summary.py)
#   mqa-rows      lab/decode_mqa_rows.py: MQA one-token short calls on 16-row tiles and 32 x 32 beside the runtime's 32 x 16
#   ceiling-h64   tune --tiles 128x128 at hdim 64, non-causal: the 128-row tile's TFLOPS (the KV-cache kernel's
#                 ceiling for MQA with 4 tokens at hdim 64, which needs ~490 TFLOPS for 90% of the H200's copy)
#   decode-anchors  bench --decode, hdim 128, on the anchor file's cells the default grid lacks (32 and 128 x 4k, 64 x 32k)
#   decode-sm80   bench --decode under h200-sm80 (the RTX cards' decode path) on the large cells, beside cuDNN
#   tune-decode   flashtune tune --decode --hdims 128 under h200; the written profile in $OUT
#   build-some    lab/build_some.py decode bwd --release: only the decode (q1, hdim 64/128) and backward kernels, today's and the release's
#   build-cache   lab/build_some.py cache: only the KV-cache kernels decode-q4 times
#   ab-pdl        bench --decode with the release's decode beside today's: q1 short calls, MQA and 8 KV heads (the dependent launch's A/B)
#   ab-decode     bench --decode with the release's decode beside today's (small cells, MQA, pages of 16), JSON in $OUT
#   ab-paged      bench --decode, hdim 128, 8 KV heads, contiguous and pages of 16 and 64, the release's beside today's
#                 (release: lab/make_release.sh a3d4199, the block table read per refill; build-release first)
#   ab-short      bench --decode, MQA one-token calls (hdim 64/128, batch 1-128, 1k-128k keys), the release's beside
#                 today's and SDPA's backends (a short call's 16-row tiles; release: make_release.sh 896fa82)
#   ab-short-gqa  the same on 1k and 16k caches with 1, 8 and 32 KV heads, beside SDPA default and cuDNN (short calls' splits)
#   ab-rowgroups  bench --decode, hdim 256 MQA one-token calls (16k-128k keys, contiguous and pages of 64), the
#                 release's (two 16-row CTAs a KV head) beside today's (branch exp/row-groups: one CTA, two row
#                 groups sharing each ring) and SDPA flash and cuDNN; release: make_release.sh main
#   ab-rowpair    bench --decode, MQA one-token calls at hdim 64/128/256 (two 16-row blocks a KV head at hdim 256 and
#                 in short calls), the release's beside today's and SDPA flash and cuDNN (the row blocks' grid order)
#   host-profile  lab/host_profile.py: host microseconds of one decode call (flashtune's paths, SDPA) and cProfile's top
#                 functions (issue 34's per-call host time); then again with cProfile of generate's path
#                 (hf.attention_forward on a dynamic cache's keys growing one a call)
#   ab-combine    bench --decode on the calls the combine kernel merges (MQA and 8 KV heads, 16k-128k keys, 1 and 4
#                 tokens), the release's beside today's (branch exp/combine-one-round; release: make_release.sh main)
#   cluster-ab    lab/cluster_ab.py: a few splits merged in a cluster against the combine kernel, short calls, beside cuDNN
#   cluster-check the cluster merge's GPU tests, then bench --decode on the cells it won and lost (hdim 128 MQA and
#                 32 KV heads, hdim 64 8 KV heads; batch 1-32, 1k-16k)
#   decode-tests  the decode GPU tests under h200: KV cache, e4m3 cache, variants, head dims, bench --decode (16 workers)
#   kvcache-tests tests/test_kvcache_gpu.py under h200 (the KV-cache kernels' cases with the rest), 16 workers
#   decode-q4     bench --decode, hdim 64/128, MQA with 4 query tokens (128 packed rows: the KV-cache kernels), contiguous
#   decode-short  bench --decode, hdim 64/128, q1, contiguous: MQA over 1k-128k caches, and 8/32 KV heads over 1k (the short calls)
#   decode-paged  bench --decode, hdim 128, 8 KV heads, pages 0,1,16,64,256
#   decode-paged-large  the same with pages 0, 64 and 256 only (issue 33's within-5% bar for pages of 64 or more)
#   fp8kv-quick   bench --decode, hdim 64/128, 8 KV heads, batch 1 and 32, 16k and 128k: flashtune on a 16-bit and on an
#                 e4m3 cache beside cuDNN (a minute)
#   kv-fp8-tests  tests/test_kv_fp8_gpu.py under h200, 16 workers
#   ab-fp8kv      bench --decode, hdim 64/128/256, MQA and 8 KV heads, batch 1-32, 16k and 128k, contiguous and pages of
#                 64: flashtune on a 16-bit and an e4m3 cache, the release's on the e4m3 cache (release: make_release.sh main)
#   decode-fp8kv  bench --decode, hdim 128: flashtune on a 16-bit and on an e4m3 cache beside cuDNN
#   fp8all        issue 36's all-FP8 prefill under lab/profiles/h100-fp8all.yaml: its GPU tests (and the FP8 Q/K ones),
#                 then lab/fp8all_tiles.py (hdim 128 non-causal 4k-16k: bf16, FP8 Q/K, all-FP8 on 128x128, 128x192 (and
#                 without pingpong) and 192x64)
#   fp8all-h100   the all-FP8 tests, then bench --profile h100 at hdim 128 (its all-FP8 tiles beside bf16 and cuDNN)
#   fp8all-quick  the all-FP8 test without keys, then lab/fp8all_tiles.py (a visit with little time)
#   fp8all-tiles  lab/fp8all_tiles.py alone
#   fp8all-sanitize  the all-FP8 kernels built in parallel, then compute-sanitizer memcheck on tools/sanitize_case.py --fp8all
#   fp8-ceiling   lab/power_clock.py --dtype e4m3 under h100 (FP8_PROFILE=h200 on an H200): bf16 and e4m3 matrix products (the two ceilings) beside
#                 flashtune's bf16 and all-FP8 kernels (hdim 128 16k, hdim 256 8k), back to back with clock and power
#                 (FLOP per SM per clock), then side by side under the bench's timer (issue 36: how far the 1.5x
#                 bar is from the e4m3 products' own ratio to bf16)
#   xu-ceiling    lab/xu_ceiling.py: exps, e4m3/bf16 packs, FFMAs and mma.sync FLOPs per cycle per SM, each kernel's
#                 bound per head dim from its slowest pipe, and per cell of the last fp8all-pv bench the FP8 bound over
#                 the bf16 measured; after sm80-grid, per cell its mma.sync bound over FlashAttention-2's (issue 35)
#   sm80-grid     issue 35's sm80 bar: bench --profile h200-sm80 beside SDPA flash on the FA grid (fa-grid-more's second half)
#   fp8all-pv     under profile h100 (FP8_PROFILE=h200 for an H200; all-FP8 twins on fp8.pv_configs): the FP8 GPU
#                 tests, bench with flashtune-fp8 and -fp8all beside cuDNN, tune --fp8-all at hdim 128
#   bench-fp8all  bench under that profile with flashtune-fp8 and flashtune-fp8all beside cuDNN (hdim 64/128/256, 4k, 16k)
#   model-recall  bench --model recall (trains the recall model, about 2 min; consistency and task accuracy), JSON in $OUT;
#                 the model steps take the GPU's own profile (h100 on an H100; on 2026-12-07d, under h200 and its
#                 128x176 causal tiles, the recall model's TTFT was 0.94x SDPA's default)
#   recall-recipes  lab/recall_recipes.py first before repeat: the first recall recipe (repeated keys, 3,000 steps
#                 at 512 tokens) beside the one before it and repeats on 1,200 steps, scored at 4k and 16k, JSON in $OUT
#   prefill-recall  the recall model's attention shape (hdim 128, 4 query heads over 2 KV heads, batch 10, causal 4k
#                 and 16k) in the kernel grid under h100 and under h200, beside cuDNN: was its TTFT of 0.94x SDPA's
#                 default (2026-12-07d, under h200) h200's 128x176 tile on an H100?
#   gpu-spec      the sm90 prefill's GPU tests (ops, prefill variants, KV cache, head dims) under $FLASHTUNE_PROFILE
#                 (default h200): what a change to the mainloop or the softmax must pass
#   model-layout-trained  lab/model_layout.py's recall forward, random weights beside the bench's trained ones
#                 (trains them first, ~100 s): flashtune beside cuDNN, each kernel's total (spec_max's vote)
#   spec-ab       lab/spec_ab.py: the trained recall model's captured attention inputs (and random ones of their shape),
#                 today's prefill beside each SPEC_AB_TREES tree (lab/make_release.sh COMMIT NAME; default:
#                 main) and cuDNN, under SPEC_AB_PROFILE (h100): time and error against fp32 (spec_max's vote)
#   model-b1, model-b16   bench --model llama3-8b-like at full depth (32 layers), batch 1 or 16, 1k and 16k
#                 (MODEL_LENGTHS and MODEL_BACKENDS others)
#                 (1k/16k/64k at batch 1 ran past 590 s on an H100 on 2026-12-07); model-b1-64k: 64k at batch 1;
#                 model-b1-eager: the rows issue 34 asks for beside them (eager, SDPA math, flash-attn2 where it
#                 imports), SDPA's default first again so that consistency compares with the same backend
#   sm80-ab       after a change to the sm80 prefill (and lab/make_release.sh REV, lab/release-src carried): its GPU
#                 tests under h200-sm80, then the FA grid (bf16) with the tree's kernels beside the release's and
#                 SDPA flash, one process (issue 35's sm80 bar; whole-tile loads: lab/results/2026-12-07f_h100-visit/)
#   read-floor    lab/read_floor.py: a sum and a copy over the bytes of each model-bench decode call, GB/s and share
#                 of the large copy's (issue 34's 85% bar against what PyTorch's own kernels reach at those sizes)
#   model-layout  lab/model_layout.py: the recall model's attention alone on the bench's layout and on transformers',
#                 beside cuDNN, then inside the model each attention kernel's time and the forward's kernel totals;
#                 then decode calls as the bench and as the model make them (model-layout-h200: the h200 profile's
#                 tiles, which the recall bench of 2026-12-07d ran)
#   cupti-host    lab/cupti_host.py twice (plain, TEARDOWN_CUPTI=1): host us of a call before and after one profiler session
#   recall-next   lab/recall_recipes.py: 128 keys and values (seeds 0, 1 and 2) and the first recipe on seed 1: after
#                 the bench's training of the first recipe recalled only the 16 most frequent keys
#                 (lab/results/2026-12-07b_recall-h100/, ../2026-12-07b_recall-cpu/)
#   recall-hd     lab/recall_recipes.py: head dim 128 (4 heads), 128 keys, lr 1e-3 on seeds 0, 1 and 2 and 3e-3 on
#                 seed 0; recall-hd2: lr 3e-3 on seeds 1 and 2, and 512 keys
#                 (lab/results/2026-12-07c_recall-cpu/: on the CPU heads of 64 in place of 32 learnt every key on 3
#                 seeds of 4, and the fourth with lr 1e-3)
#   bwd-smoke     lab/bwd_smoke.py h200: one backward per head dim and mask against fp32, the kernel that ran
#   bwd-ab-mma    lab/bwd_ab.py on the mma.sync kernels only: today's 4 and 8 warps beside
#                 the release's 4 and 8 and cuDNN (release: make_release.sh main)
#   bwd-ab-tiled  the 8-warp mma.sync kernels, hdim 64/128 (BWD_AB_HDIMS=64,128,256 adds 256): today's, the release's,
#                 every other lab/NAME-src tree's (its h200-sm80 profile's choice) and SDPA flash's
#   bwd-ab-mma-short  the same, 8 warps only, hdim 64/128 without GQA (BWD_AB_HDIMS), and SDPA flash's, at most 130 s
#   bwd-tests-sm80  tests/test_backward_gpu.py under h200-sm80 alone
#   bwd-sanitize-sm80  compute-sanitizer memcheck, racecheck and synccheck on tools/sanitize_case.py h200-sm80 --backward
#   ncu-bwd-sm80  Nsight Compute on the 8-warp mma.sync backward and its prep/finish passes (hdim 128, 4k, under
#                 h200-sm80; NCU_CELL=bwd:D:CAUSAL:N another) beside SDPA flash's (FlashAttention-2's kernel and
#                 passes), details of all, our SASS page's per-instruction stall samples as CSV
#   bwd-ab        lab/bwd_ab.py: the wgmma backward, the mma.sync one, the release's and
#                 cuDNN's, bf16, hdim 64/128, 512-16k and GQA 4:1, correctness and time in one process, JSON in $OUT
#   tune-bwd      flashtune tune --backward --profile h200 (every backward tile on the backward alone); the profile in $OUT
#   bwd-tests     tests/test_backward_gpu.py under h200 (the wgmma backward) and h200-sm80 (mma.sync), 16 workers each
#   bwd-sanitize  compute-sanitizer memcheck, racecheck, synccheck on tools/sanitize_case.py h200 --backward
#   bench-bwd-ab  bench --pass bwd, hdim 64/128, under h200 (wgmma) and h200-sm80 (mma.sync), beside cuDNN and SDPA flash
#   bench-fwd-bwd-ab  the same with --pass fwd+bwd
#   bench-bwd-256 bench --pass bwd, hdim 256 (the mma.sync kernel under h200), beside cuDNN and SDPA flash
#   bench-bwd     bench --pass bwd and --pass fwd+bwd, hdim 64/128, beside cuDNN and SDPA flash (issue 37), JSON in $OUT
#   vdim-tests    tests/test_v_head_dim_gpu.py and the hf MLA/variants model test under h200, 16 workers
#   train         bench --train: the recall model trained 300 steps with SDPA (twice), flashtune and cuDNN (issue 37's training check)
#   hf-tests      the transformers GPU tests (tests/test_hf_gpu.py, the Phi-3 one, meta-tensor tracing) under h200,
#                 judged against fp32 math beside SDPA/eager in bf16 (tests/fp32_agreement.py)
#   bench-window  bench --window 4096 at hdim 128 on 4k (plain causal) and 32k tokens beside cuDNN and SDPA efficient
#                 (issue 38's bar: the window's cell at 0.8x the causal 4k cell's TFLOPS or more), JSON in $OUT
#   bench-mla     bench --hdims 192 --hdim-v 128 (DeepSeek's MLA prefill) at 1k, 4k and 16k beside SDPA's backends, JSON in $OUT
#   h192          the sm90 profiles' hdim-192 prefill kernel: the GPU tests at 192 and 136 under h200 (test_ops_gpu.py's
#                 192 cases, test_head_dims_gpu.py), then bench --hdims 192 beside cuDNN and SDPA flash (JSON in $OUT)
#   narrow        the sm90 narrow kernels (odd head dims and MLA's V read in place): test_head_dims_gpu.py's prefill and
#                 test_v_head_dim_gpu.py under h200, the bf16 prefill kernels and their narrow twins built, bench --hdims 96
#                 beside cuDNN and SDPA flash (JSON in $OUT); bench-mla gives 192/128. Sanitizers: `build-h200 sanitize`
#                 (tools/sanitize_case.py calls every kernel path: memcheck after this step's bf16 build alone spent
#                 over 280 s compiling the rest under the sanitizer on 2026-12-07)
#   mla           the sm90 kernels with V's own head dim (192/128, 128/64): test_v_head_dim_gpu.py under h200 (the kernel
#                 that ran checked), then bench-mla's command (issue 38's bar: 192/128 at 1.0x cuDNN or more)
#   eager-capture lab/eager_capture.py: the tracebacks of bench --model's eager row (its decode step's capture,
#                 then generate) and the stream's state after the capture
#   pack          every .txt log in $OUT into logs.tgz (the device returns at most 8 files a run)
set -uo pipefail
BUDGET=$1; shift
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FLASHTUNE_CACHE_DIR=/tmp/ftc FLASHTUNE_TEST_CACHE_DIR=/tmp/ftc \
  FLASHTUNE_RELEASE_CACHE_DIR=/tmp/ftc-release
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; END=$(( $(date +%s) + BUDGET ))
run() {  # run NAME MAX_SECONDS CMD...: bounded by MAX_SECONDS and by the visit's end
  local name=$1 max=$2; shift 2
  local left=$(( END - $(date +%s) )); [ $left -lt $max ] && max=$left
  if [ $max -le 5 ]; then echo "== $name: skipped (out of time)"; return; fi
  local start=$(date +%s); timeout $max "$@" > "$OUT/$name.txt" 2>&1; local rc=$?
  echo "== $name: rc=$rc in $(( $(date +%s) - start )) s | $(grep -v '^\s*$' "$OUT/$name.txt" | tail -1 | cut -c1-150)"
}
ab() {  # ab DTYPE [ROUND]
  local tag=$1${2:+_$2}
  run ab-$tag 240 python3 lab/release_ab.py ${AB_PROFILE:-h200} bench --profile ${AB_PROFILE:-h200} --dtype $1 ${AB_ARGS:-} \
    --backends flashtune,release,sdpa-cudnn --out "$OUT/ab_$tag.json"
}
fp8all_tiles() {  # issue 36: all-FP8 tiles outside the profile beside bf16, one process
  run fp8all-tiles 150 python3 lab/fp8all_tiles.py "$OUT/fp8all_tiles.json"
}
sm80_grid() {  # issue 35's sm80 bar: the FA grid under h200-sm80 beside SDPA flash
  run bench-fa-grid-sm80 280 python3 -m flashtune bench --profile h200-sm80 --backends flashtune,sdpa-flash \
    --out "$OUT/bench-fa-grid_sm80.json"
}
for step in "$@"; do case $step in
  build) run build-h200 200 python3 -m flashtune build --profile h200 --jobs 16
         run build-sm80 120 python3 -m flashtune build --profile h200-sm80 --jobs 16 ;;
  build-h200) run build-h200 200 python3 -m flashtune build --profile h200 --jobs 16 ;;
  build-bf16) run build-bf16 200 python3 -m flashtune build --profile h200 --dtypes bfloat16 --no-backward --jobs 16 ;;
  build-sm80) run build-sm80 120 python3 -m flashtune build --profile h200-sm80 --jobs 16 ;;
  build-release) run build-release 150 env PYTHONPATH=$PWD/lab/release-src python3 -m flashtune_release build \
                   --profile h200 --jobs 16 ;;
  gpu-h200) FLASHTUNE_PROFILE=h200 run gpu-h200 420 python3 -m pytest -q -n 16 --tb=short -p no:cacheprovider -m gpu tests/ \
              --deselect tests/test_sm90_probe_gpu.py ;;
  gpu-sm80) FLASHTUNE_PROFILE=h200-sm80 run gpu-sm80 300 python3 -m pytest -q -n 16 --tb=short -p no:cacheprovider -m gpu tests/ \
              --deselect tests/test_sm90_probe_gpu.py --deselect tests/test_hf_gpu.py ;;
  verify-h200) run verify-h200 420 python3 -m flashtune verify --profile h200 --jobs 16 ;;
  sanitize) for tool in memcheck racecheck synccheck; do
              run $tool 200 compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_case.py h200
            done ;;
  fp8all-sanitize) run fp8all-build 60 python3 lab/build_fp8all.py
         run fp8all-memcheck 150 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_case.py \
           lab/profiles/h100-fp8all.yaml --fp8all ;;
  decode-smoke) FLASHTUNE_PROFILE=h200 run decode-smoke 150 python3 lab/decode_smoke.py ;;
  decode-64|decode-128|decode-256) d=${step#decode-}
         run bench-decode-$d 580 python3 -m flashtune bench --profile h200 --decode --hdims $d \
           --out "$OUT/bench-decode_h$d.json" --plot "$OUT/bench-decode_h$d.png" ;;
  decode-splits) run decode-splits 420 env FLASHTUNE_TRUST_CU_SEQLENS=1 python3 lab/decode_splits.py "$OUT/decode-splits.json" ;;
  ncu-decode) run ncu-decode 240 ncu --clock-control none --profile-from-start off --section LaunchStats \
           --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
           python3 lab/ncu_cells.py h200 decode:128:1:1:1024 decode:128:1:8:1024 decode:128:1:1:16384 \
           decode:64:1:1:16384 decode:64:8:1:16384 decode:64:32:8:1024 ;;
  ncu-bwd) run ncu-bwd 240 ncu --clock-control none --profile-from-start off --section LaunchStats \
           --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
           python3 lab/ncu_cells.py h200 bwd:64:0:512 bwd:64:0:1024 bwd:128:1:16384 ;;
  mqa-rows) run mqa-rows 300 python3 lab/decode_mqa_rows.py "$OUT/mqa-rows.json" ;;
  ceiling-h64) run ceiling-h64 400 python3 -m flashtune tune --profile h200 --hdims 64 --no-causal --tiles 128x128 \
           --final-round 0 --json --out "$OUT/h64-128x128.yaml" ;;
  fa-grid) for r in 1 2; do run bench-fa-grid-bf16-$r 280 python3 -m flashtune bench --profile h200 \
           --backends flashtune,sdpa-cudnn --out "$OUT/bench-fa-grid_bf16_run$r.json"; done ;;
  fa-grid-more) run bench-fa-grid-fp16 280 python3 -m flashtune bench --profile h200 --dtype float16 \
           --backends flashtune,sdpa-cudnn --out "$OUT/bench-fa-grid_fp16.json"
         sm80_grid ;;
  sm80-grid) sm80_grid ;;
  decode-anchors) for cell in "32,128 4096" "64 32768"; do set -- $cell
           run bench-decode-anchors-$1 200 python3 -m flashtune bench --profile h200 --decode --hdims 128 \
             --heads-kv 8,32 --batches $1 --caches $2 --out "$OUT/bench-decode_anchors_b${1/,/-}.json"
         done ;;
  decode-sm80) run bench-decode-sm80 200 python3 -m flashtune bench --profile h200-sm80 --decode --hdims 64,128,256 \
           --heads-kv 1,8,32 --batches 8,32 --caches 131072 --seqlens-q 1 --backends flashtune,sdpa-cudnn \
           --out "$OUT/bench-decode_sm80.json" ;;
  tune-decode) run tune-decode 300 python3 -m flashtune tune --profile h200 --decode --hdims 128 --jobs 16 \
           --out "$OUT/h200-decode-tuned.yaml" ;;
  build-some) run build-some 300 env PYTHONPATH=$PWD:$PWD/lab/release-src python3 lab/build_some.py decode bwd --release ;;
  build-cache) run build-cache 200 python3 lab/build_some.py cache ;;
  ab-pdl) run ab-pdl 300 python3 lab/release_ab.py h200 bench --profile h200 --decode --hdims 64,128 \
           --heads-kv 1,8 --batches 1,8,32 --caches 1024,16384 --seqlens-q 1 --pages 0 \
           --backends flashtune,release,sdpa-cudnn --out "$OUT/ab_pdl.json" ;;
  ab-decode) run ab-decode 400 python3 lab/release_ab.py h200 bench --profile h200 --decode --hdims 64,128 \
           --heads-kv 1,8 --batches 1,8 --caches 1024,16384,131072 --seqlens-q 1 --pages 0,16 \
           --backends flashtune,release,sdpa-cudnn --out "$OUT/ab_decode.json" ;;
  ab-paged) run ab-paged 400 python3 lab/release_ab.py h200 bench --profile h200 --decode --hdims 128 \
           --heads-kv 8 --batches 1,8,32 --caches 16384,131072 --seqlens-q 1 --pages 0,16,64 \
           --backends flashtune,release,sdpa-cudnn --out "$OUT/ab_paged.json" ;;
  ab-short) run ab-short 300 python3 lab/release_ab.py h200 bench --profile h200 --decode --hdims 64,128 \
           --heads-kv 1 --batches 1,8,32,128 --caches 1024,16384,131072 --seqlens-q 1 --pages 0 \
           --backends flashtune,release,sdpa-default,sdpa-flash,sdpa-efficient,sdpa-cudnn --out "$OUT/ab_short.json" ;;
  ab-short-gqa) run ab-short-gqa 230 python3 lab/release_ab.py h200 bench --profile h200 --decode --hdims 64,128 \
           --heads-kv 1,8,32 --batches 1,8,32 --caches 1024,16384 --seqlens-q 1 --pages 0 \
           --backends flashtune,release,sdpa-default,sdpa-cudnn --out "$OUT/ab_short_gqa.json" ;;
  ab-rowgroups) run ab-rowgroups 300 python3 lab/release_ab.py h200 bench --profile h200 --decode --hdims 256 \
           --heads-kv 1 --batches 1,8,32 --caches 16384,65536,131072 --seqlens-q 1 --pages 0,64 \
           --backends flashtune,release,sdpa-flash,sdpa-cudnn --out "$OUT/ab_rowgroups.json" ;;
  ab-rowpair) run ab-rowpair 300 python3 lab/release_ab.py h200 bench --profile h200 --decode --hdims 64,128,256 \
           --heads-kv 1 --batches 1,8,32 --caches 1024,131072 --seqlens-q 1 --pages 0 \
           --backends flashtune,release,sdpa-flash,sdpa-cudnn --out "$OUT/ab_rowpair.json" ;;
  host-profile) run host-profile 120 python3 lab/host_profile.py h200
         run host-profile-growing 120 python3 lab/host_profile.py h200 "hf.attention_forward (keys growing one a call)" ;;
  ab-combine) run ab-combine 400 python3 lab/release_ab.py h200 bench --profile h200 --decode --hdims 64,128 \
           --heads-kv 1,8 --batches 1,8,32 --caches 16384,131072 --seqlens-q 1,4 --pages 0 \
           --backends flashtune,release,sdpa-default,sdpa-cudnn --out "$OUT/ab_combine.json" ;;
  cluster-ab) run cluster-ab 300 python3 lab/cluster_ab.py "$OUT/cluster-ab.json" ;;
  cluster-check) FLASHTUNE_PROFILE=h200 run cluster-tests 200 python3 -m pytest -q -n 16 --tb=short -p no:cacheprovider \
           tests/test_kvcache_gpu.py tests/test_kv_fp8_gpu.py -k "cluster or identical or graph or explicit or twin"
         run bench-cluster-128 150 python3 -m flashtune bench --profile h200 --decode --hdims 128 --heads-kv 1,32 \
           --batches 1,8,32 --caches 1024,16384 --seqlens-q 1 --pages 0 --out "$OUT/bench-cluster_h128.json"
         run bench-cluster-64 150 python3 -m flashtune bench --profile h200 --decode --hdims 64 --heads-kv 1,8,32 \
           --batches 1,8,32 --caches 1024,16384 --seqlens-q 1 --pages 0 --out "$OUT/bench-cluster_h64.json" ;;
  decode-tests) FLASHTUNE_PROFILE=h200 run decode-tests 420 python3 -m pytest -q -n 16 --tb=short -p no:cacheprovider \
    tests/test_kvcache_gpu.py tests/test_kv_fp8_gpu.py tests/test_variants_gpu.py tests/test_head_dims_gpu.py \
    tests/test_bench_decode_gpu.py ;;
  gpu-spec) FLASHTUNE_PROFILE=${FLASHTUNE_PROFILE:-h200} run gpu-spec 400 python3 -m pytest -q -n 16 --tb=short \
           -p no:cacheprovider tests/test_ops_gpu.py tests/test_variants_prefill_gpu.py tests/test_kvcache_gpu.py \
           tests/test_head_dims_gpu.py ;;
  kvcache-tests) FLASHTUNE_PROFILE=h200 run kvcache-tests 300 python3 -m pytest -q -n 16 --tb=short -p no:cacheprovider \
           tests/test_kvcache_gpu.py ;;
  decode-q4) run bench-decode-q4 300 python3 -m flashtune bench --profile h200 --decode --hdims 64,128 --heads-kv 1 \
           --batches 1,8,32,128 --caches 16384,131072 --seqlens-q 4 --pages 0 --out "$OUT/bench-decode_q4.json" ;;
  decode-short) run bench-decode-mqa 300 python3 -m flashtune bench --profile h200 --decode --hdims 64,128 --heads-kv 1 \
           --caches 1024,16384,131072 --seqlens-q 1 --pages 0 --out "$OUT/bench-decode_mqa.json"
         run bench-decode-1k 200 python3 -m flashtune bench --profile h200 --decode --hdims 64,128 --heads-kv 8,32 \
           --caches 1024 --seqlens-q 1 --pages 0 --out "$OUT/bench-decode_1k.json" ;;
  decode-paged) run bench-decode-paged 400 python3 -m flashtune bench --profile h200 --decode --hdims 128 \
           --heads-kv 8 --batches 1,8,32 --caches 16384,131072 --seqlens-q 1 --pages 0,1,16,64,256 \
           --out "$OUT/bench-decode_paged.json" --plot "$OUT/bench-decode_paged.png" ;;
  decode-paged-large) run bench-decode-paged-large 300 python3 -m flashtune bench --profile h200 --decode --hdims 128 \
           --heads-kv 8 --batches 1,8,32 --caches 16384,131072 --seqlens-q 1 --pages 0,64,256 \
           --out "$OUT/bench-decode_paged-large.json" ;;
  fp8kv-quick) run bench-fp8kv-quick 200 python3 -m flashtune bench --profile h200 --decode --hdims 64,128 \
           --heads-kv 8 --batches 1,32 --caches 16384,131072 --seqlens-q 1 --pages 0 \
           --backends flashtune,flashtune-fp8kv,sdpa-cudnn --out "$OUT/bench-fp8kv-quick.json" ;;
  kv-fp8-tests) FLASHTUNE_PROFILE=h200 run kv-fp8-tests 200 python3 -m pytest -q -n 16 --tb=short -p no:cacheprovider \
           tests/test_kv_fp8_gpu.py ;;
  ab-fp8kv) run ab-fp8kv 560 python3 lab/release_ab.py h200 bench --profile h200 --decode --hdims 64,128,256 \
           --heads-kv 1,8 --batches 1,8,32 --caches 16384,131072 --seqlens-q 1 --pages 0,64 \
           --backends flashtune,flashtune-fp8kv,release-fp8kv,sdpa-cudnn --out "$OUT/ab_fp8kv.json" ;;
  decode-fp8kv) run bench-decode-fp8kv 400 python3 -m flashtune bench --profile h200 --decode --hdims 128 \
           --heads-kv 8,32 --batches 1,8,32 --caches 16384,131072 --seqlens-q 1 --pages 0,64 \
           --backends flashtune,flashtune-fp8kv,sdpa-cudnn --out "$OUT/bench-decode_fp8kv.json" ;;
  model-recall) run bench-model-recall 590 python3 -m flashtune bench --model recall --prefill 4096,16384 \
           --batches 10 --decode-steps 128 --backends sdpa,flashtune,sdpa-cudnn,sdpa-flash \
           --out "$OUT/bench-model_recall.json" ;;
  prefill-recall) for p in h100 h200; do run prefill-recall-$p 150 python3 -m flashtune bench --profile $p --hdims 128 \
           --seqlens 4096,16384 --batches 10 --heads 4 --heads-kv 2 --causal --backends flashtune,sdpa-cudnn \
           --out "$OUT/prefill-recall_$p.json"; done ;;
  sm80-ab) run build-sm80-bf16 150 python3 -m flashtune build --profile h200-sm80 --dtypes bfloat16 --no-backward --jobs 16
         run build-release-sm80 150 env PYTHONPATH=$PWD/lab/release-src python3 -m flashtune_release build \
           --profile h200-sm80 --dtypes bfloat16 --no-backward --jobs 16
         FLASHTUNE_PROFILE=h200-sm80 run sm80-ab-tests 240 python3 -m pytest -q -n 16 --tb=short -p no:cacheprovider \
           -m gpu tests/test_ops_gpu.py tests/test_head_dims_gpu.py tests/test_variants_prefill_gpu.py tests/test_fp8_gpu.py
         run ab-sm80 280 python3 lab/release_ab.py h200-sm80 bench --profile h200-sm80 \
           --backends flashtune,release,sdpa-flash --out "$OUT/ab_sm80.json" ;;
  read-floor) run read-floor 120 python3 lab/read_floor.py "$OUT/read_floor.json" ;;
  model-layout) run model-layout 240 python3 lab/model_layout.py - "$OUT/model_layout.json" ;;
  model-layout-trained) run model-layout-trained 420 python3 lab/model_layout.py - "$OUT/model_layout_trained.json" trained ;;
  spec-ab) trees=${SPEC_AB_TREES:-main}; profile=${SPEC_AB_PROFILE:-h100}
         flags="--profile $profile --dtypes bfloat16 --hdims 128 --no-decode --no-backward --no-narrow --jobs 6"
         run spec-ab-build 240 bash -c "python3 -m flashtune build $flags & for n in $trees; do
           env PYTHONPATH=$PWD/lab/\$n-src:$PWD FLASHTUNE_\${n^^}_CACHE_DIR=/tmp/ftc-\$n python3 -m flashtune_\$n build $flags &
           done; wait"
         run spec-ab 360 python3 lab/spec_ab.py $profile "$OUT/spec_ab.json" $trees ;;
  model-layout-h200) run model-layout-h200 240 python3 lab/model_layout.py h200 "$OUT/model_layout_h200.json" ;;
  recall-recipes) run recall-recipes 480 python3 lab/recall_recipes.py "$OUT/recall_recipes.json" first before repeat ;;
  cupti-host) run cupti-host 60 python3 lab/cupti_host.py
         run cupti-host-teardown 60 env TEARDOWN_CUPTI=1 python3 lab/cupti_host.py ;;
  recall-next) run recall-next 480 python3 lab/recall_recipes.py "$OUT/recall_next.json" keys128 keys128-seed1 \
           keys128-seed2 first-seed1 ;;
  recall-hd) run recall-hd 480 python3 lab/recall_recipes.py "$OUT/recall_hd.json" keys128-hd128-lr1e-3 \
           keys128-hd128-lr1e-3-seed1 keys128-hd128-lr1e-3-seed2 keys128-hd128 ;;
  recall-hd2) run recall-hd2 400 python3 lab/recall_recipes.py "$OUT/recall_hd2.json" keys128-hd128-seed1 \
           keys128-hd128-seed2 hd128 ;;
  model-b1-64k) run bench-model-b1-64k 590 python3 -m flashtune bench --model llama3-8b-like --prefill 65536 \
           --batches 1 --decode-steps 256 --backends sdpa,flashtune,sdpa-cudnn,sdpa-flash \
           --out "$OUT/bench-model_b1-64k.json" ;;
  model-b1-eager) run bench-model-b1-eager 590 python3 -m flashtune bench --model llama3-8b-like --prefill 1024,16384 \
           --batches 1 --decode-steps 256 --backends sdpa,eager,sdpa-math,flash-attn2 \
           --out "$OUT/bench-model_b1-eager.json" ;;
  eager-capture) run eager-capture 120 python3 lab/eager_capture.py ;;
  model-b1|model-b16) b=${step#model-b}; lengths=${MODEL_LENGTHS:-1024,16384}
         run bench-model-b$b 590 python3 -m flashtune bench --model llama3-8b-like --prefill $lengths \
           --batches $b --decode-steps 256 --backends ${MODEL_BACKENDS:-sdpa,flashtune,sdpa-cudnn,sdpa-flash} \
           --out "$OUT/bench-model_b$b.json" --plot "$OUT/bench-model_b$b.png" ;;
  vdim-tests) FLASHTUNE_PROFILE=h200 run vdim-tests 200 python3 -m pytest -q -n 16 --tb=short -p no:cacheprovider \
           tests/test_v_head_dim_gpu.py "tests/test_hf_gpu.py::test_models_with_windows_softcap_and_sinks_generate_like_eager" ;;
  bwd-smoke) run bwd-smoke 120 python3 lab/bwd_smoke.py h200 ;;
  bwd-ab) run bwd-ab 450 python3 lab/bwd_ab.py "$OUT/bwd_ab.json" ;;
  bwd-ab-mma) run bwd-ab-mma 450 python3 lab/bwd_ab.py "$OUT/bwd_ab_mma.json" \
           mma.sync,mma.sync-w8,release-mma.sync,release-mma.sync-w8 ;;
  bwd-ab-mma-short) run bwd-ab-mma 130 env BWD_AB_HDIMS=64,128 python3 lab/bwd_ab.py "$OUT/bwd_ab_mma.json" \
           mma.sync-w8,release-mma.sync-w8,sdpa-flash ;;
  bwd-ab-tiled) run bwd-ab-tiled 260 env BWD_AB_HDIMS=${BWD_AB_HDIMS:-64,128} BWD_AB_TREE_PROFILE=h200-sm80 python3 lab/bwd_ab.py \
           "$OUT/bwd_ab_tiled.json" "mma.sync-w8,release-mma.sync-w8$(for d in lab/*-src; do n=${d#lab/}; n=${n%-src}; \
           [ "$n" = release ] || printf ',%s' "$n"; done),sdpa-flash" ;;
  bwd-ab-wg) run bwd-ab-wg 300 python3 lab/bwd_ab.py "$OUT/bwd_ab_wg.json" wgmma-tma,release ;;
  bwd-ab-wg-short) run bwd-ab-wg 230 env BWD_AB_HDIMS=64,128 python3 lab/bwd_ab.py "$OUT/bwd_ab_wg.json" \
           wgmma-tma,release ;;
  bwd-ab-trees) trees=$(for d in lab/*-src; do n=${d#lab/}; n=${n%-src}; [ "$n" = release ] || printf ',%s' "$n"; done)
         run bwd-ab-trees 450 env BWD_AB_HDIMS=64,128 python3 lab/bwd_ab.py "$OUT/bwd_ab_trees.json" \
           "wgmma-tma,release$trees" ;;
  bwd-tests-h200) FLASHTUNE_PROFILE=h200 run bwd-tests-h200 240 python3 -m pytest -q -n 16 --tb=short \
           -p no:cacheprovider -o faulthandler_timeout=120 tests/test_backward_gpu.py ;;
  bench-bwd-h200) run bench-bwd-h200 200 python3 -m flashtune bench --profile h200 --pass bwd --hdims 64,128 \
           --backends flashtune,sdpa-cudnn,sdpa-flash --out "$OUT/bench-bwd_h200.json" ;;
  bwd-tests-sm80) FLASHTUNE_PROFILE=h200-sm80 run bwd-tests-h200-sm80 240 python3 -m pytest -q -n 16 --tb=short \
           -p no:cacheprovider -o faulthandler_timeout=120 tests/test_backward_gpu.py ;;
  bwd-sanitize-sm80) for tool in memcheck racecheck synccheck; do
              run bwd-sm80-$tool 150 compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_case.py \
                h200-sm80 --backward
            done ;;
  ncu-bwd-sm80) run ncu-bwd-sm80 150 ncu --clock-control none --profile-from-start off --section LaunchStats \
           --section SpeedOfLight --section WarpStateStats --section SourceCounters --section Occupancy \
           --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section SchedulerStats \
           --section ComputeWorkloadAnalysis --section InstructionStats \
           -k 'regex:flashtune_bwd.*_w8_sm90(_prep|_finish)?$|flash_bwd_dq_dk_dv|flash_bwd_convert_dq|flash_bwd_dot_do_o' \
           -o "$OUT/ncu-bwd-sm80" env NCU_BACKENDS=flashtune,sdpa-flash python3 lab/ncu_cells.py h200-sm80 \
           ${NCU_CELL:-bwd:128:0:4096}
         run ncu-bwd-sm80-details 60 ncu -i "$OUT/ncu-bwd-sm80.ncu-rep" --page details
         run ncu-bwd-sm80-source 60 sh -c "ncu -i '$OUT/ncu-bwd-sm80.ncu-rep' -k 'regex:flashtune_bwd.*_w8_sm90$' --page source --csv --print-source sass \
           | gzip > '$OUT/ncu-bwd-sm80_sass.csv.gz'"
         run ncu-bwd-sm80-fa2-source 60 sh -c "ncu -i '$OUT/ncu-bwd-sm80.ncu-rep' -k 'regex:flash_bwd_dq_dk_dv' --page source --csv \
           --print-source sass | gzip > '$OUT/ncu-bwd-sm80-fa2_sass.csv.gz'" ;;
  ncu-bwd-wg) run ncu-bwd-wg 200 ncu --clock-control none --profile-from-start off --section LaunchStats \
           --section SpeedOfLight --section WarpStateStats --section SourceCounters --section Occupancy \
           --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
           -k 'regex:flashtune_bwd.*_wg2_sm90a$|cudnn_generated.*bprop' \
           -o "$OUT/ncu-bwd-wg" python3 lab/ncu_cells.py h200 "${NCU_CELL:-bwd:128:0:4096}"
         run ncu-bwd-wg-details 60 ncu -i "$OUT/ncu-bwd-wg.ncu-rep" --page details
         run ncu-bwd-wg-source 60 sh -c "ncu -i '$OUT/ncu-bwd-wg.ncu-rep' -k 'regex:flashtune_bwd' --page source --csv \
           --print-source sass | gzip > '$OUT/ncu-bwd-wg_sass.csv.gz'" ;;
  ncu-fp8all) NCU_BACKENDS=flashtune,flashtune-fp8all run ncu-fp8all 200 ncu --clock-control none --profile-from-start off \
           --section LaunchStats --section SpeedOfLight --section WarpStateStats --section SourceCounters \
           --section Occupancy --section ComputeWorkloadAnalysis -k 'regex:flashtune_fwd_sm90' \
           -o "$OUT/ncu-fp8all" python3 lab/ncu_cells.py "${FP8_PROFILE:-h100}" "${NCU_CELL:-128:0:16384}"
         run ncu-fp8all-details 60 ncu -i "$OUT/ncu-fp8all.ncu-rep" --page details
         run ncu-fp8all-source 60 sh -c "ncu -i '$OUT/ncu-fp8all.ncu-rep' -k 'regex:fp8all' --page source --csv \
           --print-source sass | gzip > '$OUT/ncu-fp8all_sass.csv.gz'" ;;
  ncu-bwd-l2) run ncu-bwd-l2 200 ncu --clock-control none --profile-from-start off -k 'regex:flashtune_bwd.*_wg2_sm90a$' \
           --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
           python3 lab/ncu_cells.py h200 bwd:64:0:512 bwd:64:0:16384 ;;
  tune-bwd) run tune-bwd 300 python3 -m flashtune tune --backward --profile h200 --out "$OUT/h200-bwd-tuned.yaml" ;;
  bwd-tests) for prof in h200 h200-sm80; do
           FLASHTUNE_PROFILE=$prof run bwd-tests-$prof 240 python3 -m pytest -q -n 16 --tb=short -p no:cacheprovider \
             -o faulthandler_timeout=120 \
             tests/test_backward_gpu.py
         done ;;
  bwd-sanitize) for tool in memcheck racecheck synccheck; do
              run bwd-$tool 150 compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_case.py h200 --backward
            done ;;
  bench-bwd-ab) for prof in h200 h200-sm80; do
           run bench-bwd-$prof 200 python3 -m flashtune bench --profile $prof --pass bwd --hdims 64,128 \
             --backends flashtune,sdpa-cudnn,sdpa-flash --out "$OUT/bench-bwd_$prof.json"
         done ;;
  bench-fwd-bwd-ab) for prof in h200 h200-sm80; do
           run bench-fwd-bwd-$prof 240 python3 -m flashtune bench --profile $prof --pass fwd+bwd --hdims 64,128 \
             --backends flashtune,sdpa-cudnn,sdpa-flash --out "$OUT/bench-fwd-bwd_$prof.json"
         done ;;
  bench-bwd-256) run bench-bwd-256 200 python3 -m flashtune bench --profile h200 --pass bwd --hdims 256 \
           --backends flashtune,sdpa-cudnn,sdpa-flash --out "$OUT/bench-bwd_h256.json" ;;
  bench-bwd) for pass in bwd fwd+bwd; do
           run bench-${pass/+/-} 300 python3 -m flashtune bench --profile h200 --pass $pass --hdims 64,128 \
             --backends flashtune,sdpa-cudnn,sdpa-flash --out "$OUT/bench-${pass/+/-}.json"
         done ;;
  train) run bench-train 300 python3 -m flashtune bench --profile h200 --train --train-steps 300 \
           --backends sdpa,flashtune,sdpa-cudnn --out "$OUT/bench-train.json" --plot "$OUT/bench-train.png" ;;
  hf-tests) FLASHTUNE_PROFILE=h200 run hf-tests 300 python3 -m pytest -q -n 16 --tb=short -p no:cacheprovider \
           tests/test_hf_gpu.py tests/test_compile_tracing.py "tests/test_head_dims_gpu.py::test_a_phi3_like_model_with_head_dim_96_generates_as_close_to_fp32_as_sdpa" ;;
  bench-window) run bench-window 300 python3 -m flashtune bench --profile h200 --hdims 128 --seqlens 4096,32768 \
           --batches 1 --heads 16 --window 4096 --backends flashtune,sdpa-cudnn,sdpa-efficient \
           --out "$OUT/bench-window.json" ;;
  h192) FLASHTUNE_PROFILE=h200 run h192-tests 240 python3 -m pytest -q -n 16 --tb=short -p no:cacheprovider \
           -k "(192 or head_dims) and not phi3" tests/test_ops_gpu.py tests/test_head_dims_gpu.py
         run bench-h192 200 python3 -m flashtune bench --profile h200 --hdims 192 --backends flashtune,sdpa-cudnn,sdpa-flash \
           --out "$OUT/bench-h192.json" ;;
  narrow) FLASHTUNE_PROFILE=h200 run narrow-tests 240 python3 -m pytest -q -n 16 --tb=short -p no:cacheprovider \
           -k "prefill or v_head_dim" tests/test_head_dims_gpu.py tests/test_v_head_dim_gpu.py
         run build-narrow 200 python3 -m flashtune build --profile h200 --dtypes bfloat16 --no-decode --no-backward --jobs 16
         run bench-h96 200 python3 -m flashtune bench --profile h200 --hdims 96 --backends flashtune,sdpa-cudnn,sdpa-flash \
           --out "$OUT/bench-h96.json" ;;
  mla) FLASHTUNE_PROFILE=h200 run mla-tests 200 python3 -m pytest -q -n 16 --tb=short -p no:cacheprovider \
           tests/test_v_head_dim_gpu.py
       run bench-mla 150 python3 -m flashtune bench --profile h200 --hdims 192 --hdim-v 128 --seqlens 1024,4096,16384 \
           --backends flashtune,sdpa-cudnn,sdpa-flash,sdpa-efficient --out "$OUT/bench-mla.json" ;;
  bench-mla) run bench-mla 150 python3 -m flashtune bench --profile h200 --hdims 192 --hdim-v 128 --seqlens 1024,4096,16384 \
           --backends flashtune,sdpa-cudnn,sdpa-flash,sdpa-efficient --out "$OUT/bench-mla.json" ;;
  fp8all) FLASHTUNE_PROFILE=lab/profiles/h100-fp8all.yaml run fp8all-tests 240 python3 -m pytest -q -rP -n 16 --tb=short \
           -p no:cacheprovider tests/test_fp8_all_gpu.py tests/test_fp8_gpu.py
         run fp8all-tiles 150 python3 lab/fp8all_tiles.py "$OUT/fp8all_tiles.json" ;;
  fp8all-quick) FLASHTUNE_PROFILE=lab/profiles/h100-fp8all.yaml run fp8all-nokeys 60 python3 -m pytest -q --tb=short \
           -p no:cacheprovider tests/test_fp8_all_gpu.py -k without_keys
         fp8all_tiles ;;
  fp8all-tiles) fp8all_tiles ;;
  fp8all-pv) FLASHTUNE_PROFILE=${FP8_PROFILE:-h100} run fp8all-pv-tests 240 python3 -m pytest -q -n 16 --tb=short \
           -p no:cacheprovider tests/test_fp8_all_gpu.py tests/test_fp8_gpu.py
         run bench-fp8all-pv 200 python3 -m flashtune bench --profile "${FP8_PROFILE:-h100}" --hdims 64,128,256 \
           --seqlens 4096,16384 --backends flashtune,flashtune-fp8,flashtune-fp8all,sdpa-cudnn --out "$OUT/bench-fp8all-pv.json"
         run tune-fp8all 300 python3 -m flashtune tune --profile "${FP8_PROFILE:-h100}" --fp8-all --hdims 128 \
           --time-budget 240 --max-candidates 6 --out "$OUT/${FP8_PROFILE:-h100}-pv-tuned.yaml" ;;
  fp8all-h100) FLASHTUNE_PROFILE=h100 run fp8all-h100-tests 200 python3 -m pytest -q -n 16 --tb=short -p no:cacheprovider \
           tests/test_fp8_all_gpu.py
         run bench-fp8all-h100 240 python3 -m flashtune bench --profile h100 --hdims 128 --seqlens 4096,16384 \
           --backends flashtune,flashtune-fp8all,sdpa-cudnn --out "$OUT/bench-fp8all-h100.json" ;;
  fp8-ceiling) run fp8-ceiling 240 python3 lab/power_clock.py --profile "${FP8_PROFILE:-h100}" --dtype e4m3 --matmuls 4096,8192,16384 \
           --json "$OUT/fp8_ceiling.json"
         run fp8-ceiling-bench 200 python3 lab/power_clock.py --profile "${FP8_PROFILE:-h100}" --dtype e4m3 --timer bench \
           --matmuls 4096,8192,16384 --json "$OUT/fp8_ceiling_bench.json" ;;
  xu-ceiling) run xu-ceiling 60 python3 lab/xu_ceiling.py "$OUT/xu_ceiling.json" \
           lab/results/2026-12-07c_h100-visit/bench-fp8all-pv.json $(ls "$OUT/bench-fa-grid_sm80.json" 2>/dev/null) ;;
  bench-fp8all) run bench-fp8all 200 python3 -m flashtune bench --profile lab/profiles/h100-fp8all.yaml --hdims 64,128,256 \
           --seqlens 4096,16384 --backends flashtune,flashtune-fp8,flashtune-fp8all,sdpa-cudnn --out "$OUT/bench-fp8all.json" ;;
  pack) (cd "$OUT" && tar czf logs.tgz *.txt && rm -f *.txt) && echo "== pack: $OUT/logs.tgz" ;;
  ab-bf16|ab-bf16-[0-9]) ab bfloat16 $(echo "$step" | sed -n 's/^ab-bf16-//p') ;;
  ab-fp16|ab-fp16-[0-9]) ab float16 $(echo "$step" | sed -n 's/^ab-fp16-//p') ;;
  *) echo "== $step: unknown step" ;;
esac; done
