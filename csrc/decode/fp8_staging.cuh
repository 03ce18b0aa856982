// The FP8 cache's conversion: one warp turns a [kBlockN][kHeadDim] tile of e4m3 bytes (in its ring
// slot, kv_loader.cuh's ring_chunk layout) into the 16-bit swizzled tile the MMAs read (sm80/kernel_traits.cuh's layout),
// exactly: every e4m3 value is a half and a bfloat16 (3 mantissa bits, exponents 2^-9..2^8). The
// descales are not applied here: K's folds into the softmax scale, V's into the output.
// No barrier: the caller's __syncwarp orders the warp's reads of the ring and writes of the tile.
#pragma once
#include <cuda_fp8.h>
#include <stdint.h>
#include <type_traits>

#include "decode/kernel_traits.cuh"
#include "decode/kv_loader.cuh"
#include "sm80/kernel_traits.cuh"

namespace flashtune {
namespace decode {

// Two e4m3 values (the low bytes of `pair`) -> two 16-bit values in one register.
template <typename Elem>
__device__ __forceinline__ uint32_t e4m3x2_to(uint16_t pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
  if constexpr (std::is_same_v<Elem, __half>) {
    return uint32_t(h.x) | (uint32_t(h.y) << 16);
  } else {
    const float2 f = __half22float2(__half2(h));
    __nv_bfloat162 b = __float22bfloat162_rn(f);  // exact: a half of e4m3 origin fits bf16
    return *reinterpret_cast<uint32_t*>(&b);
  }
}

template <class T>
__device__ __forceinline__ void fp8_tile_to_16bit(uint32_t dst, uint32_t src, int lane) {
  static_assert(T::kKvFp8, "only FP8 caches are staged");
  constexpr int kChunks = T::kKvChunksPerRow;  // 16 e4m3 values = two 16-bit chunks
  constexpr int kTotal = T::kBlockN * kChunks;
  static_assert(kTotal % 32 == 0, "whole passes");
  static_assert(T::kBlockN % 8 == 0, "8-row phases");
  // Fully unrolled up to 4 passes, by 2 beyond (hdim 256's 8 passes, fully unrolled, kept too many
  // addresses live: 16 bytes spilled on sm_90a).
  constexpr int kUnroll = kTotal / 32 <= 4 ? kTotal / 32 : 2;
#pragma unroll(kUnroll)
  for (int pass = 0; pass < kTotal / 32; ++pass) {
    // Rows fastest: each 8-lane phase reads one chunk of 8 rows (swizzled apart in the ring) and
    // writes one 16-bit chunk of the same 8 rows (swizzled apart in the staging tile): no bank
    // conflicts either way (rows of one chunk in a phase would hit the 16-bit swizzle twice).
    const int i = lane + 32 * pass;
    const int row = i % T::kBlockN, chunk = i / T::kBlockN;
    uint32_t in[4];
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(in[0]), "=r"(in[1]), "=r"(in[2]), "=r"(in[3])
                 : "r"(ring_chunk<T>(src, row, chunk)));
    uint32_t out[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      out[2 * j] = e4m3x2_to<typename T::Elem>(uint16_t(in[j] & 0xffffu));
      out[2 * j + 1] = e4m3x2_to<typename T::Elem>(uint16_t(in[j] >> 16));
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t at = dst + 2 * sm80::swizzled<T::kHeadDim>(row, (2 * chunk + half) * 8);
      asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(at), "r"(out[4 * half]),
                   "r"(out[4 * half + 1]), "r"(out[4 * half + 2]), "r"(out[4 * half + 3]));
    }
  }
}

}  // namespace decode
}  // namespace flashtune
