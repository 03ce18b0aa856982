// Host-side launch of one backward specialisation: grids, dynamic shared memory, errors. The
// deterministic build launches the dQ kernel after the dK/dV kernel; the other adds dQ inside it.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "backward/tiled_kernel.cuh"
#include "backward/dq_kernel.cuh"

namespace flashtune {
namespace bwd {

template <class T>
int launch(void (*dkdv_kernel)(const BwdParams), void (*dq_kernel)(const BwdParams), const BwdParams& p,
           void* stream) {
  if (p.fwd.lse == nullptr || p.dsum == nullptr || p.dq_accum == nullptr) return int(cudaErrorInvalidValue);
  if (T::kDeterministic != (dq_kernel != nullptr)) return int(cudaErrorInvalidValue);
  const auto s = static_cast<cudaStream_t>(stream);
  for (const auto& [kernel, bytes] : {std::pair{dkdv_kernel, T::kSmemBytes}, std::pair{dq_kernel, T::kDqSmemBytes}}) {
    if (kernel != nullptr && bytes > 48 * 1024) {
      const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      if (err != cudaSuccess) return int(err);
    }
  }
  if (p.fwd.batch == 0) return int(cudaSuccess);
  const dim3 keys((p.fwd.seqlen_k + T::kBlockN - 1) / T::kBlockN, p.fwd.heads_q, p.fwd.batch);
  if (keys.x > 0) {  // no keys: dK and dV are empty, dQ stays 0
    dkdv_kernel<<<keys, T::kThreads, T::kSmemBytes, s>>>(p);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return int(err);
  }
  if (dq_kernel != nullptr) {
    const dim3 queries((p.fwd.seqlen_q + T::kDqRows - 1) / T::kDqRows, p.fwd.heads_q, p.fwd.batch);
    if (queries.x > 0) dq_kernel<<<queries, T::kThreads, T::kDqSmemBytes, s>>>(p);
  }
  return int(cudaGetLastError());
}

}  // namespace bwd
}  // namespace flashtune
