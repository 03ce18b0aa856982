// The arguments of one decode launch (few query rows against a KV cache): a split kernel and,
// with num_splits > 1, the combine kernel. Plain C++ like common/params.h; binding.cpp fills it.
#pragma once
#include <stdint.h>

namespace flashtune {

struct DecodeParams {
  const void* q;  // (batch, seqlen_q, heads_q, hdim), or varlen (total_q, heads_q, hdim)
  const void* k;  // the cache: (batch_cache, capacity, heads_kv, hdim) or pages (num_pages, page_size, heads_kv, hdim)
  const void* v;
  void* o;        // q's layout (rows, heads_q, hdim) with its own strides
  float* lse;     // (batch, heads_q, seqlen_q), or varlen (heads_q, total_q); may be null

  int64_t q_batch_stride, q_row_stride, q_head_stride;  // varlen: q_batch_stride = 0
  int64_t k_batch_stride, k_row_stride, k_head_stride;  // paged: the batch stride is a page's
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t lse_batch_stride, lse_head_stride;

  const int32_t* cu_seqlens_q;   // varlen queries: batch+1 prefix sums; null for fixed length
  const int32_t* seqused_k;      // keys per sequence (cache_seqlens); null: seqlen_k for all
  const int32_t* cache_batch_idx;  // the cache row of each sequence; null: the sequence's own
  const int32_t* leftpad_k;      // the first valid key of each sequence; null: 0
  const int32_t* block_table;    // paged: (batch, max_pages) page indices; null: contiguous
  int64_t block_table_batch_stride;
  int32_t page_size;

  int32_t batch, heads_q, heads_kv, head_ratio;
  int32_t seqlen_q;   // fixed length, or the maximum (varlen)
  int32_t seqlen_k;   // keys when seqused_k is null; else the cache capacity (for bounds)
  int32_t k_entries, k_rows;  // the cache's first two dimensions: entries (or pages) and rows in each
  int32_t total_q;    // rows of q: batch * seqlen_q, or varlen total_q

  float softmax_scale;
  float softmax_scale_log2;
  // Variants (the kernels built with them read these; others ignore them):
  float softcap_in, softcap_out;  // softcap: S <- softcap_out * tanh(S * softcap_in) on raw scores
                                  // (softcap_in = scale / cap, softcap_out = cap / scale)
  int32_t window_left, window_right;  // window: key j visible to position i iff
                                      // i + shift - left <= j <= i + shift + right (-1: unbounded)
  const float* sinks;  // sinks: (heads_q,) fp32 logits in the scaled scores' units
  const float* alibi_slopes;  // alibi: (heads_q,) or (batch, heads_q) fp32; bias -slope * |i + shift - j|
  int32_t alibi_batch_stride;  // heads_q for (batch, heads_q) slopes, else 0
  // An e4m3 cache (the FP8 kernels): dequantised value = byte * descale, per (sequence, KV head);
  // (batch, heads_kv) fp32, contiguous. Null for a 16-bit cache.
  const float* k_descale;
  const float* v_descale;

  // Split-KV: num_splits CTAs share a sequence's keys. With more than one they write fp32 partial
  // outputs normalised per split, and their LSE, at [split][row][head] (row as in total_q), which
  // the combine kernel merges into o and lse. Buffers from the caller (torch's caching allocator).
  int32_t num_splits;
  float* o_partial;    // (num_splits, total_q, heads_q, hdim)
  float* lse_partial;  // (num_splits, total_q, heads_q)
  // Instead (sm_90 and newer, at most 8 splits): 1 makes each row block's splits one thread block
  // cluster that merges them through its shared memory; no partial buffers, no combine kernel.
  int32_t cluster_merge;
};

typedef int (*DecodeLaunchFn)(const DecodeParams* params, void* stream);

}  // namespace flashtune
