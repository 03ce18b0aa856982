// The tile scheduler: which work tile a CTA runs next. Owns the order of the tiles (m-blocks
// fastest, the heaviest causal rows first), the persistent grid's walk over them (by a fixed
// stride, or from the launch's tile counter for causal and varlen calls, whose tiles differ in
// cost) and leaving that counter at 0 for the next launch. Only the producer thread calls it; it
// waits on no barrier and arrives at none (the counter is global memory, by atomics).
#pragma once
#include <type_traits>

#include "common/params.h"
#include "common/persistent_grid.h"

namespace flashtune {
namespace sm90 {

// One work tile: BM query rows of one head of one sequence, and the K/V blocks they see. With a
// window its blocks start at block0, the first any of its rows sees (a field only such kernels
// have: the tiles the consumers read from shared memory keep their size in every other kernel).
struct TileBase {
  int m_block, head, batch, kv_head;
  int seqlen_q, seqlen_k, q_row0, k_row0, tma_batch;
  int n_blocks;  // K/V blocks of BN keys this tile reads (0: every row is masked out; -1: no more tiles)
};
struct WindowTile : TileBase {
  int block0;
};
// A KV-cache kernel's tile (kernel_traits.cuh: kCache): BM packed query rows of one KV head
// (row = position x head_ratio + head in group; q_row0 0), one split's blocks from block0, keys
// from the sequence's left padding on (k_row0), tma_batch its cache entry.
struct CacheTile : TileBase {
  int block0, split, packed_rows;
};
template <class T>
using Tile = std::conditional_t<T::kCache, CacheTile, std::conditional_t<T::kWindow, WindowTile, TileBase>>;

// The tile's first K/V block: block0 with a window or a split, else 0.
template <class T>
__device__ __forceinline__ int first_block(const Tile<T>& tile) {
  if constexpr (T::kWindow || T::kCache) return tile.block0;
  else return 0;
}

// A KV-cache kernel's tile, from the CTA's place in the grid (splits x row blocks, KV heads,
// sequences), as decode/work.cuh places the decode kernels' CTAs: a causal tile reads no key past
// what its last row sees, and a split its share of those. Returns whether the tile has rows.
template <class T>
__device__ __forceinline__ bool cache_tile(const FwdParams& p, Tile<T>& tile) {
  const int row_blocks = int(gridDim.x) / p.num_splits;
  tile.m_block = int(blockIdx.x) % row_blocks;
  tile.split = int(blockIdx.x) / row_blocks;
  tile.kv_head = int(blockIdx.y);
  tile.batch = int(blockIdx.z);
  tile.head = tile.kv_head * p.head_ratio;
  tile.seqlen_q = p.seqlen_q;
  tile.packed_rows = p.seqlen_q * p.head_ratio;
  tile.q_row0 = 0;
  tile.k_row0 = p.leftpad_k != nullptr ? p.leftpad_k[tile.batch] : 0;
  tile.tma_batch = p.cache_batch_idx != nullptr ? p.cache_batch_idx[tile.batch] : tile.batch;
  const int used = p.seqused_k != nullptr ? p.seqused_k[tile.batch] : p.seqlen_k;
  tile.seqlen_k = max(0, used - tile.k_row0);
  int keys = tile.seqlen_k;
  if (T::kCausal) {  // bottom-right, per position: the last row's position sees keys up to pos + shift
    const int last_row = min(tile.packed_rows, (tile.m_block + 1) * T::kBlockM) - 1;
    keys = min(keys, max(0, last_row / p.head_ratio + tile.seqlen_k - tile.seqlen_q + 1));
  }
  const int blocks = (keys + T::kBlockN - 1) / T::kBlockN;
  const int per_split = (blocks + p.num_splits - 1) / p.num_splits;
  tile.block0 = min(blocks, tile.split * per_split);
  tile.n_blocks = min(blocks, tile.block0 + per_split) - tile.block0;
  return tile.m_block * T::kBlockM < tile.packed_rows;
}

// The tile of m-block m_block of one head of one sequence. Returns false for an m-block past the
// sequence's end (varlen: a sequence shorter than the tile's first row); the fields are set anyway.
template <class T>
__device__ __forceinline__ bool tile_of(const FwdParams& p, int m_block, int head, int batch, Tile<T>& tile) {
  tile.m_block = m_block;
  tile.head = head;
  tile.batch = batch;
  tile.kv_head = tile.head / p.head_ratio;
  tile.seqlen_q = p.seqlen_q, tile.seqlen_k = p.seqlen_k, tile.q_row0 = 0, tile.k_row0 = 0;
  tile.tma_batch = tile.batch;
  if (p.cu_seqlens_q != nullptr) {  // varlen: one TMA "batch entry" of total rows
    tile.q_row0 = p.cu_seqlens_q[tile.batch];
    tile.k_row0 = p.cu_seqlens_k[tile.batch];
    tile.seqlen_q = p.cu_seqlens_q[tile.batch + 1] - tile.q_row0;
    tile.seqlen_k = p.cu_seqlens_k[tile.batch + 1] - tile.k_row0;
    tile.tma_batch = 0;
  }
  tile.n_blocks = (tile.seqlen_k + T::kBlockN - 1) / T::kBlockN;
  if (T::kCausal) {  // bottom-right: key j visible to row i iff j <= i + seqlen_k - seqlen_q
    const int last_visible = (tile.m_block + 1) * T::kBlockM - 1 + tile.seqlen_k - tile.seqlen_q;
    tile.n_blocks = min(tile.n_blocks, last_visible < 0 ? 0 : last_visible / T::kBlockN + 1);
  }
  if constexpr (T::kWindow) {
    tile.block0 = 0;  // blocks past the last row's window end and before the first row's start: skipped
    const int shift = tile.seqlen_k - tile.seqlen_q;
    if (p.window_right >= 0) {
      const int last_visible = (tile.m_block + 1) * T::kBlockM - 1 + shift + p.window_right;
      tile.n_blocks = min(tile.n_blocks, last_visible < 0 ? 0 : last_visible / T::kBlockN + 1);
    }
    if (p.window_left >= 0)
      tile.block0 = min(tile.n_blocks, max(0, tile.m_block * T::kBlockM + shift - p.window_left) / T::kBlockN);
    tile.n_blocks -= tile.block0;
  }
  return tile.m_block * T::kBlockM < tile.seqlen_q;
}

// Tile t of batch x heads x m-blocks, m-blocks fastest (the tiles of one head run side by side
// and share its K/V in L2), the heaviest causal rows first. Returns false for a varlen
// sequence shorter than the tile's first row (the tile has no rows).
template <class T>
__device__ __forceinline__ bool tile_at(const FwdParams& p, int t, Tile<T>& tile) {
  if constexpr (T::kCache) return cache_tile<T>(p, tile);  // one tile per CTA, from its grid place
  const int num_m = (p.seqlen_q + T::kBlockM - 1) / T::kBlockM;
  return tile_of<T>(p, num_m - 1 - t % num_m, (t / num_m) % p.heads_q, t / num_m / p.heads_q, tile);
}

// Tiles per launch: m-blocks x heads x batch (the launcher's grid is this, or fewer CTAs that loop).
template <class T>
__device__ __forceinline__ int num_tiles(const FwdParams& p) {
  return (p.seqlen_q + T::kBlockM - 1) / T::kBlockM * p.heads_q * p.batch;
}

// The walk of one CTA (its producer thread) over the tiles: CTA c starts at tile c; the
// persistent grid goes on from the counter when the launcher gave one (the next free CTA takes
// the next tile), else by a stride of the grid; a one-tile CTA stops after its first.
template <class T>
struct TileScheduler {
  const FwdParams& p;
  int t = int(blockIdx.x);

  // The current tile, or the next one with rows, into `tile` (false once there is none): varlen
  // tiles past their sequence's end are skipped here, so no CTA waits for one.
  __device__ __forceinline__ bool get(Tile<T>& tile) {
    if constexpr (!T::kPersistent) {
      tile_at<T>(p, t, tile);  // valid: the kernel's entry checked it
      return true;
    }
    const int tiles = num_tiles<T>(p);
    while (t < tiles && !tile_at<T>(p, t, tile)) advance();  // varlen: no rows there
    return t < tiles;
  }
  // On to the next tile (only the persistent grid has one).
  __device__ __forceinline__ void advance() {
    t = p.tile_counter != nullptr ? int(gridDim.x) + atomicAdd(p.tile_counter, 1) : t + int(gridDim.x);
  }
  // Leave the counter at 0 for the next launch on the stream (the launcher then needs no
  // memset): every CTA has taken its last tile once all have counted themselves done.
  __device__ __forceinline__ void finish() {
    if (T::kPersistent && p.tile_counter != nullptr) release_tile_counter(p.tile_counter);
  }
};

}  // namespace sm90
}  // namespace flashtune
