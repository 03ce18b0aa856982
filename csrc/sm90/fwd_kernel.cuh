// FlashAttention-3-style forward for sm_90a, composed of its parts: the tile scheduler
// (tile_scheduler.cuh), the producer's TMA loads onto mbarrier rings (producer.cuh), the
// consumers' GEMMs by wgmma (mainloop.cuh) with the online softmax between them (softmax.cuh),
// and the epilogue (epilogue.cuh). One producer warpgroup (setmaxnreg.dec; one thread works) and
// 1-3 consumer warpgroups (setmaxnreg.inc), each owning 64 query rows of a tile. What a kernel's
// Schedule turns on, and what each step measured, is in kernel_traits.cuh and
// docs/design-sm90.md. This file is the schedule across a tile's positions: which part runs
// when, and how a deferred epilogue threads through the next tile. The same kernel reads a KV
// cache for decode's entry point (kernel_traits.cuh: KvCache; sm90/launch_kvcache.cuh).
#pragma once
#include <math.h>

#include "common/params.h"
#include "sm90/epilogue.cuh"
#include "sm90/kernel_traits.cuh"
#include "sm90/mainloop.cuh"
#include "sm90/producer.cuh"
#include "sm90/ptx_sm90.cuh"
#include "sm90/tile_scheduler.cuh"

namespace flashtune {
namespace sm90 {

// One consumer warpgroup's tiles, in the order the producer publishes them (the consumers never
// compute tile_at: its integer divisions would wait behind the other warpgroup's exps on the MUFU
// unit). Per tile: wait for its Q, then its blocks by the mainloop's positions, then its epilogue,
// now or (defer) under the next tile's S_0.
template <class T>
__device__ __forceinline__ void consume(const FwdParams& p, const TmaMaps& maps, const SmemTiles<T>& smem, int cw) {
  Pipeline<T>& pipe = Pipeline<T>::shared();
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane >> 2, t = lane & 3;
  const int row_in_tile = cw * 64 + 16 * warp + g;  // this thread's rows: +0 and +8
  Mainloop<T> ml{smem, cw};
  ml.softmax.row_in_tile = row_in_tile, ml.softmax.t = t;
  Epilogue<T> epi{p, maps, smem.o, cw, tid, row_in_tile};
  float scale = 0.f;  // the tile's softmax scale in the natural-log domain (for the LSE)
  // flat: the ring position of the pending tile's last P V while it is not yet issued (P in frag_p,
  // its rescale in alpha / rescale), else -1.
  int pending_pv = -1;
  auto start_tile_state = [&] {
    ml.zero_o();
    ml.softmax.start();
  };
  // The pending tile's last P V alone (flat, where no next S_0 goes with it: the CTA's last tile,
  // or a next one without blocks), then its epilogue.
  auto finish_pending = [&] {
    if (T::kFlatTiles && pending_pv >= 0) {
      ml.last_pv_alone(pending_pv);
      pending_pv = -1;
    }
    epi.flush(ml.acc_o);
  };

  ml.open_turns();
  for (int q_iter = 0;; ++q_iter) {
    const int q_buf = q_iter % T::kQBuffers;
    mbarrier_wait(&pipe.bar_q[q_buf], (q_iter / T::kQBuffers) & 1);
    // The producer's Tile, valid through this tile's epilogue (read where needed: registers are
    // what a consumer has least of).
    const int n_blocks = pipe.tile_info[q_iter % pipe.kTileSlots].n_blocks;
    if (n_blocks < 0) break;
    ml.q_base = smem_u32(smem.q + q_buf * T::kQBytes) + cw * 64 * T::kQKRowBytes;
    {
      const Tile<T>& tile = pipe.tile_info[q_iter % pipe.kTileSlots];
      ml.softmax.m_row0 = tile.m_block * T::kBlockM;
      ml.softmax.seqlen_k = tile.seqlen_k;
      ml.softmax.causal_shift = tile.seqlen_k - tile.seqlen_q;
      ml.softmax.scale_log2 = p.softmax_scale_log2, scale = p.softmax_scale;
      if constexpr (T::kCache) {
        ml.softmax.block0 = tile.block0;
        ml.softmax.set_positions(p.head_ratio);
      }
      if constexpr (T::kWindow) {
        ml.softmax.block0 = tile.block0;
        ml.softmax.window_left = p.window_left, ml.softmax.window_right = p.window_right;
      }
      if constexpr (T::kSoftcap) ml.softmax.softcap_in = p.softcap_in, ml.softmax.softcap_out = p.softcap_out;
      if (T::kFp8Qk) {  // S = (q . k) x q_descale x k_descale: folded into the softmax scale
        const int64_t at = int64_t(tile.batch) * p.descale_batch_stride + tile.kv_head;
        const float descale = p.q_descale[at] * p.k_descale[at];
        ml.softmax.scale_log2 *= descale;
        scale *= descale;
        if constexpr (T::kSoftcap)  // the cap is on the true scores: raw x descales x scale
          ml.softmax.softcap_in *= descale, ml.softmax.softcap_out /= descale;
      }
      if constexpr (T::kAlibi)  // the head's slope in raw-score units
        ml.softmax.alibi = scale > 0.f ? -p.alibi_slopes[tile.batch * p.alibi_batch_stride + tile.head] / scale : 0.f;
    }
    if (T::kDeferEpilogue && n_blocks == 0) finish_pending();
    if (!T::kDeferEpilogue || n_blocks == 0) start_tile_state();  // deferred: once the last tile's O is out

    if constexpr (!T::kOverlap) {
      ml.blocks_one_at_a_time(n_blocks);
      mbarrier_arrive(&pipe.q_empty[q_buf]);
    } else if (n_blocks == 0) {
      mbarrier_arrive(&pipe.q_empty[q_buf]);
    } else {
      const int first = ml.kv_iter % T::kStages;
      mbarrier_wait(&pipe.full_k[first], (ml.kv_iter / T::kStages) & 1);
      if (T::kFlatTiles && pending_pv >= 0) {
        // flat: the last tile's last P V goes in this turn after S_0 and runs under S_0's softmax;
        // then the last tile's O goes out. A path of its own from issue to wait_group<0> (ptxas
        // would otherwise see O in flight where the other path writes it, and wait).
        const int carry = pending_pv % T::kStages;
        mbarrier_wait(&pipe.full_v[carry], (pending_pv / T::kStages) & 1);
        ml.template issue<true, true, true>(first, carry);
        ml.softmax.start();  // O stays the last tile's until its P V is done
        wgmma_wait<1>();
        fence_operands(ml.acc_s);
        ml.release(&pipe.empty_k[first]);
        ml.rescale = ml.softmax.step(ml.acc_s, 0, ml.alpha);
        wgmma_wait<0>();
        fence_operands(ml.acc_o);
        fence_operands(ml.frag_p);
        ml.release(&pipe.empty_v[carry]);
        pending_pv = -1;
        ml.pack_p();
        epi.flush(ml.acc_o);  // the last tile's epilogue
        ml.zero_o();
      } else {
        ml.template issue<true, false, true>(first, 0);
        if constexpr (T::kFlatTiles) {  // nothing pending here (the CTA's first tile, or after one without blocks)
          start_tile_state();
        } else if constexpr (T::kDeferEpilogue) {  // the last tile's O goes out while S_0 runs
          epi.flush(ml.acc_o);
          start_tile_state();
        }
        ml.finish_s0(first);
      }
      ml.middle_blocks(n_blocks);
      mbarrier_arrive(&pipe.q_empty[q_buf]);  // every S of the tile is done: the next Q may load under the last P V
      if constexpr (T::kFlatTiles) {  // the last P V goes with the next tile's S_0 (or finish_pending)
        epi.defer(q_iter, ml.softmax.row_sum, ml.softmax.row_max, scale);
        pending_pv = ml.kv_iter + n_blocks - 1;
        ml.kv_iter += n_blocks;
        continue;
      }
      ml.last_pv_alone(ml.kv_iter + n_blocks - 1);
      if constexpr (T::kDeferEpilogue) {
        ml.settle_o();
        epi.defer(q_iter, ml.softmax.row_sum, ml.softmax.row_max, scale);  // written out under the next tile's S_0
      }
    }

    ml.kv_iter += n_blocks;
    if (epi.pending != q_iter) epi.store(q_iter, ml.acc_o, ml.softmax.row_sum, ml.softmax.row_max, scale);
    if constexpr (!T::kPersistent) break;  // a loop of one: nothing lives on to a next tile
  }
  if constexpr (T::kDeferEpilogue) finish_pending();
  ml.close_turns();
  epi.drain();
}

template <class T>
__device__ __forceinline__ void fwd_body(const FwdParams& p, const TmaMaps& maps) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const SmemTiles<T> smem(smem_raw);
  if constexpr (!T::kPersistent) {  // one tile per CTA, tile blockIdx.x: a CTA without rows leaves now
    Tile<T> tile;
    if (!tile_at<T>(p, blockIdx.x, tile)) return;
  }
  if (threadIdx.x == 0) Pipeline<T>::shared().init();
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x == 0) produce<T>(p, maps, smem);
    return;
  }
  setmaxnreg_inc<T::kConsumerRegs>();
  consume<T>(p, maps, smem, warpgroup - 1);
}

}  // namespace sm90
}  // namespace flashtune
