// The split kernel's merge of a row block's splits inside a thread block cluster (sm_90 and newer),
// instead of fp32 partials in global memory and the combine kernel: when the launcher makes the
// num_splits CTAs of a row block one cluster (launch.cuh; split s is the cluster's CTA s), each
// CTA leaves its rows' normalised O and LSE in its own shared memory, and after one cluster barrier
// every CTA merges a 1/num_splits share of the (row, 4 columns) cells from all of them through
// distributed shared memory, FlashDecoding's rescale as the combine kernel does it:
//   lse = log(sum_s exp(lse_s)),  o = sum_s exp(lse_s - lse) * o_s   (splits in order).
// What it saves is a short call's second kernel: the combine's launch, its wait for the split
// kernel's end and its reads of the partials from L2 (2-3 us of a 10-15 us call).
#pragma once
#include <math.h>

#include "common/cluster.cuh"
#include "common/ptx_sm80.cuh"
#include "common/row_lse.cuh"
#include "decode/output.cuh"
#include "decode/params.h"
#include "decode/work.cuh"

namespace flashtune {
namespace decode {

constexpr int kMaxClusterSplits = 8;  // the portable cluster size; runtime/decode.py asks for no more

// kept_o, kept_lse: this CTA's share of the cells as the split kernel's merge of its warps left
// them (cell c = threadIdx.x + i * kThreads: row c / (kHeadDim / 4), columns 4 x (c % ...)), O
// normalised by the split's own sum, LSE -inf for a row the split saw no key of. Every thread of
// every CTA of the cluster calls it.
template <class T, int kItems>
__device__ __forceinline__ void cluster_merge(const DecodeParams& p, const Work& w, int first_row,
                                              unsigned char* smem, const float4 (&kept_o)[kItems],
                                              const float (&kept_lse)[kItems]) {
  constexpr int D = T::kHeadDim, kQuads = D / 4, kCells = T::kRows * kQuads;
  // Over the warps' merge buffers, which the caller is done reading after this barrier: O over
  // the merged O (W x rows x (D + 8) floats, at least rows x D), the LSEs over the maxima.
  float* part_o = reinterpret_cast<float*>(smem + T::kQBytes);
  float* part_lse = reinterpret_cast<float*>(smem + T::kQBytes + T::kAfterQ);
  const int tid = threadIdx.x;
  auto live = [&](int row, int col) { return first_row + row < w.packed_rows && (T::kDim == D || col < T::kDim); };
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int c = tid + i * T::kThreads, row = c / kQuads, col = (c % kQuads) * 4;
    if (c < kCells && live(row, col)) {
      *reinterpret_cast<float4*>(part_o + row * D + col) = kept_o[i];
      if (col == 0) part_lse[row] = kept_lse[i];
    }
  }
  cluster_sync();  // every split's rows are in its shared memory, visible to the cluster

  const int n = p.num_splits;
  const uint32_t o_base = smem_addr(part_o), lse_base = smem_addr(part_lse);
  for (int c = w.split * T::kThreads + tid; c < kCells; c += n * T::kThreads) {
    const int row = c / kQuads, col = (c % kQuads) * 4;
    if (!live(row, col)) continue;
    float ls[kMaxClusterSplits];
    float4 x[kMaxClusterSplits];
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {  // every load issued before any is used
      ls[s] = s < n ? cluster_load_f32(cluster_peer_addr(lse_base + row * 4, s)) : -INFINITY;
      x[s] = s < n ? cluster_load_f32x4(cluster_peer_addr(o_base + (row * D + col) * 4, s))
                   : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float m = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) m = fmaxf(m, ls[s]);
    float sum = 0.f;
    if (m != -INFINITY)
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) sum += expf(ls[s] - m);  // exp(-inf) = 0: absent splits
    float lse = m == -INFINITY ? INFINITY : m + logf(sum);  // no key at all: +inf, O = 0
    const int packed = first_row + row;
    if constexpr (T::kSinks) {  // the head's sink joins the merged sum once
      const float sink = p.sinks[w.kv_head * p.head_ratio + packed % p.head_ratio];
      lse = lse_with_sink(m == -INFINITY ? -INFINITY : lse, sink);
      if (lse == -INFINITY) lse = INFINITY;
    }
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    if (m != -INFINITY)
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) {
        const float f = expf(ls[s] - lse);  // 0 for a split without keys, and for absent ones
        o.x += f * x[s].x, o.y += f * x[s].y, o.z += f * x[s].z, o.w += f * x[s].w;
      }
    store_output<T>(p, w, packed, col, o, lse);
  }
  cluster_sync();  // no CTA leaves while another still reads its shared memory
}

}  // namespace decode
}  // namespace flashtune
