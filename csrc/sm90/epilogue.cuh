// The epilogue of one consumer warpgroup: O normalised by the row sums and written out, and the
// LSE if the call asked for it (rows past the sequence's end are not written). Two ways out for O:
// the TMA store (tma_store: O staged in shared memory by stmatrix, one thread stores the
// warpgroup's 64 rows) and 16-byte direct stores (every varlen call too: a tile's rows past its
// sequence belong to the next one). Also owns the deferral of an epilogue to the next tile (defer):
// what the epilogue needs besides O, kept until it runs.
// Barriers: named barrier 4 + cw (the warpgroup's 128 threads) around sO, which the warpgroup's
// last TMA store must have read before it is written again; no mbarrier.
#pragma once
#include "common/convert.cuh"
#include "common/params.h"
#include "common/row_lse.cuh"
#include "sm90/kernel_traits.cuh"
#include "sm90/producer.cuh"
#include "sm90/ptx_sm90.cuh"

namespace flashtune {
namespace sm90 {

template <class T>
struct Epilogue {
  using Elem = typename T::Elem;
  static constexpr int BM = T::kBlockM, D = T::kHeadDimV;  // O's head dim
  const FwdParams& p;
  const TmaMaps& maps;
  unsigned char* const s_o;  // the O tile of the TMA store
  const int cw, tid, row_in_tile;
  // defer: the tile whose epilogue waits for the next tile's S_0 (or -1), and what it needs then
  // besides O: the row sums and maxima, and the softmax scale (FP8 descales are per tile).
  int pending = -1;
  float pending_sum[2], pending_max[2], pending_scale = 0.f;

  __device__ __forceinline__ Epilogue(const FwdParams& p_, const TmaMaps& maps_, unsigned char* s_o_, int cw_,
                                      int tid_, int row_in_tile_)
      : p(p_), maps(maps_), s_o(s_o_), cw(cw_), tid(tid_), row_in_tile(row_in_tile_) {}

  __device__ __forceinline__ void defer(int q_done, const float (&sum)[2], const float (&mx)[2], float scale) {
    pending = q_done;
    pending_sum[0] = sum[0], pending_sum[1] = sum[1];
    pending_max[0] = mx[0], pending_max[1] = mx[1];
    pending_scale = scale;
  }
  __device__ __forceinline__ void flush(const float (&acc_o)[T::kORegs]) {
    if (pending >= 0) store(pending, acc_o, pending_sum, pending_max, pending_scale);
    pending = -1;
  }

  // Row r (0: this thread's first, 1: +8) of O, times inv, into out_row by 16-byte stores if `in`.
  // Chunks 4k..4k+3 (8 columns each, a quad holds each as one 32-bit pair per thread): a 4 x 4
  // transpose within the quad in two shuffle rounds, after which thread t holds chunk 4k+t whole
  // and stores it as 16 bytes: a warp's store covers 8 rows x 64 contiguous bytes. Every lane of
  // the warp calls it (the shuffles), whether its row is stored or not.
  static __device__ __forceinline__ void store_row(Elem* out_row, const float (&acc_o)[T::kORegs], int r, float inv,
                                                   int t, bool in, int cols = D) {
#pragma unroll
    for (int k = 0; k < D / 32; ++k) {
      uint32_t x[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        x[i] = pack2<Elem>(acc_o[4 * (4 * k + i) + 2 * r] * inv, acc_o[4 * (4 * k + i) + 2 * r + 1] * inv);
      const bool hi = t & 2, odd = t & 1;
      // Round 1 (lanes t, t^2 swap halves): lanes 0-1 hold chunks 0-1 of both, lanes 2-3 chunks 2-3.
      uint32_t r0 = __shfl_xor_sync(0xffffffff, hi ? x[0] : x[2], 2);
      uint32_t r1 = __shfl_xor_sync(0xffffffff, hi ? x[1] : x[3], 2);
      if (hi) x[0] = r0, x[1] = r1; else x[2] = r0, x[3] = r1;
      // Round 2 (lanes t, t^1): each keeps its own chunk; x[j] is then lane j's pair of it.
      r0 = __shfl_xor_sync(0xffffffff, odd ? x[0] : x[1], 1);
      r1 = __shfl_xor_sync(0xffffffff, odd ? x[2] : x[3], 1);
      if (odd) x[0] = r0, x[2] = r1; else x[1] = r0, x[3] = r1;
      if (in && (!T::kNarrow || 8 * (4 * k + t) < cols))  // narrow: only the chunks of o's own head dim
        *reinterpret_cast<uint4*>(out_row + 8 * (4 * k + t)) = make_uint4(x[0], x[1], x[2], x[3]);
    }
  }

  // A KV-cache kernel's epilogue: packed row R of the tile is position R / head_ratio of head
  // kv_head * head_ratio + R % head_ratio, written where that head's row lives; with splits, as
  // fp32 partials normalised by the split's own sum, and their LSE (-inf: the split saw no key of
  // the row), at [split][row][head] for decode's combine kernel.
  __device__ __forceinline__ void store_packed(const Tile<T>& tile, const float (&acc_o)[T::kORegs],
                                               const float (&sum)[2], const float (&mx)[2], float lse_scale) {
    const int t = tid % 4;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = sum[r];
      l += __shfl_xor_sync(0xffffffff, l, 1);
      l += __shfl_xor_sync(0xffffffff, l, 2);
      const float inv = l > 0.f ? __fdividef(1.f, l) : 0.f;
      const int packed = tile.m_block * BM + row_in_tile + 8 * r;
      const bool in = packed < tile.packed_rows;
      const int pos = packed / p.head_ratio, head = tile.kv_head * p.head_ratio + packed % p.head_ratio;
      if (p.num_splits == 1) {
        Elem* out_row = static_cast<Elem*>(p.o) + int64_t(tile.batch) * p.o_batch_stride +
                        int64_t(pos) * p.o_row_stride + int64_t(head) * p.o_head_stride;
        store_row(out_row, acc_o, r, inv, t, in);
        if (in && t == 0 && p.lse != nullptr)
          p.lse[int64_t(tile.batch) * p.lse_batch_stride + int64_t(head) * p.lse_head_stride + pos] =
              row_lse(mx[r], lse_scale, l);
      } else if (in) {
        const int64_t at = (int64_t(tile.split) * p.total_q + int64_t(tile.batch) * p.seqlen_q + pos) * p.heads_q + head;
        float* dst = p.o_partial + at * D + 2 * t;
#pragma unroll
        for (int c = 0; c < D / 8; ++c)
          *reinterpret_cast<float2*>(dst + 8 * c) = make_float2(acc_o[4 * c + 2 * r] * inv, acc_o[4 * c + 2 * r + 1] * inv);
        if (t == 0) p.lse_partial[at] = l > 0.f ? row_lse(mx[r], lse_scale, l) : -INFINITY;
      }
    }
  }

  // Tile q_done's epilogue: O from its accumulators, the row sums and maxima (raw scores) and the
  // scale from scores to the LSE's natural-log domain.
  __device__ __forceinline__ void store(int q_done, const float (&acc_o)[T::kORegs], const float (&sum)[2],
                                        const float (&mx)[2], float lse_scale) {
    const Tile<T>& tile = Pipeline<T>::shared().tile_info[q_done % Pipeline<T>::kTileSlots];
    if constexpr (T::kCache) {
      store_packed(tile, acc_o, sum, mx, lse_scale);
      return;
    }
    const int lane = tid % 32, g = lane >> 2, t = lane & 3;
    const int rows_end = tile.seqlen_q;  // rows below it are stored
    const int m0 = tile.m_block * BM;
    const bool varlen = p.cu_seqlens_q != nullptr;
    Elem* out = static_cast<Elem*>(p.o) +
                (varlen ? int64_t(tile.q_row0) * p.o_row_stride : int64_t(tile.batch) * p.o_batch_stride) +
                int64_t(tile.head) * p.o_head_stride;
    const int64_t lse_off = varlen ? tile.q_row0 : int64_t(tile.batch) * p.lse_batch_stride;
    const bool tma_store = T::kTmaStore && !varlen;
    if (tma_store) {  // this warpgroup's last store must have read sO before it is written again
      if (tid == 0) bulk_wait_group_read0();
      named_barrier_sync(4 + cw, 128);
    }
    float inv_of[2];  // per row, for the stmatrix stores after the loop
    // FP8 P V: O's accumulators are P V8, the tile's V descale applied here with the row's 1 / l
    const float out_scale = T::kFp8Pv ? p.v_descale[int64_t(tile.batch) * p.descale_batch_stride + tile.kv_head] : 1.f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = sum[r];
      l += __shfl_xor_sync(0xffffffff, l, 1);
      l += __shfl_xor_sync(0xffffffff, l, 2);
      // A row that saw no key: O = 0, LSE = +inf. l >= 1 otherwise (its maximum's own term), so
      // the approximate reciprocal is within 2 ulp and has no slow path to branch around.
      float inv = l > 0.f ? __fdividef(out_scale, l) : 0.f;
      float lse_sink = 0.f;
      if constexpr (T::kSinks) {  // the head's sink logit joins the sum (LSE = its sink if no key)
        const float sink = p.sinks[tile.head];
        const float lse_keys = l > 0.f ? __fmaf_rn(mx[r], lse_scale, logf(l)) : -INFINITY;
        lse_sink = lse_with_sink(lse_keys, sink);
        inv = l > 0.f ? expf(lse_keys - lse_sink) * out_scale / l : 0.f;
        if (lse_sink == -INFINITY) lse_sink = INFINITY;
      }
      inv_of[r] = inv;
      const int row = m0 + row_in_tile + 8 * r;
      if (!tma_store) store_row(out + int64_t(row) * p.o_row_stride, acc_o, r, inv, t, row < rows_end, p.head_dim_v);
      if (row >= rows_end) continue;
      if (p.lse != nullptr && t == 0)
        p.lse[lse_off + int64_t(tile.head) * p.lse_head_stride + row] = T::kSinks ? lse_sink : row_lse(mx[r], lse_scale, l);
    }
    if (tma_store) {
      // Into sO's 128B-swizzled 64-column panels (16-byte chunk c of a row r at c ^ (r % 8)):
      // chunks c and c+1 of both rows as four 8x8 matrices per stmatrix (matrix m: row +8 (m & 1),
      // chunk c + (m >> 1)); lane l addresses row l % 8 of matrix l / 8.
      const int m = lane / 8, rows_of_m = row_in_tile - g + lane % 8 + 8 * (m & 1);
#pragma unroll
      for (int c = 0; c < D / 8; c += 2) {
        const int chunk = c + (m >> 1);
        stmatrix_x4(smem_u32(s_o) + (chunk / 8) * T::kPanelBytesO + rows_of_m * 128 + (((chunk % 8) ^ (lane % 8)) * 16),
                    pack2<Elem>(acc_o[4 * c] * inv_of[0], acc_o[4 * c + 1] * inv_of[0]),
                    pack2<Elem>(acc_o[4 * c + 2] * inv_of[1], acc_o[4 * c + 3] * inv_of[1]),
                    pack2<Elem>(acc_o[4 * c + 4] * inv_of[0], acc_o[4 * c + 5] * inv_of[0]),
                    pack2<Elem>(acc_o[4 * c + 6] * inv_of[1], acc_o[4 * c + 7] * inv_of[1]));
      }
      // Every thread's O is in sO: one thread stores the warpgroup's 64 rows (the TMA does not
      // write rows outside the tensor).
      fence_proxy_async_smem();
      named_barrier_sync(4 + cw, 128);
      if (tid == 0) {
#pragma unroll
        for (int c = 0; c < D / 64; ++c)
          if (!T::kNarrow || 64 * c < p.head_dim_v)  // narrow: no panel wholly past o's head dim
            tma_store_4d(&maps.o, s_o + c * T::kPanelBytesO + cw * 64 * 128, 64 * c, m0 + cw * 64, tile.head,
                         tile.batch);
        bulk_commit_group();
      }
    }
  }

  // Before the CTA exits: sO stays valid until the TMA has read it.
  __device__ __forceinline__ void drain() {
    if (T::kTmaStore && tid == 0) bulk_wait_group_read0();
  }
};

}  // namespace sm90
}  // namespace flashtune
