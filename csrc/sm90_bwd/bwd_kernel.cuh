// The Hopper backward (sm_90a): FlashAttention-2's algorithm on wgmma and TMA, in the layout of
// FlashAttention-3's: persistent CTAs over the key blocks of every (batch, query head) (work.cuh:
// by a stride, or from a counter where they differ in cost), a producer warpgroup (producer.cuh:
// per tile K and V, each query block's Q, dO and statistics onto a ring, and the consumers' dQ
// pieces added to the fp32 sum) and two consumer warpgroups (mainloop.cuh: each 64 of the keys),
// then this file's epilogue: dK (times the softmax scale: S was scaled) and dV of the warpgroup's
// keys, per query head (the caller sums a KV head's group), stored from the accumulators' registers
// in whole sectors (common/quad_store.cuh). The caller scales and converts dQ.
#pragma once
#include "backward/params.h"
#include "common/convert.cuh"
#include "common/quad_store.cuh"
#include "sm90/ptx_sm90.cuh"
#include "sm90_bwd/kernel_traits.cuh"
#include "sm90_bwd/mainloop.cuh"
#include "sm90_bwd/producer.cuh"
#include "sm90_bwd/work.cuh"

namespace flashtune {
namespace sm90_bwd {

// Accumulator i of the 64 x D tiles: key row acc_row(i), head-dim column acc_col(i), a pair of
// columns per register pair; stored in whole sectors, 8 bytes a thread (common/quad_store.cuh).
template <class T>
__device__ __forceinline__ void store_rows_8b(typename T::Elem* to, const float (&acc)[T::kDRegs], float scale,
                                              const BwdParams& bp, const Work<T>& w, const Mainloop<T>& ml) {
  using Elem = typename T::Elem;
#pragma unroll
  for (int chunk = 0; chunk < T::kHeadDim / 16; ++chunk) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // rows +0 and +8
      const int i0 = 8 * chunk + 2 * half, i1 = i0 + 4;  // the chunk's two n8 groups
      const uint2 cols = quad_chunk_of_16(pack2<Elem>(acc[i0] * scale, acc[i0 + 1] * scale),
                                          pack2<Elem>(acc[i1] * scale, acc[i1 + 1] * scale), ml.lane);
      const int key = w.key0() + ml.cw * 64 + ml.acc_row(i0);
      if (key < w.seqlen_k)
        *reinterpret_cast<uint2*>(to + int64_t(key) * bp.dkv_row_stride + 16 * chunk + 4 * ml.t) = cols;
    }
  }
}

template <class T>
__device__ __forceinline__ void store_dkdv(const BwdParams& bp, const Work<T>& w, const Mainloop<T>& ml) {
  using Elem = typename T::Elem;
  const int64_t offset = (bp.fwd.cu_seqlens_q == nullptr ? int64_t(w.batch) * bp.dkv_batch_stride
                                                          : int64_t(w.k_row0) * bp.dkv_row_stride) +
                         int64_t(w.head) * bp.dkv_head_stride;
  store_rows_8b<T>(static_cast<Elem*>(bp.dk) + offset, ml.acc_dk, bp.fwd.softmax_scale, bp, w, ml);
  store_rows_8b<T>(static_cast<Elem*>(bp.dv) + offset, ml.acc_dv, 1.f, bp, w, ml);
}

template <class T>
__device__ __forceinline__ void bwd_body(const BwdParams& bp, const BwdTmaMaps& maps) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const SmemTiles<T> smem(smem_raw);
  if (threadIdx.x == 0) {
    TileRing<T>::shared().init();
    Barriers<T>::shared().init();  // and the fence that makes both inits visible
  }
  __syncthreads();

  // Read through a shuffle from lane 0, the compiler knows it is the same across the warp: the
  // descriptors built from it then live in uniform registers (no R2UR before every wgmma).
  const int warpgroup = __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0);
  if (warpgroup == 0) {
    setmaxnreg_dec<T::kProducerRegs>();
    const int warp = threadIdx.x / 32;
    if (threadIdx.x == 0) load_tiles<T>(bp, maps, smem);
    else if (warp == 1) load_stats<T>(bp, smem, threadIdx.x % 32);
    else if (warp == 2) write_dq<T>(bp, maps, smem, threadIdx.x % 32);
    return;
  }
  setmaxnreg_inc<T::kConsumerRegs>();
  Mainloop<T> ml(smem, warpgroup - 1, threadIdx.x % 128);
  for_each_tile<T>(bp, [&](const Work<T>& w, int k) {
    ml.run(bp, w, k);
    store_dkdv<T>(bp, w, ml);  // from registers, while the next tile's K and V load
  });
}

}  // namespace sm90_bwd
}  // namespace flashtune
