// Host-side launch of one decode specialisation: the split kernel over (splits x row blocks,
// KV heads, sequences), then, with more than one split, the combine kernel (kCombineWarps warps a
// CTA, combine_group(num_splits) of them per item). With kPdl (kernels built for sm_90 or newer)
// the combine is the split kernel's programmatic dependent (common/pdl.cuh): launched while the
// split kernel runs, it waits for its results. No host reads of device memory and no allocation:
// a launch can be captured in a CUDA graph.
#pragma once
#include <cuda_runtime.h>

#include "decode/combine_launch.cuh"
#include "decode/split_kernel.cuh"

namespace flashtune {
namespace decode {

template <class T, bool kPdl>
int launch(void (*split)(const DecodeParams), void (*combine)(const DecodeParams), const DecodeParams& p,
           void* stream) {
  if (p.num_splits < 1 || p.num_splits > kMaxSplits ||
      (p.num_splits > 1 && (p.o_partial == nullptr || p.lse_partial == nullptr)))
    return int(cudaErrorInvalidValue);
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_kv == 0) return int(cudaSuccess);
  if (T::kSmemBytes > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(split, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
    if (err != cudaSuccess) return int(err);
  }
  const int row_blocks = (p.seqlen_q * p.head_ratio + T::kRows - 1) / T::kRows;
  const dim3 grid(p.num_splits * row_blocks, p.heads_kv, p.batch);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  split<<<grid, T::kThreads, T::kSmemBytes, s>>>(p);
  if (p.num_splits > 1) {
    const cudaError_t err = launch_combine<kPdl>(combine, p, s);
    if (err != cudaSuccess) return int(err);
  }
  return int(cudaGetLastError());
}

}  // namespace decode
}  // namespace flashtune
