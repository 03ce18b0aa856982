// Thread block clusters (sm_90 and newer): the CTAs of a cluster run at once on one GPC and read
// each other's shared memory (distributed shared memory). Decode's split kernel merges a row
// block's splits this way when they form a cluster (decode/cluster_merge.cuh). Compiled for an
// arch without clusters these trap: the launcher never asks for a cluster there.
#pragma once
#include <stdint.h>

namespace flashtune {

// Every thread of every CTA of the cluster: shared memory written before it is visible to the
// cluster's CTAs after it (release / acquire). All threads of each CTA must reach it.
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

// The address in CTA `rank`'s shared memory of what is at `addr` in this CTA's.
__device__ __forceinline__ uint32_t cluster_peer_addr(uint32_t addr, uint32_t rank) {
  uint32_t peer = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(peer) : "r"(addr), "r"(rank));
#else
  __trap();
#endif
  return peer;
}

__device__ __forceinline__ float cluster_load_f32(uint32_t peer_addr) {
  float x = 0.f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(x) : "r"(peer_addr) : "memory");
#else
  __trap();
#endif
  return x;
}

__device__ __forceinline__ float4 cluster_load_f32x4(uint32_t peer_addr) {
  float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w)
               : "r"(peer_addr)
               : "memory");
#else
  __trap();
#endif
  return x;
}

}  // namespace flashtune
