// Step 1-2 of the sm90 family (issue 5): one warpgroup computes S = Q K^T for a 64x64 tile
// of bf16 Q and K (head dim 64) with both operands loaded by TMA (128B swizzle) onto one
// mbarrier and multiplied by wgmma from shared memory. tests/test_sm90_probe*.py compile it
// and compare S against torch on the GPU. Not part of the attention op.
#include "sm90/ptx_sm90.cuh"
#include "sm90/tma_host.h"
#include "sm90/wgmma.cuh"

namespace {
constexpr int kRows = 64, kDim = 64;
constexpr int kTileBytes = kRows * kDim * 2;

__global__ void __launch_bounds__(128, 1)
flashtune_probe_sm90_qk(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                        float* s_out) {
  using namespace flashtune::sm90;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // 128B-swizzled tiles must start 1024-byte aligned.
  unsigned char* base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* sQ = base;
  unsigned char* sK = base + kTileBytes;
  __shared__ __align__(8) uint64_t bar;
  if (threadIdx.x == 0) {
    mbarrier_init(&bar, 1);
    fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(&bar, 2 * kTileBytes);
    tma_load_2d(sQ, &q_map, &bar, 0, 0);
    tma_load_2d(sK, &k_map, &bar, 0, 0);
  }
  mbarrier_wait(&bar, 0);

  float acc[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = 0.f;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kDim / 16; ++kk)  // +32 bytes per k16 step inside the swizzled rows
    Wgmma<__nv_bfloat16, 64>::ss(acc, kmajor_sw128_desc(smem_u32(sQ) + 32 * kk),
                            kmajor_sw128_desc(smem_u32(sK) + 32 * kk), kk > 0);
  wgmma_commit();
  wgmma_wait<0>();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int row = 16 * warp + g + 8 * ((i >> 1) & 1);
    const int col = 8 * (i >> 2) + 2 * t + (i & 1);
    s_out[row * kRows + col] = acc[i];
  }
}
}  // namespace

// q, k: device pointers to contiguous [64][64] bf16; s: [64][64] float. Returns a cudaError_t
// (or a CUresult from the tensor-map encoder).
extern "C" int flashtune_probe_sm90_qk_launch(const void* q, const void* k, float* s, void* stream) {
  using namespace flashtune::sm90;
  CUtensorMap q_map, k_map;
  int err = encode_bf16_2d(&q_map, q, kRows, kDim, kDim, kRows, kDim);
  if (err) return err;
  err = encode_bf16_2d(&k_map, k, kRows, kDim, kDim, kRows, kDim);
  if (err) return err;
  const int smem = 2 * kTileBytes + 1024;
  cudaFuncSetAttribute(flashtune_probe_sm90_qk, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  flashtune_probe_sm90_qk<<<1, 128, smem, static_cast<cudaStream_t>(stream)>>>(q_map, k_map, s);
  return int(cudaGetLastError());
}
