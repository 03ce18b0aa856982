// What the Hopper backward works on: tiles, each a key block of one (batch, query head) with the
// sequence's lengths and first rows and the query blocks that see its keys, and the order a CTA
// takes them in. Every thread computes them the same from the parameters; producer and consumers
// walk the same tiles and ranges.
#pragma once
#include "backward/params.h"

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

// The CTA's tiles in order, f(work, k) for the k-th with keys: a persistent grid (one CTA an SM,
// launch.cuh: without a causal mask or varlen) strides over them, so the next tile's Q, dO and
// statistics load under this one's last blocks and its K and V under its epilogue, instead of all
// behind a new CTA's start; otherwise a CTA per tile, a loop of one.
template <class T, class F>
__device__ __forceinline__ void for_each_tile(const BwdParams& bp, F&& f) {
  const int n_blocks = (bp.fwd.seqlen_k + T::kBlockN - 1) / T::kBlockN;
  const int tiles = n_blocks * bp.fwd.heads_q * bp.fwd.batch;  // launch.cuh checks it fits an int
  for (int tile = int(blockIdx.x), k = 0; tile < tiles; tile += int(gridDim.x)) {
    const Work<T> w(bp, tile, n_blocks);
    if (w.has_keys()) f(w, k++);  // varlen: a sequence shorter than this key block has none
  }
}

}  // namespace sm90_bwd
}  // namespace flashtune
