// Host-side launch of decode's combine kernel (combine_kernel.cuh), shared by the decode kernels'
// launcher (launch.cuh) and the sm90 family's KV-cache kernels (sm90/launch_kvcache.cuh).
#pragma once
#include <cuda_runtime.h>

#include "decode/combine_kernel.cuh"

namespace flashtune {
namespace decode {

// The combine kernel over every (row, head) item, after the split kernel on the stream (kPdl: as
// its programmatic dependent). The sm90 family's KV-cache kernels end with it too.
template <bool kPdl>
cudaError_t launch_combine(void (*combine)(const DecodeParams), const DecodeParams& p, cudaStream_t stream) {
  const int64_t items = int64_t(p.total_q) * p.heads_q;
  if (items == 0) return cudaSuccess;
  const int per_cta = kCombineWarps / combine_group(p.num_splits);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned((items + per_cta - 1) / per_cta));
  config.blockDim = dim3(kCombineWarps * 32);
  config.stream = stream;
  cudaLaunchAttribute dependent;
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &dependent;
  config.numAttrs = kPdl ? 1 : 0;
  return cudaLaunchKernelEx(&config, combine, p);
}

}  // namespace decode
}  // namespace flashtune
