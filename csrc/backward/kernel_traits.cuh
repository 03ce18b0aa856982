// Every size of the backward kernel (FlashAttention-2's algorithm on mma.sync; sm_80 and newer),
// derived from its template parameters. flashtune/kernels/bwd_spec.py mirrors these rules.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace flashtune {
namespace bwd {

// The dK/dV kernel: one CTA owns kBlockN = 16 * kWarps keys of one (batch, query head) and walks
// the query blocks that see them, kBlockM at a time. Each warp owns 16 of the keys (their rows of
// S^T, dP^T, dK and dV) and, for dQ, 16 of each query block's rows over kHeadDim / kDqSplit of its
// columns: with 2 or 4 warps kBlockM = kBlockN and a warp takes whole rows; with 8 warps (128
// keys, FlashAttention-2's tile: each query block's dQ adds come from half as many CTAs as with 64
// keys) kBlockM = 64 and two warps share each 16 rows, one half of the head dim each.
// kDeterministic: no dQ there (its atomic adds land in any order); the dQ kernel (dq_kernel.cuh),
// a CTA per query block walking the key blocks, computes it alone, in a fixed order.
template <typename Elem_, int kHeadDim_, int kWarps_, bool kCausal_, bool kDeterministic_ = false>
struct Traits {
  using Elem = Elem_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = kWarps_;
  static constexpr bool kCausal = kCausal_;
  static constexpr bool kDeterministic = kDeterministic_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockN = 16 * kWarps;                   // keys per CTA
  static constexpr int kBlockM = kWarps > 4 ? 64 : 16 * kWarps;  // queries per step of the CTA's loop
  static constexpr int kDqSplit = kBlockN / kBlockM;              // warps sharing 16 rows of dQ
  static constexpr int kQTiles = kBlockM / 8;   // n8 tiles of S^T (queries) per warp
  static constexpr int kDTiles = kHeadDim / 8;  // n8 tiles of dK and dV
  static constexpr int kDqTiles = kDTiles / kDqSplit;  // n8 tiles of a warp's dQ

  static constexpr int kRowBytes = kHeadDim * 2;         // a row of Q, K, V, dO
  static constexpr int kKBytes = kBlockN * kRowBytes;    // K, and V
  static constexpr int kQBytes = kBlockM * kRowBytes;    // Q, and dO
  static constexpr int kdSRowBytes = kBlockM * 2;        // dS^T [keys][queries], 16-bit
  static constexpr int kdSBytes = kBlockN * kdSRowBytes;
  // Shared memory: K, V, Q, dO, dS^T, then the query block's LSE (log2 units) and rowsum(dO O).
  static constexpr int kVOffset = kKBytes;
  static constexpr int kQOffset = 2 * kKBytes;
  static constexpr int kdOOffset = kQOffset + kQBytes;
  static constexpr int kdSOffset = kdOOffset + kQBytes;
  static constexpr int kStatsOffset = kdSOffset + kdSBytes;
  static constexpr int kSmemBytes = kStatsOffset + 2 * kBlockM * 4;

  static_assert(sizeof(Elem) == 2, "16-bit elements");
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  static_assert(kWarps == 2 || kWarps == 4 || kWarps == 8, "2, 4 or 8 warps (32, 64 or 128 keys)");
  static_assert(!(kDeterministic && kDqSplit > 1), "the dQ kernel takes a warp per 16 queries: 2 or 4 warps");
  static_assert((kBlockN * kHeadDim / 8) % kThreads == 0 && (kBlockM * kHeadDim / 8) % kThreads == 0,
                "tile loads split evenly");
  static_assert(kDqTiles % 2 == 0, "dQ's n8 tiles in pairs");
  // Live fp32 accumulators per thread: dK and dV throughout, with S^T and dP^T, later with dQ's.
  static constexpr int kAccumulators = kDTiles * 4 * 2 + (kQTiles * 4 * 2 > kDqTiles * 4 ? kQTiles * 4 * 2 : kDqTiles * 4);
  static_assert(kAccumulators <= 192, "accumulators would not fit in registers");
};

}  // namespace bwd
}  // namespace flashtune
