// Host-side launch of one sm90-family specialisation: tensor maps, grid, shared memory.
#pragma once
#include <cuda_runtime.h>

#include "common/persistent_grid.h"
#include "sm90/fwd_kernel.cuh"
#include "sm90/tma_host.h"
#include "sm90/v_transpose.cuh"

namespace flashtune {
namespace sm90 {

template <class T>
int launch(void (*kernel)(const FwdParams, const TmaMaps), const FwdParams& p, void* stream) {
  constexpr CUtensorMapDataType kVType =
      std::is_same_v<typename T::Elem, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  constexpr CUtensorMapDataType kQKType = T::kFp8Qk ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : kVType;
  const bool varlen = p.cu_seqlens_q != nullptr;
  // Varlen tensors are one "batch entry" of total rows; sequences start at cu_seqlens rows.
  const uint64_t batch = varlen ? 1 : p.batch;
  const uint64_t rows_q = varlen ? p.total_q : p.seqlen_q, rows_k = varlen ? p.total_k : p.seqlen_k;
  if constexpr (T::kFp8Qk) {  // the kernel reads the descales unconditionally
    if (p.q_descale == nullptr || p.k_descale == nullptr || (T::kFp8Pv && p.v_descale == nullptr))
      return int(cudaErrorInvalidValue);
  }
  if constexpr (T::kFp8Pv) {  // V^T first, on the same stream (fixed-length calls)
    if (varlen) return int(cudaErrorInvalidValue);
    const cudaError_t vt = launch_v_transpose<T::kHeadDim>(p, static_cast<cudaStream_t>(stream));
    if (vt != cudaSuccess) return int(vt);
  }
  // A narrow kernel's tensors have head dims of their own: the maps' widths, past which the TMA loads
  // zeros and stores nothing.
  const uint64_t dim_qk = T::kNarrow ? uint64_t(p.head_dim_qk) : T::kHeadDim;
  const uint64_t dim_v = T::kNarrow ? uint64_t(p.head_dim_v) : T::kHeadDimV;
  if (T::kNarrow && (dim_qk == 0 || dim_qk > T::kHeadDim || dim_qk % 8 || dim_v == 0 || dim_v > T::kHeadDimV || dim_v % 8))
    return int(cudaErrorInvalidValue);
  if (!T::kNarrow && (p.head_dim_qk != T::kHeadDim || p.head_dim_v != T::kHeadDimV))  // tensors of the kernel's dims
    return int(cudaErrorInvalidValue);
  TmaMaps maps;
  int err = encode_4d(&maps.q, p.q, kQKType, batch, rows_q, p.heads_q, dim_qk, p.q_batch_stride,
                      p.q_row_stride, p.q_head_stride, T::kQKBoxCols, T::kBlockM);
  if (!err)
    err = encode_4d(&maps.k, p.k, kQKType, batch, rows_k, p.heads_kv, dim_qk, p.k_batch_stride,
                    p.k_row_stride, p.k_head_stride, T::kQKBoxCols, T::kBlockN);
  // V^T, contiguous (batch, heads_kv, head dim, keys_pad): boxes of kVtRowBytes keys x every row. Without
  // keys no block is loaded, but the map must still describe a tensor: 32 keys over v's own base.
  const int64_t keys_pad = rows_k ? vt_keys_padded(rows_k) : 32;
  if (!err && T::kFp8Pv)
    err = encode_4d(&maps.v, rows_k ? p.v_transposed : p.v, CU_TENSOR_MAP_DATA_TYPE_UINT8, batch, T::kHeadDim,
                    p.heads_kv, keys_pad, p.heads_kv * T::kHeadDim * keys_pad, keys_pad, T::kHeadDim * keys_pad,
                    T::kVBoxCols, T::kHeadDim);
  else if (!err)
    err = encode_4d(&maps.v, p.v, kVType, batch, rows_k, p.heads_kv, dim_v, p.v_batch_stride,
                    p.v_row_stride, p.v_head_stride, 64, T::kBlockN);
  if (!err && T::kTmaStore)  // O is written in boxes of 64 columns x one warpgroup's 64 rows
    err = encode_4d(&maps.o, p.o, kVType, batch, rows_q, p.heads_q, dim_v, p.o_batch_stride,
                    p.o_row_stride, p.o_head_stride, 64, 64);
  if (err) return cudaErrorInvalidValue;  // a tensor the TMA cannot describe (python checks come first)
  const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
  if (attr != cudaSuccess) return int(attr);
  const int64_t tiles = int64_t((p.seqlen_q + T::kBlockM - 1) / T::kBlockM) * p.heads_q * p.batch;
  if (tiles == 0) return int(cudaSuccess);
  // Persistent: one CTA per SM (the register pool, 65536 / threads, holds one), looping over the
  // tiles; otherwise one CTA per tile, a loop of one.
  int ctas = int(tiles < INT32_MAX ? tiles : INT32_MAX);
  if constexpr (T::kPersistent) {
    const cudaError_t err = persistent_ctas(tiles, &ctas);
    if (err != cudaSuccess) return int(err);
  }
  // The kernel's next tile index (t + ctas, or ctas + the counter) must not wrap around.
  if (tiles > int64_t(INT32_MAX) - ctas) return int(cudaErrorInvalidConfiguration);
  // Causal and varlen tiles differ in cost: the persistent grid takes them from the counter (without
  // one, by a fixed stride).
  FwdParams args = p;
  const cudaError_t err_counter =
      use_tile_counter(&args.tile_counter, T::kPersistent && (T::kCausal || varlen) && p.tile_counter != nullptr,
                       p.tile_counter_zeroed != 0, static_cast<cudaStream_t>(stream));
  if (err_counter != cudaSuccess) return int(err_counter);
  kernel<<<ctas, T::kThreads, T::kSmemBytes, static_cast<cudaStream_t>(stream)>>>(args, maps);
  return int(cudaGetLastError());
}

}  // namespace sm90
}  // namespace flashtune
