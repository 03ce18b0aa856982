// Every size of the sm80-family kernel, derived from its template parameters.
// flashtune/tiles.py mirrors these rules so impossible configs never reach nvcc.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace flashtune {
namespace sm80 {

template <typename Elem_, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, int kStages_,
          bool kCausal_>
struct Traits {
  using Elem = Elem_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per CTA
  static constexpr int kBlockN = kBlockN_;  // keys per main-loop step
  static constexpr int kWarps = kWarps_;
  static constexpr int kStages = kStages_;  // K/V buffers in the cp.async ring
  static constexpr bool kCausal = kCausal_;

  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowsPerWarp = kBlockM / kWarps;  // each warp owns whole query rows
  static constexpr int kMTiles = kRowsPerWarp / 16;      // m16 MMA tiles per warp
  static constexpr int kSTiles = kBlockN / 8;            // n8 tiles of S = Q K^T per m tile
  static constexpr int kOTiles = kHeadDim / 8;           // n8 tiles of O per m tile
  static constexpr int kChunksPerRow = kHeadDim / 8;     // 16-byte chunks in one row of Q/K/V/O

  static constexpr int kQElems = kBlockM * kHeadDim;
  static constexpr int kKVElems = kBlockN * kHeadDim;
  static constexpr int kSmemBytes = (kQElems + 2 * kStages * kKVElems) * int(sizeof(Elem));

  // cp.async wait depth: groups are issued K0 V0 K1 V1 ..., kStages ahead (see fwd_kernel.cuh).
  static constexpr int kPendingGroups = 2 * kStages - 2;

  static_assert(sizeof(Elem) == 2, "16-bit elements");
  static_assert(kHeadDim % 64 == 0 && kHeadDim <= 256,
                "head dim must be 64, 128 or 256: the 128-byte swizzle needs >= 8 chunks per row");
  static_assert(kBlockM % kWarps == 0 && kRowsPerWarp % 16 == 0, "16 or 32 rows per warp");
  static_assert(kMTiles == 1 || kMTiles == 2, "16 or 32 rows per warp");
  static_assert(kBlockN % 16 == 0, "BLOCK_N is a multiple of 16 (one k16 step of P V)");
  static_assert(kStages >= 1 && kStages <= 3, "1 to 3 K/V stages");
  static_assert((kBlockN * kChunksPerRow) % kThreads == 0, "K/V tile loads split evenly");
  static_assert((kBlockM * kChunksPerRow) % kThreads == 0, "Q tile loads split evenly");
  static_assert((kRowsPerWarp * kChunksPerRow) % 32 == 0, "O stores split evenly per warp");
  static_assert(kMTiles * (kHeadDim + kBlockN) / 2 <= 192,
                "O and S accumulators would not fit in registers");
};

// Offset of element (row, col) in a [rows][kHeadDim] tile whose 16-byte chunks are XOR-swizzled
// by (row & 7): ldmatrix and cp.async then touch 8 different bank groups per 8 rows.
// Written as (128-byte group) + (swizzled chunk inside it) so that, with compile-time column
// steps, the compiler needs at most 8 lane-dependent offsets per operand, not one per step.
template <int kHeadDim>
__device__ __forceinline__ int swizzled(int row, int col) {
  const int chunk = col >> 3;
  return row * kHeadDim + ((chunk & ~7) << 3) + (((chunk & 7) ^ (row & 7)) << 3) + (col & 7);
}

}  // namespace sm80
}  // namespace flashtune
