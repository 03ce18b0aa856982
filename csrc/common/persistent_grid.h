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

// The counter a persistent launch hands tiles out from ([0]: the next tile, [1]: the CTAs done):
// where `counted` (tiles that differ in cost) the caller's, zeroed on the stream first unless
// `zeroed` says it is 0 already (a fresh one under graph capture is not); else null, and the kernel
// strides by gridDim.x. The error of the memset, if any.
inline cudaError_t use_tile_counter(int32_t** counter, bool counted, bool zeroed, cudaStream_t stream) {
  if (!counted) {
    *counter = nullptr;
    return cudaSuccess;
  }
  return zeroed ? cudaSuccess : cudaMemsetAsync(*counter, 0, 2 * sizeof(int32_t), stream);
}

// A CTA's scheduling thread, once it has taken its last tile from a launch's tile counter ([0]: the
// next tile, [1]: the CTAs done): every CTA's last take is done once all have counted themselves
// out, and the last one out sets both back to 0 for the next launch on the stream.
__device__ __forceinline__ void release_tile_counter(int* counter) {
  __threadfence();
  if (atomicAdd(counter + 1, 1) == int(gridDim.x) - 1) {
    atomicExch(counter, 0);
    atomicExch(counter + 1, 0);
  }
}

}  // namespace flashtune
