// The passes around either backward kernel (mma.sync or wgmma), each one memory-bound launch with
// kHeadDim / 8 lanes per (row, head) pair, 16 bytes of a row a lane (FlashAttention's preprocess
// and dQ conversion kernels; before, seven PyTorch launches did their work, ten with GQA):
//   prep:   rowsum(dO * O) over the head dim in fp32, less the LSE's gradient when the loss used
//           the LSE, into dsum (the LSE's layout), and the row's fp32 dQ sum zeroed for the
//           kernel's adds (the deterministic dQ kernel stores its rows instead, but a call with
//           no keys launches no kernel, and then dQ is these zeros);
//   finish: dQ = the fp32 sum times the softmax scale, in the inputs' dtype;
//   group:  with GQA, each KV head's dK and dV, the fp32 sum of its query heads' (per key row and
//           KV head; the kernel writes them per query head).
// finish reads the fp32 sum in the main kernel's layout of it (dq_layout.cuh, a template
// parameter); prep zeroes all of it in storage order.
// Every row of the q (k) tensor is visited, varlen rows past the last sequence included, so that
// no gradient row is left unwritten. The generated source names the kernels `<kernel name>_prep`,
// `<kernel name>_finish` and `<kernel name>_group` (the profiler shows them beside the main kernel).
// Every tensor's rows are 16-byte aligned (binding.cpp checks; flashtune/runtime/backward.py makes
// them so).
#pragma once
#include <cuda_runtime.h>

#include "backward/dq_layout.cuh"
#include "backward/params.h"
#include "common/convert.cuh"

namespace flashtune {
namespace bwd {

constexpr int kPassThreads = 256;  // 8 warps

// Rows of the q tensor (keys: false) a pass visits: every packed row for varlen, else batch x seqlen.
__host__ __device__ __forceinline__ int64_t pass_rows(const FwdParams& p, bool queries) {
  if (p.cu_seqlens_q != nullptr) return queries ? p.total_q : p.total_k;
  return int64_t(p.batch) * (queries ? p.seqlen_q : p.seqlen_k);
}

// 8 consecutive 16-bit values of a row a lane, one 16-byte access (at hdim 64 a lane's 4-byte
// slice made four times the memory requests for the same bytes); kLanes lanes a row, an aligned
// group of the warp, and kRowsPerWarp (row, head) pairs a warp.
template <int kHeadDim>
struct LaneSlice {
  static constexpr int kElems = 8;
  static constexpr int kLanes = kHeadDim / kElems;
  static_assert(kHeadDim % kElems == 0 && 32 % kLanes == 0, "head dim 64, 128 or 256");
  static constexpr int kRowsPerWarp = 32 / kLanes;
  __device__ __forceinline__ static int col() { return (threadIdx.x % kLanes) * kElems; }
};

// A lane's (row, head) pair: the row's batch entry and position in it (varlen: batch 0, the packed
// row), or false past the last pair. Query rows and heads, or (keys) key rows and KV heads.
// LaneSlice<kHeadDim>::kLanes lanes a pair.
template <int kHeadDim>
struct PassRow {
  int64_t batch, row, head;
  __device__ __forceinline__ bool locate(const FwdParams& p, bool queries = true) {
    using S = LaneSlice<kHeadDim>;
    const int64_t pair = (int64_t(blockIdx.x) * kPassThreads + threadIdx.x) / 32 * S::kRowsPerWarp +
                         threadIdx.x % 32 / S::kLanes;
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
  // Index into dq_accum of the row's column `col` (dq_layout.cuh: the main kernel's layout of it).
  template <class DqLayout>
  __device__ __forceinline__ int64_t dq_sum(const BwdParams& p, int col) const {
    return batch * p.dq_batch_stride + head * p.dq_head_stride +
           DqLayout::offset(int(row), col, dq_sum_rows(p.fwd), p.dq_row_stride);
  }
};

// A lane's 8 16-bit values (4 words) as one 16-byte store (a plain store of a uint4 built from
// words is split into 4-byte ones).
__device__ __forceinline__ void store_16b(void* dst, const uint32_t (&w)[4]) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]));
}

__device__ __forceinline__ void words_of(const void* src, uint32_t (&w)[4]) {
  const uint4 x = *reinterpret_cast<const uint4*>(src);
  w[0] = x.x, w[1] = x.y, w[2] = x.z, w[3] = x.w;
}

template <typename Elem>
__device__ __forceinline__ float dot_lane(const Elem* a, const Elem* b) {
  uint32_t xs[4], ys[4];
  words_of(a, xs);
  words_of(b, ys);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    for (int hi = 0; hi < 2; ++hi) sum += unpack_half<Elem>(xs[i], hi) * unpack_half<Elem>(ys[i], hi);
  return sum;
}

// dQ's fp32 sum zeroed in storage order, whatever the kernel's layout of it: dq_layout.cuh only
// permutes a head's elements within their rows of the tensor, which binding.cpp has contiguous. A
// warp's 32 lanes clear 1 KB in two 512-byte runs. Zeroed through the strips' layout, each lane's
// (row, col) slice, a store's 32 lanes fell on 32 lines, a sector each (8 lines row-major), and the
// pass took 157 us at hdim 64 x 512 tokens to the 94 of FlashAttention-2's, which also reads dO and
// O and zeroes its sum (Nsight Compute, lab/results/2026-12-06k_h100-visit/).
template <int kHeadDim>
__device__ __forceinline__ void zero_dq_sum(const BwdParams& p) {
  const int64_t thread = int64_t(blockIdx.x) * kPassThreads + threadIdx.x;  // a lane slice's 8 floats
  const int64_t end = pass_rows(p.fwd, true) * p.fwd.heads_q * (kHeadDim / 4), at = thread / 32 * 64 + thread % 32;
  float4* sum = reinterpret_cast<float4*>(p.dq_accum);  // in float4s: the warp's 64 from at - lane
  if (at < end) sum[at] = float4{};
  if (at + 32 < end) sum[at + 32] = float4{};
}

template <typename Elem, int kHeadDim>
__device__ __forceinline__ void prep_body(const BwdParams& p) {
  using S = LaneSlice<kHeadDim>;
  const FwdParams& f = p.fwd;
  zero_dq_sum<kHeadDim>(p);
  PassRow<kHeadDim> at;
  const bool valid = at.locate(f);
  const int col = S::col();
  float sum = 0.f;
  if (valid) {
    const Elem* dout = static_cast<const Elem*>(p.dout) + at.batch * p.do_batch_stride + at.row * p.do_row_stride +
                       at.head * p.do_head_stride + col;
    const Elem* out = static_cast<const Elem*>(f.o) + at.batch * f.o_batch_stride + at.row * f.o_row_stride +
                      at.head * f.o_head_stride + col;
    sum = dot_lane<Elem>(dout, out);
  }
  // Over the row's lanes, an aligned group that is valid or not as a whole: every lane shuffles.
#pragma unroll
  for (int offset = S::kLanes / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (!valid) return;
  if (col == 0) p.dsum[at.stat(f)] = p.dlse == nullptr ? sum : sum - p.dlse[at.stat(f)];
}

template <typename Elem, int kHeadDim, class DqLayout>
__device__ __forceinline__ void finish_body(const BwdParams& p) {
  PassRow<kHeadDim> at;
  if (!at.locate(p.fwd)) return;
  const int col = LaneSlice<kHeadDim>::col();
  const int64_t offset = at.dq(p) + col;  // dq: dq_accum's strides, q's layout
  const float4* sum = reinterpret_cast<const float4*>(p.dq_accum + at.template dq_sum<DqLayout>(p, col));
  const float4 lo = sum[0], hi = sum[1];
  const float s = p.fwd.softmax_scale;
  const uint32_t words[4] = {pack2<Elem>(lo.x * s, lo.y * s), pack2<Elem>(lo.z * s, lo.w * s),
                             pack2<Elem>(hi.x * s, hi.y * s), pack2<Elem>(hi.z * s, hi.w * s)};
  store_16b(static_cast<Elem*>(p.dq) + offset, words);
}

template <typename Elem, int kHeadDim>
__device__ __forceinline__ void group_body(const BwdParams& p) {
  const FwdParams& f = p.fwd;
  PassRow<kHeadDim> at;
  if (!at.locate(f, false)) return;
  const int col = LaneSlice<kHeadDim>::col();
  const int64_t from = at.batch * p.dkv_batch_stride + at.row * p.dkv_row_stride +
                       at.head * f.head_ratio * p.dkv_head_stride + col;
  const int64_t to = at.batch * p.dkv_kv_batch_stride + at.row * p.dkv_kv_row_stride + at.head * p.dkv_kv_head_stride + col;
  for (int which = 0; which < 2; ++which) {  // dK, then dV
    const Elem* src = static_cast<const Elem*>(which == 0 ? p.dk : p.dv) + from;
    float sum[8] = {};
    for (int h = 0; h < f.head_ratio; ++h) {
      uint32_t words[4];
      words_of(src + h * p.dkv_head_stride, words);
#pragma unroll
      for (int i = 0; i < 8; ++i) sum[i] += unpack_half<Elem>(words[i / 2], i % 2);
    }
    uint32_t packed[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) packed[i] = pack2<Elem>(sum[2 * i], sum[2 * i + 1]);
    store_16b(static_cast<Elem*>(which == 0 ? p.dk_kv : p.dv_kv) + to, packed);
  }
}

// One pass over every (row, head) pair of the queries (or keys), kHeadDim / 8 lanes a pair; nothing
// to do for an empty tensor.
template <int kHeadDim>
inline int launch_pass(void (*kernel)(const BwdParams), const BwdParams& p, void* stream, bool queries = true) {
  const int64_t pairs = pass_rows(p.fwd, queries) * (queries ? p.fwd.heads_q : p.fwd.heads_kv);
  if (pairs == 0) return int(cudaSuccess);
  constexpr int64_t kPairsPerBlock = kPassThreads / 32 * LaneSlice<kHeadDim>::kRowsPerWarp;
  const int64_t blocks = (pairs + kPairsPerBlock - 1) / kPairsPerBlock;
  kernel<<<unsigned(blocks), kPassThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return int(cudaGetLastError());
}

// The whole backward: prep, the main kernel's launch (`main_launch`, the family's launch<T>; none
// without keys: dK and dV are then empty or zero, dQ zero), finish, and with GQA the group pass.
template <int kHeadDim, class MainLaunch>
int launch_with_passes(void (*prep)(const BwdParams), void (*finish)(const BwdParams),
                       void (*group)(const BwdParams), const BwdParams& p, void* stream, MainLaunch main_launch) {
  if (p.dq == nullptr || p.dsum == nullptr || p.dq_accum == nullptr) return int(cudaErrorInvalidValue);
  if ((p.fwd.head_ratio > 1) != (p.dk_kv != nullptr && p.dv_kv != nullptr)) return int(cudaErrorInvalidValue);
  int err = launch_pass<kHeadDim>(prep, p, stream);
  if (err == 0 && p.fwd.batch > 0 && p.fwd.seqlen_k > 0) err = main_launch();
  if (err == 0) err = launch_pass<kHeadDim>(finish, p, stream);
  if (err == 0 && p.fwd.head_ratio > 1) err = launch_pass<kHeadDim>(group, p, stream, false);
  return err;
}

}  // namespace bwd
}  // namespace flashtune
