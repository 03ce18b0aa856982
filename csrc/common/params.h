// The arguments of one attention forward launch, shared by every kernel family.
// Plain C++ (no torch, no CUDA headers) so kernels compile fast; binding.cpp fills it.
#pragma once
#include <stdint.h>

namespace flashtune {

struct FwdParams {
  const void* q;  // (batch, seqlen_q, heads_q, hdim) or varlen (total_q, heads_q, hdim)
  const void* k;  // (batch, seqlen_k, heads_kv, hdim) or varlen (total_k, heads_kv, hdim)
  const void* v;
  void* o;        // same layout as q
  float* lse;     // (batch, heads_q, seqlen_q) or varlen (heads_q, total_q); may be null

  // Varlen: int32 prefix sums of length batch+1; null for fixed-length batches.
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;

  // Strides in elements. The last dimension is contiguous.
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t lse_batch_stride, lse_head_stride;  // varlen: batch offset is cu_seqlens_q[b]

  int32_t batch, heads_q, heads_kv, head_ratio;  // head_ratio = heads_q / heads_kv (GQA)
  int32_t seqlen_q, seqlen_k;                     // fixed lengths, or the maxima for varlen
  int32_t total_q, total_k;                       // rows of the packed tensors (varlen), else 0

  float softmax_scale;       // natural-log domain, for the LSE
  float softmax_scale_log2;  // softmax_scale * log2(e): the kernel works with exp2

  // FP8 Q/K kernels only (q and k are e4m3, o 16-bit): S = (q . k) * q_descale * k_descale,
  // one fp32 factor each per (batch, kv head), at [batch * descale_batch_stride + kv_head]
  // (FlashAttention-3's convention). Kernels fold the product into the softmax scale.
  const float* q_descale;
  const float* k_descale;
  int64_t descale_batch_stride;

  // Variants (common/variants.h; kernels built without one never read its values):
  float softcap_in, softcap_out;      // softcap: S <- softcap_out * tanh(S * softcap_in) on raw scores
                                      // (softcap_in = scale / cap, softcap_out = cap / scale)
  int32_t window_left, window_right;  // window: key j visible to query i iff
                                      // i + shift - left <= j <= i + shift + right (-1: unbounded)
  const float* sinks;                 // sinks: (heads_q,) fp32 logits in the scaled scores' units
  const float* alibi_slopes;  // alibi: (heads_q,) or (batch, heads_q) fp32; bias -slope * |i + shift - j|
  int32_t alibi_batch_stride;  // heads_q for (batch, heads_q) slopes, else 0

  // The tile counter of kernels that hand out work tiles from it (the sm90 family's persistent
  // grids, forward and backward, for causal and varlen calls): two int32 on the device, [0] the
  // tiles handed out, [1] the CTAs done; the last CTA out sets both back to 0.
  // tile_counter_zeroed = 1: they are 0 already (a per-stream pair that every such kernel leaves
  // at 0), so the launcher does not zero them first; 0: any value, zeroed on the stream first. May
  // be null for the forward, which then takes tiles by a fixed stride; the backward's launcher
  // refuses a causal or varlen call without one.
  int32_t* tile_counter;
  int32_t tile_counter_zeroed;

  // The sm90 family's KV-cache kernels (kernel_traits.cuh: kKvCache; launched through the decode
  // entry point, sm90/launch_kvcache.cuh fills these from DecodeParams; others never read them):
  // k and v are the cache (batch_cache, capacity, heads_kv, hdim), or pages (num_pages,
  // page_size, heads_kv, hdim) through block_table; seqlen_k is then the capacity.
  const int32_t* seqused_k;        // keys per sequence (cache_seqlens); null: seqlen_k for all
  const int32_t* cache_batch_idx;  // the cache entry of each sequence; null: its own
  const int32_t* leftpad_k;        // the first valid key of each sequence; null: 0
  const int32_t* block_table;      // paged: (batch, max_pages) page indices
  int64_t block_table_batch_stride;
  int32_t page_size;
  // Split-KV, as DecodeParams: num_splits CTAs share a sequence's keys; with more than one, fp32
  // partial outputs and their LSEs at [split][row][head] for decode's combine kernel.
  int32_t num_splits;
  float* o_partial;
  float* lse_partial;

  // The sm90 family's narrow kernels (kernel_traits.cuh: kNarrow; others never read these): q and k,
  // and v and o, at head dims of their own up to the kernel's (multiples of 8), the columns past them
  // zero-filled in shared memory by the TMA and never stored. Last, so every other field keeps its offset.
  int32_t head_dim_qk, head_dim_v;

  // The sm90 family's all-FP8 kernels (kernel_traits.cuh: kFp8Pv) only: v is e4m3, O = (P V8) x
  // v_descale, one fp32 factor per (batch, kv head) at q_descale's index; v_transposed is scratch
  // for V^T, (batch, heads_kv, hdim, seqlen_k rounded up to 32) bytes (sm90/v_transpose.cuh).
  const float* v_descale;
  void* v_transposed;
};

// Every generated kernel library exports `<kernel name>_launch` with this signature.
// Returns a cudaError_t value (0 = success).
typedef int (*FwdLaunchFn)(const FwdParams* params, void* stream);

}  // namespace flashtune
