// The grid of a persistent kernel (the sm90 forward's and the Hopper backward's): one CTA per SM
// of the current device, and no more CTAs than tiles.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace flashtune {

// *ctas = min(tiles, the current device's SM count); the error of the device query, if any.
inline cudaError_t persistent_ctas(int64_t tiles, int* ctas) {
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) *ctas = int(tiles < sms ? tiles : sms);
  return err;
}

}  // namespace flashtune
