// Every size of the sm90-family kernel, derived from its template parameters.
// flashtune/tiles.py mirrors these rules (block_m = 64 x consumer warpgroups, ...).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

// The consumer schedule (issue 9), each step measured on the H200 (docs/kernel-notes.md) and
// on by default; a profile's nvcc_flags can turn one off ("-DFLASHTUNE_SM90_OVERLAP=0"), and
// the flags are part of the build cache key (tools/experiments/ holds the A/B profiles).
// OVERLAP: the softmax of S_j runs while P_(j-1) V_(j-1) is on the tensor cores.
#ifndef FLASHTUNE_SM90_OVERLAP
#define FLASHTUNE_SM90_OVERLAP 1
#endif
// PINGPONG: the consumer warpgroups issue their wgmmas in turn (named barriers), so one's
// softmax runs under another's GEMMs. Part of the overlap's schedule: off without it.
#ifndef FLASHTUNE_SM90_PINGPONG
#define FLASHTUNE_SM90_PINGPONG 1
#endif
// PERSISTENT: one CTA per SM loops over the tiles (causal and varlen ones from a counter), so
// a tile's Q and first K/V blocks load under the last one.
#ifndef FLASHTUNE_SM90_PERSISTENT
#define FLASHTUNE_SM90_PERSISTENT 1
#endif

// Q_BUFFERS (experiment, 1 by default, except where DEFER_EPILOGUE brings a second): 2 lets the
// persistent grid load the next tile's Q (and then its first K/V blocks) while this tile still
// runs; tiles without room for a second Q tile keep one.
#ifndef FLASHTUNE_SM90_Q_BUFFERS
#define FLASHTUNE_SM90_Q_BUFFERS 1
#endif

// DEFER_EPILOGUE: a tile's epilogue (O's normalisation and stores) runs in the next tile, once
// that tile's S_0 is issued, so the stores overlap a GEMM instead of leaving the tensor cores
// idle (0.9 us of every 3-7 us tile at hdim 64 causal 512, tools/tile_trace.py). It needs the
// next tile's Q in early, so it brings a second Q buffer (where one fits beside the rings and
// the O tile). 2 (the default): at every head dim with room (hdim 64, hdim 128 128x128; the H200
// measured +3-7% at hdim 64 below 2k, +3-6% at hdim 128 non-causal below 2k, causal neutral);
// 1: at hdim 64 only (the default until 2026-12-03); 0: off.
#ifndef FLASHTUNE_SM90_DEFER_EPILOGUE
#define FLASHTUNE_SM90_DEFER_EPILOGUE 2
#endif

// CTAS_PER_SM (experiment, 1 by default): 2 puts two CTAs of a 64-row tile (one consumer
// warpgroup each, no pingpong) on every SM where their shared memory fits: two independent tiles
// whose softmax, epilogue and tile start each run under the other's GEMMs, instead of two
// warpgroups that start, wait and store in step on one tile. The registers per CTA halve: the
// producer keeps 40, the consumer gets 216. Tiles of 128 or 192 rows keep one CTA. Measured on
// the H200 at hdim 64 below 2k: -1 to -7% against the default (docs/kernel-notes.md).
#ifndef FLASHTUNE_SM90_CTAS_PER_SM
#define FLASHTUNE_SM90_CTAS_PER_SM 1
#endif

// TMA_STORE: the epilogue stages O in shared memory and one thread per warpgroup stores it
// with the TMA, where an O tile fits beside Q and the rings (hdim 64 192x128, hdim 128 causal
// 128x128, FP8 twins; not hdim 128 128x176 or hdim 256 128x80). Varlen calls keep direct
// stores: a tile's rows past its sequence belong to the next one.
#ifndef FLASHTUNE_SM90_TMA_STORE
#define FLASHTUNE_SM90_TMA_STORE 1
#endif

// STMATRIX: the TMA-store epilogue writes O into shared memory with stmatrix (four 8x8 matrices,
// 512 bytes a warp, per instruction) instead of 32-bit stores (128 bytes): a quarter of the
// instructions, in the epilogue that tools/tile_trace.py timed at 0.5 us of a 3-7 us tile
// (0.53 -> 0.45 us at hdim 64 causal 512 on the H200).
#ifndef FLASHTUNE_SM90_STMATRIX
#define FLASHTUNE_SM90_STMATRIX 1
#endif

// WIDE_STORES: where O is stored directly (no room for an O tile, or varlen), the bytes each
// thread stores at once. 1: each pair of threads in a quad swaps halves, so every thread stores
// 8 contiguous bytes (a warp's store fills 32-byte sectors, with half the store instructions of
// 0, 4 bytes). 2 (the default): a 4 x 4 transpose within each quad, 16 bytes (a quarter of
// 0's stores); tools/tile_trace.py on the H200: hdim 256's O stores 2.6 -> 1.9 us a 512-token tile.
#ifndef FLASHTUNE_SM90_WIDE_STORES
#define FLASHTUNE_SM90_WIDE_STORES 2
#endif

// TREE_MAX (experiment, 0 by default): each row's maximum over a block as 4 independent chains
// of fmaxf, combined at the end, instead of one chain through all its scores (a 32-64 deep
// dependency that every exp of the block waits for). Exact either way: max has no rounding.
#ifndef FLASHTUNE_SM90_TREE_MAX
#define FLASHTUNE_SM90_TREE_MAX 0
#endif

// POLY_EXP2 (experiment, 0 by default): k of every 8 scores take 2^x from poly_exp2 (FMA and
// integer pipes) instead of the MUFU unit, which at head dim 64 is as busy as the tensor cores.
#ifndef FLASHTUNE_SM90_POLY_EXP2
#define FLASHTUNE_SM90_POLY_EXP2 0
#endif

// SPLIT_S (experiment, 0 by default): each block's S = Q K^T as two wgmma groups of BN/2 keys,
// so the softmax of the first half runs while the second half is still on the tensor cores (a
// block's softmax starts half an S earlier); the halves are two online-softmax steps, and when
// the second moves a row's maximum the first half's P is rescaled before it is packed. Measured
// on the H200: a loss at every tile but 128x160 (-4 to -10% with 64-key halves, -8 to -19% at
// hdim 256's 40-key halves; 128x160 +0-5%, within the rounds' spread).
#ifndef FLASHTUNE_SM90_SPLIT_S
#define FLASHTUNE_SM90_SPLIT_S 0
#endif

// Q_IN_REGS (experiment, 0 by default): each consumer loads its 64 rows of Q into registers
// (ldmatrix, once per tile) and S = Q K^T reads only K from shared memory (wgmma with A from
// registers): a third less shared-memory traffic for S at hdim 64 128x128. Only where the
// fragments (D/4 registers) fit beside S, P and O (the model below), and not for FP8 Q.
// Measured on the H200: no change (hdim 64 causal 512 240 TFLOPS either way): shared memory
// bandwidth is not what holds the short tiles back.
#ifndef FLASHTUNE_SM90_Q_IN_REGS
#define FLASHTUNE_SM90_Q_IN_REGS 0
#endif

// SKIP_MASKED (experiment, 0 by default): in a causal diagonal or tail block, the 8-key groups
// that no row of a warp sees get P = 0 without their exps. At hdim 64 the MUFU unit is as busy
// as the tensor cores, and in a 128x128 diagonal block the first warpgroup's warps see 1-4 of the
// 8 16-key slices (hdim 64 causal 512: 4 of each tile's 10 blocks are diagonal). Measured on the
// H200: a loss, hdim 64 causal 512-1k -10 to -11%, hdim 128 causal 512-1k -3 to -7%.
#ifndef FLASHTUNE_SM90_SKIP_MASKED
#define FLASHTUNE_SM90_SKIP_MASKED 0
#endif

// LAZY_RESCALE: a row keeps its running maximum until a block's maximum exceeds it by more
// than 2^8 (FlashAttention-4's conditional rescaling): P then stays <= 256, O and the row sum
// share the stale maximum (the result is the same), and a warp whose rows all kept theirs skips
// O's rescale (D/2 multiplies per thread on the path to each P V). +3% at hdim 256 on the H200.
#ifndef FLASHTUNE_SM90_LAZY_RESCALE
#define FLASHTUNE_SM90_LAZY_RESCALE 1
#endif

// FLAT_TILES: a tile's last P V is issued with the next tile's S_0, in the same pingpong turn, and
// runs under that S_0's softmax, instead of being issued alone and waited for at the tile's end;
// the tile's epilogue follows once it is done (before the next tile's first P V). Only where the
// epilogue is deferred (a second Q buffer: the next tile's Q is in by then). 1: every such kernel
// (hdim 64, hdim 128 at 128x128); 2 (the default): the causal kernels at hdim 64, whose tiles are
// one to a few blocks long. On the H200: +2-4% at hdim 64 causal 512-2k, a loss of 2-7% at hdim
// 64 and 128 non-causal 512, even at hdim 128 causal (benchmarks/h200/2026-12-03_flat-tiles_ab*).
#ifndef FLASHTUNE_SM90_FLAT_TILES
#define FLASHTUNE_SM90_FLAT_TILES 2
#endif

// MUFU_TURN (experiment, 0 by default): the consumer warpgroups take turns on the exps of their
// softmax (named barriers, like PINGPONG's turns on the wgmmas), so one warpgroup's exps run while
// the other's GEMMs do and the MUFU unit is never split between two (cuDNN's hdim 64 kernel on the
// H200 passes such a turn around its exps, Nsight Compute's source view; but it has no GEMM turns
// and waits for each GEMM). Measured on the H200 on top of our schedule: a loss, 0.971x against
// 1.001x cuDNN over 12 cells (hdim 64 non-causal 512 and causal 2k -10%). With OVERLAP=0 (each
// GEMM waited for, no GEMM turns) it makes cuDNN's block structure: exp-sm90-cudnn-like.yaml, a
// loss of 16-22% at hdim 64 (benchmarks/h200/2026-12-03_cudnn-like_ab*).
#ifndef FLASHTUNE_SM90_MUFU_TURN
#define FLASHTUNE_SM90_MUFU_TURN 0
#endif

// COUNTER_MEMSET (the old behaviour, 0 by default): the launcher zeroes the tile counter of causal
// and varlen calls with a memset on the stream before each launch, even where it is a per-stream
// pair that the kernels leave at 0 (csrc/binding.cpp): the memset is a kernel of its own.
#ifndef FLASHTUNE_SM90_COUNTER_MEMSET
#define FLASHTUNE_SM90_COUNTER_MEMSET 0
#endif

// CLUSTER (experiment, 0 by default): non-causal kernels run as clusters of two CTAs on
// neighbouring SMs, each taking one of two adjacent m-blocks of a head; each CTA's producer loads
// half the rows of every K and V block and multicasts them to both (FlashAttention-3 does this at
// hdim >= 128 non-causal): half the L2-to-SM traffic (about 5 TB/s at hdim 128 non-causal 16k, on a card
// held at its 700 W limit: docs/kernel-notes.md). A slot is free once the consumers of both
// CTAs released it (one arrive per consumer warp on each CTA's barrier). 1: hdim >= 128; 2: every
// non-causal kernel. Measured on the H200: no gain (1.040x cuDNN against h200's 1.050x over the 18
// non-causal cells in two rounds, hdim 128 and 256 -7% to +7% a cell); at hdim 64 a loss of up to 30%
// at 512, where 3 m-blocks of 192 rows make 2 pairs, one CTA of which runs a tile with no rows.
// WIDE_CONSUMERS (experiment, 0 by default): with two consumer warpgroups, 240 registers each and
// 24 for the producer (FlashAttention-3's split) instead of 232 and 40. 1: hdim 256 only, where
// SPEC_MAX (=2) spills 116 bytes of the consumers' loop at 128x80 non-causal with 232 (at 240: none
// there; the producer's tile loop spills 56 bytes instead); 2: every two-consumer tile. Measured on
// the H200: SPEC_MAX at hdim 256 without the spills gained nothing (causal 1k -7 to -10%), and 2 with
// 128x192 tiles at hdim 128 non-causal 0.97-1.02x h200 at 8k-16k (exp-sm90-spec-wide, -h128-n192).
#ifndef FLASHTUNE_SM90_WIDE_CONSUMERS
#define FLASHTUNE_SM90_WIDE_CONSUMERS 0
#endif

#ifndef FLASHTUNE_SM90_CLUSTER
#define FLASHTUNE_SM90_CLUSTER 0
#endif

// SPLIT_TAIL (experiment, 0 by default): a non-causal persistent grid of G CTAs runs T equal tiles
// in T / G waves and a last one of T % G tiles, where the other SMs idle (hdim 128 non-causal, FA
// grid: 2048 tiles on the H200's 132 SMs, 15 waves and one of 68, 3% of the call). The last wave's
// K/V blocks are shared out evenly over all G CTAs instead (stream-K): a tile cut between CTAs is
// run as pieces, each of which writes its partial O, row maxima and sums to global scratch; the
// last piece of a tile to finish (a counter per tile and warpgroup) merges every piece's result in
// the tile's order (the same bits whichever finished last) and stores the tile. The launcher splits only where it saves at least 2% of the call. Measured on the H200: no
// gain (18 non-causal cells, two rounds: 1.045 / 1.042x cuDNN against h200's 1.053 / 1.055x, the
// short cells -2 to -6%; hdim 128 and 256 from 4k, three rounds: even), docs/kernel-notes.md.
#ifndef FLASHTUNE_SM90_SPLIT_TAIL
#define FLASHTUNE_SM90_SPLIT_TAIL 0
#endif

// SPEC_MAX: from a tile's second block on, the exps are taken against the rows' running maxima
// as they stand, without the block's own maximum (a chain of block_n / 2 FMNMX a row a thread,
// two shuffles, alpha's exps); if every thread's sum of a row's exps is at most 2^8 (so every P
// is: lazy rescaling's bound, and no maximum had to move), they stand, else S_j is computed again
// (K_j's slot is held until then) and takes the full step; NaN and overflow fail the test too.
// About 120 of 645 instructions a thread per block fewer at hdim 128 128x176. 1 (the default): hdim
// 64 and 128; 2: hdim 256 too, where ptxas spills 96-112 bytes with it. On the H200 (two rounds):
// hdim 128 +5-6% from 2k (non-causal 16k 678 / 660 -> 731 / 723 TFLOPS), hdim 64 +5% from 2k and
// -4% at non-causal 512, hdim 256 -2 to -4% (benchmarks/h200/2026-12-03_spec-*_ab*).
#ifndef FLASHTUNE_SM90_SPEC_MAX
#define FLASHTUNE_SM90_SPEC_MAX 1
#endif

// SPEC_MIN_BLOCKS (experiment, 0 by default): SPEC_MAX only in causal tiles and in non-causal ones
// of at least this many blocks (0: in every tile); shorter ones take the plain step, in the same
// loop behind a branch on the tile. Meant for hdim 64 non-causal 512-1k, which lost 1-4% to
// SPEC_MAX; measured on the H200 at 9: those cells lost another 7-8% (benchmarks/h200/
// 2026-12-03_spec-gate_fa-grid*): the loop with both paths in it is slower than either alone.
#ifndef FLASHTUNE_SM90_SPEC_MIN_BLOCKS
#define FLASHTUNE_SM90_SPEC_MIN_BLOCKS 0
#endif

// HALF_DIAGONAL (experiment, 0 by default): in causal kernels, a warpgroup whose rows see no key in
// the second half of its tile's last block (warpgroup 0 of a 128-row tile on the diagonal) computes
// that block's S with one k step over the whole block and the others over its first half, and P V
// over the first half's k steps only: 5/8 of S and half of P V for that warpgroup, of a 128x128
// block at hdim 64. The other half's scores are masked (-inf, P = 0) as before: the same result.
// 1: hdim 64 causal; 2: every causal kernel. Measured on the H200 (two rounds, causal 512-2k): no
// gain, hdim 64 causal 512 254 / 252 TFLOPS with and without (benchmarks/h200/2026-12-03_half-diagonal_ab*):
// the tensor cores are not what those tiles wait for.
#ifndef FLASHTUNE_SM90_HALF_DIAGONAL
#define FLASHTUNE_SM90_HALF_DIAGONAL 0
#endif

// S_AHEAD (experiment, 0 by default): S_(j+1) is issued one block ahead, with P_(j-1) V_(j-1) and
// before the softmax of S_j, so that it runs under that softmax (fwd_kernel.cuh). Needs a second S
// buffer: only where S twice, P and O fit the consumer's registers (hdim 64 at 128x128).
#ifndef FLASHTUNE_SM90_S_AHEAD
#define FLASHTUNE_SM90_S_AHEAD 0
#endif

namespace flashtune {
namespace sm90 {

// Elem: V, P and O (16-bit). kFp8Qk: Q and K are e4m3 and S = Q K^T runs on FP8 wgmma (k32).
// kPingpongTile: the tile's own pingpong switch (a profile config's `pingpong: false`), beside the
// PINGPONG flag that turns it off for a whole profile.
template <typename Elem_, int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_, bool kCausal_,
          bool kFp8Qk_ = false, bool kPingpongTile_ = true>
struct Traits {
  using Elem = Elem_;
  static constexpr bool kFp8Qk = kFp8Qk_;
  static constexpr bool kOverlap = FLASHTUNE_SM90_OVERLAP != 0;
  static constexpr bool kPersistent = FLASHTUNE_SM90_PERSISTENT != 0;
  static constexpr int kSmemLimit = 227 * 1024;  // per block, opt-in (sm_90)
  static constexpr bool kPingpong =
      FLASHTUNE_SM90_PINGPONG != 0 && kPingpongTile_ && kOverlap && kBlockM_ > 64;  // 2-3 consumers
  using QKElem = std::conditional_t<kFp8Qk, __nv_fp8_e4m3, Elem>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  // Buffers on each of the K and V mbarrier rings. One each (K_(j+1) loads once S_j is done) makes
  // room in shared memory, but each block then waits for its K: hdim 256 128x80 -31 to -39% on the
  // H200 with the overlap, cuDNN's 128x128 without it even (tools/experiments/exp-sm90-*s1*).
  static constexpr int kStages = kStages_;
  static constexpr bool kCausal = kCausal_;

  static constexpr int kConsumers = kBlockM / 64;  // one warpgroup per 64 query rows
  static constexpr int kThreads = 128 * (kConsumers + 1);  // + the producer warpgroup
  static constexpr int kSRegs = kBlockN / 2;  // accumulators per thread: S is 64 x kBlockN per warpgroup
  static constexpr int kORegs = kHeadDim / 2;

  // Tiles are column panels of [rows][row bytes], swizzled by the TMA as wgmma reads them:
  // 128-byte rows (128B swizzle), or 64-byte rows for an FP8 head dim of 64 (64B swizzle).
  static constexpr int kQKElemBytes = int(sizeof(QKElem));
  static constexpr int kQKRowBytes = kHeadDim * kQKElemBytes < 128 ? kHeadDim * kQKElemBytes : 128;
  static constexpr int kQKPanels = kHeadDim * kQKElemBytes / kQKRowBytes;
  static constexpr int kQKBoxCols = kQKRowBytes / kQKElemBytes;  // elements per TMA box row
  static constexpr int kVPanels = kHeadDim / 64;                 // V: 64 16-bit elements per row
  static constexpr int kKSteps = kHeadDim * kQKElemBytes / 32;   // wgmma k16 (16-bit) or k32 (FP8): 32 bytes

  // Shared memory: kQBuffers Q tiles, then kStages K and kStages V tiles, each 1024-byte
  // aligned (rows are multiples of 16, so every panel stays aligned for its swizzle).
  static constexpr int kQBytes = kBlockM * kHeadDim * kQKElemBytes;
  static constexpr int kKBytes = kBlockN * kHeadDim * kQKElemBytes;
  static constexpr int kVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kPanelBytesQ = kBlockM * kQKRowBytes;
  static constexpr int kPanelBytesK = kBlockN * kQKRowBytes;
  static constexpr int kPanelBytesV = kBlockN * 128;
  static constexpr int kOBytes = kBlockM * kHeadDim * 2;  // O staged as 64-column panels of [rows][128 B]
  static constexpr int kPanelBytesO = kBlockM * 128;
  // A second Q tile only for a CTA that loops, and where it fits without pushing out the O tile
  // of the TMA store (one Q buffer and the rings leave room for it or they do not).
  static constexpr int kRingBytes = kStages * (kKBytes + kVBytes) + 1024;  // + alignment slack
  static constexpr bool kOTileFits = FLASHTUNE_SM90_TMA_STORE != 0 && kQBytes + kRingBytes + kOBytes <= kSmemLimit;
  static constexpr bool kDeferWanted =
      kOverlap && kPersistent &&
      (FLASHTUNE_SM90_DEFER_EPILOGUE == 2 || (FLASHTUNE_SM90_DEFER_EPILOGUE == 1 && kHeadDim_ == 64));
  static constexpr int kQBuffers =
      kPersistent && (FLASHTUNE_SM90_Q_BUFFERS == 2 || kDeferWanted) &&
              2 * kQBytes + kRingBytes + (kOTileFits ? kOBytes : 0) <= kSmemLimit
          ? 2 : 1;
  static constexpr int kMainBytes = kQBuffers * kQBytes + kRingBytes;
  static constexpr bool kTmaStore = kOTileFits;
  static constexpr bool kDeferEpilogue = kDeferWanted && kQBuffers == 2;
  static constexpr bool kMufuTurn = FLASHTUNE_SM90_MUFU_TURN != 0 && kConsumers > 1 && FLASHTUNE_SM90_SPLIT_S == 0;
  static constexpr bool kFlatTiles = (FLASHTUNE_SM90_FLAT_TILES == 1 || (FLASHTUNE_SM90_FLAT_TILES == 2 && kCausal && kHeadDim == 64)) &&
                                     kDeferEpilogue && FLASHTUNE_SM90_SPLIT_S == 0;
  // CLUSTER: 2 CTAs share each K/V block (the producers' halves: BN / 2 rows each). Only the
  // persistent non-causal schedule: the pair's tiles see the same blocks.
  static constexpr int kCluster =
      (FLASHTUNE_SM90_CLUSTER == 2 || (FLASHTUNE_SM90_CLUSTER == 1 && kHeadDim_ >= 128)) && !kCausal_ && kPersistent
          ? 2 : 1;
  static constexpr int kKvBoxRows = kBlockN_ / kCluster;  // rows of one producer's K / V box
  // SPLIT_TAIL: tiles of equal cost (non-causal) on the fixed-stride persistent grid.
  static constexpr bool kSplitTail = FLASHTUNE_SM90_SPLIT_TAIL != 0 && !kCausal_ && kPersistent && kCluster == 1;
  // A piece's partial result per consumer thread: O's accumulators, then the two rows' maxima and sums.
  static constexpr int kPartialFloats = kORegs + 4;
  static constexpr int kSmemBytes = kMainBytes + (kTmaStore ? kOBytes : 0);
  static constexpr int kSmemPerSm = 228 * 1024, kReservedSmemPerCta = 1024;  // sm_90
  static constexpr int kCtasPerSm =
      FLASHTUNE_SM90_CTAS_PER_SM == 2 && kConsumers == 1 && 2 * (kSmemBytes + kReservedSmemPerCta) <= kSmemPerSm ? 2 : 1;
  static constexpr int kStoreBytes = 4 << FLASHTUNE_SM90_WIDE_STORES;  // direct O stores: 4, 8 or 16 bytes
  static constexpr bool kStmatrix = FLASHTUNE_SM90_STMATRIX != 0;
  static constexpr bool kTreeMax = FLASHTUNE_SM90_TREE_MAX != 0;
  static constexpr int kPolyExp2Of8 = FLASHTUNE_SM90_POLY_EXP2;  // scores i with i % 8 < this: poly_exp2
  static constexpr bool kLazyRescale = FLASHTUNE_SM90_LAZY_RESCALE != 0;
  static constexpr bool kSplitS = FLASHTUNE_SM90_SPLIT_S != 0 && kOverlap;  // halves: multiples of 8 keys
  static constexpr float kRescaleLog2 = 8.f;  // lazy: rescale once the maximum grew by more than 2^8
  // SPEC_MAX: on the overlapped loop's plain softmax (not the split, turned or masked-skip ones)
  static constexpr bool kSpecMax = (FLASHTUNE_SM90_SPEC_MAX == 2 || (FLASHTUNE_SM90_SPEC_MAX == 1 && kHeadDim_ <= 128)) &&
                                   kOverlap && kLazyRescale && !kSplitS && FLASHTUNE_SM90_MUFU_TURN == 0 &&
                                   FLASHTUNE_SM90_SKIP_MASKED == 0;
  static constexpr int kSpecMinBlocksNonCausal = FLASHTUNE_SM90_SPEC_MIN_BLOCKS;
  // HALF_DIAGONAL: wgmma N = block_n / 2 must be a multiple of 8
  static constexpr bool kHalfDiagonal =
      (FLASHTUNE_SM90_HALF_DIAGONAL == 2 || (FLASHTUNE_SM90_HALF_DIAGONAL == 1 && kHeadDim_ == 64)) && kCausal_ &&
      kOverlap && !kSplitS && kConsumers > 1 && (kBlockN_ / 2) % 8 == 0;
  static constexpr int kHalfPvSteps = (kBlockN_ / 2 + 15) / 16;  // P V's k16 steps over the first half

  // Register split (setmaxnreg): the producer issues TMA and walks the tiles; with 2 consumers
  // it keeps 40 (FA3's 24 spills our persistent tile loop), the consumers 232, with the
  // persistent grid on or off (the A/B's control was measured with this split).
  static constexpr bool kWideConsumers =
      kConsumers == 2 && kCtasPerSm == 1 &&
      (FLASHTUNE_SM90_WIDE_CONSUMERS == 2 || (FLASHTUNE_SM90_WIDE_CONSUMERS == 1 && kHeadDim_ == 256));
  static constexpr int kProducerRegs =
      kConsumers == 3 ? 32 : (kWideConsumers ? 24 : (kConsumers == 2 || kCtasPerSm == 2 ? 40 : 56));
  static constexpr int kConsumerRegs =
      kConsumers == 3 ? 160 : (kConsumers == 2 ? (kWideConsumers ? 240 : 232) : (kCtasPerSm == 2 ? 216 : 240));
  // S_AHEAD: two S buffers, O and about 64 for the rest (P's registers are free by the softmax); the
  // plain overlapped loop's features only
  static constexpr bool kSAhead = FLASHTUNE_SM90_S_AHEAD != 0 && kOverlap && !kSplitS && !kHalfDiagonal &&
                                  FLASHTUNE_SM90_MUFU_TURN == 0 && FLASHTUNE_SM90_SKIP_MASKED == 0 &&
                                  kSpecMinBlocksNonCausal == 0 && !kSplitTail && kCluster == 1 &&
                                  kStages >= 2 && 2 * kSRegs + kORegs + 64 <= kConsumerRegs;  // K_j and K_(j+1) held

  // S, P (half of S's count), O and Q's fragments, and about 40 for addresses and the softmax.
  static constexpr bool kQInRegs = FLASHTUNE_SM90_Q_IN_REGS != 0 && !kFp8Qk &&
                                   kSRegs + kSRegs / 2 + kORegs + kHeadDim / 4 + 40 <= kConsumerRegs;

  // SKIP_MASKED: only where the loop's second copy fits (S, P and O plus 72): hdim 64 and hdim 128
  // at 128x128; ptxas spilled 228-312 bytes at 192x128 (160 registers), 128x176 and 128x80.
  static constexpr bool kSkipMasked =
      FLASHTUNE_SM90_SKIP_MASKED != 0 && kSRegs + kSRegs / 2 + kORegs + 72 <= kConsumerRegs;
  static_assert(!kQInRegs || kQKRowBytes == 128, "Q_IN_REGS reads Q's 128-byte swizzled rows");
  static_assert(sizeof(Elem) == 2, "16-bit V, P and O");
  static_assert(kQKRowBytes == 128 || kQKRowBytes == 64, "Q/K rows of 64 or 128 bytes per swizzle panel");
  static_assert(kKBytes % 1024 == 0 && kQBytes % 1024 == 0 && kVBytes % 1024 == 0, "tiles stay 1024-byte aligned");
  static_assert(kHeadDim % 64 == 0 && kHeadDim <= 256, "head dim 64, 128 or 256");
  static_assert(kBlockM % 64 == 0 && kConsumers >= 1 && kConsumers <= 3, "block_m = 64, 128 or 192");
  static_assert(kBlockN % 16 == 0 && kBlockN >= 16 && kBlockN <= 256, "block_n: multiple of 16, <= 256");
  static_assert(FLASHTUNE_SM90_Q_BUFFERS == 1 || FLASHTUNE_SM90_Q_BUFFERS == 2, "1 or 2 Q buffers");
  static_assert(FLASHTUNE_SM90_DEFER_EPILOGUE >= 0 && FLASHTUNE_SM90_DEFER_EPILOGUE <= 2, "DEFER_EPILOGUE: 0, 1 or 2");
  static_assert(FLASHTUNE_SM90_WIDE_STORES >= 0 && FLASHTUNE_SM90_WIDE_STORES <= 2, "WIDE_STORES: 0, 1 or 2");
  static_assert(kStages >= 1 && kStages <= 4, "1 to 4 stages");
  static_assert(FLASHTUNE_SM90_FLAT_TILES >= 0 && FLASHTUNE_SM90_FLAT_TILES <= 2, "FLAT_TILES: 0, 1 or 2");
  static_assert(kPolyExp2Of8 >= 0 && kPolyExp2Of8 <= 8, "POLY_EXP2: 0 to 8 of every 8 scores");
  static_assert(kSmemBytes <= kSmemLimit, "over the 227 KB per-block limit");
  // setmaxnreg moves registers within the CTA's pool: what the launch gives every thread
  // (65536 / CTAs per SM / threads, rounded down to 8). Asking for more makes setmaxnreg.inc
  // wait forever.
  static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <=
                    ((65536 / kCtasPerSm / kThreads) & ~7) * kThreads,
                "register split over the CTA's pool");
  static_assert(FLASHTUNE_SM90_CTAS_PER_SM == 1 || FLASHTUNE_SM90_CTAS_PER_SM == 2, "CTAS_PER_SM: 1 or 2");
  static_assert(FLASHTUNE_SM90_CLUSTER >= 0 && FLASHTUNE_SM90_CLUSTER <= 2, "CLUSTER: 0, 1 or 2");
  static_assert(FLASHTUNE_SM90_SPEC_MAX >= 0 && FLASHTUNE_SM90_SPEC_MAX <= 2, "SPEC_MAX: 0, 1 or 2");
  static_assert(FLASHTUNE_SM90_WIDE_CONSUMERS >= 0 && FLASHTUNE_SM90_WIDE_CONSUMERS <= 2, "WIDE_CONSUMERS: 0, 1 or 2");
  static_assert(FLASHTUNE_SM90_HALF_DIAGONAL >= 0 && FLASHTUNE_SM90_HALF_DIAGONAL <= 2, "HALF_DIAGONAL: 0, 1 or 2");
  static_assert(kCluster == 1 || kCtasPerSm == 1, "a cluster CTA fills its SM");
  static_assert(kKvBoxRows % 8 == 0, "a producer's K/V half is whole 8-row swizzle atoms");
};

}  // namespace sm90
}  // namespace flashtune
