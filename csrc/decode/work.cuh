// The decode kernel's tile scheduler: what one CTA computes. Grid: x = row blocks * num_splits
// (row block fastest, or split fastest when the splits merge in a cluster), y = KV head,
// z = sequence. The CTA's rows are the query rows of its KV head packed as
// row = position * head_ratio + head in group; its keys are one split's share of the sequence's
// key blocks (kBlockN each), which key group g (warp w alone, or the row groups' warps sharing a
// ring: kernel_traits.cuh) walks as blocks g, g + kKeyGroups, ...
// Reads only params (and the per-sequence int32 arrays); no barriers.
#pragma once
#include <stdint.h>

#include "decode/params.h"

namespace flashtune {
namespace decode {

struct Work {
  int batch, kv_head, row_block, split;
  int seqlen_q, seqlen_k;  // this sequence's query positions and valid keys (after left padding)
  int packed_rows;         // seqlen_q * head_ratio
  int causal_shift;        // bottom-right causal: key j visible to position i iff j <= i + shift
  int64_t q_offset, o_offset, lse_offset;  // element offsets of the sequence's first row
  int64_t row0;            // the sequence's first row in total_q (partial buffers, varlen LSE)
  int cache_batch, leftpad;
  int block_begin, block_end;  // this split's key blocks [begin, end)
  float softcap_in, softcap_out;      // the softcap variant's (params.h)
  int window_left, window_right;      // the window variant's (params.h)
};

template <class T>
__device__ __forceinline__ Work schedule_work(const DecodeParams& p) {
  Work w;
  if (p.cluster_merge) {  // a row block's splits are neighbours in x: a cluster along x is one row block
    w.split = blockIdx.x % p.num_splits;
    w.row_block = blockIdx.x / p.num_splits;
  } else {  // the row blocks of one split are neighbours: they read the same keys at once, the later from L2
    const int row_blocks = (p.seqlen_q * p.head_ratio + T::kRows - 1) / T::kRows;
    w.row_block = blockIdx.x % row_blocks;
    w.split = blockIdx.x / row_blocks;
  }
  w.kv_head = blockIdx.y;
  w.batch = blockIdx.z;
  w.seqlen_q = p.seqlen_q;
  w.q_offset = int64_t(w.batch) * p.q_batch_stride;
  w.o_offset = int64_t(w.batch) * p.o_batch_stride;
  w.lse_offset = int64_t(w.batch) * p.lse_batch_stride;
  w.row0 = int64_t(w.batch) * p.seqlen_q;
  if (p.cu_seqlens_q != nullptr) {
    const int start = p.cu_seqlens_q[w.batch];
    w.seqlen_q = p.cu_seqlens_q[w.batch + 1] - start;
    w.q_offset = int64_t(start) * p.q_row_stride;
    w.o_offset = int64_t(start) * p.o_row_stride;
    w.lse_offset = start;
    w.row0 = start;
  }
  w.packed_rows = w.seqlen_q * p.head_ratio;
  w.leftpad = p.leftpad_k != nullptr ? p.leftpad_k[w.batch] : 0;
  w.cache_batch = p.cache_batch_idx != nullptr ? p.cache_batch_idx[w.batch] : w.batch;
  const int used = p.seqused_k != nullptr ? p.seqused_k[w.batch] : p.seqlen_k;
  w.seqlen_k = max(0, used - w.leftpad);
  w.causal_shift = w.seqlen_k - w.seqlen_q;
  if constexpr (T::kSoftcap) {
    w.softcap_in = p.softcap_in, w.softcap_out = p.softcap_out;
    if constexpr (T::kKvFp8) {  // the cap is on the true scores: raw x descale x scale
      const float descale = p.k_descale[w.batch * p.heads_kv + w.kv_head];
      w.softcap_in *= descale, w.softcap_out /= descale;
    }
  }
  if (T::kWindow) w.window_left = p.window_left, w.window_right = p.window_right;
  int keys = w.seqlen_k, first_key = 0;
  const int last_row = min(w.packed_rows, (w.row_block + 1) * T::kRows) - 1;
  if (T::kCausal) {  // no key past what the CTA's last row sees
    keys = min(keys, max(0, last_row / p.head_ratio + w.causal_shift + 1));
  }
  if (T::kWindow) {  // nor before what its first row sees, nor past what its last row sees
    const int first_pos = (w.row_block * T::kRows) / p.head_ratio;
    if (p.window_left >= 0) first_key = max(0, first_pos + w.causal_shift - p.window_left);
    if (p.window_right >= 0) keys = min(keys, max(0, last_row / p.head_ratio + w.causal_shift + p.window_right + 1));
  }
  const int first_block = min(first_key, keys) / T::kBlockN;  // blocks before it: no key any row sees
  const int blocks = (keys + T::kBlockN - 1) / T::kBlockN;
  const int per_split = (blocks - first_block + p.num_splits - 1) / p.num_splits;
  w.block_begin = min(blocks, first_block + w.split * per_split);
  w.block_end = min(blocks, w.block_begin + per_split);
  return w;
}

}  // namespace decode
}  // namespace flashtune
