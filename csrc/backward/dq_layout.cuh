// Where dQ's fp32 sum (dq_accum) keeps element (row, col) of one head: the kernel's atomic adds and
// the finish pass's reads go through one of these, so the two agree. Each permutes a head's elements
// within the tensor's own rows, so the prep pass zeroes them all in storage order.
// `row` counts from the tensor's first row (varlen: the packed row), `rows` is how many there are
// (dq_sum_rows), `row_stride` is dq_accum's.
//   DqRows:      q's layout (row-major rows; every kernel but tiled_kernel.cuh's).
//   DqStrips<D>: rows in strips of 8, each strip's 8 x 8 tiles stored whole, 64 floats in a row:
//                tile (strip, c) at the strip's row c / (D / 64), floats (c % (D / 64)) * 64 on.
//                One m16n8 accumulator half (8 rows x 8 columns, a float pair a lane) is then one
//                256-byte piece, so a warp's add touches two 128-byte lines, not eight (one per
//                row): FlashAttention-2 permutes its dQ sum for the same reason. The last strip,
//                if partial, stays row-major (its rows have no room for the tiles).
#pragma once
#include <stdint.h>

#include "common/params.h"

namespace flashtune {
namespace bwd {

// `rows` for a call: every packed row (varlen), else one batch entry's.
__host__ __device__ __forceinline__ int dq_sum_rows(const FwdParams& p) {
  return p.cu_seqlens_q != nullptr ? p.total_q : p.seqlen_q;
}

struct DqRows {
  __host__ __device__ __forceinline__ static int64_t offset(int row, int col, int /*rows*/, int64_t row_stride) {
    return int64_t(row) * row_stride + col;
  }
};

template <int kHeadDim>
struct DqStrips {
  static_assert(kHeadDim % 64 == 0, "whole tiles in a row");
  static constexpr int kTilesPerRow = kHeadDim / 64;
  // (row, col)'s place `at`, and for col / 8 a multiple of kTilesPerRow the steps from it to
  // (row, col + 8 i) for i < kTilesPerRow (`tile` each) and to (row, col + 8 kTilesPerRow) (`tiles`),
  // in either layout of the strip: selected, not branched, so that a kernel's adds need no branch
  struct Place {
    int64_t at, tiles;
    int tile;
  };
  __host__ __device__ __forceinline__ static Place place(int row, int col, int rows, int64_t row_stride) {
    const int strip_row0 = row & ~7, tile = col >> 3;
    const bool whole = strip_row0 + 8 <= rows;
    const int64_t in_strip = int64_t(strip_row0 + tile / kTilesPerRow) * row_stride + (tile % kTilesPerRow) * 64 +
                             ((row & 7) << 3) + (col & 7);
    return {whole ? in_strip : int64_t(row) * row_stride + col, whole ? row_stride : 8 * kTilesPerRow, whole ? 64 : 8};
  }
  __host__ __device__ __forceinline__ static int64_t offset(int row, int col, int rows, int64_t row_stride) {
    return place(row, col, rows, row_stride).at;
  }
};

}  // namespace bwd
}  // namespace flashtune
