// The FP8 cache's math: a warp reads its ring slot's e4m3 K and V bytes straight into MMA
// fragments, converting in registers (no 16-bit copy of the tile in shared memory), and the MMAs
// run in f16 (every e4m3 value is an f16 exactly).
//
// Fragments of m16n8k16 want pairs of consecutive k-indices, which ldmatrix's 16-bit elements give
// two bytes apart; so both sums of the step are taken in a permuted order, which a sum allows:
//   S = Q K^T over the head dim: k-indices 2t, 2t+1, 2t+8, 2t+9 of a 16-dim slice are dims 4t..4t+3
//     (sigma), so one b16 ldmatrix matrix of 8 key rows x 16 bytes is one whole B fragment; Q is
//     stored in shared memory in that order (load_q_fp8);
//   O = P V over the keys: the k-indices 2t, 2t+1, 2t+8, 2t+9 of a 16-key slice are keys t, t+4,
//     t+8, t+12 (pi), which S's columns follow by the K rows each ldmatrix lane addresses (S's
//     column 2t + e of n-tile nt is key nt * 8 + t + 4e: key_col); a lane then reads 4 bytes of
//     4 key rows and two byte permutes give its V fragments for 4 dims, so O's n8 tile 4q + j holds
//     dims 32q + 4g + j (its columns are put back in order at the merge).
// The ring's swizzle (kv_loader.cuh's fp8_chunk_swizzle) keeps both reads free of bank conflicts.
#pragma once
#include <math.h>
#include <stdint.h>

#include "common/ptx_sm80.cuh"
#include "decode/kernel_traits.cuh"
#include "decode/kv_loader.cuh"
#include "decode/params.h"
#include "decode/work.cuh"
#include "sm80/kernel_traits.cuh"

namespace flashtune {
namespace decode {

// The key a 16-bit S column stands for, or with an FP8 cache (pi above): S element e of n-tile
// nt, lane quad t, relative to the step's first key.
template <class T>
__device__ __forceinline__ int key_col(int nt, int t, int e) {
  if constexpr (T::kKvFp8) {
    return nt * 8 + t + 4 * (e & 1);
  } else {
    return nt * 8 + 2 * t + (e & 1);
  }
}

// Four e4m3 values (the bytes of `w`, lowest first) -> two f16 pairs: lo = bytes 0, 1; hi = 2, 3.
__device__ __forceinline__ void e4m3x4_to_f16x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}

__device__ __forceinline__ uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
  return d;
}

// Q of the CTA's rows into shared memory as f16, in sigma order, times 2^q_exp (returned,
// CTA-uniform): the largest finite |q| of the tile scaled into [2^14, 2^15), so every 16-bit q is an
// f16 exactly (a bf16's 8 mantissa bits fit an f16's 11) down to about 2^-31 of the largest.
// Plain loads, not cp.async: the maximum is needed before anything is stored. `scratch`: kWarps
// floats of shared memory no one else uses yet. Rows past the CTA's and dims past kDim are zero.
template <class T>
__device__ __forceinline__ int load_q_fp8(const DecodeParams& p, const Work& w, int first_row, uint32_t sQ,
                                          float* scratch, int tid) {
  using Elem = typename T::Elem;
  constexpr int D = T::kHeadDim, kChunks = T::kRows * T::kChunksPerRow;
  constexpr int kPer = (kChunks + T::kThreads - 1) / T::kThreads;
  const Elem* q = static_cast<const Elem*>(p.q) + w.q_offset;
  uint4 raw[kPer];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int c = tid + i * T::kThreads, r = c / T::kChunksPerRow, chunk = c % T::kChunksPerRow;
    const int packed = first_row + r;
    const bool ok = c < kChunks && packed < w.packed_rows && (T::kDim == D || chunk < T::kDimChunks);
    raw[i] = make_uint4(0, 0, 0, 0);
    if (ok) {
      const int pos = packed / p.head_ratio, head = w.kv_head * p.head_ratio + packed % p.head_ratio;
      raw[i] = *reinterpret_cast<const uint4*>(q + int64_t(pos) * p.q_row_stride + int64_t(head) * p.q_head_stride +
                                               chunk * 8);
    }
    const Elem* x = reinterpret_cast<const Elem*>(&raw[i]);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float a = fabsf(float(x[e]));
      amax = fmaxf(amax, a < INFINITY ? a : 0.f);  // inf and nan pass through the scaling as they are
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (tid % 32 == 0) scratch[tid / 32] = amax;
  __syncthreads();
  amax = 0.f;
#pragma unroll
  for (int i = 0; i < T::kWarps; ++i) amax = fmaxf(amax, scratch[i]);
  int amax_exp = 0;
  frexpf(amax, &amax_exp);  // amax < 2^amax_exp
  // a tile of all but zeros (2^-85 and less) is not scaled all the way
  const int q_exp = amax > 0.f ? min(15 - amax_exp, 100) : 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int c = tid + i * T::kThreads, r = c / T::kChunksPerRow, chunk = c % T::kChunksPerRow;
    if (c >= kChunks) continue;
    const Elem* x = reinterpret_cast<const Elem*>(&raw[i]);
    const int slice = chunk >> 1, half = chunk & 1;
#pragma unroll
    for (int pair = 0; pair < 4; ++pair) {  // dims 8 half + 2 pair, +1 -> k-index of the slice
      const int kidx = 4 * half + 2 * (pair >> 1) + 8 * (pair & 1);
      const __half2 h = __floats2half2_rn(ldexpf(float(x[2 * pair]), q_exp), ldexpf(float(x[2 * pair + 1]), q_exp));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sQ + 2 * sm80::swizzled<D>(r, slice * 16 + kidx)),
                   "r"(*reinterpret_cast<const uint32_t*>(&h)));
    }
  }
  return q_exp;
}

// Per lane: where its K ldmatrix rows and its V reads start in a slot (byte offsets), for every
// 64-dim group kq of the K rows and both row parities of the V rows.
template <class T>
struct Fp8Lanes {
  static constexpr int kGroups = T::kHeadDim / 64;
  uint32_t k[kGroups];  // lane l addresses row (m >> 1) + 4 (m & 1) of matrix l / 8 (m = l % 8), chunk 4 kq + l / 8
  uint32_t v_row[2];    // rows t and t + 4 (t = l % 4) and the lane's 4 bytes in the chunk
  int v_chunk, v_swizzle[2];

  __device__ __forceinline__ explicit Fp8Lanes(int lane) {
    const int m = lane & 7, j = lane >> 3;
    const int k_row = (m >> 1) + 4 * (m & 1);
#pragma unroll
    for (int kq = 0; kq < kGroups; ++kq)
      k[kq] = k_row * T::kKvRowBytes + (((4 * kq + j) ^ fp8_chunk_swizzle<T>(k_row)) << 4);
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      v_row[p] = (t + 4 * p) * T::kKvRowBytes + 4 * (g & 3);
      v_swizzle[p] = fp8_chunk_swizzle<T>(t + 4 * p);
    }
    v_chunk = g >> 2;
  }
};

// s += Q K^T for the step's keys in the slot at sK (e4m3), Q (f16, sigma order) at q_addr.
template <class T>
__device__ __forceinline__ void scores_fp8(float (&s)[T::kMTiles][T::kSTiles][4], uint32_t sK,
                                           const uint32_t (&q_addr)[4], const Fp8Lanes<T>& lanes) {
  constexpr int MT = T::kMTiles;
#pragma unroll
  for (int kq = 0; kq < T::kHeadDim / 64; ++kq) {
    uint32_t a[MT][4][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < 4; ++j) ldmatrix_x4(a[mt][j], q_addr[j] + mt * 16 * T::kRowBytes + kq * 128);
#pragma unroll
    for (int nt = 0; nt < T::kSTiles; ++nt) {
      uint32_t kw[4];  // matrix j: keys nt * 8 + pi, dims 16 (4 kq + j) + 4t .. + 3
      ldmatrix_x4(kw, sK + nt * 8 * T::kKvRowBytes + lanes.k[kq]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t b0, b1;
        e4m3x4_to_f16x2(kw[j], b0, b1);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) mma_16816<__half>(s[mt][nt], a[mt][j], b0, b1);
      }
    }
  }
}

// o += P V for one 16-key slice `slice` of the step: p, P's A fragments (f16); V (e4m3) at sV.
template <class T>
__device__ __forceinline__ void accumulate_pv_fp8(float (&o)[T::kMTiles][T::kOTiles][4],
                                                  const uint32_t (&p)[T::kMTiles][4], uint32_t sV, int slice,
                                                  const Fp8Lanes<T>& lanes) {
  const uint32_t base = sV + slice * 16 * T::kKvRowBytes;
#pragma unroll
  for (int q = 0; q < T::kHeadDim / 32; ++q) {
    uint32_t w[4];  // rows t + 4i (keys of k-indices 2t, 2t+1, 2t+8, 2t+9), dims 32q + 4g .. + 3
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int chunk = 2 * q + lanes.v_chunk;
      const uint32_t at = base + (i >> 1) * 8 * T::kKvRowBytes + lanes.v_row[i & 1] +
                          (((chunk & ~7) | ((chunk & 7) ^ lanes.v_swizzle[i & 1])) << 4);
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(w[i]) : "r"(at));
    }
    // Byte j of each row -> dim 32q + 4g + j: pairs (row 0, row 1) and (row 2, row 3) of it.
    const uint32_t r01_lo = byte_perm(w[0], w[1], 0x5140), r01_hi = byte_perm(w[0], w[1], 0x7362);
    const uint32_t r23_lo = byte_perm(w[2], w[3], 0x5140), r23_hi = byte_perm(w[2], w[3], 0x7362);
    uint32_t b01[4], b23[4];  // index j: dim 32q + 4g + j
    e4m3x4_to_f16x2(r01_lo, b01[0], b01[1]);
    e4m3x4_to_f16x2(r01_hi, b01[2], b01[3]);
    e4m3x4_to_f16x2(r23_lo, b23[0], b23[1]);
    e4m3x4_to_f16x2(r23_hi, b23[2], b23[3]);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int mt = 0; mt < T::kMTiles; ++mt) mma_16816<__half>(o[mt][4 * q + j], p[mt], b01[j], b23[j]);
  }
}

}  // namespace decode
}  // namespace flashtune
