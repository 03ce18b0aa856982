// The consumer side of the mainloop: one warpgroup's GEMMs over a tile's K/V blocks, S_j = Q K_j^T
// and O += P_j V_j by wgmma, with the online softmax (softmax.cuh) between them. Owns O's and P's
// registers, the order in which the GEMMs are issued and waited for, and the pingpong turns.
// Barriers: waits on full_k / full_v (a block landed) and arrives on empty_k / empty_v (this
// thread is done with a slot: K_j once S_j is complete, V_j once P_j V_j is); pingpong turns are
// named barriers 1 + cw (warpgroup cw waits, cw - 1 arrives, 256 threads count); the speculative
// step's vote is named barrier 13 + cw.
//
// The overlap's schedule, FlashAttention-3's intra-warpgroup pipeline: S_j and P_(j-1) V_(j-1) are
// issued together in one turn (issue<>), the softmax of S_j runs while the P V still does, and O
// is rescaled by the softmax's alpha just before the next P V is issued, while S_(j+1) already
// runs: off the critical path. The tile's first block issues S_0 alone (with flat tiles, beside
// the last tile's final P V), its last P V goes alone after the loop (with flat tiles, into the
// next tile's first turn).
#pragma once
#include "common/convert.cuh"
#include "sm90/epilogue.cuh"
#include "sm90/kernel_traits.cuh"
#include "sm90/producer.cuh"
#include "sm90/ptx_sm90.cuh"
#include "sm90/softmax.cuh"
#include "sm90/wgmma.cuh"

namespace flashtune {
namespace sm90 {

template <class T>
struct Mainloop {
  using Elem = typename T::Elem;
  static constexpr int BN = T::kBlockN, DV = T::kHeadDimV;
  const SmemTiles<T>& smem;
  const int cw;  // this consumer warpgroup: query rows cw*64 .. cw*64+63 of the tile
  const uint32_t vote_barrier;  // the speculative step's named barrier, 13 + cw (see the constructor)
  uint32_t q_base = 0;  // this warpgroup's rows of the tile's Q buffer
  int kv_iter = 0;  // K/V blocks consumed since the CTA started: the rings' position
  float acc_s[T::kSRegs], acc_o[T::kORegs], alpha[2];
  // P as wgmma A fragments: k16 slice s of 16-bit P is accumulators 8s .. 8s+7; k32 slice s of
  // e4m3 P (FP8 P V) is accumulators 16s .. 16s+15 (pack_p)
  uint32_t frag_p[T::kPvSteps][4];
  bool rescale = false;  // the last softmax's answer: whether O needs alpha before the next P V
  OnlineSoftmax<T> softmax;

  // Not an aggregate: the registers above start undefined (aggregate initialisation would zero
  // them at the kernel's entry, 64 instructions before the first tile).
  // The vote's barrier id is made once and held: left to it, ptxas computed it again from the thread
  // index in every block, and spilled a register to make room for that.
  __device__ __forceinline__ Mainloop(const SmemTiles<T>& smem_, int cw_)
      : smem(smem_), cw(cw_), vote_barrier(opaque(13 + cw_)) {}

  static __device__ __forceinline__ Pipeline<T>& pipe() { return Pipeline<T>::shared(); }

  __device__ __forceinline__ uint32_t k_tile(int stage) const { return smem_u32(smem.k + stage * T::kKBytes); }
  __device__ __forceinline__ uint32_t v_tile(int stage) const { return smem_u32(smem.v + stage * T::kVBytes); }

  // S = Q K^T of the block in K slot k_base: k steps of 32 bytes along the head dim (k16 of
  // 16-bit, k32 of FP8), inside a panel's swizzled rows, then on to the next panel. Issued as one
  // group, not waited for.
  __device__ __forceinline__ void issue_qk(uint32_t k_base) {
    // K's descriptors from one (k_base is the stage's, uniform); Q's per warpgroup, in vector
    // registers, and ptxas keeps a tile's eight of them out of the loop.
    const uint64_t desc_k = kmajor_desc<T::kQKRowBytes>(k_base);
#pragma unroll
    for (int kk = 0; kk < T::kKSteps; ++kk) {
      constexpr int kStepsPerPanel = T::kQKRowBytes / 32;
      const uint32_t offset_q = (kk / kStepsPerPanel) * T::kPanelBytesQ + 32 * (kk % kStepsPerPanel);
      const uint32_t offset_k = (kk / kStepsPerPanel) * T::kPanelBytesK + 32 * (kk % kStepsPerPanel);
      Wgmma<typename T::QKElem, BN>::ss(acc_s, kmajor_desc<T::kQKRowBytes>(q_base + offset_q),
                                        desc_advance(desc_k, offset_k), kk > 0);
    }
    wgmma_commit();
  }
  // O += P V of the block in V slot v_base: 16-bit V is an MN-major operand (head dim contiguous),
  // panels kPanelBytesV apart, 16 keys (2048 B) a k step; FP8 V^T is K-major, 32 keys a k step
  // inside a panel's swizzled rows, then on to the next panel (as issue_qk walks the head dim).
  // One group, not waited for.
  __device__ __forceinline__ void issue_pv(uint32_t v_base) {
    if constexpr (T::kFp8Pv) {
      const uint64_t desc_v = kmajor_desc<T::kVtRowBytes>(v_base);
      constexpr int kStepsPerPanel = T::kVtRowBytes / 32;
#pragma unroll
      for (int s = 0; s < T::kPvSteps; ++s)
        Wgmma<__nv_fp8_e4m3, DV>::rs(acc_o, frag_p[s],
                                     desc_advance(desc_v, (s / kStepsPerPanel) * T::kPanelBytesV + 32 * (s % kStepsPerPanel)));
    } else {
      const uint64_t desc_v = mnmajor_sw128_desc(v_base, T::kPanelBytesV);
#pragma unroll
      for (int s = 0; s < T::kPvSteps; ++s) Wgmma<Elem, DV>::rs(acc_o, frag_p[s], desc_advance(desc_v, 2048 * s));
    }
    wgmma_commit();
  }
  // P's fragments from the softmax's exps, all packed before the next wgmma fence so ptxas need
  // not serialise the wgmmas (C7519). 16-bit: register e of slice s is row +8 (e & 1) at the
  // column pair of accumulator group 2s + e / 2, as S's. e4m3: register e holds four bytes of row
  // +8 (e & 1), from accumulator groups 4s + 2 (e / 2) and the one after (two columns each), so
  // the k32 fragment's slot 4t + i (+16) holds key 8 (i / 2) + 2t + i % 2 (+16) of the 32: the
  // order V^T's keys are laid out in (v_transpose.cuh), and no register crosses a thread.
  __device__ __forceinline__ void pack_p() {
#pragma unroll
    for (int s = 0; s < T::kPvSteps; ++s)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (T::kFp8Pv) {
          const int a = 16 * s + 8 * (e >> 1) + 2 * (e & 1);
          frag_p[s][e] = pack4_e4m3(acc_s[a], acc_s[a + 1], acc_s[a + 4], acc_s[a + 5]);
        } else {
          frag_p[s][e] = pack2<Elem>(acc_s[8 * s + 2 * e], acc_s[8 * s + 2 * e + 1]);
        }
      }
  }
  __device__ __forceinline__ void rescale_o() {
#pragma unroll
    for (int i = 0; i < T::kORegs; ++i) acc_o[i] *= alpha[(i >> 1) & 1];
  }
  __device__ __forceinline__ void zero_o() {
#pragma unroll
    for (int i = 0; i < T::kORegs; ++i) acc_o[i] = 0.f;
  }
  __device__ __forceinline__ void release(uint64_t* empty) { mbarrier_arrive(empty); }
  // defer: O is complete; a copy that ptxas sees (fence_operands emits nothing), so that reading it
  // under the next tile's S_0 is not a read of a wgmma's registers (C7517 would wait).
  __device__ __forceinline__ void settle_o() {
#pragma unroll
    for (int i = 0; i < T::kORegs; ++i) {
      float copy;
      asm volatile("mov.b32 %0, %1;" : "=f"(copy) : "f"(acc_o[i]));
      acc_o[i] = copy;
    }
  }

  // Pingpong: warpgroup cw issues its wgmmas after warpgroup cw-1 (cyclically) has issued its own.
  // Each warpgroup takes a turn per block it issues (every warpgroup of a CTA is on the same tile),
  // and the order runs on across tiles: warpgroup 0 starts its next tile's S as soon as the last
  // one has issued its last S, under that one's last P V and epilogue. The last warpgroup opens
  // once per CTA (open_turns), and warpgroup 0 takes the final hand-over at exit (close_turns), so
  // no arrive is left over.
  __device__ __forceinline__ void my_turn() {
    if constexpr (T::kPingpong) named_barrier_sync(1 + cw, 256);
  }
  __device__ __forceinline__ void end_turn() {
    if constexpr (T::kPingpong) named_barrier_arrive(1 + (cw + 1) % T::kConsumers, 256);
  }
  __device__ __forceinline__ void open_turns() {
    if (T::kPingpong && cw == T::kConsumers - 1) named_barrier_arrive(1, 256);  // the first warpgroup goes first
  }
  __device__ __forceinline__ void close_turns() {
    if (T::kPingpong && cw == 0) my_turn();  // the last hand-over (or the opening one, if no tile had a block)
  }

  // One issue of the pipeline, the step every position of a tile shares: S = Q K^T of the block in
  // K slot s_stage (kS), then O += P V of the one in V slot pv_stage (kPV: O first rescaled by the
  // last softmax's alpha, while S runs), in this warpgroup's pingpong turn (kTurn). Issued, not
  // waited for: the caller waits for what it needs next (wgmma groups complete in order).
  template <bool kS, bool kPV, bool kTurn>
  __device__ __forceinline__ void issue(int s_stage, int pv_stage) {
    if constexpr (kS) fence_operands(acc_s);
    if constexpr (kS && kPV) {
      fence_operands(acc_o);
      fence_operands(frag_p);
    }
    if constexpr (kS) {
      wgmma_fence();
      if constexpr (kTurn) my_turn();
      issue_qk(k_tile(s_stage));
    }
    if constexpr (kPV) {
      if (rescale) rescale_o();  // by S_(j-1)'s alpha: O holds up to P_(j-2) V_(j-2), complete
      fence_operands(acc_o);
      if constexpr (!kS) fence_operands(frag_p);
      wgmma_fence();  // O's registers changed since the last fence
      issue_pv(v_tile(pv_stage));
    }
    if constexpr (kTurn) end_turn();
  }

  // The first block's S_0 completes: its slot is released, its softmax starts the rows' maxima
  // (alpha is 0 here, and O still zero) and P_0 is packed.
  __device__ __forceinline__ void finish_s0(int first) {
    wgmma_wait<0>();
    fence_operands(acc_s);
    release(&pipe().empty_k[first]);
    rescale = softmax.step(acc_s, 0, alpha);
    pack_p();
  }

  // Blocks 1 .. n_blocks - 1 of the tile: S_j with P_(j-1) V_(j-1) in one turn, S_j's softmax while
  // the P V runs (spec_max: against the maxima as they stand, and S_j again from K_j, still held,
  // where that fails), then P_j packed over P_(j-1)'s registers.
  // spec_max speculates until the tile's first failed vote, then takes the full step: a trained
  // model's queries that find their key far above every earlier one (recall, retrieval heads) fail
  // it block after block, each failure a second QK^T GEMM with the P V waited for; random inputs
  // never fail it. The vote is the warpgroup's, so `speculate` is uniform across it.
  __device__ __forceinline__ void middle_blocks(int n_blocks) {
    bool speculate = true;
    for (int j = 1; j < n_blocks; ++j) {
      const int kv = kv_iter + j, stage = kv % T::kStages, prev = (kv - 1) % T::kStages;
      mbarrier_wait(&pipe().full_k[stage], (kv / T::kStages) & 1);
      mbarrier_wait(&pipe().full_v[prev], ((kv - 1) / T::kStages) & 1);
      issue<true, true, true>(stage, prev);
      wgmma_wait<1>();
      fence_operands(acc_s);
      if constexpr (T::kSpecMax) {
        bool full_step = true;
        if (speculate) {
          if (softmax.speculative(acc_s, j, vote_barrier)) {
            full_step = false;
          } else {  // a maximum moved (or worse): S_j again, the full step, and no more speculation
            speculate = false;
            fence_operands(acc_s);
            wgmma_fence();
            // K_j's slot address made anew: else the compiler keeps the turn's K descriptors (two
            // registers each, for this rare path) live through the speculative step, and spills
            issue_qk(opaque(k_tile(stage)));
            wgmma_wait<0>();  // and P_(j-1) V_(j-1) with it (groups complete in order)
            fence_operands(acc_s);
          }
        }
        rescale = full_step ? softmax.step(acc_s, j, alpha) : false;
        release(&pipe().empty_k[stage]);
      } else {
        release(&pipe().empty_k[stage]);  // S_j is done: K_j's slot may take K_(j+stages)
        rescale = softmax.step(acc_s, j, alpha);
      }
      wgmma_wait<0>();
      fence_operands(acc_o);
      fence_operands(frag_p);
      release(&pipe().empty_v[prev]);  // P_(j-1) V_(j-1) is done
      pack_p();
    }
  }

  // A KV-cache kernel's last block may hold cache rows past the sequence's end, never written:
  // their P is 0, but 0 x NaN is NaN, so they are zeroed before P V reads them (K's are masked in
  // S). The consumer warpgroups share the rows, and all of them wait at named barrier 8 before
  // either issues the P V. Whole 128-byte rows: the swizzle moves chunks only within a row.
  __device__ __forceinline__ void clear_rows_past_end(int stage, int key0) {
    const int valid = max(0, softmax.seqlen_k - key0);
    if (valid >= BN) return;  // the same for the whole CTA
    unsigned char* v = smem.v + stage * T::kVBytes;
    constexpr int kRowChunks = T::kVPanels * 8;  // 16-byte chunks of a row, over its panels
    for (int c = int(threadIdx.x) - 128; c < (BN - valid) * kRowChunks; c += 128 * T::kConsumers) {
      const int row = valid + c / kRowChunks, panel = (c % kRowChunks) / 8;
      *reinterpret_cast<uint4*>(v + panel * T::kPanelBytesV + row * 128 + (c % 8) * 16) = make_uint4(0, 0, 0, 0);
    }
    fence_proxy_async_smem();  // the zeros, seen by the wgmma's reads (the async proxy)
    named_barrier_sync(8, 128 * T::kConsumers);
  }

  // A tile's last P V (block kv of the rings) alone, by the last softmax's alpha, waited for.
  __device__ __forceinline__ void last_pv_alone(int kv) {
    const int stage = kv % T::kStages;
    mbarrier_wait(&pipe().full_v[stage], (kv / T::kStages) & 1);
    if constexpr (T::kCache) clear_rows_past_end(stage, (softmax.block0 + kv - kv_iter) * BN);
    issue<false, true, false>(0, stage);
    wgmma_wait<0>();
    fence_operands(acc_o);
    release(&pipe().empty_v[stage]);
  }

  // Without the overlap: one block at a time, S_j, its softmax, P_j V_j, each waited for.
  __device__ __forceinline__ void blocks_one_at_a_time(int n_blocks) {
    for (int j = 0; j < n_blocks; ++j) {
      const int stage = (kv_iter + j) % T::kStages, phase = ((kv_iter + j) / T::kStages) & 1;
      mbarrier_wait(&pipe().full_k[stage], phase);
      issue<true, false, false>(stage, 0);
      wgmma_wait<0>();
      fence_operands(acc_s);
      release(&pipe().empty_k[stage]);  // this thread is done with K_j
      rescale = softmax.step(acc_s, j, alpha);
      pack_p();
      mbarrier_wait(&pipe().full_v[stage], phase);
      issue<false, true, false>(0, stage);
      wgmma_wait<0>();
      fence_operands(acc_o);
      release(&pipe().empty_v[stage]);  // and with V_j
    }
  }
};

}  // namespace sm90
}  // namespace flashtune
