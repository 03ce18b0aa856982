// Every size of the decode kernel, derived from its template parameters.
// flashtune/kernels/decode_spec.py mirrors these rules so impossible configs never reach nvcc.
//
// The decode kernel packs the query rows that share a KV head (GQA: head_ratio heads x seqlen_q
// positions) into kRows rows of one tile, so each K/V byte is read once per KV head, and gives
// each warp its own keys (kBlockN per step, warp w taking steps w, w + kWarps, ...) with its own
// cp.async ring: a warp never waits for another until the end, where their partial softmax
// states are merged through shared memory.
//
// A head dim other than 64, 128 or 256 (any multiple of 8 from 32 to 256) is computed at the next
// of those (kHeadDim): its rows in shared memory are zero beyond kDim, so the MMAs and the
// swizzle are the built sizes' own, while global memory is read and written at kDim only (the
// cache's bytes, which bound decode, are the head dim's).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace flashtune {
namespace decode {

// How a key row's address is found.
enum class Paging : int {
  kContiguous = 0,  // (batch, capacity, heads_kv, hdim), rows at a stride
  kPages = 1,       // pages of a multiple of kBlockN rows: one block_table lookup per tile
  kGather = 2,      // any page size: one lookup per row
};

template <typename Elem_, int kDim_, int kRows_, int kBlockN_, int kWarps_, int kStages_, Paging kPaging_,
          bool kCausal_>
struct Traits {
  using Elem = Elem_;
  static constexpr int kDim = kDim_;  // the head dim of q, the cache and o
  static constexpr int kHeadDim = kDim <= 64 ? 64 : kDim <= 128 ? 128 : 256;  // computed at
  static constexpr int kDimChunks = kDim / 8;  // 16-byte chunks of a row in global memory
  static constexpr int kRows = kRows_;      // packed query rows per CTA (heads x positions)
  static constexpr int kBlockN = kBlockN_;  // keys per warp step
  static constexpr int kWarps = kWarps_;
  static constexpr int kStages = kStages_;  // K/V tiles in each warp's ring
  static constexpr Paging kPaging = kPaging_;
  static constexpr bool kCausal = kCausal_;  // bottom-right aligned, per packed row's position

  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMTiles = kRows / 16;        // m16 MMA tiles, every warp all of them
  static constexpr int kSTiles = kBlockN / 8;       // n8 tiles of S per m tile
  static constexpr int kOTiles = kHeadDim / 8;      // n8 tiles of O per m tile
  static constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks of a row
  static constexpr int kRowBytes = kHeadDim * 2;

  static constexpr int kQBytes = kRows * kRowBytes;
  static constexpr int kTileBytes = kBlockN * kRowBytes;          // one K or one V tile
  static constexpr int kWarpRingBytes = kStages * 2 * kTileBytes;  // K and V per stage
  static constexpr int kRingBytes = kWarps * kWarpRingBytes;
  // The merge: each warp's O (fp32, rows padded by 8 floats against bank conflicts) over the idle
  // ring, then the rows' maxima and sums per warp after it.
  static constexpr int kMergeRowFloats = kHeadDim + 8;
  static constexpr int kMergeOBytes = kWarps * kRows * kMergeRowFloats * 4;
  static constexpr int kMergeStatBytes = 2 * kWarps * kRows * 4;
  static constexpr int kAfterQ = kRingBytes > kMergeOBytes ? kRingBytes : kMergeOBytes;
  static constexpr int kSmemBytes = kQBytes + kAfterQ + kMergeStatBytes;

  static_assert(sizeof(Elem) == 2, "16-bit elements");
  static_assert(kDim % 8 == 0 && kDim >= 32 && kDim <= 256, "head dim: a multiple of 8 from 32 to 256");
  static_assert(kRows == 16 || kRows == 32, "16 or 32 packed rows");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 64, "kBlockN: 16, 32, 48 or 64 keys");
  static_assert(kStages >= 2 && kStages <= 4, "2 to 4 stages per warp");
  static_assert(kWarps == 2 || kWarps == 4 || kWarps == 8, "2, 4 or 8 warps");
  static_assert((kBlockN * kChunksPerRow) % 32 == 0, "a warp loads its tiles in whole passes");
  static_assert(kMTiles * (kHeadDim + kBlockN) / 2 <= 192, "O and S accumulators fit in registers");
};

}  // namespace decode
}  // namespace flashtune
