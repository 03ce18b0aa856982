// Host-side launch of one decode specialisation: the split kernel over (splits x row blocks,
// KV heads, sequences), then, with more than one split, the combine kernel (kCombineWarps warps a
// CTA, combine_group(num_splits) of them per item). With kPdl (kernels built for sm_90 or newer)
// the combine is the split kernel's programmatic dependent (common/pdl.cuh): launched while the
// split kernel runs, it waits for its results. With p.cluster_merge (kCluster: kernels built for
// sm_90 or newer) each row block's splits are launched as one thread block cluster, which merges
// them itself (cluster_merge.cuh): no combine kernel. No host reads of device memory and no
// allocation: a launch can be captured in a CUDA graph.
#pragma once
#include <cuda_runtime.h>

#include "decode/combine_launch.cuh"
#include "decode/split_kernel.cuh"

namespace flashtune {
namespace decode {

// The split kernel's dynamic shared memory above the 48 KB a launch gets without asking.
template <class T>
cudaError_t allow_smem(void (*split)(const DecodeParams)) {
  if (T::kSmemBytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(split, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
}

// CTAs of the split kernel that run at once in clusters of `splits` (the device's most active
// clusters x splits; clusters wait for whole free SMs of one GPC, so fewer than the SMs can hold
// alone): a grid of more runs its clusters in two waves, where the combine kernel would have cost
// less (runtime/decode_splits.py). 0 without cluster merges or when the query fails.
template <class T, bool kCluster>
int cluster_slots(void (*split)(const DecodeParams), int splits) {
  if (!kCluster || splits < 2 || splits > kMaxClusterSplits || allow_smem<T>(split) != cudaSuccess) return 0;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(splits));
  config.blockDim = dim3(T::kThreads);
  config.dynamicSmemBytes = T::kSmemBytes;
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = unsigned(splits), cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, reinterpret_cast<const void*>(split), &config) != cudaSuccess) {
    (void)cudaGetLastError();  // a failed query is no launch error
    return 0;
  }
  return clusters * splits;
}

template <class T, bool kPdl, bool kCluster>
int launch(void (*split)(const DecodeParams), void (*combine)(const DecodeParams), const DecodeParams& p,
           void* stream) {
  const bool cluster = p.cluster_merge != 0;
  if (p.num_splits < 1 || p.num_splits > kMaxSplits ||
      (cluster && (!kCluster || p.num_splits < 2 || p.num_splits > kMaxClusterSplits)) ||
      (p.num_splits > 1 && !cluster && (p.o_partial == nullptr || p.lse_partial == nullptr)))
    return int(cudaErrorInvalidValue);
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_kv == 0) return int(cudaSuccess);
  if (const cudaError_t err = allow_smem<T>(split); err != cudaSuccess) return int(err);
  const int row_blocks = (p.seqlen_q * p.head_ratio + T::kRows - 1) / T::kRows;
  const dim3 grid(p.num_splits * row_blocks, p.heads_kv, p.batch);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (cluster) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = dim3(T::kThreads);
    config.dynamicSmemBytes = T::kSmemBytes;
    config.stream = s;
    cudaLaunchAttribute splits;
    splits.id = cudaLaunchAttributeClusterDimension;
    splits.val.clusterDim.x = unsigned(p.num_splits), splits.val.clusterDim.y = 1, splits.val.clusterDim.z = 1;
    config.attrs = &splits;
    config.numAttrs = 1;
    return int(cudaLaunchKernelEx(&config, split, p));
  }
  split<<<grid, T::kThreads, T::kSmemBytes, s>>>(p);
  if (p.num_splits > 1) {
    const cudaError_t err = launch_combine<kPdl>(combine, p, s);
    if (err != cudaSuccess) return int(err);
  }
  return int(cudaGetLastError());
}

}  // namespace decode
}  // namespace flashtune
