// Every size of the backward kernel (FlashAttention-2's algorithm on mma.sync; sm_80 and newer),
// derived from its template parameters. flashtune/kernels/bwd_spec.py mirrors these rules.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace flashtune {
namespace bwd {

// The dK/dV kernel: one CTA owns kBlockN keys of one (batch, query head) and walks the query blocks
// that see them, kBlockM at a time. Up to hdim 128 each warp owns 16 of the keys (their rows of
// S^T, dP^T, dK and dV) and, for dQ, 16 of each query block's rows over kHeadDim / kDqSplit of its
// columns: with 2 or 4 warps kBlockM = kBlockN and a warp takes whole rows; with 8 warps (128
// keys, FlashAttention-2's tile: each query block's dQ adds come from half as many CTAs as with 64
// keys) kBlockM = 64 and two warps share each 16 rows, one half of the head dim each.
// At hdim 256 a warp's dK and dV over the whole head dim would be 256 fp32 registers a thread, so
// in this layout kKvSplit = 2 warps share each 16 keys: each computes S^T and dP^T for half the
// query block, both go through shared memory as P^T and dS^T, and each then accumulates dK and dV
// over its half of the head dim; kBlockM = kBlockN, dQ as with 8 warps above, in chunks of 8 n8
// tiles.
// kDeterministic: no dQ there (its atomic adds land in any order); the dQ kernel (dq_kernel.cuh),
// a CTA of kDqRows queries walking the key blocks kBlockN at a time, computes it alone, in a fixed
// order, each warp 16 whole rows.
// kQStages: 2 where shared memory holds two query blocks' Q, dO and statistics (the spec decides,
// flashtune/kernels/bwd_spec.py: bwd_q_stages): the next block's load runs under this one's math.
// kTiled: 8 warps in tiled_kernel.cuh's layout (each GEMM tiled over the 8 warps by 32-row pieces,
// P^T and dS^T through shared memory) with FlashAttention-2's tiles: 128 keys x 128 queries a step
// at hdim 64, 128 x 64 at 128, 64 x 64 at 256 (no kKvSplit: a warp's dK and dV are 32 keys over a
// quarter of the head dim), where it fits the arch (the spec decides: mma_sync_bwd_tiled); the RTX
// cards' 99 KB take the 16-key layout's 8 warps at hdim 64.
template <typename Elem_, int kHeadDim_, int kWarps_, bool kCausal_, bool kDeterministic_ = false, int kQStages_ = 1,
          bool kTiled_ = false>
struct Traits {
  using Elem = Elem_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = kWarps_;
  static constexpr bool kCausal = kCausal_;
  static constexpr bool kDeterministic = kDeterministic_;
  static constexpr int kQStages = kQStages_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr bool kTiled = kTiled_;
  static constexpr int kKvSplit = kHeadDim == 256 && !kTiled ? 2 : 1;  // warps sharing 16 keys' dK and dV
  static constexpr int kKeyGroups = kWarps / kKvSplit;                // 16-key groups
  static constexpr int kBlockN = kTiled ? (kHeadDim == 256 ? 64 : 128) : 16 * kKeyGroups;  // keys per CTA
  static constexpr int kBlockM = kTiled ? (kHeadDim == 256 ? 64 : 8192 / kHeadDim)
                                 : kKvSplit > 1 ? kBlockN : kWarps > 4 ? 64 : 16 * kWarps;
  static constexpr int kSQueries = kBlockM / kKvSplit;         // queries of a warp's S^T and dP^T
  static constexpr int kQTiles = kSQueries / 8;                // their n8 tiles
  static constexpr int kDTiles = kHeadDim / 8;                 // n8 tiles of a whole row
  static constexpr int kKvTiles = kDTiles / kKvSplit;          // n8 tiles of a warp's dK and dV
  static constexpr int kDqSplit = 16 * kWarps / kBlockM;       // warps sharing 16 rows of dQ
  static constexpr int kDqTiles = kDTiles / kDqSplit;          // n8 tiles of a warp's dQ
  static constexpr int kDqChunk = kKvSplit > 1 ? 8 : kDqTiles;  // dQ's n8 tiles held at once
  static constexpr int kDqRows = 16 * kWarps;                  // the dQ kernel's queries a CTA

  static constexpr int kRowBytes = kHeadDim * 2;         // a row of Q, K, V, dO
  static constexpr int kKBytes = kBlockN * kRowBytes;    // K, and V
  static constexpr int kQBytes = kBlockM * kRowBytes;    // Q, and dO
  static constexpr int kdSRowBytes = kBlockM * 2;        // dS^T (and P^T) [keys][queries], 16-bit
  static constexpr int kdSBytes = kBlockN * kdSRowBytes;
  // Shared memory: K, V, then kQStages stages of a query block's Q, dO, LSE and rowsum(dO O) (both
  // fp32, the LSE in natural-log units as the forward wrote it), then dS^T, with kKvSplit or kTiled P^T.
  static constexpr int kStatsBytes = 2 * kBlockM * 4;
  static constexpr int kStageBytes = 2 * kQBytes + kStatsBytes;
  static constexpr int kVOffset = kKBytes;
  static constexpr int kQOffset = 2 * kKBytes;            // stage s at + s * kStageBytes
  static constexpr int kdOOffset = kQOffset + kQBytes;
  static constexpr int kStatsOffset = kdOOffset + kQBytes;
  static constexpr int kdSOffset = kQOffset + kQStages * kStageBytes;
  static constexpr int kPOffset = kdSOffset + kdSBytes;
  static constexpr int kSmemBytes = kPOffset + (kKvSplit > 1 || kTiled ? kdSBytes : 0);
  // The dQ kernel's: K and V of kBlockN keys, Q and dO of kDqRows queries.
  static constexpr int kDqSmemBytes = 2 * kKBytes + 2 * kDqRows * kRowBytes;

  static_assert(sizeof(Elem) == 2, "16-bit elements");
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head dim 64, 128 or 256");
  static_assert(kWarps == 2 || kWarps == 4 || kWarps == 8, "2, 4 or 8 warps (32, 64 or 128 keys)");
  static_assert(kQStages == 1 || kQStages == 2, "one or two query-block stages");
  static_assert(!kTiled || (kWarps == 8 && !kDeterministic), "tiled: 8 warps, not deterministic");
  static_assert(kBlockM <= kThreads, "a thread per statistics row");
  static_assert(kKvSplit == 1 || kWarps >= 4, "hdim 256: 4 or 8 warps (a warp's S^T is 16 queries or more)");
  static_assert(!kDeterministic || kDqSplit == 1 || kKvSplit > 1,
                "deterministic: the dQ kernel's warp per 16 queries (2 or 4 warps; hdim 256 any)");
  static_assert((kBlockN * kHeadDim / 8) % kThreads == 0 && (kBlockM * kHeadDim / 8) % kThreads == 0,
                "tile loads split evenly");
  static_assert(kDqTiles % kDqChunk == 0 && kDqChunk % 2 == 0, "dQ's n8 tiles in pairs, whole chunks");
  // Live fp32 accumulators per thread: dK and dV throughout, with S^T and dP^T, later with dQ's
  // (the 16-key layouts; tiled_kernel.cuh checks its own).
  static constexpr int kAccumulators = kKvTiles * 4 * 2 + (kQTiles * 4 * 2 > kDqChunk * 4 ? kQTiles * 4 * 2 : kDqChunk * 4);
  static_assert(kTiled || kAccumulators <= 192, "accumulators would not fit in registers");
  static_assert(!kDeterministic || kDTiles * 4 + kBlockN / 8 * 4 * 2 <= 192, "the dQ kernel's accumulators");
};

}  // namespace bwd
}  // namespace flashtune
