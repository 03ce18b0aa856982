// The arguments of one attention backward launch: the forward's (FwdParams: Q, K, V, O, its LSE,
// the lengths, strides and scales) and the gradients'. Plain C++, filled by binding.cpp.
#pragma once
#include <stdint.h>

#include "common/params.h"

namespace flashtune {

struct BwdParams {
  FwdParams fwd;  // fwd.lse is required: the forward's log-sum-exp, natural log

  const void* dout;  // dO, O's shape, its own strides (elements; the last dimension contiguous)
  int64_t do_batch_stride, do_row_stride, do_head_stride;
  // rowsum(dO * O) - dlse per query row and head, in fwd.lse's layout and strides: written by the
  // prep pass (passes.cuh), read by the kernel. dlse: the LSE's gradient in the same layout, or null.
  float* dsum;
  const float* dlse;

  // dQ summed in fp32 over the key blocks (by the kernel's adds: zeroed by the prep pass; or stored
  // by the deterministic dQ kernel), (batch, seqlen_q, heads_q, hdim) or varlen (total_q, heads_q,
  // hdim), each head's rows in the main kernel's layout (dq_layout.cuh: q's, or the tiled kernel's
  // strips); the finish pass writes dq = softmax_scale * dq_accum in q's dtype, in q's layout and
  // dq_accum's strides.
  float* dq_accum;
  void* dq;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;

  // dK and dV per query head (batch, seqlen_k, heads_q, hdim) or varlen (total_k, heads_q, hdim),
  // both in these strides.
  void* dk;
  void* dv;
  int64_t dkv_batch_stride, dkv_row_stride, dkv_head_stride;
  // GQA (head_ratio > 1): the group pass (passes.cuh) writes each KV head's sum of its query heads'
  // dK and dV here, k's shape, both in these strides; null without GQA (dk and dv are the gradients).
  void* dk_kv;
  void* dv_kv;
  int64_t dkv_kv_batch_stride, dkv_kv_row_stride, dkv_kv_head_stride;
};

// Every generated backward library exports `<kernel name>_launch` with this signature.
typedef int (*BwdLaunchFn)(const BwdParams* params, void* stream);

}  // namespace flashtune
