// The combine kernel of split-KV decode: one warp per (query row, head) merges the num_splits
// partial outputs (fp32, each normalised by its own sum) by their LSEs, FlashDecoding's rescale:
//   lse = log(sum_s exp(lse_s)),  o = sum_s exp(lse_s - lse) * o_s,
// and writes o (16-bit) and, when asked, lse. Splits are summed in order: two identical calls
// give identical bits. No shared memory, no barriers.
#pragma once
#include <math.h>
#include <stdint.h>

#include "common/convert.cuh"
#include "decode/params.h"

namespace flashtune {
namespace decode {

template <typename Elem, int kHeadDim>
__device__ __forceinline__ void combine_body(const DecodeParams& p) {
  constexpr int kPerLane = kHeadDim / 32;  // 2, 4 or 8 columns per lane
  const int lane = threadIdx.x % 32;
  const int64_t item = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (item >= int64_t(p.total_q) * p.heads_q) return;
  const int64_t row = item / p.heads_q;  // in total_q
  const int head = int(item % p.heads_q);
  const int64_t stride = int64_t(p.total_q) * p.heads_q;  // between splits

  float m = -INFINITY;
  for (int s = lane; s < p.num_splits; s += 32) m = fmaxf(m, p.lse_partial[s * stride + item]);
#pragma unroll
  for (int d = 16; d > 0; d /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
  float sum = 0.f;
  if (m != -INFINITY)
    for (int s = lane; s < p.num_splits; s += 32) sum += expf(p.lse_partial[s * stride + item] - m);
#pragma unroll
  for (int d = 16; d > 0; d /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, d);
  const float lse = m == -INFINITY ? INFINITY : m + logf(sum);  // no key at all: +inf, O = 0

  float o[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) o[i] = 0.f;
  if (m != -INFINITY) {
    for (int s = 0; s < p.num_splits; ++s) {
      const float ls = p.lse_partial[s * stride + item];
      if (ls == -INFINITY) continue;
      const float f = expf(ls - lse);
      const float* src = p.o_partial + (s * stride + item) * kHeadDim + lane * kPerLane;
#pragma unroll
      for (int i = 0; i < kPerLane; i += 2) {
        const float2 x = *reinterpret_cast<const float2*>(src + i);
        o[i] += f * x.x, o[i + 1] += f * x.y;
      }
    }
  }

  // The row's place in o and lse: fixed-length rows are (batch, position); varlen rows are rows.
  int64_t o_at, lse_at;
  if (p.cu_seqlens_q == nullptr) {
    const int64_t b = row / p.seqlen_q, pos = row % p.seqlen_q;
    o_at = b * p.o_batch_stride + pos * p.o_row_stride;
    lse_at = b * p.lse_batch_stride + pos;
  } else {
    o_at = row * p.o_row_stride;
    lse_at = row;
  }
  Elem* out = static_cast<Elem*>(p.o) + o_at + int64_t(head) * p.o_head_stride + lane * kPerLane;
#pragma unroll
  for (int i = 0; i < kPerLane; i += 2) *reinterpret_cast<uint32_t*>(out + i) = pack2<Elem>(o[i], o[i + 1]);
  if (lane == 0 && p.lse != nullptr) p.lse[lse_at + int64_t(head) * p.lse_head_stride] = lse;
}

}  // namespace decode
}  // namespace flashtune
