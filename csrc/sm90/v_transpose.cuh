// The all-FP8 kernels' V^T (kernel_traits.cuh: kFp8Pv). FP8 wgmma reads only K-major operands, so
// O += P V needs V with the keys contiguous: this pass rewrites e4m3 v (batch, keys, heads_kv, head
// dim; any strides, the head dim contiguous) as V^T (batch, heads_kv, head dim, keys padded to a
// multiple of 32), contiguous, in the scratch the op hands over (FwdParams::v_transposed), before
// the attention kernel on the same stream. Keys past the sequence are zero (their P is 0, and 0 x
// NaN would not be). Each 32 keys are permuted as P's bytes sit in an FP8 wgmma A fragment
// (mainloop.cuh's pack_p): key 16 h + 8 i + 2 t + b at position 16 h + 4 t + 2 i + b, so that P
// packs from S's accumulators without a shuffle.
#pragma once
#include <stdint.h>

#include "common/params.h"

namespace flashtune {
namespace sm90 {

constexpr int kVtKeys = 64;     // keys per CTA
constexpr int kVtThreads = 256;

__host__ __device__ constexpr int64_t vt_keys_padded(int64_t keys) { return (keys + 31) / 32 * 32; }

// Position `pos` of a 32-key group of V^T holds this key of the group.
__device__ __forceinline__ int vt_key_at(int pos) {
  const int h = pos >> 4, t = (pos >> 2) & 3, i = (pos >> 1) & 1, b = pos & 1;
  return 16 * h + 8 * i + 2 * t + b;
}

// CTA (key block, KV head, batch): kVtKeys keys x D bytes into shared memory by 16-byte loads, then
// each thread writes 16 bytes of one head-dim row of V^T, gathered from 16 keys' bytes.
template <int D>
__global__ void __launch_bounds__(kVtThreads) v_transpose_kernel(const FwdParams p) {
  constexpr int kRow = D + 16;  // a row's bytes, padded: the column reads of 16 keys spread over the banks
  __shared__ __align__(16) uint8_t tile[kVtKeys * kRow];
  const int key0 = blockIdx.x * kVtKeys, head = blockIdx.y, batch = blockIdx.z;
  const int64_t keys_pad = vt_keys_padded(p.seqlen_k);
  const uint8_t* v = static_cast<const uint8_t*>(p.v) + int64_t(batch) * p.v_batch_stride + int64_t(head) * p.v_head_stride;
  for (int c = threadIdx.x; c < kVtKeys * D / 16; c += kVtThreads) {
    const int r = c / (D / 16), col = 16 * (c % (D / 16));
    uint4 x = make_uint4(0, 0, 0, 0);
    if (key0 + r < p.seqlen_k) x = *reinterpret_cast<const uint4*>(v + int64_t(key0 + r) * p.v_row_stride + col);
    *reinterpret_cast<uint4*>(tile + r * kRow + col) = x;
  }
  __syncthreads();
  uint8_t* out = static_cast<uint8_t*>(p.v_transposed) + (int64_t(batch) * p.heads_kv + head) * D * keys_pad;
  for (int c = threadIdx.x; c < D * (kVtKeys / 16); c += kVtThreads) {
    const int d = c / (kVtKeys / 16), j = c % (kVtKeys / 16);  // positions 16 j .. 16 j + 15 of the CTA's keys
    if (key0 + 16 * j >= keys_pad) continue;  // past the padded end (groups of 32 are whole)
    uint32_t w[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      w[q] = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int pos = 16 * j + 4 * q + b, key = (pos & ~31) + vt_key_at(pos & 31);
        w[q] |= uint32_t(tile[key * kRow + d]) << (8 * b);
      }
    }
    *reinterpret_cast<uint4*>(out + int64_t(d) * keys_pad + key0 + 16 * j) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// Launched before the attention kernel, on its stream. Fixed-length calls only (the op sends no
// varlen call with an e4m3 v), with v at the kernel's head dim (the op pads others first).
template <int D>
cudaError_t launch_v_transpose(const FwdParams& p, cudaStream_t stream) {
  if (p.seqlen_k == 0) return cudaSuccess;  // no keys: nothing to lay out (no block is loaded)
  if (p.cu_seqlens_k != nullptr || p.v_transposed == nullptr || p.head_dim_v != D) return cudaErrorInvalidValue;
  const dim3 grid(unsigned((p.seqlen_k + kVtKeys - 1) / kVtKeys), unsigned(p.heads_kv), unsigned(p.batch));
  v_transpose_kernel<D><<<grid, kVtThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace sm90
}  // namespace flashtune
