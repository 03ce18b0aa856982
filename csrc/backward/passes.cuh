// The passes around either backward kernel (mma.sync or wgmma), each one memory-bound launch with a
// warp per (row, head) pair (FlashAttention's preprocess and dQ conversion kernels; before, seven
// PyTorch launches did their work, ten with GQA):
//   prep:   rowsum(dO * O) over the head dim in fp32, less the LSE's gradient when the loss used
//           the LSE, into dsum (the LSE's layout), and the row's fp32 dQ sum zeroed for the
//           kernel's adds (the deterministic dQ kernel stores its rows instead, but a call with
//           no keys launches no kernel, and then dQ is these zeros);
//   finish: dQ = the fp32 sum times the softmax scale, in the inputs' dtype;
//   group:  with GQA, each KV head's dK and dV, the fp32 sum of its query heads' (a warp per key
//           row and KV head; the kernel writes them per query head).
// Every row of the q (k) tensor is visited, varlen rows past the last sequence included, so that
// no gradient row is left unwritten. The generated source names the kernels `<kernel name>_prep`,
// `<kernel name>_finish` and `<kernel name>_group` (the profiler shows them beside the main kernel).
#pragma once
#include <cuda_runtime.h>

#include <type_traits>

#include "backward/params.h"
#include "common/convert.cuh"

namespace flashtune {
namespace bwd {

constexpr int kPassThreads = 256;  // 8 warps, 8 (row, head) pairs a CTA

// Rows of the q tensor (keys: false) a pass visits: every packed row for varlen, else batch x seqlen.
__host__ __device__ __forceinline__ int64_t pass_rows(const FwdParams& p, bool queries) {
  if (p.cu_seqlens_q != nullptr) return queries ? p.total_q : p.total_k;
  return int64_t(p.batch) * (queries ? p.seqlen_q : p.seqlen_k);
}

// A warp's (row, head) pair: the row's batch entry and position in it (varlen: batch 0, the
// packed row), or false past the last pair. Query rows and heads, or (keys) key rows and KV heads.
struct PassRow {
  int64_t batch, row, head;
  __device__ __forceinline__ bool locate(const FwdParams& p, bool queries = true) {
    const int64_t pair = (int64_t(blockIdx.x) * kPassThreads + threadIdx.x) / 32;
    const int heads = queries ? p.heads_q : p.heads_kv;
    if (pair >= pass_rows(p, queries) * heads) return false;
    head = pair % heads;
    const int64_t r = pair / heads, seqlen = queries ? p.seqlen_q : p.seqlen_k;
    const bool varlen = p.cu_seqlens_q != nullptr;
    batch = varlen ? 0 : r / seqlen;
    row = varlen ? r : r % seqlen;
    return true;
  }
  // Index into the LSE's layout: (batch, heads, seqlen_q), or (heads, total_q) for varlen.
  __device__ __forceinline__ int64_t stat(const FwdParams& p) const {
    return batch * p.lse_batch_stride + head * p.lse_head_stride + row;
  }
  __device__ __forceinline__ int64_t dq(const BwdParams& p) const {
    return batch * p.dq_batch_stride + row * p.dq_row_stride + head * p.dq_head_stride;
  }
};

// kHeadDim / 32 consecutive 16-bit values a lane: 2 (one 4-byte load) at hdim 64, 4 (8 bytes) at
// 128, 8 (16 bytes) at 256; their fp32 values as kFloatVecs vectors of 8 or 16 bytes.
template <int kHeadDim>
struct LaneSlice {
  static constexpr int kElems = kHeadDim / 32;
  static_assert(kElems == 2 || kElems == 4 || kElems == 8, "head dim 64, 128 or 256");
  using Packed = std::conditional_t<kElems == 2, uint32_t, std::conditional_t<kElems == 4, uint2, uint4>>;
  using Floats = std::conditional_t<kElems == 2, float2, float4>;
  static constexpr int kFloatVecs = kElems * 4 / int(sizeof(Floats));
};

// A lane's kHeadDim / 32 16-bit values (kElems / 2 words) as one 4-, 8- or 16-byte store (built
// through a word array, a plain store of Packed is split into 4-byte ones).
template <int kHeadDim, typename Elem>
__device__ __forceinline__ void store_lane(Elem* dst, const uint32_t (&w)[LaneSlice<kHeadDim>::kElems / 2]) {
  constexpr int kWords = LaneSlice<kHeadDim>::kElems / 2;
  if constexpr (kWords == 1) {
    *reinterpret_cast<uint32_t*>(dst) = w[0];
  } else if constexpr (kWords == 2) {
    asm volatile("st.global.v2.b32 [%0], {%1, %2};\n" ::"l"(dst), "r"(w[0]), "r"(w[1]));
  } else {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]));
  }
}

template <typename Elem, int kHeadDim>
__device__ __forceinline__ float dot_lane(const Elem* a, const Elem* b) {
  using S = LaneSlice<kHeadDim>;
  const auto x = *reinterpret_cast<const typename S::Packed*>(a);
  const auto y = *reinterpret_cast<const typename S::Packed*>(b);
  const uint32_t* xs = reinterpret_cast<const uint32_t*>(&x);
  const uint32_t* ys = reinterpret_cast<const uint32_t*>(&y);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < S::kElems / 2; ++i)
    for (int hi = 0; hi < 2; ++hi) sum += unpack_half<Elem>(xs[i], hi) * unpack_half<Elem>(ys[i], hi);
  return sum;
}

template <typename Elem, int kHeadDim>
__device__ __forceinline__ void prep_body(const BwdParams& p) {
  using S = LaneSlice<kHeadDim>;
  const FwdParams& f = p.fwd;
  PassRow at;
  if (!at.locate(f)) return;
  const int lane = threadIdx.x % 32, col = lane * S::kElems;
  const Elem* dout = static_cast<const Elem*>(p.dout) + at.batch * p.do_batch_stride + at.row * p.do_row_stride +
                     at.head * p.do_head_stride + col;
  const Elem* out = static_cast<const Elem*>(f.o) + at.batch * f.o_batch_stride + at.row * f.o_row_stride +
                    at.head * f.o_head_stride + col;
  float sum = dot_lane<Elem, kHeadDim>(dout, out);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) p.dsum[at.stat(f)] = p.dlse == nullptr ? sum : sum - p.dlse[at.stat(f)];
  auto* zeros = reinterpret_cast<typename S::Floats*>(p.dq_accum + at.dq(p) + col);
#pragma unroll
  for (int v = 0; v < S::kFloatVecs; ++v) zeros[v] = typename S::Floats{};
}

template <typename Elem, int kHeadDim>
__device__ __forceinline__ void finish_body(const BwdParams& p) {
  using S = LaneSlice<kHeadDim>;
  PassRow at;
  if (!at.locate(p.fwd)) return;
  const int64_t offset = at.dq(p) + (threadIdx.x % 32) * S::kElems;  // dq has dq_accum's strides
  alignas(16) float sum[S::kElems];
#pragma unroll
  for (int v = 0; v < S::kFloatVecs; ++v)
    reinterpret_cast<typename S::Floats*>(sum)[v] = reinterpret_cast<const typename S::Floats*>(p.dq_accum + offset)[v];
  const float scale = p.fwd.softmax_scale;
  uint32_t words[S::kElems / 2];
#pragma unroll
  for (int i = 0; i < S::kElems / 2; ++i) words[i] = pack2<Elem>(sum[2 * i] * scale, sum[2 * i + 1] * scale);
  store_lane<kHeadDim>(static_cast<Elem*>(p.dq) + offset, words);
}

template <typename Elem, int kHeadDim>
__device__ __forceinline__ void group_body(const BwdParams& p) {
  using S = LaneSlice<kHeadDim>;
  const FwdParams& f = p.fwd;
  PassRow at;
  if (!at.locate(f, false)) return;
  const int col = (threadIdx.x % 32) * S::kElems;
  const int64_t from = at.batch * p.dkv_batch_stride + at.row * p.dkv_row_stride +
                       at.head * f.head_ratio * p.dkv_head_stride + col;
  const int64_t to = at.batch * p.dkv_kv_batch_stride + at.row * p.dkv_kv_row_stride + at.head * p.dkv_kv_head_stride + col;
  for (int which = 0; which < 2; ++which) {  // dK, then dV
    const Elem* src = static_cast<const Elem*>(which == 0 ? p.dk : p.dv) + from;
    float sum[S::kElems] = {};
    for (int h = 0; h < f.head_ratio; ++h) {
      const auto x = *reinterpret_cast<const typename S::Packed*>(src + h * p.dkv_head_stride);
      const uint32_t* words = reinterpret_cast<const uint32_t*>(&x);
#pragma unroll
      for (int i = 0; i < S::kElems; ++i) sum[i] += unpack_half<Elem>(words[i / 2], i % 2);
    }
    uint32_t packed[S::kElems / 2];
#pragma unroll
    for (int i = 0; i < S::kElems / 2; ++i) packed[i] = pack2<Elem>(sum[2 * i], sum[2 * i + 1]);
    store_lane<kHeadDim>(static_cast<Elem*>(which == 0 ? p.dk_kv : p.dv_kv) + to, packed);
  }
}

// One pass over every (row, head) pair of the queries (or keys); nothing to do for an empty tensor.
inline int launch_pass(void (*kernel)(const BwdParams), const BwdParams& p, void* stream, bool queries = true) {
  const int64_t pairs = pass_rows(p.fwd, queries) * (queries ? p.fwd.heads_q : p.fwd.heads_kv);
  if (pairs == 0) return int(cudaSuccess);
  const int64_t blocks = (pairs * 32 + kPassThreads - 1) / kPassThreads;
  kernel<<<unsigned(blocks), kPassThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return int(cudaGetLastError());
}

// The whole backward: prep, the main kernel's launch (`main_launch`, the family's launch<T>; none
// without keys: dK and dV are then empty or zero, dQ zero), finish, and with GQA the group pass.
template <class MainLaunch>
int launch_with_passes(void (*prep)(const BwdParams), void (*finish)(const BwdParams),
                       void (*group)(const BwdParams), const BwdParams& p, void* stream, MainLaunch main_launch) {
  if (p.dq == nullptr || p.dsum == nullptr || p.dq_accum == nullptr) return int(cudaErrorInvalidValue);
  if ((p.fwd.head_ratio > 1) != (p.dk_kv != nullptr && p.dv_kv != nullptr)) return int(cudaErrorInvalidValue);
  int err = launch_pass(prep, p, stream);
  if (err == 0 && p.fwd.batch > 0 && p.fwd.seqlen_k > 0) err = main_launch();
  if (err == 0) err = launch_pass(finish, p, stream);
  if (err == 0 && p.fwd.head_ratio > 1) err = launch_pass(group, p, stream, false);
  return err;
}

}  // namespace bwd
}  // namespace flashtune
