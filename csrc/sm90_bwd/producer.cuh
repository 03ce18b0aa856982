// The Hopper backward's loads and the barriers the CTA shares. Per tile, the producer warpgroup's
// warp 0 (one thread) brings K and V (bar_kv; first waiting on kv_empty: every consumer thread is
// done with the last tile's), then each query block's Q and dO by TMA onto a ring of kStages slots
// (full: the bytes arrived); its warp 1 writes the block's statistics into the same slot (the LSE in
// log2 units, +inf past the sequence's end so that P is 0 there, and rowsum(dO O)) and arrives on
// full with its 32 threads. Both wait on empty (every consumer thread released the slot) before
// refilling it. The ring runs on across tiles: a tile's first blocks load under the last one's end.
// Its warp 2 adds the consumers' dQ pieces to the fp32 sum (write_dq, below: named barriers
// kDqFullBarrier / kDqEmptyBarrier + cw with each consumer warpgroup).
#pragma once
#include "backward/params.h"
#include "sm90/ptx_sm90.cuh"
#include "sm90_bwd/kernel_traits.cuh"
#include "sm90_bwd/work.cuh"

namespace flashtune {
namespace sm90_bwd {

using sm90::mbarrier_arrive;
using sm90::mbarrier_arrive_expect_tx;
using sm90::mbarrier_init;
using sm90::mbarrier_wait;
using sm90::tma_load_4d;
using sm90::tma_reduce_add_4d;

// The tensor maps, 4-D (dim, rows, heads, batch) as the forward's (sm90/producer.cuh); varlen
// tensors are one batch entry of total rows. dq: the fp32 dQ sum.
struct BwdTmaMaps {
  CUtensorMap q, k, v, dout, dq;
};

template <class T>
struct Barriers {
  static constexpr int kStatsThreads = 32;
  uint64_t bar_kv, kv_empty, full[T::kStages], empty[T::kStages];

  static __device__ __forceinline__ Barriers& shared() {
    __shared__ __align__(8) Barriers bars;
    return bars;
  }
  __device__ __forceinline__ void init() {  // one thread, before the CTA's barrier
    mbarrier_init(&bar_kv, 1);
    mbarrier_init(&kv_empty, 128 * T::kConsumers);
    for (int s = 0; s < T::kStages; ++s) {
      mbarrier_init(&full[s], 1 + kStatsThreads);  // the TMA thread's expect_tx and the statistics warp
      mbarrier_init(&empty[s], 128 * T::kConsumers);
    }
    sm90::fence_barrier_init();
  }
};

// The shared-memory tiles, from a 1024-byte aligned base (the 128B swizzle's atom).
template <class T>
struct SmemTiles {
  unsigned char* base;
  __device__ __forceinline__ explicit SmemTiles(unsigned char* raw)
      : base(reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023))) {}
  __device__ __forceinline__ unsigned char* k() const { return base; }
  __device__ __forceinline__ unsigned char* v() const { return base + T::kVOffset; }
  __device__ __forceinline__ unsigned char* q(int stage) const { return base + T::kQOffset + stage * T::kQBytes; }
  __device__ __forceinline__ unsigned char* dout(int stage) const {
    return base + T::kdOOffset + stage * T::kQBytes;
  }
  __device__ __forceinline__ unsigned char* ds(int buf) const { return base + T::kDsOffset + buf * T::kDsBytes; }
  __device__ __forceinline__ unsigned char* dq(int cw) const { return base + T::kDqOffset + cw * T::kDqStageBytes; }
  __device__ __forceinline__ float* lse(int stage) const {
    return reinterpret_cast<float*>(base + T::kStatsOffset + stage * T::kStatsBytes);
  }
  __device__ __forceinline__ float* dsum(int stage) const { return lse(stage) + T::kBlockM; }
};

// Warp 0's thread 0, also the tile scheduler: per tile K and V, then every query block's Q and dO;
// `i` counts the ring's slots over all of the CTA's tiles.
template <class T>
__device__ __forceinline__ void load_tiles(const BwdParams& bp, const BwdTmaMaps& maps, const SmemTiles<T>& smem) {
  Barriers<T>& bars = Barriers<T>::shared();
  int i = 0;
  schedule_tiles<T>(bp, [&](const Work<T>& w, int k) {
    if (k > 0) mbarrier_wait(&bars.kv_empty, (k - 1) & 1);
    const int key_row = w.k_row0 + w.key0();
    mbarrier_arrive_expect_tx(&bars.bar_kv, 2 * T::kKBytes);
    for (int c = 0; c < T::kPanels; ++c) {
      tma_load_4d(smem.k() + c * T::kPanelBytesK, &maps.k, &bars.bar_kv, 64 * c, key_row, w.kv_head, w.tma_batch);
      tma_load_4d(smem.v() + c * T::kPanelBytesK, &maps.v, &bars.bar_kv, 64 * c, key_row, w.kv_head, w.tma_batch);
    }
    for (int m = w.m_begin; m < w.m_end; ++m, ++i) {
      const int stage = i % T::kStages;
      if (i >= T::kStages) mbarrier_wait(&bars.empty[stage], ((i / T::kStages) & 1) ^ 1);
      mbarrier_arrive_expect_tx(&bars.full[stage], 2 * T::kQBytes);
      const int row = w.q_row0 + m * T::kBlockM;
      for (int c = 0; c < T::kPanels; ++c) {
        tma_load_4d(smem.q(stage) + c * T::kPanelBytesQ, &maps.q, &bars.full[stage], 64 * c, row, w.head,
                    w.tma_batch);
        tma_load_4d(smem.dout(stage) + c * T::kPanelBytesQ, &maps.dout, &bars.full[stage], 64 * c, row, w.head,
                    w.tma_batch);
      }
    }
  });
}

// Warp 1: each query block's statistics, one row per lane and pass; the slots as load_tiles counts them.
// A block's global loads are all issued before its slot's wait, into registers, then stored by
// st.shared (loads each followed by a generic store, which may alias them, were eight round trips
// in a row at hdim 64: longer than the consumers' block).
template <class T>
__device__ __forceinline__ void load_stats(const BwdParams& bp, const SmemTiles<T>& smem, int lane) {
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr int kPasses = T::kBlockM / 32;
  Barriers<T>& bars = Barriers<T>::shared();
  int i = 0;
  for_each_tile<T>(bp, [&](const Work<T>& w, int) {
    const float* lse = bp.fwd.lse + w.lse;
    const float* dsum = bp.dsum + w.lse;
    for (int m = w.m_begin; m < w.m_end; ++m, ++i) {
      float lse_rows[kPasses], dsum_rows[kPasses];
#pragma unroll
      for (int j = 0; j < kPasses; ++j) {
        const int row = m * T::kBlockM + 32 * j + lane;
        const bool valid = row < w.seqlen_q;
        lse_rows[j] = valid ? __ldg(lse + row) * kLog2e : INFINITY;
        dsum_rows[j] = valid ? __ldg(dsum + row) : 0.f;
      }
      const int stage = i % T::kStages;
      if (i >= T::kStages) mbarrier_wait(&bars.empty[stage], ((i / T::kStages) & 1) ^ 1);
      const uint32_t lse_tile = sm90::smem_u32(smem.lse(stage)), dsum_tile = sm90::smem_u32(smem.dsum(stage));
#pragma unroll
      for (int j = 0; j < kPasses; ++j) {
        sm90::st_shared_f32(lse_tile + 4 * (32 * j + lane), lse_rows[j]);
        sm90::st_shared_f32(dsum_tile + 4 * (32 * j + lane), dsum_rows[j]);
      }
      mbarrier_arrive(&bars.full[stage]);  // release: the writes above are seen by whoever waits on full
    }
  });
}

// Warp 2: each block's dQ pieces, added to the fp32 sum (dq_accum, unscaled) by two TMA reduce-adds
// each (one per 32 columns), issued by lane 0 once consumer warpgroup cw has staged its piece
// (kDqFullBarrier + cw); the staging tiles are released (kDqEmptyBarrier + cw) once the reduces have
// read them, which the next block's writers wait for. Rows past a sequence's end are 0 (their P is)
// or outside the tensor map: adding them changes nothing. The consumers thus never wait on the TMA.
template <class T>
__device__ __forceinline__ void write_dq(const BwdParams& bp, const BwdTmaMaps& maps, const SmemTiles<T>& smem,
                                         int lane) {
  int i = 0;
  for_each_tile<T>(bp, [&](const Work<T>& w, int) {
    for (int m = w.m_begin; m < w.m_end; ++m, ++i) {
      if (i > 0) {  // the last block's reduces have read the staging tiles
        if (lane == 0) sm90::bulk_wait_group_read0();
        __syncwarp();
        for (int cw = 0; cw < T::kConsumers; ++cw)
          sm90::named_barrier_arrive(T::kDqEmptyBarrier + cw, T::kDqBarrierThreads);
      }
      for (int cw = 0; cw < T::kConsumers; ++cw) {
        sm90::named_barrier_sync(T::kDqFullBarrier + cw, T::kDqBarrierThreads);
        if (lane == 0) {
          const int row = w.q_row0 + m * T::kBlockM + T::dq_query_panel(cw) * 64;
          for (int box = 0; box < 2; ++box)
            tma_reduce_add_4d(&maps.dq, smem.dq(cw) + box * T::kDqBoxBytes, T::dq_dim_panel(cw) * 64 + 32 * box, row,
                              w.head, w.tma_batch);
          sm90::bulk_commit_group();
        }
      }
    }
  });
  if (lane == 0) sm90::bulk_wait_group0();  // complete before the CTA exits (the source is its shared memory)
}

}  // namespace sm90_bwd
}  // namespace flashtune
