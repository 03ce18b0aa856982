// Where a finished query row of the decode kernel goes: 4 columns of its output into o (16-bit) at
// the row's position and head, and its LSE into lse (when asked) with the first of them. Written
// by the split kernel with one split (split_kernel.cuh) and by a cluster's merge (cluster_merge.cuh).
#pragma once
#include <stdint.h>

#include "common/convert.cuh"
#include "decode/params.h"
#include "decode/work.cuh"

namespace flashtune {
namespace decode {

// packed: the row's index among the CTA's packed rows (position * head_ratio + head in group).
template <class T>
__device__ __forceinline__ void store_output(const DecodeParams& p, const Work& w, int packed, int col, float4 o,
                                             float lse) {
  using Elem = typename T::Elem;
  const int pos = packed / p.head_ratio, head = w.kv_head * p.head_ratio + packed % p.head_ratio;
  Elem* out = static_cast<Elem*>(p.o) + w.o_offset + int64_t(pos) * p.o_row_stride + int64_t(head) * p.o_head_stride +
              col;
  *reinterpret_cast<uint2*>(out) = make_uint2(pack2<Elem>(o.x, o.y), pack2<Elem>(o.z, o.w));
  if (col == 0 && p.lse != nullptr) p.lse[w.lse_offset + int64_t(head) * p.lse_head_stride + pos] = lse;
}

}  // namespace decode
}  // namespace flashtune
