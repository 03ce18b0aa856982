// Every size of the sm80-family kernel, derived from its template parameters.
// flashtune/kernels/tiles.py mirrors these rules so impossible configs never reach nvcc.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

#include "common/variants.h"

namespace flashtune {
namespace sm80 {

template <typename Elem_, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, int kStages_,
          bool kCausal_, bool kFp8Qk_ = false, class Variants_ = Variants<>>
struct Traits {
  using Elem = Elem_;  // V, O and P; also Q and K unless kFp8Qk
  static constexpr bool kSoftcap = Variants_::softcap;  // common/variants.h
  static constexpr bool kWindow = Variants_::window;
  static constexpr bool kSinks = Variants_::sinks;
  static constexpr bool kAlibi = Variants_::alibi;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per CTA
  static constexpr int kBlockN = kBlockN_;  // keys per main-loop step
  static constexpr int kWarps = kWarps_;
  static constexpr int kStages = kStages_;  // K/V buffers in the cp.async ring
  static constexpr bool kCausal = kCausal_;
  // Q and K in e4m3: S = Q K^T on mma m16n8k32 (sm_89+); P V stays 16-bit.
  static constexpr bool kFp8Qk = kFp8Qk_;
  using QKElem = std::conditional_t<kFp8Qk, __nv_fp8_e4m3, Elem>;

  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowsPerWarp = kBlockM / kWarps;  // each warp owns whole query rows
  static constexpr int kMTiles = kRowsPerWarp / 16;      // m16 MMA tiles per warp
  static constexpr int kSTiles = kBlockN / 8;            // n8 tiles of S = Q K^T per m tile
  static constexpr int kOTiles = kHeadDim / 8;           // n8 tiles of O per m tile
  static constexpr int kChunksPerRow = kHeadDim / 8;     // 16-byte chunks in one row of V/O

  // Q/K rows in bytes. Both MMAs take 32 bytes of k per step (k16 of 16-bit, k32 of 8-bit) with
  // the same byte-level fragments, so Q/K tiles are handled as rows of kQKRowUnits 16-bit units.
  static constexpr int kQKRowBytes = kHeadDim * int(sizeof(QKElem));
  static constexpr int kQKRowUnits = kQKRowBytes / 2;
  static constexpr int kQKChunksPerRow = kQKRowBytes / 16;
  static constexpr int kQKSteps = kQKRowBytes / 32;  // k steps of S = Q K^T
  static constexpr int kRowBytes = kHeadDim * int(sizeof(Elem));  // a V or O row

  static constexpr int kQBytes = kBlockM * kQKRowBytes;
  static constexpr int kKBytes = kBlockN * kQKRowBytes;  // one K stage
  static constexpr int kVBytes = kBlockN * kRowBytes;    // one V stage
  // The epilogue stages O at offset 0: over Q and, with FP8 Q (half O's size), on into the K/V
  // ring, which is idle by then. Only FP8 with kBlockM > 3 * kStages * kBlockN needs the max.
  static constexpr int kOStageBytes = kBlockM * kRowBytes;
  static constexpr int kRingBytes = kQBytes + kStages * (kKBytes + kVBytes);
  static constexpr int kSmemBytes = kRingBytes > kOStageBytes ? kRingBytes : kOStageBytes;

  // cp.async wait depth: groups are issued K0 V0 K1 V1 ..., kStages ahead (see fwd_kernel.cuh).
  static constexpr int kPendingGroups = 2 * kStages - 2;

  static_assert(sizeof(Elem) == 2, "16-bit elements");
  static_assert(sizeof(QKElem) == 1 || sizeof(QKElem) == 2, "8- or 16-bit Q/K");
  static_assert(kHeadDim % 64 == 0 && kHeadDim <= 256, "head dim must be 64, 128 or 256");
  static_assert(kQKRowBytes == 64 || kQKRowBytes % 128 == 0,
                "swizzle: rows of >= 8 16-byte chunks, or 4-chunk rows (FP8 D=64)");
  static_assert(kBlockM % kWarps == 0 && kRowsPerWarp % 16 == 0, "16 or 32 rows per warp");
  static_assert(kMTiles == 1 || kMTiles == 2, "16 or 32 rows per warp");
  static_assert(kBlockN % 16 == 0, "BLOCK_N is a multiple of 16 (one k16 step of P V)");
  static_assert(kStages >= 1 && kStages <= 3, "1 to 3 K/V stages");
  static_assert((kBlockN * kChunksPerRow) % kThreads == 0, "K/V tile loads split evenly");
  static_assert((kBlockM * kChunksPerRow) % kThreads == 0, "Q tile loads split evenly");
  // Whole Q/K rows per load pass; an FP8 K tile may split unevenly (see load_tile_async).
  static_assert(kThreads % kQKChunksPerRow == 0, "whole Q/K rows per load pass");
  static_assert(kOStageBytes <= kSmemBytes, "O staging must fit in shared memory");
  static_assert((kRowsPerWarp * kChunksPerRow) % 32 == 0, "O stores split evenly per warp");
  static_assert(kMTiles * (kHeadDim + kBlockN) / 2 <= 192,
                "O and S accumulators would not fit in registers");
};

// Swizzled index of 16-byte chunk `chunk` (< 8) of `row` inside its 128-byte group, for rows of
// kRowUnits 16-bit units. 128+ byte rows XOR with (row & 7); 64-byte rows (FP8 D=64), two to a
// 128-byte line, XOR with ((row >> 1) & 3). Either way any 8 consecutive rows' copies of one
// logical chunk land in 8 different 16-byte bank groups: ldmatrix phases are conflict-free.
template <int kRowUnits>
__device__ __forceinline__ int swizzle_chunk(int chunk, int row) {
  static_assert(kRowUnits == 32 || kRowUnits % 64 == 0, "64-byte or 128n-byte rows");
  if constexpr (kRowUnits >= 64) return chunk ^ (row & 7);
  else return chunk ^ ((row >> 1) & 3);
}

// Offset in 16-bit units of unit (row, col) of a [rows][kRowUnits] tile whose 16-byte chunks are
// swizzled by swizzle_chunk (for 16-bit tiles kRowUnits = kHeadDim and units are elements).
// Written as (128-byte group) + (swizzled chunk inside it) so that, with compile-time column
// steps, the compiler needs at most 8 lane-dependent offsets per operand, not one per step.
template <int kRowUnits>
__device__ __forceinline__ int swizzled(int row, int col) {
  const int chunk = col >> 3;
  return row * kRowUnits + ((chunk & ~7) << 3) + (swizzle_chunk<kRowUnits>(chunk & 7, row) << 3) +
         (col & 7);
}

}  // namespace sm80
}  // namespace flashtune
