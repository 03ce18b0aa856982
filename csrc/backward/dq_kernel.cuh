// The deterministic backward's dQ kernel: one CTA per kDqRows queries of a (batch, query head)
// walks the key blocks they see, in order, and stores dQ once (no atomic adds, so the same inputs
// give the same bits). It recomputes P and dS, which the dK/dV kernel (bwd_kernel.cuh, built
// kDeterministic) computed too: about 1.4x the backward's matmul work for reproducibility.
//   S = Q K^T, P = exp(scale S - LSE), dP = dO V^T, dS = P (dP - rowsum(dO O)), dQ += dS K
// Each warp owns 16 query rows, as in the forward: no reduction across warps.
#pragma once
#include "backward/bwd_kernel.cuh"

namespace flashtune {
namespace bwd {

template <class T>
__device__ __forceinline__ void dq_body(const BwdParams& bp) {
  using Elem = typename T::Elem;
  constexpr int D = T::kHeadDim, BM = T::kDqRows, BN = T::kBlockN;
  constexpr int KT = BN / 8, DT = T::kDTiles;
  constexpr uint32_t kRowBytes = T::kRowBytes;
  const FwdParams& p = bp.fwd;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t sK = smem_addr(smem_raw), sV = sK + T::kVOffset, sQ = sK + T::kQOffset,
                 sdO = sQ + BM * kRowBytes;  // its own layout past K and V: kDqRows of Q and dO

  const int m_block = gridDim.x - 1 - blockIdx.x;  // causal: the longest rows first
  const int head = blockIdx.y, batch = blockIdx.z;
  const int kv_head = head / p.head_ratio;
  const Sequence seq = sequence(bp, batch);
  const int seqlen_q = seq.seqlen_q, seqlen_k = seq.seqlen_k;
  const int q0 = m_block * BM;
  if (q0 >= seqlen_q) return;

  const Elem* gK = static_cast<const Elem*>(p.k) + seq.k + int64_t(kv_head) * p.k_head_stride;
  const Elem* gV = static_cast<const Elem*>(p.v) + seq.v + int64_t(kv_head) * p.v_head_stride;
  const int causal_shift = seqlen_k - seqlen_q;
  int n_end = (seqlen_k + BN - 1) / BN;
  if (T::kCausal) {
    const int last_visible = q0 + BM - 1 + causal_shift;  // of the block's last row
    n_end = min(n_end, last_visible < 0 ? 0 : last_visible / BN + 1);
  }

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int x = lane & 7, hi = lane >> 4, mid = (lane >> 3) & 1;
  uint32_t a_q[4], a_do[4], b_rows[4], bt_rows[4];  // as in bwd_body, the warp's rows now queries
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t a_rel = (warp * 16 + mid * 8 + x) * kRowBytes + (swizzle_chunk<D>(2 * i + hi, x) << 4);
    a_q[i] = sQ + a_rel;
    a_do[i] = sdO + a_rel;
    b_rows[i] = (hi * 8 + x) * kRowBytes + (swizzle_chunk<D>(2 * i + mid, x) << 4);
    bt_rows[i] = (mid * 8 + x) * kRowBytes + (((2 * i + hi) ^ x) << 4);
  }

  load_rows_async<T, BM>(sQ, static_cast<const Elem*>(p.q) + seq.q + int64_t(head) * p.q_head_stride +
                                 int64_t(q0) * p.q_row_stride,
                         p.q_row_stride, seqlen_q - q0, tid);
  load_rows_async<T, BM>(sdO, static_cast<const Elem*>(bp.dout) + seq.dout + int64_t(head) * bp.do_head_stride +
                                  int64_t(q0) * bp.do_row_stride,
                         bp.do_row_stride, seqlen_q - q0, tid);
  cp_async_commit();
  // The thread's two rows' statistics (rows past the end: P = 0)
  constexpr float kLog2e = 1.4426950408889634f;
  float lse_log2[2], dsum[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = q0 + warp * 16 + g + 8 * r;
    const bool valid = row < seqlen_q;
    const int64_t at = seq.lse + int64_t(head) * p.lse_head_stride + row;
    lse_log2[r] = valid ? p.lse[at] * kLog2e : INFINITY;
    dsum[r] = valid ? bp.dsum[at] : 0.f;
  }

  float acc_dq[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dq[dt][e] = 0.f;

  for (int n = 0; n < n_end; ++n) {
    const int key0 = n * BN;
    __syncthreads();  // every warp is done with the last block's K and V
    load_rows_async<T, BN>(sK, gK + int64_t(key0) * p.k_row_stride, p.k_row_stride, seqlen_k - key0, tid);
    load_rows_async<T, BN>(sV, gV + int64_t(key0) * p.v_row_stride, p.v_row_stride, seqlen_k - key0, tid);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    float acc_s[KT][4], acc_ds[KT][4];
    rows_times_rows_t<T, KT>(acc_s, a_q, sK, b_rows);
    rows_times_rows_t<T, KT>(acc_ds, a_do, sV, b_rows);  // dP
#pragma unroll
    for (int nt = 0; nt < KT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const int key = key0 + nt * 8 + 2 * t + (e & 1);
        const int row = q0 + warp * 16 + g + 8 * r;
        const bool masked = key >= seqlen_k || (T::kCausal && key > row + causal_shift);
        const float prob = masked ? 0.f : fast_exp2(fmaf(acc_s[nt][e], p.softmax_scale_log2, -lse_log2[r]));
        acc_ds[nt][e] = prob * (acc_ds[nt][e] - dsum[r]);
      }
    uint32_t frag_ds[KT / 2][4];
    to_a_fragments<Elem, KT>(frag_ds, acc_ds);
    frag_times_rows<T, KT / 2, DT>(acc_dq, frag_ds, sK, bt_rows);
  }

  float* gdQ = bp.dq_accum + seq.dq + int64_t(head) * bp.dq_head_stride;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = q0 + warp * 16 + g + 8 * r;
    if (row < seqlen_q) {
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
        *reinterpret_cast<float2*>(gdQ + int64_t(row) * bp.dq_row_stride + dt * 8 + 2 * t) =
            make_float2(acc_dq[dt][2 * r], acc_dq[dt][2 * r + 1]);
    }
  }
}

}  // namespace bwd
}  // namespace flashtune
