// Host-side launch of one backward specialisation: grid, dynamic shared memory, errors.
#pragma once
#include <cuda_runtime.h>

#include "backward/bwd_kernel.cuh"

namespace flashtune {
namespace bwd {

template <class T>
int launch(void (*kernel)(const BwdParams), const BwdParams& p, void* stream) {
  if (p.fwd.lse == nullptr || p.dsum == nullptr || p.dq_accum == nullptr) return int(cudaErrorInvalidValue);
  if (T::kSmemBytes > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
    if (err != cudaSuccess) return int(err);
  }
  const dim3 grid((p.fwd.seqlen_k + T::kBlockN - 1) / T::kBlockN, p.fwd.heads_q, p.fwd.batch);
  if (grid.x == 0 || grid.z == 0) return int(cudaSuccess);  // no keys: dK, dV empty, dQ stays 0
  kernel<<<grid, T::kThreads, T::kSmemBytes, static_cast<cudaStream_t>(stream)>>>(p);
  return int(cudaGetLastError());
}

}  // namespace bwd
}  // namespace flashtune
