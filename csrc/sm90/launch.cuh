// Host-side launch of one sm90-family specialisation: tensor maps, grid, shared memory.
#pragma once
#include <cuda_runtime.h>

#include "sm90/fwd_kernel.cuh"
#include "sm90/tma_host.h"

namespace flashtune {
namespace sm90 {

// CLUSTER: clusters of kCluster CTAs, as many as fit on the GPU at once (the occupancy API: SMs
// are paired within a GPC, so the count can be below SMs / 2) and no more than there are pairs,
// each walking the pairs by a fixed stride (both CTAs of a cluster must take the same ones).
template <class T>
int launch_clusters(void (*kernel)(const FwdParams, const TmaMaps), const FwdParams& p, const TmaMaps& maps,
                    int pairs, void* stream) {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = T::kCluster, cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = 1;
  config.blockDim = dim3(T::kThreads);
  config.dynamicSmemBytes = T::kSmemBytes;
  config.stream = static_cast<cudaStream_t>(stream);
  config.attrs = &cluster;
  config.numAttrs = 1;
  config.gridDim = dim3(T::kCluster);  // the query's; the launch's below
  // Asked once per device (a host round trip of its own): the answer depends on the kernel and the GPU.
  static int resident[64] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return int(err);
  if (device < 0 || device >= 64) return int(cudaErrorInvalidDevice);
  if (resident[device] == 0) {
    int clusters = 0;
    err = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
    if (err != cudaSuccess) return int(err);
    if (clusters == 0) return int(cudaErrorInvalidConfiguration);  // not one cluster fits: say so, never loop forever
    resident[device] = clusters;
  }
  const int clusters = pairs < resident[device] ? pairs : resident[device];
  config.gridDim = dim3(clusters * T::kCluster);
  FwdParams args = p;
  args.tile_counter = nullptr;  // both CTAs of a cluster stride alike
  err = cudaLaunchKernelEx(&config, kernel, args, maps);
  if (err != cudaSuccess) return int(err);
  return int(cudaGetLastError());
}

// SPLIT_TAIL: how many of `tiles` equal tiles (the last ones) to share out over `ctas` CTAs by
// their K/V blocks, or 0. A wave of T % G tiles after T / G whole ones leaves G - T % G SMs idle
// for a tile's time; split, it costs (T % G) / G of one. Only where that saves at least 2% of the
// call, each CTA's share is at least one block (a tile is at least 8), and the counters suffice.
// flashtune/tiles.py's sm90_split_tail_tiles is the same rule (the GPU tests choose shapes by it).
inline int split_tail_tiles(int64_t tiles, int ctas, int tile_blocks, int consumers) {
  const int64_t rest = tiles % ctas, waves = tiles / ctas + (rest > 0);
  if (rest == 0 || tile_blocks < 8 || rest * tile_blocks < ctas) return 0;
  if ((ctas - rest) * 50 < int64_t(ctas) * waves) return 0;
  if (rest * consumers > FwdParams::kScratchCounters - 2) return 0;
  if (int64_t(ctas) * (rest * tile_blocks + 1) >= (int64_t(1) << 31)) return 0;  // the kernel's 32-bit unit math
  return int(rest);
}

template <class T>
int launch(void (*kernel)(const FwdParams, const TmaMaps), const FwdParams& p, void* stream) {
  constexpr CUtensorMapDataType kVType =
      std::is_same_v<typename T::Elem, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  constexpr CUtensorMapDataType kQKType = T::kFp8Qk ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : kVType;
  const bool varlen = p.cu_seqlens_q != nullptr;
  // Varlen tensors are one "batch entry" of total rows; sequences start at cu_seqlens rows.
  const uint64_t batch = varlen ? 1 : p.batch;
  const uint64_t rows_q = varlen ? p.total_q : p.seqlen_q, rows_k = varlen ? p.total_k : p.seqlen_k;
  if constexpr (T::kFp8Qk) {  // the kernel reads both descales unconditionally
    if (p.q_descale == nullptr || p.k_descale == nullptr) return int(cudaErrorInvalidValue);
  }
  TmaMaps maps;
  int err = encode_4d(&maps.q, p.q, kQKType, batch, rows_q, p.heads_q, T::kHeadDim, p.q_batch_stride,
                      p.q_row_stride, p.q_head_stride, T::kQKBoxCols, T::kBlockM);
  if (!err)
    err = encode_4d(&maps.k, p.k, kQKType, batch, rows_k, p.heads_kv, T::kHeadDim, p.k_batch_stride,
                    p.k_row_stride, p.k_head_stride, T::kQKBoxCols, T::kKvBoxRows);
  if (!err)
    err = encode_4d(&maps.v, p.v, kVType, batch, rows_k, p.heads_kv, T::kHeadDim, p.v_batch_stride,
                    p.v_row_stride, p.v_head_stride, 64, T::kKvBoxRows);
  if (!err && T::kTmaStore)  // O is written in boxes of 64 columns x one warpgroup's 64 rows
    err = encode_4d(&maps.o, p.o, kVType, batch, rows_q, p.heads_q, T::kHeadDim, p.o_batch_stride,
                    p.o_row_stride, p.o_head_stride, 64, 64);
  if (err) return cudaErrorInvalidValue;  // a tensor the TMA cannot describe (python checks come first)
  const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
  if (attr != cudaSuccess) return int(attr);
  // Work items: tiles, or with CLUSTER pairs of tiles (one cluster of two CTAs each).
  const int64_t tiles =
      int64_t((p.seqlen_q + T::kCluster * T::kBlockM - 1) / (T::kCluster * T::kBlockM)) * p.heads_q * p.batch;
  if (tiles == 0) return int(cudaSuccess);
  // Persistent: one CTA per SM (the register pool, 65536 / threads, holds one; two with
  // CTAS_PER_SM), looping over the tiles; otherwise one CTA per tile, a loop of one.
  int ctas = int(tiles < INT32_MAX ? tiles : INT32_MAX);
  if constexpr (T::kPersistent) {
    int device = 0, sms = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return int(err);
    const int64_t slots = int64_t(sms) * T::kCtasPerSm;
    ctas = int(tiles < slots ? tiles : slots);
  }
  // The kernel's next tile index (t + ctas, or ctas + the counter) must not wrap around.
  if (tiles > int64_t(INT32_MAX) - ctas) return int(cudaErrorInvalidConfiguration);
  if constexpr (T::kCluster > 1) return launch_clusters<T>(kernel, p, maps, int(tiles), stream);
  const bool counted = T::kPersistent && (T::kCausal || varlen) && p.tile_counter != nullptr;
  FwdParams args = p;
  args.split_tail = 0;
  if constexpr (T::kSplitTail) {
    // Every SM takes a CTA (also where there are fewer tiles than SMs), if the tail is split.
    int device = 0, sms = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return int(err);
    const int grid = sms * T::kCtasPerSm;
    const int split = varlen || p.tile_counter == nullptr || p.scratch == nullptr
                          ? 0 : split_tail_tiles(tiles, grid, (p.seqlen_k + T::kBlockN - 1) / T::kBlockN, T::kConsumers);
    if (split > 0) {
      const int64_t bytes = int64_t(2) * grid * T::kConsumers * T::kPartialFloats * 128 * sizeof(float);
      args.split_ws = static_cast<float*>(p.scratch(p.scratch_ctx, bytes));
      if (args.split_ws != nullptr) {
        args.split_tail = split;
        args.split_counters = p.tile_counter + 2;
        ctas = grid;
        if (!p.tile_counter_zeroed) {  // a fresh scratch (graph capture): its counters zeroed first
          err = cudaMemsetAsync(args.split_counters, 0, int64_t(split) * T::kConsumers * sizeof(int32_t),
                                static_cast<cudaStream_t>(stream));
          if (err != cudaSuccess) return int(err);
        }
      }
    }
  }
  if (!counted) {
    args.tile_counter = nullptr;  // the kernel then strides by gridDim.x
  } else if (!p.tile_counter_zeroed || FLASHTUNE_SM90_COUNTER_MEMSET) {  // a memset is a kernel of its own in the call's GPU time
    const cudaError_t err =
        cudaMemsetAsync(args.tile_counter, 0, 2 * sizeof(int32_t), static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) return int(err);
  }
  kernel<<<ctas, T::kThreads, T::kSmemBytes, static_cast<cudaStream_t>(stream)>>>(args, maps);
  return int(cudaGetLastError());
}

}  // namespace sm90
}  // namespace flashtune
