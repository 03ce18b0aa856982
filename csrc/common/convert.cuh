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

// 2^x with the hardware approximation (what the softmax needs; -inf -> 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 2^x for x <= 0 on the FMA and integer pipes instead of the MUFU unit (which does 16 ex2 per
// clock per SM, as fast as the tensor cores consume a head dim of 64): x = n + f with n the
// nearest integer (adding 1.5 * 2^23 rounds it into the low mantissa bits), 2^f on [-0.5, 0.5]
// by a cubic with constant term 1 (relative error 1.0e-4, under half an ulp of bf16 and fp16
// P), and n added to the exponent field. x is clamped at -127, where n = -127 and f = 0 give
// exactly +0 (so -inf, a masked score, still gives 0); x in (-127, -126) gives a denormal.
// tests/test_poly_exp2.py replays these float32 steps against exp2 with these coefficients.
__device__ __forceinline__ float poly_exp2(float x) {
  constexpr float kExp2C1 = 0.6932829f, kExp2C2 = 0.24221097f, kExp2C3 = 0.05500893f;
  constexpr float kRoundShift = 12582912.f;  // 1.5 * 2^23
  x = fmaxf(x, -127.f);
  const float shifted = __fadd_rn(x, kRoundShift);
  const float f = __fsub_rn(x, __fsub_rn(shifted, kRoundShift));
  float p = fmaf(fmaf(fmaf(kExp2C3, f, kExp2C2), f, kExp2C1), f, 1.f);
  return __uint_as_float(__float_as_uint(p) + (__float_as_uint(shifted) << 23));  // mod 2^32: n may be < 0
}

}  // namespace flashtune
