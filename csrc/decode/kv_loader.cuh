// The producer side of the decode kernel: where a sequence's key rows live (contiguous cache,
// pages of whole tiles, or pages gathered row by row through the block table, read a block ahead)
// and one warp's cp.async copies of a [kBlockN][kHeadDim] K or V tile (or its share of one) into a
// swizzled ring slot.
// Waits on nothing and arrives at nothing: the caller commits and waits on the cp.async groups.
#pragma once
#include <stdint.h>

#include "common/ptx_sm80.cuh"
#include "decode/kernel_traits.cuh"
#include "decode/params.h"
#include "sm80/kernel_traits.cuh"

namespace flashtune {
namespace decode {

// The block table's pages a warp's block of keys lies in, read one block ahead of its copies
// (split_kernel.cuh's issue): the read's latency then overlaps a step of the warp's math instead of
// stalling the refill that needs it. kPages: the page of the block (a tile lies in one page);
// kGather: each lane's pages of rows lane, lane + 32, ...; kContiguous: nothing.
template <class T>
struct BlockPages {
  static constexpr int kLaneRows = T::kPaging == Paging::kGather ? (T::kBlockN + 31) / 32 : 0;
  int page = 0;
  int row_page[kLaneRows > 0 ? kLaneRows : 1];

  // The pages of the block at j0 (rows at or beyond `valid` read nothing).
  __device__ __forceinline__ void read(const int32_t* pages, int page_size, int j0, int valid, int lane) {
    if constexpr (T::kPaging == Paging::kPages) {
      if (j0 < valid) page = pages[j0 / page_size];
    } else if constexpr (T::kPaging == Paging::kGather) {
#pragma unroll
      for (int i = 0; i < kLaneRows; ++i) {
        const int j = j0 + lane + 32 * i;
        row_page[i] = j < valid ? pages[j / page_size] : 0;
      }
    }
  }
};

// A sequence's K (or V) cache, as the element offset of key row j (relative to the sequence's
// first valid key) from the tensor's base, for one KV head.
template <class T>
struct KvRows {
  int64_t head_offset;  // kv_head * head_stride (+ cache row and left padding when contiguous)
  int64_t row_stride, page_stride;
  int page_size;

  // The offset of the tile starting at j0 (j0 a multiple of kBlockN); kPages: it lies in `page`.
  __device__ __forceinline__ int64_t tile_base(int j0, int page) const {
    if constexpr (T::kPaging == Paging::kPages) {
      return head_offset + int64_t(page) * page_stride + int64_t(j0 % page_size) * row_stride;
    } else {
      return head_offset + int64_t(j0) * row_stride;
    }
  }
  // kGather: the offset of row j, which lies in `page`.
  __device__ __forceinline__ int64_t row_offset(int j, int page) const {
    return head_offset + int64_t(page) * page_stride + int64_t(j % page_size) * row_stride;
  }
};

// The XOR on a 16-byte chunk of FP8 ring row `row` (low 3 bits of the chunk index). ldmatrix's 8
// rows of one matrix (keys nt * 8 + {0, 4, 1, 5, 2, 6, 3, 7}) and each V read (4 rows t + 4i, 32
// bytes each, for one i) must land in different banks: 128+ byte rows take row bits (1 0 2), so
// rows t + 4i differ in the pair of chunks; 64-byte rows (two to a 128-byte line, the row's parity
// picks the half) take (1 2).
template <class T>
__device__ __forceinline__ int fp8_chunk_swizzle(int row) {
  if constexpr (T::kKvRowBytes >= 128) {
    return ((row & 3) << 1) | ((row >> 2) & 1);
  } else {
    return (((row >> 1) & 1) << 1) | ((row >> 2) & 1);
  }
}

// Where 16-byte chunk `chunk` of tile row `row` lands in a ring slot: 16-bit tiles swizzled for
// ldmatrix; FP8 tiles for fp8_fragments.cuh's reads (fp8_chunk_swizzle).
template <class T>
__device__ __forceinline__ uint32_t ring_chunk(uint32_t smem, int row, int chunk) {
  if constexpr (T::kKvFp8) {
    return smem + row * T::kKvRowBytes + (((chunk & ~7) | ((chunk & 7) ^ fp8_chunk_swizzle<T>(row))) << 4);
  } else {
    return smem + 2 * sm80::swizzled<T::kHeadDim>(row, chunk * 8);
  }
}

// One warp copies rows j0 .. j0+kBlockN-1 of `rows` into the tile at `smem` (ring_chunk's
// layout); rows at or beyond `valid`, and columns at or beyond the head dim kDim, are zero-filled
// (their source never read). Each lane keeps one 16-byte column chunk and walks rows
// 32 / kKvChunksPerRow apart. With kParts > 1 (a key group's warps sharing a ring), this warp
// copies part `part` of kParts equal runs of the tile's rows.
template <class T, int kParts = 1>
__device__ __forceinline__ void load_kv_tile(uint32_t smem, const typename T::KvElem* base, const KvRows<T>& rows,
                                             const BlockPages<T>& block, int j0, int valid, int lane, int part = 0) {
  constexpr int kChunks = T::kKvChunksPerRow;
  constexpr int kChunkElems = T::kKvChunkElems;
  constexpr int kRowsPerPass = 32 / kChunks > 0 ? 32 / kChunks : 1;
  constexpr int kLanesPerRow = kChunks < 32 ? kChunks : 32;
  constexpr int kChunksPerLane = kChunks / kLanesPerRow;  // 1: a row has at most 32 chunks (hdim 256, 16-bit)
  constexpr int kPasses = T::kBlockN / kRowsPerPass;
  static_assert(kPasses % kParts == 0, "a key group's warps copy equal runs of a tile");
  // Pass `pass` is this warp's (warp-uniform; the loops stay unrolled, so indices stay compile-time).
  auto mine_pass = [&](int pass) { return kParts == 1 || pass / (kPasses / kParts) == part; };
  const int row0 = lane / kLanesPerRow;
  const int chunk0 = lane % kLanesPerRow;
  if constexpr (T::kPaging == Paging::kGather) {
    // Each lane holds the offsets of rows lane and lane + 32 (their pages read ahead); the copies
    // take them by shuffle.
    int64_t mine[(T::kBlockN + 31) / 32];
#pragma unroll
    for (int i = 0; i < (T::kBlockN + 31) / 32; ++i) {
      const int j = j0 + lane + 32 * i;
      mine[i] = j < valid ? rows.row_offset(j, block.row_page[i]) : 0;
    }
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      if (!mine_pass(pass)) continue;
      const int row = row0 + pass * kRowsPerPass;
      // row / 32 is the pass's (row0 < kRowsPerPass, which divides 32): a compile-time index
      const int64_t src = __shfl_sync(0xffffffffu, mine[pass * kRowsPerPass / 32], row % 32);
      const bool row_ok = j0 + row < valid;
#pragma unroll
      for (int c = 0; c < kChunksPerLane; ++c) {
        const int chunk = chunk0 + c * kLanesPerRow;
        const bool ok = row_ok && (T::kDim == T::kHeadDim || chunk < T::kKvDimChunks);
        cp_async_16(ring_chunk<T>(smem, row, chunk), base + (ok ? src : 0) + chunk * kChunkElems, ok);
      }
    }
  } else {
    // A 64-bit tile base and 32-bit offsets inside the tile (kBlockN rows of a cache row stride).
    const typename T::KvElem* tile = base + rows.tile_base(j0, block.page);
    const int row_stride = int(rows.row_stride);
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      if (!mine_pass(pass)) continue;
      const int row = row0 + pass * kRowsPerPass;
      const bool row_ok = j0 + row < valid;
#pragma unroll
      for (int c = 0; c < kChunksPerLane; ++c) {
        const int chunk = chunk0 + c * kLanesPerRow;
        const bool ok = row_ok && (T::kDim == T::kHeadDim || chunk < T::kKvDimChunks);
        cp_async_16(ring_chunk<T>(smem, row, chunk), tile + (ok ? row * row_stride + chunk * kChunkElems : 0), ok);
      }
    }
  }
}

}  // namespace decode
}  // namespace flashtune
