// Step 3 of the sm90 family (issue 5): one warpgroup runs a whole attention forward for
// head dim 64 - TMA loads of Q, K_j, V_j (128B swizzle) on mbarriers, S = Q K_j^T by wgmma
// from shared memory, online softmax on the accumulators, O += P V_j by wgmma with P from
// registers and V as an MN-major operand. No pipelining, no masking (seqlens multiples of
// 64, non-causal): it checks the operand layouts the real kernel will build on.
// tests/test_sm90_probe_gpu.py compares it with the fp32 reference. Not part of the op.
#include <cuda_bf16.h>
#include <math.h>

#include "common/convert.cuh"
#include "sm90/ptx_sm90.cuh"
#include "sm90/tma_host.h"
#include "sm90/wgmma.cuh"

namespace {
constexpr int kBlock = 64, kDim = 64;
constexpr int kTileBytes = kBlock * kDim * 2;

__global__ void __launch_bounds__(128, 1)
flashtune_probe_sm90_attn(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                          const __grid_constant__ CUtensorMap v_map, __nv_bfloat16* out, int seqlen_k,
                          float scale_log2) {
  using namespace flashtune::sm90;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char *sQ = base, *sK = base + kTileBytes, *sV = base + 2 * kTileBytes;
  __shared__ __align__(8) uint64_t bar_q, bar_kv;
  const int m_block = blockIdx.x;
  if (threadIdx.x == 0) {
    mbarrier_init(&bar_q, 1);
    mbarrier_init(&bar_kv, 1);
    fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(&bar_q, kTileBytes);
    tma_load_2d(sQ, &q_map, &bar_q, 0, m_block * kBlock);
  }
  mbarrier_wait(&bar_q, 0);

  const int lane = threadIdx.x % 32, t = lane & 3;
  float acc_o[32], row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 32; ++i) acc_o[i] = 0.f;

  for (int j = 0; j < seqlen_k / kBlock; ++j) {
    if (threadIdx.x == 0) {
      mbarrier_arrive_expect_tx(&bar_kv, 2 * kTileBytes);
      tma_load_2d(sK, &k_map, &bar_kv, 0, j * kBlock);
      tma_load_2d(sV, &v_map, &bar_kv, 0, j * kBlock);
    }
    mbarrier_wait(&bar_kv, j & 1);

    float acc_s[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) acc_s[i] = 0.f;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kDim / 16; ++kk)
      Wgmma<__nv_bfloat16, 64>::ss(acc_s, kmajor_sw128_desc(smem_u32(sQ) + 32 * kk),
                              kmajor_sw128_desc(smem_u32(sK) + 32 * kk), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();

    // Online softmax: accumulator i is row g + 8*((i>>1)&1), column 8*(i>>2) + 2t + (i&1).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = row_max[r];
#pragma unroll
      for (int i = 0; i < 32; ++i)
        if (((i >> 1) & 1) == r) m = fmaxf(m, acc_s[i]);
      m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 2));
      const float alpha = exp2f((row_max[r] - m) * scale_log2);
      row_max[r] = m;
      row_sum[r] *= alpha;
#pragma unroll
      for (int i = 0; i < 32; ++i)
        if (((i >> 1) & 1) == r) {
          acc_o[i] *= alpha;
          acc_s[i] = exp2f((acc_s[i] - m) * scale_log2);
          row_sum[r] += acc_s[i];
        }
    }
    // P as the register A operand: k slice s takes accumulators 8s..8s+7 as 4 bf16 pairs.
    // All of P is packed before the fence: a register written between wgmmas makes ptxas
    // inject warpgroup.arrive (C7519) and serialise them.
    uint32_t p_frag[kBlock / 16][4];
#pragma unroll
    for (int s = 0; s < kBlock / 16; ++s)
#pragma unroll
      for (int e = 0; e < 4; ++e) p_frag[s][e] = flashtune::pack2<__nv_bfloat16>(acc_s[8 * s + 2 * e], acc_s[8 * s + 2 * e + 1]);
    wgmma_fence();  // O's accumulators and P were just written by ordinary instructions
#pragma unroll
    for (int s = 0; s < kBlock / 16; ++s)
      Wgmma<__nv_bfloat16, 64>::rs(acc_o, p_frag[s], mnmajor_sw128_desc(smem_u32(sV) + 2048 * s, 0));
    wgmma_commit();
    wgmma_wait<0>();
    __syncthreads();  // every warp is done with sK/sV before thread 0 refills them
  }

  const int warp = threadIdx.x / 32, g = lane >> 2;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = row_sum[r];
    l += __shfl_xor_sync(0xffffffff, l, 1);
    l += __shfl_xor_sync(0xffffffff, l, 2);
    const int row = m_block * kBlock + 16 * warp + g + 8 * r;
#pragma unroll
    for (int c = 0; c < 8; ++c) {  // accumulators 4c + 2r, 4c + 2r + 1: columns 8c + 2t, +1
      const uint32_t packed = flashtune::pack2<__nv_bfloat16>(acc_o[4 * c + 2 * r] / l, acc_o[4 * c + 2 * r + 1] / l);
      *reinterpret_cast<uint32_t*>(out + row * kDim + 8 * c + 2 * t) = packed;
    }
  }
}
}  // namespace

// q [seqlen_q][64], k and v [seqlen_k][64] bf16 contiguous; seqlens multiples of 64.
extern "C" int flashtune_probe_sm90_attn_launch(const void* q, const void* k, const void* v, void* out,
                                                int seqlen_q, int seqlen_k, float softmax_scale, void* stream) {
  using namespace flashtune::sm90;
  CUtensorMap q_map, k_map, v_map;
  int err = encode_bf16_2d(&q_map, q, seqlen_q, kDim, kDim, kBlock, kDim);
  if (!err) err = encode_bf16_2d(&k_map, k, seqlen_k, kDim, kDim, kBlock, kDim);
  if (!err) err = encode_bf16_2d(&v_map, v, seqlen_k, kDim, kDim, kBlock, kDim);
  if (err) return err;
  const int smem = 3 * kTileBytes + 1024;
  cudaFuncSetAttribute(flashtune_probe_sm90_attn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  flashtune_probe_sm90_attn<<<seqlen_q / kBlock, 128, smem, static_cast<cudaStream_t>(stream)>>>(
      q_map, k_map, v_map, static_cast<__nv_bfloat16*>(out), seqlen_k, softmax_scale * 1.4426950408889634f);
  return int(cudaGetLastError());
}
