// Every size of the Hopper backward kernel (wgmma and TMA, sm_90a), derived from its template
// parameters. flashtune/kernels/bwd_spec.py mirrors these rules (bwd_smem_bytes).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace flashtune {
namespace sm90_bwd {

// A tile is kBlockN = 128 keys of one (batch, query head): K and V stay in the CTA's shared memory
// while it walks the query blocks that see them, kBlockM queries at a time, Q, dO and their statistics
// on a ring of kStages slots. Two consumer warpgroups each own 64 of the keys (their rows of S^T,
// dP^T, dK and dV: no reduction across warpgroups); a producer warpgroup loads.
// dQ = dS K needs every key of the block: dS^T goes through shared memory (two buffers, one per
// parity of the step), and each warpgroup takes one 64 x 64 piece of the query block's dQ: its
// 64-column panel of the head dim at hdim 128 (kBlockM = 64), its 64 query rows at hdim 64
// (kBlockM = 128).
// The piece goes to global memory by one TMA reduce-add (fp32) per 32 columns from a staging tile
// in shared memory, one per warpgroup, issued by a producer warp (float2 atomic adds from registers
// measured 0.85x; see docs/experiments.md).
template <typename Elem_, int kHeadDim_, bool kCausal_>
struct Traits {
  using Elem = Elem_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kCausal = kCausal_;
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kBlockN = 64 * kConsumers;            // keys per CTA
  static constexpr int kBlockM = kHeadDim == 64 ? 128 : 64;  // queries per step
  static constexpr int kStages = 2;

  static constexpr int kPanels = kHeadDim / 64;      // 64-column panels of [rows][128 B], 128B swizzle
  static constexpr int kQPanels = kBlockM / 64;      // dS^T's panels: 64 queries each, [keys][128 B]
  static constexpr int kKSteps = kHeadDim / 16;      // k16 steps along the head dim
  static constexpr int kMSteps = kBlockM / 16;       // k16 steps along the queries
  static constexpr int kSRegs = kBlockM / 2;         // S^T and dP^T: 64 keys x kBlockM per warpgroup
  static constexpr int kDRegs = kHeadDim / 2;        // dK and dV: 64 keys x kHeadDim
  static constexpr int kDqRegs = 32;                 // dQ: one 64 x 64 piece
  static constexpr bool kDsFromPackedP = kBlockM > 64;  // mainloop.cuh's softmax_ds says why

  static constexpr int kPanelBytesK = kBlockN * 128;  // K and V panels
  static constexpr int kPanelBytesQ = kBlockM * 128;  // Q and dO panels
  static constexpr int kPanelBytesDs = kBlockN * 128; // dS^T panels
  static constexpr int kKBytes = kBlockN * kHeadDim * 2;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;
  static constexpr int kStatsBytes = 2 * kBlockM * 4;  // a slot's LSE (log2 units) and rowsum(dO O)
  // A warpgroup's 64 x 64 fp32 dQ piece as two boxes of 32 columns, [64 rows][128 B], 128B swizzle:
  // its query panel and head-dim panel of the block's dQ.
  static constexpr int kDqBoxBytes = 64 * 128;
  static constexpr int kDqStageBytes = 2 * kDqBoxBytes;
  __device__ static constexpr int dq_query_panel(int cw) { return kQPanels > 1 ? cw : 0; }
  __device__ static constexpr int dq_dim_panel(int cw) { return kPanels > 1 ? cw : 0; }

  // Named barriers: the consumers' exchange of dS^T (256 threads); per consumer warpgroup cw, its dQ
  // staging tile full (the warpgroup arrives, the producer's dQ warp waits) and empty (the reverse),
  // 128 + 32 threads each.
  static constexpr int kDsBarrier = 1;
  static constexpr int kDqFullBarrier = 2;   // + cw
  static constexpr int kDqEmptyBarrier = 2 + kConsumers;  // + cw
  static constexpr int kDqBarrierThreads = 128 + 32;

  // Shared memory from a 1024-byte aligned base: K, V, kStages Q, kStages dO, two dS^T, the
  // consumers' dQ staging tiles, then the statistics' slots.
  static constexpr int kVOffset = kKBytes;
  static constexpr int kQOffset = 2 * kKBytes;
  static constexpr int kdOOffset = kQOffset + kStages * kQBytes;
  static constexpr int kDsOffset = kdOOffset + kStages * kQBytes;
  static constexpr int kDqOffset = kDsOffset + 2 * kDsBytes;
  static constexpr int kStatsOffset = kDqOffset + kConsumers * kDqStageBytes;
  static constexpr int kSmemBytes = kStatsOffset + kStages * kStatsBytes + 1024;  // + alignment slack

  // Register split (setmaxnreg) over the pool of 65536 / 384 = 168 per thread: the producer's three
  // working warps (loads, statistics, dQ's reduce-adds) need few, but with 24 their loops over a
  // persistent CTA's tiles spilled (24-40 bytes); with 40 nothing spills, and the consumers' block
  // loop at 232 is the same code as at 240 but for 2-4 instructions (ptxas, sm_90a).
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;

  static_assert(sizeof(Elem) == 2, "16-bit elements");
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  static_assert(kPanels * kQPanels == kConsumers, "one 64 x 64 piece of dQ per consumer warpgroup");
  static_assert(kSmemBytes <= 227 * 1024, "over the 227 KB per-block limit");
  static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <= ((65536 / kThreads) & ~7) * kThreads,
                "register split over the CTA's pool");
};

}  // namespace sm90_bwd
}  // namespace flashtune
