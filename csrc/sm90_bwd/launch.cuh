// Host-side launch of one Hopper backward specialisation: tensor maps, grid, shared memory.
#pragma once
#include <cuda_runtime.h>

#include <type_traits>

#include "common/persistent_grid.h"
#include "sm90/tma_host.h"
#include "sm90_bwd/bwd_kernel.cuh"

namespace flashtune {
namespace sm90_bwd {

template <class T>
int launch(void (*kernel)(const BwdParams, const BwdTmaMaps), const BwdParams& bp, void* stream) {
  const FwdParams& p = bp.fwd;
  if (p.lse == nullptr || bp.dsum == nullptr || bp.dq_accum == nullptr) return int(cudaErrorInvalidValue);
  constexpr CUtensorMapDataType kType =
      std::is_same_v<typename T::Elem, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const uint64_t batch = varlen ? 1 : p.batch;
  const uint64_t rows_q = varlen ? p.total_q : p.seqlen_q, rows_k = varlen ? p.total_k : p.seqlen_k;
  BwdTmaMaps maps;
  int err = sm90::encode_4d(&maps.q, p.q, kType, batch, rows_q, p.heads_q, T::kHeadDim, p.q_batch_stride,
                            p.q_row_stride, p.q_head_stride, 64, T::kBlockM);
  if (!err)
    err = sm90::encode_4d(&maps.dout, bp.dout, kType, batch, rows_q, p.heads_q, T::kHeadDim, bp.do_batch_stride,
                          bp.do_row_stride, bp.do_head_stride, 64, T::kBlockM);
  if (!err)
    err = sm90::encode_4d(&maps.k, p.k, kType, batch, rows_k, p.heads_kv, T::kHeadDim, p.k_batch_stride,
                          p.k_row_stride, p.k_head_stride, 64, T::kBlockN);
  if (!err)
    err = sm90::encode_4d(&maps.v, p.v, kType, batch, rows_k, p.heads_kv, T::kHeadDim, p.v_batch_stride,
                          p.v_row_stride, p.v_head_stride, 64, T::kBlockN);
  if (!err)  // the fp32 sum, q's shape: boxes of 32 columns x one warpgroup's 64 rows
    err = sm90::encode_4d(&maps.dq, bp.dq_accum, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, batch, rows_q, p.heads_q,
                          T::kHeadDim, bp.dq_batch_stride, bp.dq_row_stride, bp.dq_head_stride, 32, 64);
  if (err) return int(cudaErrorInvalidValue);  // a tensor the TMA cannot describe (python checks come first)
  const cudaError_t attr = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
  if (attr != cudaSuccess) return int(attr);
  const int64_t tiles = tile_count<T>(bp);
  if (tiles == 0) return int(cudaSuccess);  // no keys: dK and dV are empty, dQ stays 0
  // Persistent: one CTA per SM (its ~195 KiB of shared memory hold one) walking the tiles, so that
  // a tile's loads run under the last one's end. Tiles of one cost (no causal mask, one length) by a
  // fixed stride; causal and varlen tiles differ in cost (a fixed stride gave CTAs 1.3-1.9x the mean
  // load), so there the next free CTA takes the next tile from the launch's counter, as the GPU hands
  // out CTAs (work.cuh, schedule_tiles).
  int ctas = 0;
  const cudaError_t err_sm = persistent_ctas(tiles, &ctas);
  if (err_sm != cudaSuccess) return int(err_sm);
  if (tiles > int64_t(INT32_MAX) - ctas) return int(cudaErrorInvalidConfiguration);  // the tile index would wrap
  const bool counted = T::kCausal || p.cu_seqlens_q != nullptr;
  if (counted && p.tile_counter == nullptr) return int(cudaErrorInvalidValue);
  BwdParams args = bp;
  const cudaError_t err_counter =
      use_tile_counter(&args.fwd.tile_counter, counted, p.tile_counter_zeroed != 0, static_cast<cudaStream_t>(stream));
  if (err_counter != cudaSuccess) return int(err_counter);
  kernel<<<ctas, T::kThreads, T::kSmemBytes, static_cast<cudaStream_t>(stream)>>>(args, maps);
  return int(cudaGetLastError());
}

}  // namespace sm90_bwd
}  // namespace flashtune
