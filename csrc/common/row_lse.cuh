// A softmax row's log-sum-exp, as both kernel families write it (flash_attn's softmax_lse).
#pragma once
#include <math.h>

namespace flashtune {

// From the row's running maximum (a raw score), the scale that maps scores to the softmax's
// natural-log domain and the row's sum of exps l. One fused multiply-add written out: left to
// the compiler, an epilogue inlined at several call sites (the sm90 deferred epilogue) was
// contracted at some and not at others, so a row's LSE depended by 1 ulp on which path its tile
// took, which the persistent scheduler's tile counter decides at run time.
// A row that saw no key (l = 0): +inf, FlashAttention's convention (its O is 0).
__device__ __forceinline__ float row_lse(float row_max, float scale, float l) {
  return l > 0.f ? __fmaf_rn(row_max, scale, logf(l)) : INFINITY;
}

// The sinks variant (common/variants.h): a row's keys' LSE (-inf: no key) with its head's sink
// logit joined, logaddexp(keys, sink). -inf for neither (a sink of -inf joins nothing); a caller
// writes that as +inf, FlashAttention's no-key LSE.
__device__ __forceinline__ float lse_with_sink(float lse_keys, float sink) {
  if (sink == -INFINITY) return lse_keys;
  if (lse_keys == -INFINITY) return sink;
  return fmaxf(lse_keys, sink) + log1pf(expf(-fabsf(lse_keys - sink)));
}

}  // namespace flashtune
