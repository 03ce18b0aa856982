// The mainloop's loads: one producer thread walks its CTA's tiles (tile_scheduler.cuh), publishes
// each tile in shared memory with its Q, and streams the tile's K and V blocks onto two rings.
// Barriers: waits on q_empty (the consumers are done with a Q buffer: after a tile's last S, or
// for a deferred epilogue once that has run too) and on empty_k / empty_v (every consumer thread
// has released a ring slot); arrives on bar_q, full_k and full_v with the bytes the TMA brings
// (complete_tx). K and V have rings of their own: K_j is free once S_j is done, V_j only after
// P_j V_j, which the overlap issues an iteration later; one shared slot would hold K back.
#pragma once
#include "sm90/kernel_traits.cuh"
#include "sm90/ptx_sm90.cuh"
#include "sm90/tile_scheduler.cuh"

namespace flashtune {
namespace sm90 {

// The tensor maps are 4-D (dim, rows, heads, batch); varlen tensors are one batch entry of
// total rows, and a sequence starts at row cu_seqlens[b]. FP8 P V's V^T: (keys, head dim, heads,
// batch), fixed-length calls only. A KV-cache kernel's (launch_kvcache.cuh):
// q 5-D (dim, head in group, KV head, position, batch), k and v over the cache's entries or pages.
struct TmaMaps {
  CUtensorMap q, k, v, o;  // o: used by the TMA-store epilogue only
};

// What the producer and the consumers share besides the tiles' bytes: the barriers, and the
// tiles themselves. Tile q_iter is published in slot q_iter % kTileSlots: the producer writes it
// once the Q buffer is free, which is after every consumer has finished the epilogue of the tile
// kQBuffers + 1 before it (the last one that used the slot): one slot more than Q buffers. A
// deferred epilogue runs in the next tile before that tile releases its Q, so the count holds.
template <class T>
struct Pipeline {
  static constexpr int kTileSlots = T::kQBuffers + 1;
  uint64_t bar_q[T::kQBuffers], q_empty[T::kQBuffers];
  uint64_t full_k[T::kStages], empty_k[T::kStages], full_v[T::kStages], empty_v[T::kStages];
  Tile<T> tile_info[kTileSlots];

  // The CTA's one instance. Every part asks for it here rather than holding a reference: then each
  // access is plainly to shared memory (a reference kept in a struct lost that, and its generic
  // addresses took registers the main loop spilled for).
  static __device__ __forceinline__ Pipeline& shared() {
    __shared__ __align__(8) Pipeline pipe;
    return pipe;
  }

  __device__ __forceinline__ void init() {  // one thread, before the CTA's barrier
    for (int b = 0; b < T::kQBuffers; ++b) {
      mbarrier_init(&bar_q[b], 1);
      mbarrier_init(&q_empty[b], 128 * T::kConsumers);
    }
    for (int s = 0; s < T::kStages; ++s) {
      mbarrier_init(&full_k[s], 1);
      mbarrier_init(&full_v[s], 1);
      mbarrier_init(&empty_k[s], 128 * T::kConsumers);  // every consumer thread releases a slot
      mbarrier_init(&empty_v[s], 128 * T::kConsumers);
    }
    fence_barrier_init();
  }
};

// The shared-memory tiles: kQBuffers Q tiles, then the kStages K and kStages V slots, then the
// TMA-store epilogue's O tile, from a 1024-byte aligned base (the 128B swizzle's atom).
template <class T>
struct SmemTiles {
  unsigned char* q;
  unsigned char* k;
  unsigned char* v;
  unsigned char* o;
  __device__ __forceinline__ explicit SmemTiles(unsigned char* raw) {
    q = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
    k = q + T::kQBuffers * T::kQBytes;
    v = k + T::kStages * T::kKBytes;
    o = v + T::kStages * T::kVBytes;
  }
};

// The producer's loop: the next tile's Q and first blocks load once the consumers have released
// the Q buffer it goes to (with two buffers, the one the tile before last used), under the tile
// before's last P V and epilogue. The K/V rings run on across tiles (kv_iter counts blocks since
// the CTA started). n_blocks = -1 in a published tile tells the consumers to stop.
template <class T>
__device__ __forceinline__ void produce(const FwdParams& p, const TmaMaps& maps, const SmemTiles<T>& smem) {
  constexpr int BM = T::kBlockM, BN = T::kBlockN;
  Pipeline<T>& pipe = Pipeline<T>::shared();
  TileScheduler<T> scheduler{p};
  int kv_iter = 0;
  for (int q_iter = 0;; ++q_iter) {
    Tile<T> tile;
    const int buf = q_iter % T::kQBuffers;  // Q buffer, used for the (q_iter / kQBuffers)-th time
    const bool have = scheduler.get(tile);
    if constexpr (T::kPersistent) {  // free once the consumers released its last use (and this tile's slot)
      const int use = q_iter / T::kQBuffers;
      if (use > 0) mbarrier_wait(&pipe.q_empty[buf], (use - 1) & 1);
      if (!have) {
        pipe.tile_info[q_iter % pipe.kTileSlots].n_blocks = -1;
        mbarrier_arrive(&pipe.bar_q[buf]);  // no bytes: the consumers stop
        break;
      }
    }
    pipe.tile_info[q_iter % pipe.kTileSlots] = tile;
    mbarrier_arrive_expect_tx(&pipe.bar_q[buf], T::kQBytes);
    for (int c = 0; c < T::kQKPanels; ++c) {
      if constexpr (T::kCache)  // packed: BM / head_ratio positions x the group's heads (launch_kvcache.cuh's map)
        tma_load_5d(smem.q + buf * T::kQBytes + c * T::kPanelBytesQ, &maps.q, &pipe.bar_q[buf], T::kQKBoxCols * c,
                    0, tile.kv_head, tile.m_block * (BM / p.head_ratio), tile.batch);
      else
        tma_load_4d(smem.q + buf * T::kQBytes + c * T::kPanelBytesQ, &maps.q, &pipe.bar_q[buf], T::kQKBoxCols * c,
                    tile.q_row0 + tile.m_block * BM, tile.head, tile.tma_batch);
    }
    const Tile<T>& cur = pipe.tile_info[q_iter % pipe.kTileSlots];  // read back: the producer has 40 registers or fewer
    for (int j = 0; j < cur.n_blocks; ++j, ++kv_iter) {
      const int stage = kv_iter % T::kStages, free_phase = ((kv_iter / T::kStages) & 1) ^ 1;
      int row = cur.k_row0 + (first_block<T>(cur) + j) * BN, page = 0;
      if constexpr (T::kPaged) {  // pages hold whole blocks (page_size % BN == 0): one lookup per block
        page = p.block_table[int64_t(cur.batch) * p.block_table_batch_stride + row / p.page_size];
        row %= p.page_size;
      }
      unsigned char* k_tile = smem.k + stage * T::kKBytes;
      unsigned char* v_tile = smem.v + stage * T::kVBytes;
      if (kv_iter >= T::kStages) mbarrier_wait(&pipe.empty_k[stage], free_phase);
      mbarrier_arrive_expect_tx(&pipe.full_k[stage], T::kKBytes);
      for (int c = 0; c < T::kQKPanels; ++c)
        tma_load_4d(k_tile + c * T::kPanelBytesK, &maps.k, &pipe.full_k[stage], T::kQKBoxCols * c, row, cur.kv_head,
                    T::kPaged ? page : cur.tma_batch);
      if (kv_iter >= T::kStages) mbarrier_wait(&pipe.empty_v[stage], free_phase);
      mbarrier_arrive_expect_tx(&pipe.full_v[stage], T::kVBytes);
      for (int c = 0; c < T::kVPanels; ++c) {
        if constexpr (T::kFp8Pv)  // V^T: panel c is keys row + c x kVtRowBytes.., every head-dim row
          tma_load_4d(v_tile + c * T::kPanelBytesV, &maps.v, &pipe.full_v[stage], row + T::kVBoxCols * c, 0,
                      cur.kv_head, cur.tma_batch);
        else
          tma_load_4d(v_tile + c * T::kPanelBytesV, &maps.v, &pipe.full_v[stage], T::kVBoxCols * c, row, cur.kv_head,
                      T::kPaged ? page : cur.tma_batch);
      }
    }
    if constexpr (!T::kPersistent) break;  // a loop of one
    scheduler.advance();
  }
  scheduler.finish();
}

}  // namespace sm90
}  // namespace flashtune
