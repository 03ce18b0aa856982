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

  // FP8 Q/K kernels only (q and k are e4m3, v and o 16-bit): S = (q . k) * q_descale * k_descale,
  // one fp32 factor each per (batch, kv head), at [batch * descale_batch_stride + kv_head]
  // (FlashAttention-3's convention). Kernels fold the product into the softmax scale.
  const float* q_descale;
  const float* k_descale;
  int64_t descale_batch_stride;

  // Scratch for kernels that hand out work tiles from a counter (the sm90 family's persistent
  // grid, for causal and varlen calls): two int32 on the device, [0] the tiles handed out, [1]
  // the CTAs done; the last CTA out sets both back to 0. tile_counter_zeroed = 1: they are 0
  // already (a per-stream pair that every such kernel leaves at 0), so the launcher does not
  // zero them first; 0: any value, zeroed on the stream first. May be null: those kernels then
  // take tiles by a fixed stride.
  int32_t* tile_counter;
  int32_t tile_counter_zeroed;
  // tile_counter is the first 2 of kScratchCounters int32; the rest are the split tail's counters
  // (sm90 SPLIT_TAIL: one per split tile and consumer warpgroup), left at 0 by the kernels too.
  static constexpr int kScratchCounters = 2 + 1024;

  // Device scratch a launcher asks for (the sm90 split tail's partial results): `bytes` on the
  // call's stream, alive until the launch is enqueued (the allocator orders its reuse on the
  // stream); returns null if none could be had (the launcher then does without).
  void* (*scratch)(void* ctx, int64_t bytes);
  void* scratch_ctx;

  // Filled by the sm90 launcher for its kernel (SPLIT_TAIL): the last split_tail tiles' K/V blocks
  // are shared out evenly over every CTA; 0: no split. split_ws holds the pieces' partial O.
  int32_t split_tail;
  int32_t* split_counters;
  float* split_ws;
};

// Every generated kernel library exports `<kernel name>_launch` with this signature.
// Returns a cudaError_t value (0 = success).
typedef int (*FwdLaunchFn)(const FwdParams* params, void* stream);

}  // namespace flashtune
