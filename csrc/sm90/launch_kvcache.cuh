// Host-side launch of one sm90-family KV-cache kernel (kernel_traits.cuh: kCache), through the
// decode entry point (DecodeParams, as the decode kernels take it): its FwdParams, the tensor maps
// of the packed Q and of the cache (contiguous entries, or pages holding whole key blocks), the
// grid (splits x row blocks, KV heads, sequences), then with splits decode's combine kernel. No
// host reads of device memory, no allocation: a launch can be captured in a CUDA graph.
#pragma once
#include <cuda_runtime.h>

#include "common/params.h"
#include "decode/combine_launch.cuh"
#include "decode/params.h"
#include "sm90/fwd_kernel.cuh"
#include "sm90/tma_host.h"

namespace flashtune {
namespace sm90 {

// What of a decode launch the sm90 kernel reads, as its FwdParams (no varlen, no variant, no
// tile counter: those stay zero).
inline FwdParams cache_fwd_params(const DecodeParams& d) {
  FwdParams p{};
  p.q = d.q, p.k = d.k, p.v = d.v, p.o = d.o, p.lse = d.lse;
  p.q_batch_stride = d.q_batch_stride, p.q_row_stride = d.q_row_stride, p.q_head_stride = d.q_head_stride;
  p.k_batch_stride = d.k_batch_stride, p.k_row_stride = d.k_row_stride, p.k_head_stride = d.k_head_stride;
  p.v_batch_stride = d.v_batch_stride, p.v_row_stride = d.v_row_stride, p.v_head_stride = d.v_head_stride;
  p.o_batch_stride = d.o_batch_stride, p.o_row_stride = d.o_row_stride, p.o_head_stride = d.o_head_stride;
  p.lse_batch_stride = d.lse_batch_stride, p.lse_head_stride = d.lse_head_stride;
  p.batch = d.batch, p.heads_q = d.heads_q, p.heads_kv = d.heads_kv, p.head_ratio = d.head_ratio;
  p.seqlen_q = d.seqlen_q, p.seqlen_k = d.seqlen_k, p.total_q = d.total_q;
  p.softmax_scale = d.softmax_scale, p.softmax_scale_log2 = d.softmax_scale_log2;
  p.window_left = p.window_right = -1;
  p.seqused_k = d.seqused_k, p.cache_batch_idx = d.cache_batch_idx, p.leftpad_k = d.leftpad_k;
  p.block_table = d.block_table, p.block_table_batch_stride = d.block_table_batch_stride, p.page_size = d.page_size;
  p.num_splits = d.num_splits, p.o_partial = d.o_partial, p.lse_partial = d.lse_partial;
  return p;
}

template <class T>
int launch_kvcache(void (*kernel)(const FwdParams, const TmaMaps), void (*combine)(const DecodeParams),
                   const DecodeParams& d, void* stream) {
  static_assert(T::kCache, "a KV-cache kernel");
  // What the runtime routes here (flashtune/runtime/decode.py); anything else is an internal error.
  if (d.num_splits < 1 || d.num_splits > decode::kMaxSplits || d.cluster_merge ||
      (d.num_splits > 1 && (d.o_partial == nullptr || d.lse_partial == nullptr)) || d.cu_seqlens_q != nullptr ||
      d.head_ratio < 1 || T::kBlockM % d.head_ratio != 0 || T::kPaged != (d.block_table != nullptr) ||
      (T::kPaged && d.page_size % T::kBlockN != 0))
    return int(cudaErrorInvalidValue);
  if (d.batch == 0 || d.seqlen_q == 0 || d.heads_kv == 0) return int(cudaSuccess);
  constexpr CUtensorMapDataType kType =
      std::is_same_v<typename T::Elem, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const int positions = T::kBlockM / d.head_ratio;  // query positions per tile
  TmaMaps maps;
  int err = encode_q_packed(&maps.q, d.q, kType, d.batch, d.seqlen_q, d.heads_kv, d.head_ratio, T::kHeadDim,
                            d.q_batch_stride, d.q_row_stride, d.q_head_stride, T::kQKBoxCols, positions);
  if (!err)
    err = encode_4d(&maps.k, d.k, kType, d.k_entries, d.k_rows, d.heads_kv, T::kHeadDim, d.k_batch_stride,
                    d.k_row_stride, d.k_head_stride, T::kQKBoxCols, T::kBlockN);
  if (!err)
    err = encode_4d(&maps.v, d.v, kType, d.k_entries, d.k_rows, d.heads_kv, T::kHeadDim, d.v_batch_stride,
                    d.v_row_stride, d.v_head_stride, 64, T::kBlockN);
  if (err) return int(cudaErrorInvalidValue);
  const cudaError_t attr = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
  if (attr != cudaSuccess) return int(attr);
  const int row_blocks = (d.seqlen_q + positions - 1) / positions;
  const dim3 grid(unsigned(d.num_splits * row_blocks), unsigned(d.heads_kv), unsigned(d.batch));
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  kernel<<<grid, T::kThreads, T::kSmemBytes, s>>>(cache_fwd_params(d), maps);
  if (d.num_splits > 1) {
    const cudaError_t combined = decode::launch_combine<false>(combine, d, s);
    if (combined != cudaSuccess) return int(combined);
  }
  return int(cudaGetLastError());
}

}  // namespace sm90
}  // namespace flashtune
