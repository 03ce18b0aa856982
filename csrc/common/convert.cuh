// Conversions both kernel families use: f32 pairs to packed 16-bit, and 2^x for the softmax.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <type_traits>

namespace flashtune {

// Two floats -> one 32-bit register of two 16-bit values (low half = x).
template <typename Elem>
__device__ __forceinline__ uint32_t pack2(float x, float y) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __half2 h = __floats2half2_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

// Half `hi` (0: low, 1: high) of a register pack2 made, as a float.
template <typename Elem>
__device__ __forceinline__ float unpack_half(uint32_t packed, int hi) {
  const uint32_t bits = hi ? packed >> 16 : packed & 0xFFFF;
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    return __uint_as_float(bits << 16);
  } else {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  }
}

// tanh with the hardware approximation (sm_75+; the logit softcap's, as FlashAttention's).
__device__ __forceinline__ float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 2^x with the hardware approximation (what the softmax needs; -inf -> 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace flashtune
