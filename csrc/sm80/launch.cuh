// Host-side launch of one sm80-family specialisation: grid, dynamic shared memory, errors.
#pragma once
#include <cuda_runtime.h>

#include "sm80/fwd_kernel.cuh"

namespace flashtune {
namespace sm80 {

template <class T>
int launch(void (*kernel)(const FwdParams), const FwdParams& p, void* stream) {
  if constexpr (T::kFp8Qk) {  // the kernel reads both descales unconditionally
    if (p.q_descale == nullptr || p.k_descale == nullptr) return int(cudaErrorInvalidValue);
  }
  if (T::kSmemBytes > 48 * 1024) {
    // Opt in to more than 48 KB of dynamic shared memory (per device; cheap to repeat).
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
    if (err != cudaSuccess) return int(err);
  }
  const dim3 grid((p.seqlen_q + T::kBlockM - 1) / T::kBlockM, p.heads_q, p.batch);
  if (grid.x == 0) return int(cudaSuccess);  // seqlen_q == 0: nothing to compute
  kernel<<<grid, T::kThreads, T::kSmemBytes, static_cast<cudaStream_t>(stream)>>>(p);
  return int(cudaGetLastError());
}

}  // namespace sm80
}  // namespace flashtune
