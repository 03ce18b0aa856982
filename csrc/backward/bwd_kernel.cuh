// FlashAttention-2's backward on mma.sync m16n8k16 (sm_80 and newer: the A100, the RTX cards, and
// the H100/H200 under an sm80 profile). The forward kept only O and the LSE; per key block:
//   P^T  = exp(scale K Q^T - LSE)          recomputed from the LSE, no softmax state
//   dV  += P^T dO
//   dP^T = V dO^T
//   dS^T = P^T (dP^T - rowsum(dO O))       the caller computes the row sums
//   dK  += dS^T Q                          (times scale, in the epilogue)
//   dQ  += dS K                            fp32 atomic adds, one CTA per key block adds its share
//
// One CTA owns kBlockN keys of one (batch, query head); K and V stay in shared memory while it
// walks the query blocks that see them (causal: from the diagonal on). Each warp owns 16 keys:
// its rows of S^T and dP^T, and of the dK and dV accumulators, so neither needs a reduction
// across warps (at hdim 256 two warps share the 16 keys: S^T and dP^T over half the queries each,
// dK and dV over half the head dim each, P^T and dS^T exchanged through shared memory). dQ needs
// a reduction: dS^T goes through shared memory and each warp then takes 16 of the query block's
// rows of dS K over all the CTA's keys (with 8 warps or at hdim 256, half of those rows' columns).
#pragma once
#include <math.h>

#include "backward/dq_layout.cuh"
#include "backward/kernel_traits.cuh"
#include "backward/params.h"
#include "common/ptx_sm80.cuh"
#include "common/quad_store.cuh"
#include "sm80/kernel_traits.cuh"

namespace flashtune {
namespace bwd {

using sm80::swizzle_chunk;
using sm80::swizzled;

// kRows rows of a [rows][kHeadDim] 16-bit tile into swizzled shared memory; rows at or beyond
// rows_valid are zero-filled. Each thread keeps one 16-byte column chunk and walks the rows.
template <class T, int kRows, typename E>
__device__ __forceinline__ void load_rows_async(uint32_t smem, const E* gmem, int64_t row_stride, int rows_valid,
                                                int tid) {
  constexpr int kChunks = T::kHeadDim / 8;
  constexpr int kRowsPerPass = T::kThreads / kChunks;
  static_assert(kRows % kRowsPerPass == 0, "whole passes");
  const int row0 = tid / kChunks, chunk = tid % kChunks;
#pragma unroll
  for (int i = 0; i < kRows / kRowsPerPass; ++i) {
    const int row = row0 + i * kRowsPerPass;
    const bool valid = row < rows_valid;
    cp_async_16(smem + 2 * swizzled<T::kHeadDim>(row, chunk * 8),
                gmem + (valid ? int64_t(row) * row_stride : 0) + chunk * 8, valid);
  }
}

// acc (16 rows x 16 * kTiles/2 columns, the m16n8 accumulator layout) as A fragments of k16 steps:
// two adjacent n8 tiles are one k16 fragment, so this is a reshape in registers.
template <typename Elem, int kTiles>
__device__ __forceinline__ void to_a_fragments(uint32_t (&frag)[kTiles / 2][4], const float (&acc)[kTiles][4]) {
#pragma unroll
  for (int kk = 0; kk < kTiles / 2; ++kk) {
    frag[kk][0] = pack2<Elem>(acc[2 * kk][0], acc[2 * kk][1]);
    frag[kk][1] = pack2<Elem>(acc[2 * kk][2], acc[2 * kk][3]);
    frag[kk][2] = pack2<Elem>(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
    frag[kk][3] = pack2<Elem>(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
  }
}

// acc[kTiles n8 tiles] = A (16 rows, from `a_lane`: the warp's rows of a [rows][kHeadDim] tile) times
// the transpose of the [kTiles * 8][kHeadDim] tile at `b_tile` (`b_lane`: this lane's row address).
template <class T, int kTiles>
__device__ __forceinline__ void rows_times_rows_t(float (&acc)[kTiles][4], const uint32_t (&a_lane)[4],
                                                  uint32_t b_tile, const uint32_t (&b_lane)[4]) {
  using Elem = typename T::Elem;
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < T::kHeadDim / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, a_lane[kk % 4] + (kk / 4) * 128);
#pragma unroll
    for (int nt = 0; nt < kTiles; nt += 2) {
      uint32_t b[4];
      ldmatrix_x4(b, b_tile + b_lane[kk % 4] + nt * 8 * T::kRowBytes + (kk / 4) * 128);
      mma_16816<Elem>(acc[nt], a, b[0], b[1]);
      mma_16816<Elem>(acc[nt + 1], a, b[2], b[3]);
    }
  }
}

// acc[kTiles n8 tiles] += frag (16 rows x 16 * kSteps, A fragments) times the [16 * kSteps][kHeadDim]
// tile at `b_tile`, its first 8 * kTiles columns (`bt_lane`: this lane's row address for transposed
// loads; a later part of the head dim: b_tile plus that part's 128-byte groups).
template <class T, int kSteps, int kTiles>
__device__ __forceinline__ void frag_times_rows(float (&acc)[kTiles][4], const uint32_t (&frag)[kSteps][4],
                                                uint32_t b_tile, const uint32_t (&bt_lane)[4]) {
  using Elem = typename T::Elem;
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
    for (int dt = 0; dt < kTiles; dt += 2) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, b_tile + bt_lane[(dt / 2) % 4] + kk * 16 * T::kRowBytes + (dt / 8) * 128);
      mma_16816<Elem>(acc[dt], frag[kk], b[0], b[1]);
      mma_16816<Elem>(acc[dt + 1], frag[kk], b[2], b[3]);
    }
}

// One sequence's lengths and the element offsets of its first row in every tensor (varlen: from
// cu_seqlens; else the batch entry's).
struct Sequence {
  int seqlen_q, seqlen_k;
  int64_t q, k, v, dout, dq, dkv, lse;
  int q_row0, q_rows;  // the first query row in the tensor's rows, and dq_sum_rows
};

__device__ __forceinline__ Sequence sequence(const BwdParams& bp, int batch) {
  const FwdParams& p = bp.fwd;
  if (p.cu_seqlens_q == nullptr) {
    return {p.seqlen_q, p.seqlen_k, batch * p.q_batch_stride, batch * p.k_batch_stride, batch * p.v_batch_stride,
            batch * bp.do_batch_stride, batch * bp.dq_batch_stride, batch * bp.dkv_batch_stride,
            batch * p.lse_batch_stride, 0, dq_sum_rows(p)};
  }
  const int q_start = p.cu_seqlens_q[batch], k_start = p.cu_seqlens_k[batch];
  return {p.cu_seqlens_q[batch + 1] - q_start, p.cu_seqlens_k[batch + 1] - k_start, q_start * p.q_row_stride,
          k_start * p.k_row_stride, k_start * p.v_row_stride, q_start * bp.do_row_stride, q_start * bp.dq_row_stride,
          k_start * bp.dkv_row_stride, q_start, q_start, dq_sum_rows(p)};
}

// A dK/dV CTA's view of its (batch, query head): Q, dO, dQ and the statistics from its sequence's
// first row, K and V from the CTA's first key, dK/dV's offset, the lengths and the query blocks that
// see the CTA's keys (bwd_body and tiled_body alike).
template <class T>
struct KeyBlock {
  using Elem = typename T::Elem;
  const Elem *q, *dout, *k, *v;
  float* dq;            // dq_accum at the sequence's first row (of this head)
  int q_row0, q_rows;  // that row among the tensor's rows (varlen: packed), and their number (DqLayout)
  const float *lse, *dsum;
  int64_t dkv;  // dK and dV: element offset of the sequence's first row (of this head)
  int seqlen_q, seqlen_k, key0;
  int causal_shift;    // bottom-right causal: key j is visible to query i iff j <= i + shift
  int m_begin, m_end;  // the query blocks (kBlockM rows) that see any of the CTA's keys
};

template <class T>
__device__ __forceinline__ KeyBlock<T> key_block(const BwdParams& bp, int n_block, int head, int batch) {
  using Elem = typename T::Elem;
  const FwdParams& p = bp.fwd;
  const int kv_head = head / p.head_ratio;
  const Sequence seq = sequence(bp, batch);
  const int key0 = n_block * T::kBlockN;
  KeyBlock<T> kb;
  kb.q = static_cast<const Elem*>(p.q) + seq.q + int64_t(head) * p.q_head_stride;
  kb.dout = static_cast<const Elem*>(bp.dout) + seq.dout + int64_t(head) * bp.do_head_stride;
  kb.k = static_cast<const Elem*>(p.k) + seq.k + int64_t(kv_head) * p.k_head_stride + int64_t(key0) * p.k_row_stride;
  kb.v = static_cast<const Elem*>(p.v) + seq.v + int64_t(kv_head) * p.v_head_stride + int64_t(key0) * p.v_row_stride;
  kb.dq = bp.dq_accum + seq.dq + int64_t(head) * bp.dq_head_stride;
  kb.q_row0 = seq.q_row0;
  kb.q_rows = seq.q_rows;
  kb.lse = p.lse + seq.lse + int64_t(head) * p.lse_head_stride;
  kb.dsum = bp.dsum + seq.lse + int64_t(head) * p.lse_head_stride;
  kb.dkv = seq.dkv + int64_t(head) * bp.dkv_head_stride;
  kb.seqlen_q = seq.seqlen_q;
  kb.seqlen_k = seq.seqlen_k;
  kb.key0 = key0;
  kb.causal_shift = seq.seqlen_k - seq.seqlen_q;
  kb.m_end = (seq.seqlen_q + T::kBlockM - 1) / T::kBlockM;
  kb.m_begin = T::kCausal ? min(kb.m_end, max(0, key0 - kb.causal_shift) / T::kBlockM) : 0;
  return kb;
}

// The CTA's K and V into shared memory by cp.async (keys past the end as zeros).
template <class T>
__device__ __forceinline__ void load_keys(uint32_t sK, uint32_t sV, const KeyBlock<T>& kb, const FwdParams& p,
                                          int tid) {
  load_rows_async<T, T::kBlockN>(sK, kb.k, p.k_row_stride, kb.seqlen_k - kb.key0, tid);
  load_rows_async<T, T::kBlockN>(sV, kb.v, p.v_row_stride, kb.seqlen_k - kb.key0, tid);
}

// The query block at q0's Q, dO and statistics into the stage at `stage` (its offsets from K's), all
// by cp.async (thread i < kBlockM: statistics row i). Rows past the end arrive as zeros: Q's and
// dO's make S = 0 and dO = 0 there, so P is finite, and P^T dO and dS = P (V dO^T - 0) are 0. The
// LSE stays in natural-log units (+inf for a row that sees no key: P = 0).
template <class T>
__device__ __forceinline__ void load_query_block(uint32_t stage, const KeyBlock<T>& kb, const BwdParams& bp, int q0,
                                                 int tid) {
  const FwdParams& p = bp.fwd;
  constexpr int BM = T::kBlockM;
  load_rows_async<T, BM>(stage + T::kQOffset, kb.q + int64_t(q0) * p.q_row_stride, p.q_row_stride, kb.seqlen_q - q0,
                         tid);
  load_rows_async<T, BM>(stage + T::kdOOffset, kb.dout + int64_t(q0) * bp.do_row_stride, bp.do_row_stride,
                         kb.seqlen_q - q0, tid);
  if (tid < BM) {
    const bool valid = q0 + tid < kb.seqlen_q;
    const uint32_t stats = stage + T::kStatsOffset + 4 * tid;
    cp_async_4(stats, kb.lse + (valid ? q0 + tid : 0), valid);
    cp_async_4(stats + 4 * BM, kb.dsum + (valid ? q0 + tid : 0), valid);
  }
}

// The top of query block m's step: its Q, dO and statistics complete and visible to every warp,
// and every warp done with the last block; with two stages the next block's loads issued into the
// other stage, to run under this block's math (with one, this block's loads wait for the last
// block's math). Returns where the block lies in that stage (`smem`: the kernel's shared memory, K
// at its start).
struct QueryStage {
  uint32_t q, dout;         // shared addresses of the block's Q and dO tiles
  const float *lse, *dsum;  // its statistics, kBlockM of each
};
template <class T, class LoadBlock>
__device__ __forceinline__ QueryStage begin_query_block(const unsigned char* smem, int m, int m_begin, int m_end,
                                                        const LoadBlock& load_block) {
  const int q0 = m * T::kBlockM;
  const int stage = T::kQStages > 1 ? (m - m_begin) & 1 : 0;
  if (T::kQStages == 1 && m > m_begin) {
    __syncthreads();
    load_block(q0, 0);
    cp_async_commit();
  }
  cp_async_wait<0>();  // this block's loads (and the first time K and V)
  __syncthreads();
  if (T::kQStages > 1 && m + 1 < m_end) {
    load_block(q0 + T::kBlockM, stage ^ 1);
    cp_async_commit();
  }
  const uint32_t at = smem_addr(smem) + stage * T::kStageBytes;
  const float* stats = reinterpret_cast<const float*>(smem + T::kStatsOffset + stage * T::kStageBytes);
  return {at + T::kQOffset, at + T::kdOOffset, stats, stats + T::kBlockM};
}

template <class T>
__device__ __forceinline__ void bwd_body(const BwdParams& bp) {
  using Elem = typename T::Elem;
  constexpr int D = T::kHeadDim, BM = T::kBlockM, BN = T::kBlockN;
  constexpr int QT = T::kQTiles, KVT = T::kKvTiles;
  constexpr uint32_t kRowBytes = T::kRowBytes;
  const FwdParams& p = bp.fwd;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t sK = smem_addr(smem_raw), sV = sK + T::kVOffset, sdS = sK + T::kdSOffset, sP = sK + T::kPOffset;
  Elem* dS_tile = reinterpret_cast<Elem*>(smem_raw + T::kdSOffset);
  Elem* P_tile = reinterpret_cast<Elem*>(smem_raw + T::kPOffset);  // kKvSplit > 1 only

  const KeyBlock<T> kb = key_block<T>(bp, blockIdx.x, blockIdx.y, blockIdx.z);
  const int seqlen_q = kb.seqlen_q, seqlen_k = kb.seqlen_k, key0 = kb.key0;
  if (key0 >= seqlen_k) return;  // uniform across the CTA
  const int causal_shift = kb.causal_shift, m_begin = kb.m_begin, m_end = kb.m_end;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int x = lane & 7, hi = lane >> 4, mid = (lane >> 3) & 1;
  // The warp's 16 keys (key group), and with kKvSplit its part: of each query block's S^T and dP^T
  // (kSQueries from the query part * kSQueries) and of the head dim of dK and dV.
  // (compile-time warp and 0 without kKvSplit: the hdim 64/128 kernels keep their code)
  const int key_group = T::kKvSplit > 1 ? warp % T::kKeyGroups : warp;
  const int part = T::kKvSplit > 1 ? warp / T::kKeyGroups : 0;
  const int s_col0 = part * T::kSQueries;
  const uint32_t kv_col_bytes = part * (D / T::kKvSplit) * 2;  // whole 128-byte groups: no swizzle change

  // ldmatrix row addresses (the forward's scheme, sm80/fwd_kernel.cuh): per k step of 32 bytes
  // the swizzled chunk takes one of 4 lane-dependent values; the rest are compile-time offsets.
  //   a_k, a_v: A fragments of the warp's 16 key rows of K and V (absolute addresses)
  //   b_rows:   B fragments, n = rows of Q or dO, k = head dim (relative to the tile)
  //   bt_rows:  B fragments, k = rows of dO, Q or K, n = head dim, transposed loads (relative)
  uint32_t a_k[4], a_v[4], b_rows[4], bt_rows[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t a_rel = (key_group * 16 + mid * 8 + x) * kRowBytes + (swizzle_chunk<D>(2 * i + hi, x) << 4);
    a_k[i] = sK + a_rel;
    a_v[i] = sV + a_rel;
    b_rows[i] = (hi * 8 + x) * kRowBytes + (swizzle_chunk<D>(2 * i + mid, x) << 4);
    bt_rows[i] = (mid * 8 + x) * kRowBytes + (((2 * i + hi) ^ x) << 4);
  }
  // dQ: the warp's 16 query rows and its first head-dim column (T::kDqSplit warps share the rows).
  const int dq_row0 = T::kDqSplit == 1 ? warp * 16 : (warp % (BM / 16)) * 16;
  const int dq_col0 = T::kDqSplit == 1 ? 0 : (warp / (BM / 16)) * (D / T::kDqSplit);
  // dS as A fragments for dQ, transposed loads from dS^T [keys][queries]: keys kk * 16 + hi * 8 + x,
  // this warp's queries dq_row0 + mid * 8 (row & 7 = x, so every k step shares the swizzle).
  const uint32_t ds_lane = sdS + 2 * swizzled<BM>(hi * 8 + x, dq_row0 + mid * 8);
  // K as dQ's B fragments, transposed loads: with whole rows, bt_rows at compile-time offsets; a
  // warp with part of the columns takes bt_rows's scheme at column dq_col0 + 16 j (kept apart: the
  // whole-row kernels have no registers to spare).
  uint32_t bt_dq[T::kDqSplit > 1 ? T::kDqTiles / 2 : 1];
#pragma unroll
  for (int j = 0; j < T::kDqTiles / 2 && T::kDqSplit > 1; ++j) {
    const int group = dq_col0 / 16 + j;  // 16-column group of the head dim
    bt_dq[j] = (mid * 8 + x) * kRowBytes + (((2 * (group % 4) + hi) ^ x) << 4) + (group / 4) * 128;
  }

  auto load_block = [&](int q0, int stage) { load_query_block<T>(sK + stage * T::kStageBytes, kb, bp, q0, tid); };
  load_keys<T>(sK, sV, kb, p, tid);
  if (m_begin < m_end) load_block(m_begin * BM, 0);
  cp_async_commit();

  float acc_dk[KVT][4], acc_dv[KVT][4];
#pragma unroll
  for (int dt = 0; dt < KVT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[dt][e] = acc_dv[dt][e] = 0.f;

  constexpr float kLog2e = 1.4426950408889634f;
  for (int m = m_begin; m < m_end; ++m) {
    const int q0 = m * BM;
    const QueryStage block = begin_query_block<T>(smem_raw, m, m_begin, m_end, load_block);
    const uint32_t sQ = block.q, sdO = block.dout;

    // ---- P^T = exp2(scale_log2 S^T - LSE), S^T = K Q^T over the warp's 16 keys (and its queries)
    float acc_s[QT][4];
    rows_times_rows_t<T, QT>(acc_s, a_k, sQ + s_col0 * kRowBytes, b_rows);
#pragma unroll
    for (int nt = 0; nt < QT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + key_group * 16 + g + 8 * (e >> 1);
        const int col = s_col0 + nt * 8 + 2 * t + (e & 1);
        const bool masked = key >= seqlen_k || (T::kCausal && key > q0 + col + causal_shift);
        acc_s[nt][e] = masked ? 0.f : fast_exp2(fmaf(acc_s[nt][e], p.softmax_scale_log2, -block.lse[col] * kLog2e));
      }

    // ---- dS^T = P^T (dP^T - rowsum(dO O)), dP^T = V dO^T
    float acc_ds[QT][4];
    rows_times_rows_t<T, QT>(acc_ds, a_v, sdO + s_col0 * kRowBytes, b_rows);
#pragma unroll
    for (int nt = 0; nt < QT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        acc_ds[nt][e] = acc_s[nt][e] * (acc_ds[nt][e] - block.dsum[s_col0 + nt * 8 + 2 * t + (e & 1)]);

    uint32_t frag_p[QT / 2][4], frag_ds[QT / 2][4];
    to_a_fragments<Elem, QT>(frag_p, acc_s);
    to_a_fragments<Elem, QT>(frag_ds, acc_ds);
    // dS^T to shared memory for dQ (and with kKvSplit P^T, for the warps sharing these keys):
    // fragment (kk, i) holds row g (+8 for i odd), columns kk * 16 + 2t (+8 for i >= 2)
    if constexpr (!T::kDeterministic || T::kKvSplit > 1) {
#pragma unroll
      for (int kk = 0; kk < QT / 2; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int at = swizzled<BM>(key_group * 16 + g + 8 * (i & 1), s_col0 + kk * 16 + 8 * (i >> 1) + 2 * t);
          *reinterpret_cast<uint32_t*>(dS_tile + at) = frag_ds[kk][i];
          if constexpr (T::kKvSplit > 1) *reinterpret_cast<uint32_t*>(P_tile + at) = frag_p[kk][i];
        }
    }

    // ---- dV += P^T dO, dK += dS^T Q
    if constexpr (T::kKvSplit == 1) {
      frag_times_rows<T, QT / 2, KVT>(acc_dv, frag_p, sdO, bt_rows);
      frag_times_rows<T, QT / 2, KVT>(acc_dk, frag_ds, sQ, bt_rows);
    } else {
      __syncthreads();  // P^T and dS^T complete: each warp takes all the block's queries, its head-dim part
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk) {  // A fragments of 16 keys x 16 queries, one k step at a time
        const int at = swizzled<BM>(key_group * 16 + mid * 8 + x, kk * 16 + hi * 8);
        uint32_t frag[1][4];
        ldmatrix_x4(frag[0], sP + 2 * at);
        frag_times_rows<T, 1, KVT>(acc_dv, frag, sdO + kk * 16 * kRowBytes + kv_col_bytes, bt_rows);
        ldmatrix_x4(frag[0], sdS + 2 * at);
        frag_times_rows<T, 1, KVT>(acc_dk, frag, sQ + kk * 16 * kRowBytes + kv_col_bytes, bt_rows);
      }
    }

    if constexpr (T::kDeterministic) continue;  // dQ is the dQ kernel's
    if constexpr (T::kKvSplit == 1) __syncthreads();  // dS^T complete
    // ---- dQ (the warp's 16 query rows) += dS K, added to the fp32 sum in global memory
    // In chunks of kDqChunk n8 tiles (the whole warp's columns but at hdim 256, where dK and dV
    // hold 128 registers).
    constexpr int QDT = T::kDqTiles, CH = T::kDqChunk;
#pragma unroll
    for (int c = 0; c < QDT; c += CH) {
      float acc_dq[CH][4];
#pragma unroll
      for (int dt = 0; dt < CH; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dq[dt][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4_trans(a, ds_lane + kk * 16 * T::kdSRowBytes);
#pragma unroll
        for (int dt = 0; dt < CH; dt += 2) {
          uint32_t b[4];
          const uint32_t lane_row = T::kDqSplit > 1 ? bt_dq[T::kDqSplit > 1 ? (c + dt) / 2 : 0]
                                                    : bt_rows[(dt / 2) % 4] + (dt / 8) * 128;
          ldmatrix_x4_trans(b, sK + lane_row + kk * 16 * kRowBytes);
          mma_16816<Elem>(acc_dq[dt], a, b[0], b[1]);
          mma_16816<Elem>(acc_dq[dt + 1], a, b[2], b[3]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = q0 + dq_row0 + g + 8 * r;
        if (row < seqlen_q) {
          float* out = kb.dq + int64_t(row) * bp.dq_row_stride + dq_col0 + c * 8 + 2 * t;
#pragma unroll
          for (int dt = 0; dt < CH; ++dt) {
#if __CUDA_ARCH__ >= 900  // sm_90 and sm_120 add two adjacent floats in one instruction (REDG.E.ADD.F32x2):
            // half the reductions: the 8-warp kernel 1.17x as fast on an H100 (docs/design.md)
            atomicAdd(reinterpret_cast<float2*>(out + dt * 8), make_float2(acc_dq[dt][2 * r], acc_dq[dt][2 * r + 1]));
#else
            atomicAdd(out + dt * 8, acc_dq[dt][2 * r]);
            atomicAdd(out + dt * 8 + 1, acc_dq[dt][2 * r + 1]);
#endif
          }
        }
      }
    }
  }

  cp_async_wait<0>();  // K and V's loads complete where no query block came (varlen: no queries)

  // ---- Epilogue: dK (times the softmax scale: S was scaled) and dV of the warp's keys, in whole
  // sectors, 8 bytes a thread (common/quad_store.cuh; every lane shuffles, then the rows in range store)
  Elem* gdK = static_cast<Elem*>(bp.dk) + kb.dkv;
  Elem* gdV = static_cast<Elem*>(bp.dv) + kb.dkv;
  static_assert(KVT % 2 == 0, "pairs of n8 tiles: 16 columns");
  const float sc = p.softmax_scale;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + key_group * 16 + g + 8 * r;
    const int64_t row = int64_t(key) * bp.dkv_row_stride + part * (D / T::kKvSplit) + 4 * t;
#pragma unroll
    for (int dt = 0; dt < KVT; dt += 2) {  // n8 tiles dt and dt + 1: 16 columns
      const uint2 dk = quad_chunk_of_16(pack2<Elem>(acc_dk[dt][2 * r] * sc, acc_dk[dt][2 * r + 1] * sc),
                                        pack2<Elem>(acc_dk[dt + 1][2 * r] * sc, acc_dk[dt + 1][2 * r + 1] * sc), lane);
      const uint2 dv = quad_chunk_of_16(pack2<Elem>(acc_dv[dt][2 * r], acc_dv[dt][2 * r + 1]),
                                        pack2<Elem>(acc_dv[dt + 1][2 * r], acc_dv[dt + 1][2 * r + 1]), lane);
      if (key < seqlen_k) {
        *reinterpret_cast<uint2*>(gdK + row + dt * 8) = dk;
        *reinterpret_cast<uint2*>(gdV + row + dt * 8) = dv;
      }
    }
  }
}

}  // namespace bwd
}  // namespace flashtune
