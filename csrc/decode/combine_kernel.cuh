// The combine kernel of split-KV decode: merges the num_splits partial outputs (fp32, each
// normalised by its own sum) of a (query row, head) item by their LSEs, FlashDecoding's rescale:
//   lse = log(sum_s exp(lse_s)),  o = sum_s exp(lse_s - lse) * o_s,
// and writes o (16-bit) and, when asked, lse.
//
// A group of combine_group(num_splits) warps shares an item: with one query row and one KV head
// (MQA at batch 1) a call has 32 items and 100+ splits, and one warp walking them all waited one
// memory latency per eight splits (15 us at 122 splits, more than the split kernel). Every warp
// of the group reduces all the LSEs (each gets the same bits), sums its own splits (part,
// part + group, ...) with eight partial rows in flight, and the group's first warp adds the parts
// in order through shared memory. A warp's first eight partial rows are loaded with the LSEs,
// before their reduction, so that up to 64 splits cost the kernel one memory latency, not two or
// three. The group size depends on num_splits only: two identical calls give identical bits.
#pragma once
#include <math.h>
#include <stdint.h>

#include "common/convert.cuh"
#include "common/pdl.cuh"
#include "common/row_lse.cuh"
#include "decode/params.h"

namespace flashtune {
namespace decode {

constexpr int kMaxSplits = 256;      // runtime/kvcache.py refuses more; launch.cuh checks
constexpr int kSplitsInFlight = 8;   // partial rows a lane loads before it adds any
constexpr int kCombineWarps = 8;     // per CTA: kCombineWarps / combine_group(n) items

// Warps per item: enough that none walks more than one round of kSplitsInFlight, at most a CTA.
__host__ __device__ constexpr int combine_group(int num_splits) {
  return num_splits <= kSplitsInFlight ? 1 : num_splits <= 2 * kSplitsInFlight ? 2
         : num_splits <= 4 * kSplitsInFlight ? 4 : 8;
}

// kDim: the head dim (a multiple of 8 from 32 to 256); the lanes cover the next of 64, 128 or 256
// columns, kPerLane each, and lanes past kDim only help with the LSEs.
// kSinks: the head's sink logit joins the merged sum once (split_kernel.cuh leaves it out of the partials).
// kPdl: launched as the split kernel's programmatic dependent (launch.cuh): wait for its results.
template <typename Elem, int kDim, bool kSinks = false, bool kPdl = false>
__device__ __forceinline__ void combine_body(const DecodeParams& p) {
  constexpr int kHeadDim = kDim <= 64 ? 64 : kDim <= 128 ? 128 : 256;
  constexpr int kPerLane = kHeadDim / 32;  // 2, 4 or 8 columns per lane: never split by kDim (a multiple of 8)
  constexpr int kLseSlots = kMaxSplits / 32;
  __shared__ float parts[kCombineWarps][kHeadDim];  // each warp's sum over its splits (groups > 1)
  if constexpr (kPdl) grid_dependency_wait();
  const int n = p.num_splits, group = combine_group(n);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, part = warp % group;
  const int64_t item = int64_t(blockIdx.x) * (kCombineWarps / group) + warp / group;
  const bool active = item < int64_t(p.total_q) * p.heads_q;  // a CTA's groups all reach the barrier
  const int64_t row = item / p.heads_q;  // in total_q
  const int head = int(item % p.heads_q);
  const int64_t stride = int64_t(p.total_q) * p.heads_q;  // between splits

  // Split s's LSE lives in lane s % 32, slot s / 32: all loaded at once, then reduced by shuffles.
  float ls[kLseSlots];
#pragma unroll
  for (int i = 0; i < kLseSlots; ++i) {
    const int s = lane + 32 * i;
    ls[i] = active && s < n ? p.lse_partial[s * stride + item] : -INFINITY;
  }

  // This warp's splits part, part + group, ...: kSplitsInFlight partial rows (and LSEs, for their
  // weights) loaded together, their latencies overlapping, then added in split order. The first
  // round's loads go out here, beside the LSEs', before anything waits for either.
  const float* src = p.o_partial + item * kDim + lane * kPerLane;
  const bool columns = active && (kDim == kHeadDim || lane * kPerLane < kDim);  // this lane has columns of the row
  float x[kSplitsInFlight][kPerLane], w[kSplitsInFlight];
  auto load_round = [&](int s0) {
#pragma unroll
    for (int u = 0; u < kSplitsInFlight; ++u) {
      const int s = s0 + u * group;
      const bool in = columns && s < n;
      w[u] = in ? p.lse_partial[s * stride + item] : -INFINITY;
#pragma unroll
      for (int i = 0; i < kPerLane; i += 2) {
        const float2 v = in ? *reinterpret_cast<const float2*>(src + s * stride * kDim + i) : make_float2(0.f, 0.f);
        x[u][i] = v.x, x[u][i + 1] = v.y;
      }
    }
  };
  load_round(part);
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < kLseSlots; ++i) m = fmaxf(m, ls[i]);
#pragma unroll
  for (int d = 16; d > 0; d /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
  float sum = 0.f;
  if (m != -INFINITY)
#pragma unroll
    for (int i = 0; i < kLseSlots; ++i) sum += expf(ls[i] - m);  // exp(-inf) = 0: absent splits
#pragma unroll
  for (int d = 16; d > 0; d /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, d);
  float lse = m == -INFINITY ? INFINITY : m + logf(sum);  // no key at all: +inf, O = 0
  if constexpr (kSinks) {  // lse = logaddexp(keys' lse, sink): the partials weigh exp(lse_s - lse)
    const float sink = active ? p.sinks[head] : -INFINITY;
    const float keys = m == -INFINITY ? -INFINITY : lse;
    lse = lse_with_sink(keys, sink);
    if (lse == -INFINITY) lse = INFINITY;  // no key and a sink of -inf: as a row without keys
  }

  float o[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) o[i] = 0.f;
  if (m != -INFINITY && columns)  // else no split saw a key: O = 0
    for (int s0 = part;;) {
#pragma unroll
      for (int u = 0; u < kSplitsInFlight; ++u) {
        const float f = expf(w[u] - lse);  // 0 for a split without keys (its partial O is 0)
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) o[i] += f * x[u][i];
      }
      s0 += kSplitsInFlight * group;
      if (s0 >= n) break;
      load_round(s0);  // more than 64 splits: another round
    }
  if (group > 1) {  // the group's parts, added in order by its first warp
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) parts[warp][lane * kPerLane + i] = o[i];
    __syncthreads();
    if (part != 0) return;
    for (int g = 1; g < group; ++g)
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) o[i] += parts[warp + g][lane * kPerLane + i];
  }
  if (!active) return;

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
  if (columns)
#pragma unroll
    for (int i = 0; i < kPerLane; i += 2) *reinterpret_cast<uint32_t*>(out + i) = pack2<Elem>(o[i], o[i + 1]);
  if (lane == 0 && p.lse != nullptr) p.lse[lse_at + int64_t(head) * p.lse_head_stride] = lse;
}

}  // namespace decode
}  // namespace flashtune
