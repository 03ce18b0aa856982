// FlashAttention-3-style forward for sm_90a: TMA loads with 128B swizzle onto mbarrier rings
// (K and V each their own), one producer warpgroup (setmaxnreg.dec) and 1-3 consumer warpgroups
// (setmaxnreg.inc), S = Q K^T and O += P V by wgmma, online softmax on the accumulators.
// The schedule (kernel_traits.cuh, each step measured in docs/kernel-notes.md): the softmax of
// S_j overlaps P_(j-1) V_(j-1), consumer warpgroups take turns on the tensor cores (pingpong),
// a persistent grid loops each CTA over tiles, O is rescaled only when a row's maximum grew by
// more than 2^8 (lazy rescaling), and at hdim 64 and 128 a block's exps are taken against the
// maxima as they stand, S computed again in the rare block that moves one (speculative maxima);
// where an O tile fits, the TMA stores O; where a second Q tile
// fits too, a tile's epilogue runs under the next tile's S_0 (deferred), and in the causal kernels
// at hdim 64 its last P V goes with that S_0 (flat tiles).
#pragma once
#include <math.h>

#include "common/convert.cuh"
#include "common/params.h"
#include "common/row_lse.cuh"
#include "common/ptx_sm80.cuh"  // ldmatrix (Q_IN_REGS)
#include "sm90/kernel_traits.cuh"
#include "sm90/ptx_sm90.cuh"
#include "sm90/trace.cuh"
#include "sm90/wgmma.cuh"

namespace flashtune {
namespace sm90 {

// The tensor maps are 4-D (dim, rows, heads, batch); varlen tensors are one batch entry of
// total rows, and a sequence starts at row cu_seqlens[b].
struct TmaMaps {
  CUtensorMap q, k, v, o;  // o: used by the TMA-store epilogue only
};

// One work tile: BM query rows of one head of one sequence, and the K/V blocks they see.
struct Tile {
  int m_block, head, batch, kv_head;
  int seqlen_q, seqlen_k, q_row0, k_row0, tma_batch;
  int n_blocks;  // K/V blocks of BN keys this tile reads (0: every row is masked out)
  // SPLIT_TAIL: a piece of a tile reads blocks block0 .. block0 + n_blocks - 1; piece = 2 r + s for
  // a piece of the r-th split tile, whose partial result goes to slot 2 blockIdx.x + s; -1: whole.
  int block0, piece;
};

// The tile of m-block m_block of one head of one sequence. Returns false for an m-block past the
// sequence's end (varlen: a sequence shorter than the tile's first row); the fields are set anyway.
template <class T>
__device__ __forceinline__ bool tile_of(const FwdParams& p, int m_block, int head, int batch, Tile& tile) {
  tile.m_block = m_block;
  tile.head = head;
  tile.batch = batch;
  tile.kv_head = tile.head / p.head_ratio;
  tile.seqlen_q = p.seqlen_q, tile.seqlen_k = p.seqlen_k, tile.q_row0 = 0, tile.k_row0 = 0;
  tile.tma_batch = tile.batch;
  tile.block0 = 0, tile.piece = -1;
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
  return tile.m_block * T::kBlockM < tile.seqlen_q;
}

// Tile t of batch x heads x m-blocks, m-blocks fastest (the tiles of one head run side by side
// and share its K/V in L2), the heaviest causal rows first. Returns false for a varlen
// sequence shorter than the tile's first row (the tile has no rows).
template <class T>
__device__ __forceinline__ bool tile_at(const FwdParams& p, int t, Tile& tile) {
  const int num_m = (p.seqlen_q + T::kBlockM - 1) / T::kBlockM;
  return tile_of<T>(p, num_m - 1 - t % num_m, (t / num_m) % p.heads_q, t / num_m / p.heads_q, tile);
}

// CLUSTER: work item t is a pair of adjacent m-blocks (2 (t % pairs), + 1) of one head, and CTA
// `rank` of the cluster takes the one at 2 (t % pairs) + rank. Returns false, for both CTAs alike,
// where the pair's first m-block has no rows (varlen); a second one past the sequence's end is
// still run (its K/V blocks are the partner's) and writes nothing: its rows fail every row check,
// and the TMA store does not write outside the tensor.
template <class T>
__device__ __forceinline__ bool pair_tile_at(const FwdParams& p, int t, int rank, Tile& tile) {
  const int num_pairs = (p.seqlen_q + 2 * T::kBlockM - 1) / (2 * T::kBlockM);
  const int m_first = 2 * (t % num_pairs);
  tile_of<T>(p, m_first + rank, (t / num_pairs) % p.heads_q, t / num_pairs / p.heads_q, tile);
  return m_first * T::kBlockM < tile.seqlen_q;
}

// SPLIT_TAIL: the last p.split_tail tiles' K/V blocks ("units", tile by tile) are shared out over the
// grid's CTAs: CTA c takes units [tail_begin(c), tail_begin(c + 1)), so a tile may be cut between
// two or three CTAs (each range is at least one block; a tile is at least eight).
// 32-bit: the launcher splits only where ctas x (units + 1) < 2^31.
__device__ __forceinline__ int tail_begin(int c, int units, int ctas) { return c * units / ctas; }
// The CTA whose range holds unit u: the last c with tail_begin(c) <= u.
__device__ __forceinline__ int tail_cta_of(int u, int units, int ctas) { return ((u + 1) * ctas + units - 1) / units - 1; }

// Tiles per launch: m-blocks x heads x batch (CLUSTER: pairs of m-blocks).
template <class T>
__device__ __forceinline__ int num_tiles(const FwdParams& p) {
  return (p.seqlen_q + T::kCluster * T::kBlockM - 1) / (T::kCluster * T::kBlockM) * p.heads_q * p.batch;
}

// A CTA loops over tiles (persistent when the launcher's grid is smaller than the tile count;
// one tile per CTA otherwise). The producer picks each tile and publishes it (the whole Tile)
// in shared memory with the Q load; the consumers read it once Q has landed, and n_blocks = -1
// tells them to stop. The consumers never compute tile_at: its integer divisions wait behind
// the other warpgroup's exps on the MUFU unit (0.15 us of each of a tile's two lookups at hdim
// 64 on the H200, tools/tile_trace.py).
template <class T>
__device__ __forceinline__ void fwd_body(const FwdParams& p, const TmaMaps& maps) {
  using Elem = typename T::Elem;
  constexpr int BM = T::kBlockM, BN = T::kBlockN, D = T::kHeadDim;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* base =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* sQ = base;                            // kQBuffers tiles
  unsigned char* sK = sQ + T::kQBuffers * T::kQBytes;  // kStages tiles
  unsigned char* sV = sK + T::kStages * T::kKBytes;   // kStages tiles
  unsigned char* sO = sV + T::kStages * T::kVBytes;   // the TMA-store epilogue's O tile, if any
  // bar_q: Q (and the tile) landed; q_empty: the consumers are done with Q. K and V have
  // rings of their own: K_j is free once S_j is done, V_j only after P_j V_j, which the overlap
  // issues an iteration later; one shared slot would hold K back and leave no prefetch.
  // With 2 Q buffers (an experiment) the next tile's Q loads while this tile still uses its own.
  __shared__ __align__(8) uint64_t bar_q[T::kQBuffers], q_empty[T::kQBuffers];
  __shared__ __align__(8) uint64_t full_k[T::kStages], empty_k[T::kStages], full_v[T::kStages], empty_v[T::kStages];
  // Tile q_iter is published in slot q_iter % kTileSlots: the producer writes it once the Q buffer
  // is free, which is after every consumer has finished the epilogue of the tile kQBuffers + 1
  // before it (the last one that used the slot): one slot more than Q buffers. A deferred
  // epilogue runs in the next tile before that tile releases its Q, so the count holds.
  constexpr int kTileSlots = T::kQBuffers + 1;
  constexpr int kSlotReleases = T::kCluster > 1 ? T::kCluster * 4 * T::kConsumers : 128 * T::kConsumers;
  __shared__ Tile tile_info[kTileSlots];
  __shared__ float turn_zero, turn_sink[T::kThreads / 32];  // MUFU_TURN's fences (ptx_sm90.cuh)
  __shared__ int split_last[T::kConsumers];  // SPLIT_TAIL: whether this warpgroup's piece was its tile's last
  if constexpr (!T::kPersistent) {  // one tile per CTA, tile blockIdx.x: a CTA without rows leaves now
    Tile tile;
    if (!tile_at<T>(p, blockIdx.x, tile)) return;
  }

  if (threadIdx.x == 0) {
    for (int b = 0; b < T::kQBuffers; ++b) {
      mbarrier_init(&bar_q[b], 1);
      mbarrier_init(&q_empty[b], 128 * T::kConsumers);
    }
    for (int s = 0; s < T::kStages; ++s) {
      mbarrier_init(&full_k[s], 1);
      mbarrier_init(&full_v[s], 1);
      // Every consumer thread releases a slot; CLUSTER: one arrive per consumer warp of each CTA.
      mbarrier_init(&empty_k[s], kSlotReleases);
      mbarrier_init(&empty_v[s], kSlotReleases);
    }
    fence_barrier_init();
    turn_zero = 0.f;
  }
  if constexpr (T::kCluster > 1)
    cluster_sync();  // the partner's loads and releases land on these barriers
  else
    __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    // ---- Producer: one thread picks the tiles and issues every TMA load. The K/V rings run on
    // across tiles (kv_iter counts blocks since the CTA started); the next tile's Q and first
    // blocks load once the consumers have released Q (after the tile's last S), under its last
    // P V and epilogue; with 2 Q buffers (an experiment), as soon as the tile before released
    // its Q, so the next tile's first K/V blocks follow into the slots this tile frees.
    setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x == 0) {
      FT_TRACE_CLOCK(0);
      const int tiles = num_tiles<T>(p);
      // CLUSTER: the two CTAs walk the same pairs (cluster by cluster, by a fixed stride) and each
      // loads half of every K/V block's rows into both.
      const int rank = T::kCluster > 1 ? int(cluster_ctarank()) : 0;
      const int workers = T::kCluster > 1 ? int(cluster_count_x()) : int(gridDim.x);
      // From the counter when the launcher gave one (causal and varlen tiles differ in cost: the
      // next free CTA takes the next tile), else by a fixed stride.
      auto next_tile = [&](int t) {
        return p.tile_counter != nullptr ? workers + atomicAdd(p.tile_counter, 1) : t + workers;
      };
      auto find_tile = [&](int t, Tile& tile) {
        return T::kCluster > 1 ? pair_tile_at<T>(p, t, rank, tile) : tile_at<T>(p, t, tile);
      };
      auto load_kv = [&](unsigned char* dst, const CUtensorMap* map, uint64_t* bar, int col, int row, const Tile& at,
                         int row_bytes) {
        if constexpr (T::kCluster > 1)
          tma_load_4d_multicast(dst + rank * T::kKvBoxRows * row_bytes, map, bar, col, row + rank * T::kKvBoxRows,
                                at.kv_head, at.tma_batch, uint16_t((1u << T::kCluster) - 1));
        else
          tma_load_4d(dst, map, bar, col, row, at.kv_head, at.tma_batch);
      };
      // SPLIT_TAIL: tiles below `whole` by the fixed stride, then this CTA's units of the rest.
      const int split = T::kSplitTail ? p.split_tail : 0, whole = tiles - split;
      const int tile_blocks = (p.seqlen_k + BN - 1) / BN, units = split * tile_blocks;
      int unit = tail_begin(blockIdx.x, units, gridDim.x);
      const int unit_first = unit, unit_end = tail_begin(blockIdx.x + 1, units, gridDim.x);
      // The next piece of this CTA's units (false once they are done).
      auto next_piece = [&](Tile& tile) {
        if (unit >= unit_end) return false;
        const int r = unit / tile_blocks;
        tile_at<T>(p, whole + r, tile);
        tile.block0 = unit - r * tile_blocks;
        tile.n_blocks = min(tile_blocks - tile.block0, unit_end - unit);
        if (tile.n_blocks < tile_blocks) tile.piece = 2 * r + (unit == unit_first ? 0 : 1);
        unit += tile.n_blocks;
        return true;
      };
      int kv_iter = 0;
      int t = T::kCluster > 1 ? int(cluster_id_x()) : int(blockIdx.x);
      for (int q_iter = 0;; ++q_iter) {
        Tile tile;
        const int buf = q_iter % T::kQBuffers;  // Q buffer, used for the (q_iter / kQBuffers)-th time
        if constexpr (T::kPersistent) {
          bool have;
          if (T::kSplitTail && t >= whole) {
            have = next_piece(tile);
          } else {
            while (t < tiles && !find_tile(t, tile)) t = next_tile(t);  // varlen: no rows there
            have = t < tiles;
          }
          // free once the consumers released its last use (and with it this tile's slot)
          const int use = q_iter / T::kQBuffers;
          if (use > 0) mbarrier_wait(&q_empty[buf], (use - 1) & 1);
          if (!have) {
            tile_info[q_iter % kTileSlots].n_blocks = -1;
            mbarrier_arrive(&bar_q[buf]);  // no bytes: the consumers stop
            break;
          }
          FT_TRACE_VALUE(q_iter, kTraceTileIndex, t);
        } else {
          tile_at<T>(p, t, tile);  // valid: checked on entry
        }
        tile_info[q_iter % kTileSlots] = tile;
        mbarrier_arrive_expect_tx(&bar_q[buf], T::kQBytes);
        for (int c = 0; c < T::kQKPanels; ++c)
          tma_load_4d(sQ + buf * T::kQBytes + c * T::kPanelBytesQ, &maps.q, &bar_q[buf], T::kQKBoxCols * c,
                      tile.q_row0 + tile.m_block * BM, tile.head, tile.tma_batch);
        FT_TRACE(q_iter, kTraceQIssued);
        const Tile& cur = tile_info[q_iter % kTileSlots];  // read back: the producer has 40 registers or fewer
        for (int j = 0; j < cur.n_blocks; ++j, ++kv_iter) {
          const int stage = kv_iter % T::kStages, free_phase = ((kv_iter / T::kStages) & 1) ^ 1;
          const int row = cur.k_row0 + ((T::kSplitTail ? cur.block0 : 0) + j) * BN;
          unsigned char* k_tile = sK + stage * T::kKBytes;
          unsigned char* v_tile = sV + stage * T::kVBytes;
          if (kv_iter >= T::kStages) mbarrier_wait(&empty_k[stage], free_phase);
          mbarrier_arrive_expect_tx(&full_k[stage], T::kKBytes);
          for (int c = 0; c < T::kQKPanels; ++c)
            load_kv(k_tile + c * T::kPanelBytesK, &maps.k, &full_k[stage], T::kQKBoxCols * c, row, cur, T::kQKRowBytes);
          if (kv_iter >= T::kStages) mbarrier_wait(&empty_v[stage], free_phase);
          mbarrier_arrive_expect_tx(&full_v[stage], T::kVBytes);
          for (int c = 0; c < T::kVPanels; ++c)
            load_kv(v_tile + c * T::kPanelBytesV, &maps.v, &full_v[stage], 64 * c, row, cur, 128);
        }
        FT_TRACE(q_iter, kTraceKvIssued);
        if constexpr (!T::kPersistent) break;
        if (!T::kSplitTail || t < whole) t = next_tile(t);
      }
      if (T::kPersistent && p.tile_counter != nullptr) {
        // Leave the counter at 0 for the next launch on the stream (the launcher then needs no
        // memset): every CTA has taken its last tile once all have counted themselves done.
        __threadfence();
        if (atomicAdd(p.tile_counter + 1, 1) == int(gridDim.x) - 1) {
          atomicExch(p.tile_counter, 0);
          atomicExch(p.tile_counter + 1, 0);
        }
      }
      if constexpr (T::kCluster > 1) {
        // The partner's consumers release this CTA's slots from their SM: stay until every release
        // of the last blocks is in (the last use of each slot), so none lands after this CTA exits.
        for (int i = kv_iter; i < kv_iter + T::kStages; ++i)
          if (i >= T::kStages) {
            mbarrier_wait(&empty_k[i % T::kStages], ((i / T::kStages) & 1) ^ 1);
            mbarrier_wait(&empty_v[i % T::kStages], ((i / T::kStages) & 1) ^ 1);
          }
      }
      FT_TRACE_CLOCK(2);
    }
    return;
  }

  // ---- Consumers: warpgroup cw owns query rows cw*64 .. cw*64+63 of the tile.
  setmaxnreg_inc<T::kConsumerRegs>();
  const int cw = warpgroup - 1;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane >> 2, t = lane & 3;
  const int row_in_tile = cw * 64 + 16 * warp + g;  // this thread's rows: +0 and +8
  uint32_t q_base = 0;  // this warpgroup's rows of the tile's Q buffer
  // Per tile: where it is, its softmax scale (FP8 descales are per batch and kv head), O and
  // the running row maxima and sums. The steps below read them by reference.
  // Only what the softmax's masks need stays live through the main loop; the epilogue looks
  // the tile up again (registers are what a consumer has least of).
  int m_row0 = 0, seqlen_k = 0;
  int causal_shift = 0;  // bottom-right causal: key j visible to row i iff j <= i + shift
  float scale_log2 = 0.f, scale = 0.f;
  float acc_o[T::kORegs];
  float row_max[2], row_sum[2];
  uint32_t frag_q[T::kQInRegs ? T::kKSteps : 1][4];  // Q_IN_REGS: the tile's Q, this warpgroup's rows

  // S_j = Q K_j^T: k steps of 32 bytes along the head dim (k16 of 16-bit, k32 of FP8), inside
  // a panel's swizzled rows, then on to the next panel. Issued, not waited for.
  auto k_tile = [&](int stage) { return smem_u32(sK + stage * T::kKBytes); };
  auto v_tile = [&](int stage) { return smem_u32(sV + stage * T::kVBytes); };
  // This thread is done with a K or V slot. CLUSTER: the slot is filled in both CTAs by both
  // producers, so lane 0 of each warp (the warp is past its wgmma wait) tells both CTAs.
  auto release = [&](uint64_t* empty) {
    if constexpr (T::kCluster > 1) {
      if (lane == 0)
#pragma unroll
        for (int c = 0; c < T::kCluster; ++c) mbarrier_arrive_cluster(empty, c);
    } else {
      mbarrier_arrive(empty);
    }
  };
  // Keys [key0, key0 + N) of the block into acc (N / 2 accumulators a thread), not committed.
  auto issue_qk_keys = [&](auto n_keys, float* acc, uint32_t k_base, int key0, int k_steps = T::kKSteps) {
    constexpr int N = decltype(n_keys)::value;
    float(&acc_n)[N / 2] = *reinterpret_cast<float(*)[N / 2]>(acc);
    // K's descriptors from one (k_base is the stage's, uniform); Q's as before: per warpgroup, so in
    // vector registers, and ptxas keeps a tile's eight of them out of the loop.
    const uint64_t desc_k = kmajor_desc<T::kQKRowBytes>(k_base);
#pragma unroll
    for (int kk = 0; kk < T::kKSteps; ++kk) {
      if (k_steps > 0 ? kk >= k_steps : kk < -k_steps) continue;  // the first k_steps, or all but the first -k_steps
      constexpr int kStepsPerPanel = T::kQKRowBytes / 32;
      const uint32_t offset_q = (kk / kStepsPerPanel) * T::kPanelBytesQ + 32 * (kk % kStepsPerPanel);
      const uint32_t offset_k =
          (kk / kStepsPerPanel) * T::kPanelBytesK + key0 * T::kQKRowBytes + 32 * (kk % kStepsPerPanel);
      if constexpr (T::kQInRegs)
        Wgmma<Elem, N>::rs_kmajor(acc_n, frag_q[kk], desc_advance(desc_k, offset_k), kk > 0);
      else
        Wgmma<typename T::QKElem, N>::ss(acc_n, kmajor_desc<T::kQKRowBytes>(q_base + offset_q),
                                         desc_advance(desc_k, offset_k), kk > 0);
    }
  };
  // Q_IN_REGS: this warpgroup's 64 rows of Q as wgmma A fragments, one ldmatrix of four 8x8
  // matrices per k step of 16 columns (matrix m: rows +8 (m & 1), columns +8 (m >> 1); lane l
  // addresses row l % 8 of matrix l / 8), from the TMA's 128B-swizzled panels (16-byte chunk c of
  // a row r at c ^ (r % 8)).
  auto load_q_frags = [&](int q_buf) {
    const int m = lane / 8, row = cw * 64 + 16 * warp + 8 * (m & 1) + lane % 8;
    const uint32_t row_base = smem_u32(sQ + q_buf * T::kQBytes) + row * 128;
#pragma unroll
    for (int kk = 0; kk < T::kKSteps; ++kk) {
      const int chunk = 2 * (kk % 4) + (m >> 1);
      ldmatrix_x4(frag_q[kk], row_base + (kk / 4) * T::kPanelBytesQ + ((chunk ^ (row % 8)) * 16));
    }
  };
  // half (HALF_DIAGONAL): the block's first BN / 2 keys: a first k step over all BN keys, the others
  // over the first half (the second half's scores are partial sums, and masked: no row of this
  // warpgroup sees those keys). A path that left those accumulators to other instructions (C7515)
  // or split them in two (C7511) made ptxas serialise every wgmma; each arm opens its own wgmma
  // group (a branch between the fence and the wgmmas did too, C7520).
  auto issue_qk = [&](float (&acc_s)[T::kSRegs], uint32_t k_base, bool half = false) {
    if constexpr (T::kSplitS) {  // two groups: wait_group can release the first half alone
      issue_qk_keys(std::integral_constant<int, BN / 2>{}, acc_s, k_base, 0);
      wgmma_commit();
      issue_qk_keys(std::integral_constant<int, BN / 2>{}, acc_s + T::kSRegs / 2, k_base, BN / 2);
    } else if (T::kHalfDiagonal && half) {
      wgmma_fence();
      issue_qk_keys(std::integral_constant<int, BN>{}, acc_s, k_base, 0, 1);
      issue_qk_keys(std::integral_constant<int, T::kHalfDiagonal ? BN / 2 : BN>{}, acc_s, k_base, 0, -1);
      wgmma_commit();
      return;
    } else {
      if (T::kHalfDiagonal) wgmma_fence();
      issue_qk_keys(std::integral_constant<int, BN>{}, acc_s, k_base, 0);
    }
    wgmma_commit();
  };
  // The accumulators of half h of S (SPLIT_S), for fencing it alone while the other is in flight.
  auto s_half = [&](float (&acc_s)[T::kSRegs], int h) -> float(&)[T::kSRegs / 2] {
    return *reinterpret_cast<float(*)[T::kSRegs / 2]>(acc_s + h * (T::kSRegs / 2));
  };
  // O += P V_j: V is an MN-major operand (head dim contiguous), panels kPanelBytesV apart.
  // half (HALF_DIAGONAL): the k steps of the block's first BN / 2 keys (P is 0 past them).
  auto issue_pv = [&](const uint32_t (&frag_p)[BN / 16][4], uint32_t v_base, bool half = false) {
    const uint64_t desc_v = mnmajor_sw128_desc(v_base, T::kPanelBytesV);
    if (T::kHalfDiagonal && half) {
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < T::kHalfPvSteps; ++s) Wgmma<Elem, D>::rs(acc_o, frag_p[s], desc_advance(desc_v, 2048 * s));
      wgmma_commit();
      return;
    } else {
      if (T::kHalfDiagonal) wgmma_fence();
#pragma unroll
      for (int s = 0; s < BN / 16; ++s) Wgmma<Elem, D>::rs(acc_o, frag_p[s], desc_advance(desc_v, 2048 * s));
    }
    wgmma_commit();
  };
  // HALF_DIAGONAL: whether block j, the last of a tile of n_blocks, is half a block for this
  // warpgroup (its last row sees at most the block's first BN / 2 keys).
  auto half_block = [&](int j, int n_blocks) -> bool {
    if constexpr (!T::kHalfDiagonal) {
      return false;
    } else {
      const int wg_keys = min(seqlen_k, m_row0 + cw * 64 + 63 + causal_shift + 1);
      return j == n_blocks - 1 && wg_keys - j * BN <= BN / 2;
    }
  };
  // MUFU_TURN: consumer warpgroups take turns on the exps, as on the tensor cores (PINGPONG): the
  // MUFU unit of an SM sub-partition serves the warps of every warpgroup, and at hdim 64 a block's
  // exps take it as long as the block's GEMMs take the tensor cores. Named barrier 7 + cw: cw
  // waits, cw-1 (cyclically) arrives; the order runs on across blocks and tiles like the GEMMs'.
  // The exps' offsets come back through the barrier and the arrive follows a store of the row
  // sums (ptxas would move the exps across plain barriers, ptx_sm90.cuh).
  auto mufu_turn_wait = [&](float (&m_scaled)[2]) {
    if constexpr (T::kMufuTurn) {
      const float zero = named_barrier_sync_fenced(7 + cw, 256, smem_u32(&turn_zero));
      m_scaled[0] += zero, m_scaled[1] += zero;
    }
  };
  auto mufu_turn_pass = [&](float sums) {
    if constexpr (T::kMufuTurn)
      named_barrier_arrive_fenced(7 + (cw + 1) % T::kConsumers, 256, smem_u32(&turn_sink[threadIdx.x / 32]), sums, lane == 0);
  };
  // The masks of block j's accumulators [i0, i1): -inf where a row does not see the key. Returns
  // how many columns from the first on some row of this warp sees (the same for the warp) and
  // whether the block needed masks at all.
  auto mask_scores = [&](float (&acc_s)[T::kSRegs], int j, int i0, int i1, bool& masked) -> int {
    const int key0 = j * BN + 2 * i0, keys = 2 * (i1 - i0);
    const bool tail = key0 + keys > seqlen_k;
    const bool diagonal = T::kCausal && key0 + keys - 1 > m_row0 + causal_shift;
    masked = tail || diagonal;
    int live = keys;
    if (masked) {
      // Per row, how many of the columns from this thread's first one on are visible (keys
      // below seqlen_k and, causal, at most row + shift); accumulator i sits at the constant
      // offset 8 ((i - i0) / 4) + i % 2 from it: one compare and one select per element.
      int visible[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = m_row0 + row_in_tile + 8 * r;
        visible[r] = (T::kCausal ? min(seqlen_k, row + causal_shift + 1) : seqlen_k) - (key0 + 2 * t);
      }
#pragma unroll
      for (int i = i0; i < i1; ++i)
        if (8 * ((i - i0) >> 2) + (i & 1) >= visible[(i >> 1) & 1]) acc_s[i] = -INFINITY;
      const int warp_last_row = m_row0 + row_in_tile - g + 15;  // its keys bound every row's of the warp
      live = (T::kCausal ? min(seqlen_k, warp_last_row + causal_shift + 1) : seqlen_k) - key0;
    }
    return live;
  };
  // Masks (the tail block and, for causal, blocks that cross the diagonal), then the online
  // softmax on the accumulators: P in place of S, new row maxima and sums, and alpha, the
  // factor O must be rescaled by. Accumulator i belongs to row +8*((i>>1)&1); a row lives in
  // one quad. Returns whether O needs the rescale (the same for the whole warp); with lazy
  // rescaling, false while every row of the warp keeps its maximum (alpha = 1).
  // Accumulators [i0, i1) (multiples of 4: columns 2 i0 .. 2 i1 of the block; constants once
  // inlined) are one online-softmax step: the whole block, or one half of it with SPLIT_S.
  auto softmax_step = [&](float (&acc_s)[T::kSRegs], int j, int i0, int i1, float (&alpha)[2]) -> bool {
    bool masked;
    const int live = mask_scores(acc_s, j, i0, i1, masked);
    bool moved = false;
    float m_scaled[2];  // each row's maximum, scaled: the exps' offset
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = row_max[r];
      if constexpr (T::kTreeMax) {  // 4 independent chains, then 2 steps to join them
        float chain[4] = {m, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
        for (int i = i0; i < i1; ++i) {
          const int c = (i & 1) + 2 * ((i >> 3) & 1);
          if (((i >> 1) & 1) == r) chain[c] = fmaxf(chain[c], acc_s[i]);
        }
        m = fmaxf(fmaxf(chain[0], chain[1]), fmaxf(chain[2], chain[3]));
      } else {
#pragma unroll
        for (int i = i0; i < i1; ++i)
          if (((i >> 1) & 1) == r) m = fmaxf(m, acc_s[i]);
      }
      m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 2));
      // Lazy: keep the old maximum unless this one is more than 2^kRescaleLog2 above it (from
      // -inf it always moves; -inf to -inf gives NaN, which keeps it). The quad agrees.
      if (T::kLazyRescale && !((m - row_max[r]) * scale_log2 > T::kRescaleLog2)) m = row_max[r];
      m_scaled[r] = m == -INFINITY ? 0.f : m * scale_log2;  // no (-inf) - (-inf)
      alpha[r] = T::kLazyRescale && m == row_max[r] ? 1.f : fast_exp2(row_max[r] * scale_log2 - m_scaled[r]);
      moved |= m != row_max[r];
      row_max[r] = m;
    }
    // MUFU_TURN: the exps (the MUFU unit's share of the block) in this warpgroup's turn.
    mufu_turn_wait(m_scaled);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = 0.f;
      // SKIP_MASKED (masked blocks only, a second copy of the loop): an 8-key group that no row
      // of the warp sees is P = 0 without its exps, behind a branch the whole warp takes alike.
      auto exp_scores = [&](auto skip_masked) {
#pragma unroll
        for (int i = i0; i < i1; ++i)
          if (((i >> 1) & 1) == r) {
            if (decltype(skip_masked)::value && 8 * ((i - i0) >> 2) >= live) {
              acc_s[i] = 0.f;
              continue;
            }
            const float x = fmaf(acc_s[i], scale_log2, -m_scaled[r]);
            acc_s[i] = i % 8 < T::kPolyExp2Of8 ? poly_exp2(x) : fast_exp2(x);
            sum += acc_s[i];
          }
      };
      if (T::kSkipMasked && masked)
        exp_scores(std::true_type{});
      else
        exp_scores(std::false_type{});
      row_sum[r] = row_sum[r] * alpha[r] + sum;
    }
    mufu_turn_pass(row_sum[0] + row_sum[1]);
    return !T::kLazyRescale || __any_sync(0xffffffff, moved);
  };
  auto softmax = [&](float (&acc_s)[T::kSRegs], int j, float (&alpha)[2]) -> bool {
    return softmax_step(acc_s, j, 0, T::kSRegs, alpha);
  };
  // SPEC_MAX: block j's exps against the rows' maxima as they stand (no block maximum). They stand
  // (true) if every thread's sum of a row's exps is at most 2^kRescaleLog2 throughout the
  // warpgroup: then every P is within lazy rescaling's bound and no maximum moves (alpha = 1).
  // Overflow and NaN fail the test, and so does a row without a maximum yet that sees a key (none
  // can from block 1 on: every row that sees a key sees key 0). The caller then computes S_j again
  // for the full step, which is a wgmma: the vote is the warpgroup's (named barrier 13 + cw).
  auto softmax_speculative = [&](float (&acc_s)[T::kSRegs], int j) -> bool {
    bool masked;
    mask_scores(acc_s, j, 0, T::kSRegs, masked);
    float sums[2];
    bool small = true;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const bool no_max = row_max[r] == -INFINITY;
      const float m_scaled = no_max ? 0.f : row_max[r] * scale_log2;  // no (-inf) - (-inf)
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < T::kSRegs; ++i)
        if (((i >> 1) & 1) == r) {
          const float x = fmaf(acc_s[i], scale_log2, -m_scaled);
          acc_s[i] = i % 8 < T::kPolyExp2Of8 ? poly_exp2(x) : fast_exp2(x);
          sum += acc_s[i];
        }
      small &= sum <= float(1 << int(T::kRescaleLog2)) && (!no_max || sum == 0.f);
      sums[r] = sum;
    }
    if (named_barrier_any(13 + cw, 128, !small)) return false;
    row_sum[0] += sums[0], row_sum[1] += sums[1];
    return true;
  };
  // SPLIT_S: the second half's step, after the first half's (which set alpha). If it moved a
  // row's maximum, the first half's P (exps against the old maximum) takes its alpha too, and O
  // the product of both.
  auto softmax_second_half = [&](float (&acc_s)[T::kSRegs], int j, float (&alpha)[2]) -> bool {
    float alpha_hi[2];
    const bool moved = softmax_step(acc_s, j, T::kSRegs / 2, T::kSRegs, alpha_hi);
    if (moved) {
#pragma unroll
      for (int i = 0; i < T::kSRegs / 2; ++i) acc_s[i] *= alpha_hi[(i >> 1) & 1];
      alpha[0] *= alpha_hi[0], alpha[1] *= alpha_hi[1];
    }
    return moved;
  };
  // P as register A fragments (k slice s = accumulators 8s..8s+7), all packed before the next
  // wgmma fence so ptxas need not serialise the wgmmas (C7519).
  auto pack_p = [&](const float (&acc_s)[T::kSRegs], uint32_t (&frag_p)[BN / 16][4]) {
#pragma unroll
    for (int s = 0; s < BN / 16; ++s)
#pragma unroll
      for (int e = 0; e < 4; ++e) frag_p[s][e] = pack2<Elem>(acc_s[8 * s + 2 * e], acc_s[8 * s + 2 * e + 1]);
  };
  auto rescale_o = [&](const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < T::kORegs; ++i) acc_o[i] *= alpha[(i >> 1) & 1];
  };

  // Pingpong turns: warpgroup cw issues its wgmmas after warpgroup cw-1 (cyclically) has
  // issued its own. Named barrier 1 + cw: cw waits, cw-1 arrives; 256 threads count. Each
  // warpgroup takes n_blocks turns per tile (every warpgroup of a CTA is on the same tile), and
  // the order runs on across tiles: warpgroup 0 starts its next tile's S as soon as the last
  // one has issued its last S, under that one's last P V and epilogue. The last warpgroup opens
  // once per CTA, and warpgroup 0 takes the final hand-over at exit, so no arrive is left over.
  auto turn_to = [&](int next) { named_barrier_arrive(1 + next, 256); };
  auto my_turn = [&] {
    if constexpr (T::kPingpong) named_barrier_sync(1 + cw, 256);
  };
  auto end_turn = [&] {
    if constexpr (T::kPingpong) turn_to((cw + 1) % T::kConsumers);
  };
  if (T::kPingpong && cw == T::kConsumers - 1) turn_to(0);  // the first warpgroup goes first
  if (T::kMufuTurn && cw == T::kConsumers - 1) named_barrier_arrive(7, 256);  // and takes the first exps

  // tools/tile_trace.py's timeline (empty unless FLASHTUNE_SM90_TRACE): step `step` of tile `it`.
  auto mark = [&](int it, int step) {
    if (tid == 0) FT_TRACE(it, kTraceConsumer0 + kTraceConsumerSteps * cw + step);
  };

  // SPLIT_TAIL: the end of a piece of a tile. The warpgroup writes its partial result (O not yet
  // normalised, its rows' maxima, each thread's row sums; slot-major, then float i of every thread
  // side by side) and counts itself in on the tile's counter; the tile's last piece to finish
  // merges every piece's result (true: it stores the tile), the others are done (false).
  auto merge_pieces = [&](int piece, float (&sum)[2], float (&mx)[2], float lse_scale) -> bool {
    const int r = piece >> 1;
    const int tile_blocks = (p.seqlen_k + BN - 1) / BN, units = p.split_tail * tile_blocks;
    auto slot = [&](int at) {
      return p.split_ws + (int64_t(at) * T::kConsumers + cw) * (T::kPartialFloats * 128) + tid;
    };
    float* mine = slot(2 * blockIdx.x + (piece & 1));
#pragma unroll
    for (int i = 0; i < T::kORegs; ++i) mine[i * 128] = acc_o[i];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      mine[(T::kORegs + rr) * 128] = mx[rr];
      mine[(T::kORegs + 2 + rr) * 128] = sum[rr];
    }
    __threadfence();  // the partial result is out before the count says so
    named_barrier_sync(10 + cw, 128);
    const int c0 = tail_cta_of(r * tile_blocks, units, gridDim.x);
    const int c1 = tail_cta_of((r + 1) * tile_blocks - 1, units, gridDim.x);
    if (tid == 0) {
      int* counter = p.split_counters + r * T::kConsumers + cw;
      const bool last = atomicAdd(counter, 1) == c1 - c0;
      if (last) atomicExch(counter, 0);  // every piece has counted: 0 again for the next launch
      __threadfence();
      split_last[cw] = last;
    }
    named_barrier_sync(10 + cw, 128);
    if (!split_last[cw]) return false;
    // Every piece, this one's too, from the scratch in the tile's order: the same sums in the same
    // order whichever piece finished last, so a call's result does not depend on the timing.
    const float to_log2 = lse_scale * float(M_LOG2E);  // maxima are raw scores
    // Nothing yet: the first piece's factors are 0 for O (finite, so O x 0 is a zero) and 1 for it.
    mx[0] = mx[1] = -INFINITY;
    sum[0] = sum[1] = 0.f;
    for (int c = c0; c <= c1; ++c) {
      // CTA c's piece of this tile is its first if its range starts inside the tile, else its last.
      const float* other = slot(2 * c + (tail_begin(c, units, gridDim.x) >= r * tile_blocks ? 0 : 1));
      float f_mine[2], f_other[2];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const float m_other = __ldcg(other + (T::kORegs + rr) * 128);
        const float sum_other = __ldcg(other + (T::kORegs + 2 + rr) * 128);
        const float m = fmaxf(mx[rr], m_other);
        f_mine[rr] = mx[rr] == -INFINITY ? 0.f : fast_exp2((mx[rr] - m) * to_log2);
        f_other[rr] = m_other == -INFINITY ? 0.f : fast_exp2((m_other - m) * to_log2);
        sum[rr] = sum[rr] * f_mine[rr] + sum_other * f_other[rr];
        mx[rr] = m;
      }
#pragma unroll
      for (int i = 0; i < T::kORegs; ++i)
        acc_o[i] = acc_o[i] * f_mine[(i >> 1) & 1] + __ldcg(other + i * 128) * f_other[(i >> 1) & 1];
    }
    return true;
  };

  // ---- Epilogue of tile q_done: normalise O by the row sums, write it (rows past seqlen_q are
  // not) and, if asked, the LSE (row maxima mx, softmax scale lse_scale).
  auto epilogue = [&](int q_done, const float (&sum_in)[2], const float (&mx_in)[2], float lse_scale) {
    const Tile& tile = tile_info[q_done % kTileSlots];
    float sum[2] = {sum_in[0], sum_in[1]}, mx[2] = {mx_in[0], mx_in[1]};
    // Rows below rows_end are stored: none for a piece of a split tile that is not its last (it
    // runs the rest with its stores off: returning here made ptxas spill the main loop's values).
    int rows_end = tile.seqlen_q;
    if constexpr (T::kSplitTail)
      if (tile.piece >= 0 && !merge_pieces(tile.piece, sum, mx, lse_scale)) rows_end = 0;
    const int m0 = tile.m_block * BM;
    const bool varlen = p.cu_seqlens_q != nullptr;
    Elem* out = static_cast<Elem*>(p.o) +
                (varlen ? int64_t(tile.q_row0) * p.o_row_stride : int64_t(tile.batch) * p.o_batch_stride) +
                int64_t(tile.head) * p.o_head_stride;
    const int64_t lse_off = varlen ? tile.q_row0 : int64_t(tile.batch) * p.lse_batch_stride;
    const bool tma_store = T::kTmaStore && !varlen && !kTraceSkipO;
    if (tma_store) {  // this warpgroup's last store must have read sO before it is written again
      if (tid == 0) bulk_wait_group_read0();
      named_barrier_sync(4 + cw, 128);
    }
    mark(q_done, kTraceEpilogueReady);
    float inv_of[2];  // per row, for the stmatrix stores after the loop
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = sum[r];
      l += __shfl_xor_sync(0xffffffff, l, 1);
      l += __shfl_xor_sync(0xffffffff, l, 2);
      // A row that saw no key: O = 0, LSE = +inf. l >= 1 otherwise (its maximum's own term), so
      // the approximate reciprocal is within 2 ulp and has no slow path to branch around.
      const float inv = l > 0.f ? __fdividef(1.f, l) : 0.f;
      inv_of[r] = inv;
      const int row = m0 + row_in_tile + 8 * r;
      if (tma_store && !T::kStmatrix) {  // into sO's 128B-swizzled panels: 16-byte chunk c ^ (row % 8) of each 128-byte row
        const uint32_t row_base = smem_u32(sO) + (row_in_tile + 8 * r) * 128;
#pragma unroll
        for (int c = 0; c < D / 8; ++c)
          st_shared_u32(row_base + (c / 8) * T::kPanelBytesO + (((c % 8) ^ (g % 8)) * 16) + 4 * t,
                        pack2<Elem>(acc_o[4 * c + 2 * r] * inv, acc_o[4 * c + 2 * r + 1] * inv));
      }
      Elem* out_row = out + int64_t(row) * p.o_row_stride;
      if (!tma_store && T::kStoreBytes == 16 && !kTraceSkipO) {
        // Chunks 4k..4k+3 (8 columns each, a quad holds each as one 32-bit pair per thread): a 4 x 4
        // transpose within the quad in two shuffle rounds, after which thread t holds chunk 4k+t
        // whole and stores it as 16 bytes: a warp's store covers 8 rows x 64 contiguous bytes.
#pragma unroll
        for (int k = 0; k < D / 32; ++k) {
          uint32_t x[4];
#pragma unroll
          for (int i = 0; i < 4; ++i)
            x[i] = pack2<Elem>(acc_o[4 * (4 * k + i) + 2 * r] * inv, acc_o[4 * (4 * k + i) + 2 * r + 1] * inv);
          const bool hi = t & 2, odd = t & 1;
          // Round 1 (lanes t, t^2 swap halves): lanes 0-1 hold chunks 0-1 of both, lanes 2-3 chunks 2-3.
          uint32_t r0 = __shfl_xor_sync(0xffffffff, hi ? x[0] : x[2], 2);
          uint32_t r1 = __shfl_xor_sync(0xffffffff, hi ? x[1] : x[3], 2);
          if (hi) x[0] = r0, x[1] = r1; else x[2] = r0, x[3] = r1;
          // Round 2 (lanes t, t^1): each keeps its own chunk; x[j] is then lane j's pair of it.
          r0 = __shfl_xor_sync(0xffffffff, odd ? x[0] : x[1], 1);
          r1 = __shfl_xor_sync(0xffffffff, odd ? x[2] : x[3], 1);
          if (odd) x[0] = r0, x[2] = r1; else x[1] = r0, x[3] = r1;
          if (row < rows_end)
            *reinterpret_cast<uint4*>(out_row + 8 * (4 * k + t)) = make_uint4(x[0], x[1], x[2], x[3]);
        }
      }
      if (!tma_store && T::kStoreBytes == 8 && !kTraceSkipO) {
        // Chunks c, c+1 (8 columns each): the even thread of a pair takes the odd one's columns
        // of chunk c, the odd thread the even one's of chunk c+1; each stores 4 columns. Every
        // lane shuffles (a quad shares its row, the warp does not), so the row check follows.
        const bool odd = t & 1;
#pragma unroll
        for (int c = 0; c < D / 8; c += 2) {
          const uint32_t a = pack2<Elem>(acc_o[4 * c + 2 * r] * inv, acc_o[4 * c + 2 * r + 1] * inv);
          const uint32_t b = pack2<Elem>(acc_o[4 * c + 4 + 2 * r] * inv, acc_o[4 * c + 4 + 2 * r + 1] * inv);
          const uint32_t got = __shfl_xor_sync(0xffffffff, odd ? a : b, 1);
          if (row < rows_end)
            *reinterpret_cast<uint2*>(out_row + 8 * (c + odd) + 2 * (t & ~1)) =
                odd ? make_uint2(got, b) : make_uint2(a, got);
        }
      }
      if (row >= rows_end) continue;
      if (!tma_store && T::kStoreBytes == 4 && !kTraceSkipO) {
#pragma unroll
        for (int c = 0; c < D / 8; ++c)  // accumulators 4c + 2r, 4c + 2r + 1: columns 8c + 2t, +1
          *reinterpret_cast<uint32_t*>(out_row + 8 * c + 2 * t) =
              pack2<Elem>(acc_o[4 * c + 2 * r] * inv, acc_o[4 * c + 2 * r + 1] * inv);
      }
      if (p.lse != nullptr && t == 0)
        p.lse[lse_off + int64_t(tile.head) * p.lse_head_stride + row] = row_lse(mx[r], lse_scale, l);
    }
    if (tma_store && T::kStmatrix) {
      // Chunks c and c+1 of both rows as four 8x8 matrices per stmatrix (matrix m: row +8 (m & 1),
      // chunk c + (m >> 1)); lane l addresses row l % 8 of matrix l / 8, in the same swizzle.
      const int m = lane / 8, rows_of_m = row_in_tile - g + lane % 8 + 8 * (m & 1);
#pragma unroll
      for (int c = 0; c < D / 8; c += 2) {
        const int chunk = c + (m >> 1);
        stmatrix_x4(smem_u32(sO) + (chunk / 8) * T::kPanelBytesO + rows_of_m * 128 + (((chunk % 8) ^ (lane % 8)) * 16),
                    pack2<Elem>(acc_o[4 * c] * inv_of[0], acc_o[4 * c + 1] * inv_of[0]),
                    pack2<Elem>(acc_o[4 * c + 2] * inv_of[1], acc_o[4 * c + 3] * inv_of[1]),
                    pack2<Elem>(acc_o[4 * c + 4] * inv_of[0], acc_o[4 * c + 5] * inv_of[0]),
                    pack2<Elem>(acc_o[4 * c + 6] * inv_of[1], acc_o[4 * c + 7] * inv_of[1]));
      }
    }
    mark(q_done, kTraceOWritten);
    if (tma_store) {  // every thread's O is in sO: one thread stores the warpgroup's 64 rows
      fence_proxy_async_smem();
      named_barrier_sync(4 + cw, 128);
      if (tid == 0 && rows_end > 0) {
#pragma unroll
        for (int c = 0; c < D / 64; ++c)
          tma_store_4d(&maps.o, sO + c * T::kPanelBytesO + cw * 64 * 128, 64 * c, m0 + cw * 64, tile.head,
                       tile.batch);
        bulk_commit_group();
      }
    }
    mark(q_done, kTraceStored);
  };

  float acc_s[T::kSRegs], alpha[2];
  uint32_t frag_p[BN / 16][4];
  bool rescale = false;  // softmax's answer: whether O needs alpha before the next P V
  int kv_iter = 0;  // K/V blocks consumed since the CTA started: the ring's position
  // DEFER_EPILOGUE: a tile's epilogue runs in the next tile, once that tile's S_0 is issued (or
  // after the loop). What it needs meanwhile: O (complete: a wgmma still in flight across the
  // loop's back edge makes ptxas serialise every wgmma, C7514/C7518), the row sums and maxima,
  // and the softmax scale (FP8 descales are per tile).
  int pending = -1;  // the tile whose epilogue waits, or -1
  float pending_sum[2], pending_max[2], pending_scale = 0.f;
  // FLAT_TILES: the K/V block (ring position) of the pending tile's last P V while it is not yet
  // issued (P in frag_p, its rescale in alpha / rescale), else -1.
  int pending_pv = -1;
  bool pending_half = false;  // and whether it is half a block (HALF_DIAGONAL)
  auto zero_o = [&] {
#pragma unroll
    for (int i = 0; i < T::kORegs; ++i) acc_o[i] = 0.f;
  };
  auto start_rows = [&] {
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;
  };
  auto start_tile_state = [&] {
    zero_o();
    start_rows();
  };
  // Tile q_done's epilogue waits (for the next tile's S_0): what it needs besides O.
  auto defer_epilogue = [&](int q_done) {
    pending = q_done;
    pending_sum[0] = row_sum[0], pending_sum[1] = row_sum[1];
    pending_max[0] = row_max[0], pending_max[1] = row_max[1];
    pending_scale = scale;
  };
  auto flush_pending = [&] {
    if (pending >= 0) epilogue(pending, pending_sum, pending_max, pending_scale);
    pending = -1;
  };
  // A tile's last P V (block kv of the ring) alone, by the last softmax's alpha, waited for.
  auto last_pv_alone = [&](int kv, bool half) {
    const int stage = kv % T::kStages;
    mbarrier_wait(&full_v[stage], (kv / T::kStages) & 1);
    if (rescale) rescale_o(alpha);
    fence_operands(acc_o);
    fence_operands(frag_p);
    wgmma_fence();
    issue_pv(frag_p, v_tile(stage), half);
    wgmma_wait<0>();
    fence_operands(acc_o);
    release(&empty_v[stage]);
  };
  // FLAT_TILES: the pending tile's last P V alone (no next S_0 to go with: the CTA's last tile, or
  // a next one without blocks), then its epilogue.
  auto finish_pending = [&] {
    if (T::kFlatTiles && pending_pv >= 0) {
      last_pv_alone(pending_pv, pending_half);
      mark(pending, kTraceLastPvDone);
      pending_pv = -1;
    }
    flush_pending();
  };

  // S_AHEAD: a tile's blocks with S one block ahead: S_(j+1) is issued with P_(j-1) V_(j-1), before
  // the softmax of S_j, so it runs under that softmax instead of after it (S_j in acc_s for even j,
  // acc_t for odd). Groups complete in order: a turn issues P_(j-1) V_(j-1), then S_(j+1); the
  // softmax waits for S_j (issued a turn before) and P_(j-1) V_(j-1), with S_(j+1) pending: P's
  // registers are then free, and two S, P and O would not fit the consumer's 232 (C7512).
  // S_(j+1) is in flight across the loop's back edge: the loop is unrolled by two so that
  // the buffers never swap registers, and the last block, which issues no S, is a copy of its own,
  // as is the first turn of a 1-block tile (a branch around an S issue made ptxas serialise the
  // wgmmas, C7515 / C7520). The rest (FLAT_TILES' carried P V, SPEC_MAX) as in the plain loop.
  float acc_t[T::kSAhead ? T::kSRegs : 1];
  auto s_ahead_blocks = [&](int q_iter, int n_blocks) {
    if constexpr (T::kSAhead) {
      const int first = kv_iter % T::kStages, second = (kv_iter + 1) % T::kStages;
      mbarrier_wait(&full_k[first], (kv_iter / T::kStages) & 1);
      mark(q_iter, kTraceK0Landed);
      // The tile's first turn: S_0, the last tile's P V if FLAT_TILES carries one, S_1 if there is a
      // block 1; then the softmax of S_0. Four straight paths, each from its issue to its waits.
      auto first_turn = [&](auto carry_c, auto ahead_c) {
        constexpr bool kCarry = decltype(carry_c)::value, kAhead = decltype(ahead_c)::value;
        const int carry_stage = kCarry ? pending_pv % T::kStages : 0;
        if constexpr (kCarry) mbarrier_wait(&full_v[carry_stage], (pending_pv / T::kStages) & 1);
        if constexpr (kAhead) mbarrier_wait(&full_k[second], ((kv_iter + 1) / T::kStages) & 1);
        fence_operands(acc_s);
        fence_operands(acc_t);
        fence_operands(acc_o);
        fence_operands(frag_p);
        wgmma_fence();
        my_turn();
        issue_qk(acc_s, k_tile(first));
        if constexpr (kCarry) {
          if (rescale) rescale_o(alpha);  // the last tile's alpha
          fence_operands(acc_o);
          wgmma_fence();
          issue_pv(frag_p, v_tile(carry_stage));
        }
        if constexpr (kAhead) {
          wgmma_fence();
          issue_qk(acc_t, k_tile(second));
        }
        end_turn();
        mark(q_iter, kTraceTurn);
        if constexpr (kCarry) {
          start_rows();  // O stays the last tile's until its P V is done
        } else if constexpr (T::kFlatTiles) {  // nothing pending here
          start_tile_state();
        } else if constexpr (T::kDeferEpilogue) {  // the last tile's O goes out while S_0 runs
          flush_pending();
          start_tile_state();
        }
        wgmma_wait<int(kAhead)>();  // S_0 and the carried P V: S_1 alone runs under the softmax
        fence_operands(acc_s);
        fence_operands(acc_o);
        fence_operands(frag_p);
        mark(q_iter, kTraceS0Done);
        release(&empty_k[first]);
        if constexpr (kCarry) {
          release(&empty_v[carry_stage]);
          mark(pending, kTraceLastPvDone);
          pending_pv = -1;
        }
        rescale = softmax(acc_s, 0, alpha);
        pack_p(acc_s, frag_p);
        if constexpr (kCarry) {
          flush_pending();  // the last tile's epilogue
          zero_o();
        }
      };
      // Block j (>= 1): S_j in cur, issued a turn before; this turn issues P_(j-1) V_(j-1) and, unless
      // j is the last block, S_(j+1) into next.
      auto block = [&](int j, float (&cur)[T::kSRegs], float (&next)[T::kSRegs], auto issue_next_c) {
        constexpr bool kNext = decltype(issue_next_c)::value;
        const int stage = (kv_iter + j) % T::kStages, prev = (kv_iter + j - 1) % T::kStages;
        const int ahead = (kv_iter + j + 1) % T::kStages;
        mbarrier_wait(&full_v[prev], ((kv_iter + j - 1) / T::kStages) & 1);
        if constexpr (kNext) mbarrier_wait(&full_k[ahead], ((kv_iter + j + 1) / T::kStages) & 1);
        if (rescale) rescale_o(alpha);  // by S_(j-1)'s alpha: O holds up to P_(j-2) V_(j-2), complete
        fence_operands(acc_o);
        fence_operands(frag_p);
        if constexpr (kNext) fence_operands(next);
        wgmma_fence();
        my_turn();
        issue_pv(frag_p, v_tile(prev));
        if constexpr (kNext) {
          wgmma_fence();
          issue_qk(next, k_tile(ahead));
        }
        end_turn();
        wgmma_wait<kNext ? 1 : 0>();  // S_j and P_(j-1) V_(j-1): P's registers are free for P_j
        fence_operands(cur);
        fence_operands(acc_o);
        fence_operands(frag_p);
        release(&empty_v[prev]);
        if (T::kSpecMax && softmax_speculative(cur, j)) {
          rescale = false;
        } else {
          if constexpr (T::kSpecMax) {  // a maximum moved (or worse): S_j again from K_j, still held
            fence_operands(cur);
            wgmma_fence();
            issue_qk(cur, k_tile(stage));
            wgmma_wait<0>();  // and the rest with it
            fence_operands(cur);
            if constexpr (kNext) fence_operands(next);
          }
          rescale = softmax(cur, j, alpha);
        }
        release(&empty_k[stage]);
        pack_p(cur, frag_p);
      };
      const bool carry = T::kFlatTiles && pending_pv >= 0;
      if (n_blocks == 1) {
        if (carry) first_turn(std::true_type{}, std::false_type{});
        else first_turn(std::false_type{}, std::false_type{});
        return;
      }
      if (carry) first_turn(std::true_type{}, std::true_type{});
      else first_turn(std::false_type{}, std::true_type{});
      for (int j = 1;; j += 2) {  // S_j in flight in acc_t at the top
        if (j == n_blocks - 1) {
          block(j, acc_t, acc_s, std::false_type{});
          break;
        }
        block(j, acc_t, acc_s, std::true_type{});
        if (j + 1 == n_blocks - 1) {
          block(j + 1, acc_s, acc_t, std::false_type{});
          break;
        }
        block(j + 1, acc_s, acc_t, std::true_type{});
      }
    }
  };

  for (int q_iter = 0;; ++q_iter) {
    const int q_buf = q_iter % T::kQBuffers;
    mbarrier_wait(&bar_q[q_buf], (q_iter / T::kQBuffers) & 1);
    mark(q_iter, kTraceQLanded);
    // The producer's Tile, valid through this tile's epilogue (read where needed: registers are
    // what a consumer has least of).
    const int n_blocks = tile_info[q_iter % kTileSlots].n_blocks;
    if (n_blocks < 0) break;
    q_base = smem_u32(sQ + q_buf * T::kQBytes) + cw * 64 * T::kQKRowBytes;
    {
      const Tile& tile = tile_info[q_iter % kTileSlots];
      m_row0 = tile.m_block * BM;
      // Keys count from the tile's first block (SPLIT_TAIL's pieces start past 0): block j's masks.
      const int piece_key0 = T::kSplitTail ? tile.block0 * BN : 0;
      seqlen_k = tile.seqlen_k - piece_key0;
      causal_shift = tile.seqlen_k - tile.seqlen_q - piece_key0;
      scale_log2 = p.softmax_scale_log2, scale = p.softmax_scale;
      if (T::kFp8Qk) {  // S = (q . k) x q_descale x k_descale: folded into the softmax scale
        const int64_t at = int64_t(tile.batch) * p.descale_batch_stride + tile.kv_head;
        const float descale = p.q_descale[at] * p.k_descale[at];
        scale_log2 *= descale;
        scale *= descale;
      }
    }
    if constexpr (T::kQInRegs) {
      load_q_frags(q_buf);
      fence_operands(frag_q);
    }
    if (T::kDeferEpilogue && n_blocks == 0) finish_pending();
    if (!T::kDeferEpilogue || n_blocks == 0) start_tile_state();  // deferred: once the last tile's O is out

    if constexpr (!T::kOverlap) {
      // One block at a time: S_j, softmax, P_j V_j, each waited for.
      for (int j = 0; j < n_blocks; ++j) {
        const int stage = (kv_iter + j) % T::kStages;
        const int phase = ((kv_iter + j) / T::kStages) & 1;
        mbarrier_wait(&full_k[stage], phase);
        const uint32_t k_base = k_tile(stage), v_base = v_tile(stage);
        fence_operands(acc_s);
        wgmma_fence();
        issue_qk(acc_s, k_base);
        wgmma_wait<0>();
        fence_operands(acc_s);
        release(&empty_k[stage]);  // this thread is done with K_j
        if (softmax(acc_s, j, alpha)) rescale_o(alpha);
        pack_p(acc_s, frag_p);
        mbarrier_wait(&full_v[stage], phase);
        fence_operands(acc_o);
        fence_operands(frag_p);
        wgmma_fence();
        issue_pv(frag_p, v_base);
        wgmma_wait<0>();
        fence_operands(acc_o);
        release(&empty_v[stage]);  // and with V_j
      }
      mbarrier_arrive(&q_empty[q_buf]);
    } else if (n_blocks == 0) {
      mbarrier_arrive(&q_empty[q_buf]);
    } else {
      // FA3's intra-warpgroup overlap: S_j = Q K_j^T and O += P_(j-1) V_(j-1) are in flight
      // together, and the softmax of S_j runs while the second one still does. Groups complete
      // in order, so wait_group<1> means S_j is done; P_(j-1)'s registers stay pinned (fenced)
      // until wait_group<0>, when P_j is packed over them. O is rescaled by the softmax's alpha
      // just before the next P V is issued, while S_(j+1) already runs: off the critical path.
      if constexpr (T::kSAhead) {
        s_ahead_blocks(q_iter, n_blocks);
      } else {
        const int first = kv_iter % T::kStages;
        mbarrier_wait(&full_k[first], (kv_iter / T::kStages) & 1);
        mark(q_iter, kTraceK0Landed);
        if (T::kFlatTiles && pending_pv >= 0) {
          // FLAT_TILES: the last tile's last P V goes in this turn after S_0 and runs under S_0's
          // softmax; then the last tile's O goes out. A path of its own from issue to wait_group<0>
          // (ptxas would otherwise see O in flight where the other path writes it, and wait).
          const int carry_stage = pending_pv % T::kStages;
          mbarrier_wait(&full_v[carry_stage], (pending_pv / T::kStages) & 1);
          fence_operands(acc_s);
          fence_operands(acc_o);
          fence_operands(frag_p);
          wgmma_fence();
          my_turn();
          issue_qk(acc_s, k_tile(first), half_block(0, n_blocks));
          if (rescale) rescale_o(alpha);  // the last tile's alpha
          fence_operands(acc_o);
          wgmma_fence();
          issue_pv(frag_p, v_tile(carry_stage), pending_half);
          end_turn();
          mark(q_iter, kTraceTurn);
          start_rows();  // O stays the last tile's until its P V is done
          wgmma_wait<1>();
          fence_operands(acc_s);
          mark(q_iter, kTraceS0Done);
          release(&empty_k[first]);
          rescale = softmax(acc_s, 0, alpha);
          wgmma_wait<0>();
          fence_operands(acc_o);
          fence_operands(frag_p);
          release(&empty_v[carry_stage]);
          mark(pending, kTraceLastPvDone);
          pending_pv = -1;
          pack_p(acc_s, frag_p);
          flush_pending();  // the last tile's epilogue
          zero_o();
        } else {
          fence_operands(acc_s);
          wgmma_fence();
          my_turn();
          issue_qk(acc_s, k_tile(first), half_block(0, n_blocks));
          end_turn();
          mark(q_iter, kTraceTurn);
          if constexpr (T::kFlatTiles) {  // nothing pending here (the CTA's first tile, or after one without blocks)
            start_tile_state();
          } else if constexpr (T::kDeferEpilogue) {  // the last tile's O goes out while S_0 runs
            flush_pending();
            start_tile_state();
          }
          if constexpr (T::kSplitS) {  // the first half's softmax while the second half runs
            wgmma_wait<1>();
            fence_operands(s_half(acc_s, 0));
            rescale = softmax_step(acc_s, 0, 0, T::kSRegs / 2, alpha);
            wgmma_wait<0>();
            fence_operands(s_half(acc_s, 1));
            mark(q_iter, kTraceS0Done);
            release(&empty_k[first]);
            rescale |= softmax_second_half(acc_s, 0, alpha);
          } else {
            wgmma_wait<0>();
            fence_operands(acc_s);
            mark(q_iter, kTraceS0Done);
            release(&empty_k[first]);
            rescale = softmax(acc_s, 0, alpha);  // alpha is 0 here, and O still zero
          }
          pack_p(acc_s, frag_p);
        }
        // SPEC_MAX: in every tile, or (SPEC_MIN_BLOCKS, an experiment) in causal ones and non-causal
        // ones of at least kSpecMinBlocksNonCausal blocks.
        const bool speculate = T::kCausal || T::kSpecMinBlocksNonCausal == 0 || n_blocks >= T::kSpecMinBlocksNonCausal;
        for (int j = 1; j < n_blocks; ++j) {
          const int stage = (kv_iter + j) % T::kStages, prev = (kv_iter + j - 1) % T::kStages;
          mbarrier_wait(&full_k[stage], ((kv_iter + j) / T::kStages) & 1);
          mbarrier_wait(&full_v[prev], ((kv_iter + j - 1) / T::kStages) & 1);
          fence_operands(acc_s);
          fence_operands(acc_o);
          fence_operands(frag_p);
          wgmma_fence();
          my_turn();
          issue_qk(acc_s, k_tile(stage), half_block(j, n_blocks));
          if (rescale) rescale_o(alpha);  // by S_(j-1)'s alpha: O holds up to P_(j-2) V_(j-2), complete
          fence_operands(acc_o);
          wgmma_fence();  // O's registers changed since the last fence
          issue_pv(frag_p, v_tile(prev));
          end_turn();
          if constexpr (T::kSplitS) {  // groups: S_j's halves, then P V; each half's softmax once it is in
            wgmma_wait<2>();
            fence_operands(s_half(acc_s, 0));
            rescale = softmax_step(acc_s, j, 0, T::kSRegs / 2, alpha);
            wgmma_wait<1>();
            fence_operands(s_half(acc_s, 1));
            release(&empty_k[stage]);
            rescale |= softmax_second_half(acc_s, j, alpha);
          } else if constexpr (T::kSpecMax) {
            wgmma_wait<1>();
            fence_operands(acc_s);
            if (!speculate) release(&empty_k[stage]);
            if (speculate && softmax_speculative(acc_s, j)) {
              rescale = false;
            } else {
              if (speculate) {  // a maximum moved (or worse): S_j again from K_j, still held, and the full step
                fence_operands(acc_s);
                wgmma_fence();
                issue_qk(acc_s, k_tile(stage));
                wgmma_wait<0>();  // and P_(j-1) V_(j-1) with it
                fence_operands(acc_s);
              }
              rescale = softmax(acc_s, j, alpha);
            }
            if (speculate) release(&empty_k[stage]);
          } else {
            wgmma_wait<1>();
            fence_operands(acc_s);
            release(&empty_k[stage]);  // S_j is done: K_j's slot may take K_(j+stages)
            rescale = softmax(acc_s, j, alpha);
          }
          wgmma_wait<0>();
          fence_operands(acc_o);
          fence_operands(frag_p);
          release(&empty_v[prev]);  // P_(j-1) V_(j-1) is done
          pack_p(acc_s, frag_p);
        }
      }
      mbarrier_arrive(&q_empty[q_buf]);  // every S of the tile is done: the next Q may load under the last P V
      if constexpr (T::kFlatTiles) {  // the last P V goes with the next tile's S_0 (or finish_pending)
        defer_epilogue(q_iter);
        pending_pv = kv_iter + n_blocks - 1;
        pending_half = half_block(n_blocks - 1, n_blocks);
        kv_iter += n_blocks;
        continue;
      }
      last_pv_alone(kv_iter + n_blocks - 1, half_block(n_blocks - 1, n_blocks));
      mark(q_iter, kTraceLastPvDone);
      if constexpr (T::kDeferEpilogue) {
        // O is complete: a copy that ptxas sees (fence_operands emits nothing), so that reading
        // it under the next tile's S_0 is not a read of a wgmma's registers (C7517 would wait).
#pragma unroll
        for (int i = 0; i < T::kORegs; ++i) {
          float copy;
          asm volatile("mov.b32 %0, %1;" : "=f"(copy) : "f"(acc_o[i]));
          acc_o[i] = copy;
        }
        defer_epilogue(q_iter);  // written out under the next tile's S_0
      }
    }

    kv_iter += n_blocks;
    if (pending != q_iter) epilogue(q_iter, row_sum, row_max, scale);
    if constexpr (!T::kPersistent) break;  // a loop of one: nothing lives on to a next tile
  }
  if constexpr (T::kDeferEpilogue) finish_pending();
  if (T::kPingpong && cw == 0) my_turn();  // the last hand-over (or the opening one, if no tile had a block)
  if (T::kMufuTurn && cw == 0) named_barrier_sync(7, 256);  // the same for the exps' turns
  if (T::kTmaStore && tid == 0) bulk_wait_group_read0();  // sO stays valid until the TMA has read it
}

}  // namespace sm90
}  // namespace flashtune
