// What the Hopper backward works on: tiles, each a key block of one (batch, query head) with the
// sequence's lengths and first rows and the query blocks that see its keys, and the order a CTA
// takes them in: one thread picks them and publishes each (the tile ring, below), and every role
// walks the same tiles and computes each one's fields the same from the parameters.
#pragma once
#include "backward/params.h"
#include "common/persistent_grid.h"
#include "sm90/ptx_sm90.cuh"

namespace flashtune {
namespace sm90_bwd {

template <class T>
struct Work {
  int n_block, head, kv_head, batch;
  int seqlen_q, seqlen_k;
  int q_row0, k_row0, tma_batch;  // the TMA's coordinates: varlen tensors are one entry of total rows
  int64_t lse;                    // the sequence's first entry of the LSE and rowsum(dO O) rows
  int m_begin, m_end;             // query blocks that see any of the keys

  // Tile `tile` of (key block, head, batch), the key block fastest: a (head, batch)'s key blocks are
  // taken together (they share its Q and dO in L2), its first (under a causal mask the heaviest:
  // the first keys see the most queries) first.
  __device__ __forceinline__ Work(const BwdParams& bp, int tile, int n_blocks) {
    const FwdParams& p = bp.fwd;
    n_block = tile % n_blocks;
    head = (tile / n_blocks) % p.heads_q, batch = tile / n_blocks / p.heads_q;
    kv_head = head / p.head_ratio;
    if (p.cu_seqlens_q == nullptr) {
      seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k;
      q_row0 = k_row0 = 0, tma_batch = batch;
      lse = int64_t(batch) * p.lse_batch_stride;
    } else {
      q_row0 = p.cu_seqlens_q[batch], k_row0 = p.cu_seqlens_k[batch];
      seqlen_q = p.cu_seqlens_q[batch + 1] - q_row0, seqlen_k = p.cu_seqlens_k[batch + 1] - k_row0;
      tma_batch = 0;
      lse = q_row0;
    }
    lse += int64_t(head) * p.lse_head_stride;
    m_end = (seqlen_q + T::kBlockM - 1) / T::kBlockM;
    // Bottom-right causal: key j is visible to query i iff j <= i + seqlen_k - seqlen_q.
    m_begin = T::kCausal ? min(m_end, max(0, key0() - causal_shift()) / T::kBlockM) : 0;
  }
  __device__ __forceinline__ int key0() const { return n_block * T::kBlockN; }
  __device__ __forceinline__ int causal_shift() const { return seqlen_k - seqlen_q; }
  __device__ __forceinline__ bool has_keys() const { return key0() < seqlen_k; }  // else the tile is skipped
  // Whether the query block at q0 needs a mask: keys past the end, or (causal) keys that some of its
  // queries do not see. Uniform across the CTA.
  __device__ __forceinline__ bool needs_mask(int q0) const {
    return key0() + T::kBlockN > seqlen_k || (T::kCausal && key0() + T::kBlockN - 1 > q0 + causal_shift());
  }
};

// The CTA's tiles reach every role through the tile ring: the producer's load thread (the
// scheduler, schedule_tiles) picks each next tile and publishes its index in one of two slots
// (full[s]: one arrival, its store released by it); each of the other warps (the statistics and dQ
// warps, the consumers' eight) reads it and releases the slot (empty[s], lane 0 once its warp has
// read). An index of -1 ends the walk. So one thread decides, and every role walks the same tiles.
template <class T>
struct TileRing {
  static constexpr int kSlots = 2;
  static constexpr int kReaderWarps = 2 + 4 * T::kConsumers;
  uint64_t full[kSlots], empty[kSlots];
  int tile[kSlots];

  static __device__ __forceinline__ TileRing& shared() {
    __shared__ __align__(8) TileRing ring;
    return ring;
  }
  __device__ __forceinline__ void init() {  // one thread, before the CTA's barrier (and the init fence)
    for (int s = 0; s < kSlots; ++s) {
      sm90::mbarrier_init(&full[s], 1);
      sm90::mbarrier_init(&empty[s], kReaderWarps);
    }
  }
};

// The key blocks of the longest sequence, and the launch's tiles, (key block, head, batch): the
// launcher sizes the grid by the count the scheduler walks.
template <class T>
__host__ __device__ __forceinline__ int key_blocks(const BwdParams& bp) {
  return (bp.fwd.seqlen_k + T::kBlockN - 1) / T::kBlockN;
}
template <class T>
__host__ __device__ __forceinline__ int64_t tile_count(const BwdParams& bp) {
  return int64_t(key_blocks<T>(bp)) * bp.fwd.heads_q * bp.fwd.batch;
}

// The scheduler (one thread): CTA c starts at tile c; the next is the grid's stride on, or (causal
// and varlen calls, whose tiles differ in cost: bp.fwd.tile_counter) the launch counter's next, taken
// once f has issued the tile's last load, so that whichever CTA frees first takes it, as the GPU hands
// out CTAs. Tiles without keys (varlen) are skipped. f(work, k) for the k-th tile, after its index is
// published; at the end -1, and the counter left at 0 for the next launch (release_tile_counter, as
// the forward's scheduler).
template <class T, class F>
__device__ __forceinline__ void schedule_tiles(const BwdParams& bp, F&& f) {
  TileRing<T>& ring = TileRing<T>::shared();
  const int n_blocks = key_blocks<T>(bp);
  const int tiles = int(tile_count<T>(bp));  // launch.cuh checks it fits an int
  int* const counter = bp.fwd.tile_counter;
  auto next = [&](int t) {
    return counter != nullptr ? int(gridDim.x) + atomicAdd(counter, 1) : t + int(gridDim.x);
  };
  int t = int(blockIdx.x);
  for (int k = 0;; ++k) {
    while (t < tiles && !Work<T>(bp, t, n_blocks).has_keys()) t = next(t);  // varlen: too short a sequence
    const int s = k % TileRing<T>::kSlots;
    if (k >= TileRing<T>::kSlots) sm90::mbarrier_wait(&ring.empty[s], ((k / TileRing<T>::kSlots) & 1) ^ 1);
    ring.tile[s] = t < tiles ? t : -1;
    sm90::mbarrier_arrive(&ring.full[s]);
    if (t >= tiles) break;
    f(Work<T>(bp, t, n_blocks), k);
    t = next(t);
  }
  if (counter != nullptr) release_tile_counter(counter);
}

// Every other role's walk, by whole warps: the published tiles in order, f(work, k) for the k-th.
template <class T, class F>
__device__ __forceinline__ void for_each_tile(const BwdParams& bp, F&& f) {
  TileRing<T>& ring = TileRing<T>::shared();
  const int n_blocks = key_blocks<T>(bp);
  for (int k = 0;; ++k) {
    const int s = k % TileRing<T>::kSlots;
    sm90::mbarrier_wait(&ring.full[s], (k / TileRing<T>::kSlots) & 1);
    const int t = ring.tile[s];
    __syncwarp();
    if (threadIdx.x % 32 == 0) sm90::mbarrier_arrive(&ring.empty[s]);
    if (t < 0) break;
    f(Work<T>(bp, t, n_blocks), k);
  }
}

}  // namespace sm90_bwd
}  // namespace flashtune
