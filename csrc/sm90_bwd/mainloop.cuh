// One consumer warpgroup of the Hopper backward: its 64 keys' GEMMs over every query block that
// sees them. The forward kept only O and the LSE; per query block (FlashAttention-2's algorithm,
// with keys as the rows of every accumulator, as FlashAttention-3 does on Hopper):
//   S^T  = K Q^T, dP^T = V dO^T          issued together, A and B from shared memory (K-major),
//                                         right after the block's LSE is read
//   P^T  = exp2(scale_log2 S^T - LSE)     while dP^T runs
//   dV  += P^T dO                         P^T's accumulators are the A fragments (registers)
//   dS^T = P^T (dP^T - rowsum(dO O))
//   dQ   = dS K                           one 64 x 64 piece per warpgroup from dS^T in shared memory
//                                         (both MN-major); added to the fp32 sum in global memory
//                                         while the next GEMM runs:
//   dK  += dS^T Q                         dS^T's accumulators as the A fragments
// (dQ's piece going out under dK's GEMM, the statistics by LDS, and descriptors built
// once were 1.08x at hdim 128 on an H100, docs/design.md.)
// Barriers: per tile waits on bar_kv, on full per block, and arrives on kv_empty once its last GEMM
// (the last to read K and V) is complete; arrives on empty when its reads of a slot are done; the
// consumers meet at named barrier kDsBarrier (256 threads) once both halves of dS^T are in shared
// memory; a warpgroup waits on kDqEmptyBarrier + cw before it writes its dQ staging tile (the
// producer's dQ warp saw its last reduces read it) and arrives on kDqFullBarrier + cw after, which
// that warp waits on before the reduces (producer.cuh, write_dq). dS^T has two buffers:
// a warpgroup writes block m+1's only after passing block m's barrier, which the other passed
// only after its dQ of block m-1 (the same buffer) was complete.
#pragma once
#include "common/convert.cuh"
#include "sm90/ptx_sm90.cuh"
#include "sm90/wgmma.cuh"
#include "sm90_bwd/kernel_traits.cuh"
#include "sm90_bwd/producer.cuh"
#include "sm90_bwd/work.cuh"

namespace flashtune {
namespace sm90_bwd {

using namespace sm90;

template <class T>
struct Mainloop {
  using Elem = typename T::Elem;
  static constexpr int BM = T::kBlockM, D = T::kHeadDim;

  const SmemTiles<T>& smem;
  const int cw, warp, g, t, lane;
  int it = 0;  // query blocks done over the CTA's tiles: the ring's slot and phase, dS^T's buffer
  float acc_s[T::kSRegs], acc_dp[T::kSRegs];
  float acc_dk[T::kDRegs], acc_dv[T::kDRegs], acc_dq[T::kDqRegs];
  uint32_t frag_p[T::kMSteps][4], frag_ds[T::kMSteps][4];
  // The query block's statistics at this thread's accumulator columns 8 j + 2 t (+1): the LSE (log2
  // units) and rowsum(dO O), read from the slot into registers ahead of their use.
  float2 lse[T::kSRegs / 4], dsum[T::kSRegs / 4];

  __device__ __forceinline__ Mainloop(const SmemTiles<T>& smem_, int cw_, int tid)
      : smem(smem_), cw(cw_), warp(tid / 32), g((tid % 32) >> 2), t(tid & 3), lane(tid % 32) {}

  // This warpgroup's 64 rows of a K or V tile as the K-major A operand; a query block's Q or dO as
  // the K-major B operand of S^T / dP^T. Built once; each k step is one add (desc_advance).
  __device__ __forceinline__ uint64_t key_rows_desc(const unsigned char* tile) const {
    return kmajor_desc<128>(smem_u32(tile) + cw * 64 * 128);
  }
  __device__ __forceinline__ static uint64_t query_rows_desc(const unsigned char* tile) {
    return kmajor_desc<128>(smem_u32(tile));
  }

  // acc (64 keys x BM queries) = rows of `a` (K or V) times the query block's `b` (Q or dO) transposed:
  // k step kk is 32 B into 64-column panel kk / 4 of each.
  __device__ __forceinline__ void issue_keys_by_queries(float (&acc)[T::kSRegs], uint64_t a, uint64_t b) {
#pragma unroll
    for (int kk = 0; kk < T::kKSteps; ++kk)
      Wgmma<Elem, BM>::ss(acc, desc_advance(a, (kk / 4) * T::kPanelBytesK + 32 * (kk % 4)),
                          desc_advance(b, (kk / 4) * T::kPanelBytesQ + 32 * (kk % 4)), kk > 0);
    wgmma_commit();
  }
  // acc (64 keys x D) += frag (64 keys x BM queries, A fragments) times `b` (Q or dO: MN-major B).
  __device__ __forceinline__ void issue_frag_by_rows(float (&acc)[T::kDRegs], const uint32_t (&frag)[T::kMSteps][4],
                                                     const unsigned char* b) {
    const uint64_t desc = mnmajor_sw128_desc(smem_u32(b), T::kPanelBytesQ);
#pragma unroll
    for (int s = 0; s < T::kMSteps; ++s) Wgmma<Elem, D>::rs(acc, frag[s], desc_advance(desc, 2048 * s));
    wgmma_commit();
  }
  // dQ's piece of this warpgroup: query panel qp, head-dim panel dp; dS^T's panel qp (keys x 64
  // queries) as the MN-major A operand, K's panel dp (keys x 64 dims) as the MN-major B.
  __device__ __forceinline__ void issue_dq(const unsigned char* ds) {
    const uint64_t desc_a = mnmajor_sw128_desc(smem_u32(ds) + T::dq_query_panel(cw) * T::kPanelBytesDs, T::kPanelBytesDs);
    const uint64_t desc_b = mnmajor_sw128_desc(smem_u32(smem.k()) + T::dq_dim_panel(cw) * T::kPanelBytesK, T::kPanelBytesK);
#pragma unroll
    for (int s = 0; s < T::kBlockN / 16; ++s)
      Wgmma<Elem, 64>::ss_mn(acc_dq, desc_advance(desc_a, 2048 * s), desc_advance(desc_b, 2048 * s), s > 0);
    wgmma_commit();
  }

  // Registers a wgmma overwrites (its first k step does not accumulate) hold no value the compiler
  // must keep: the wrappers' "+f" operands would otherwise keep the last block's S^T, dP^T and dQ
  // live through this one's GEMMs.
  template <int N>
  __device__ __forceinline__ static void forget(float (&acc)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "=f"(acc[i]));
  }

  // Accumulator i of a 64 x N wgmma: row 16 warp + g + 8 ((i >> 1) & 1), column 8 (i / 4) + 2 t + (i & 1).
  __device__ __forceinline__ int acc_row(int i) const { return 16 * warp + g + 8 * ((i >> 1) & 1); }
  __device__ __forceinline__ int acc_col(int i) const { return 8 * (i / 4) + 2 * t + (i & 1); }

  // A slot's statistics into registers: LDS.64 pairs, columns 8 j + 2 t and +1.
  __device__ __forceinline__ void load_stats(float2 (&to)[T::kSRegs / 4], const float* from) const {
#pragma unroll
    for (int j = 0; j < T::kSRegs / 4; ++j) to[j] = ld_shared_f32x2(smem_u32(from + 8 * j + 2 * t));
  }
  // The statistic of accumulator i's column.
  __device__ __forceinline__ static float at_col(const float2 (&stat)[T::kSRegs / 4], int i) {
    return i & 1 ? stat[i / 4].y : stat[i / 4].x;
  }

  // P^T from S^T: exp2(scale_log2 S - LSE of the query), 0 where masked (kMask: keys past the end,
  // or causal keys a query does not see; a block without either skips the compares).
  template <bool kMask>
  __device__ __forceinline__ void softmax_p(const Work<T>& w, float scale_log2, int q0) {
    const int key_base = w.key0() + cw * 64;
#pragma unroll
    for (int i = 0; i < T::kSRegs; ++i) {
      const float p = fast_exp2(fmaf(acc_s[i], scale_log2, -at_col(lse, i)));
      if (kMask) {
        const int key = key_base + acc_row(i), query = q0 + acc_col(i);
        const bool hidden = key >= w.seqlen_k || (T::kCausal && key > query + w.causal_shift());
        acc_s[i] = hidden ? 0.f : p;
      } else {
        acc_s[i] = p;
      }
    }
  }
  // dS^T = P^T (dP^T - rowsum(dO O)) into acc_dp. With 128 queries a step (hdim 64) P is read back
  // from its 16-bit fragments: S^T's 64 fp32 registers would otherwise stay live beside dP^T's, and
  // spill; P is rounded to 16 bits for dV anyway.
  __device__ __forceinline__ void softmax_ds() {
#pragma unroll
    for (int i = 0; i < T::kSRegs; ++i) {
      const float p = T::kDsFromPackedP ? unpack_half<Elem>(frag_p[i / 8][(i % 8) / 2], i & 1) : acc_s[i];
      acc_dp[i] = p * (acc_dp[i] - at_col(dsum, i));
    }
  }
  // Accumulators as wgmma A fragments: k slice s is accumulators 8s .. 8s+7 (two n8 column groups).
  __device__ __forceinline__ static void pack(uint32_t (&frag)[T::kMSteps][4], const float (&acc)[T::kSRegs]) {
#pragma unroll
    for (int s = 0; s < T::kMSteps; ++s)
#pragma unroll
      for (int e = 0; e < 4; ++e) frag[s][e] = pack2<Elem>(acc[8 * s + 2 * e], acc[8 * s + 2 * e + 1]);
  }
  // dS^T into shared memory, [keys][queries] in 64-query panels of 128B-swizzled rows (16-byte
  // chunk c of row r at c ^ (r % 8)): fragment s is four 8 x 8 matrices (m: keys +8 (m & 1),
  // queries 16 s + 8 (m >> 1)); lane l gives row l % 8 of matrix l / 8.
  __device__ __forceinline__ void store_ds(unsigned char* ds) const {
    const int m = lane / 8, key = cw * 64 + 16 * warp + 8 * (m & 1) + lane % 8;
#pragma unroll
    for (int s = 0; s < T::kMSteps; ++s) {
      const int query = 16 * s + 8 * (m >> 1);
      const uint32_t addr = smem_u32(ds) + (query / 64) * T::kPanelBytesDs + key * 128 +
                            ((((query % 64) / 8) ^ (key % 8)) * 16);
      stmatrix_x4(addr, frag_ds[s][0], frag_ds[s][1], frag_ds[s][2], frag_ds[s][3]);
    }
  }
  // The warpgroup's dQ piece into its staging tile (two boxes of 32 columns, 16-byte chunk c of row r
  // at c ^ (r % 8)), for the producer's dQ warp to add to the fp32 sum (write_dq); `first`: the
  // CTA's first, else once that warp has seen the last piece's reduces read the tile.
  __device__ __forceinline__ void stage_dq(bool first) const {
    unsigned char* stage = smem.dq(cw);
    if (!first) named_barrier_sync(T::kDqEmptyBarrier + cw, T::kDqBarrierThreads);
    // Rows 16 warp + g (+8): row % 8 is g. The base is made here, opaque: else ptxas keeps the
    // 16 stores' addresses live through the main loop, and spills at hdim 64.
    const uint32_t base = opaque(smem_u32(stage) + acc_row(0) * 128 + 8 * (t & 1));
    const uint32_t swizzle = uint32_t(g) << 4;
#pragma unroll
    for (int i = 0; i < T::kDqRegs; i += 4) {  // n8 group i / 4: rows +0 and +8, columns 8 (i / 4) + 2 t
      const int col = acc_col(i), box = col / 32, chunk = (col % 32) / 4;
      const uint32_t at = base + box * T::kDqBoxBytes + ((uint32_t(chunk) << 4) ^ swizzle);
      st_shared_f32x2(at, acc_dq[i], acc_dq[i + 1]);
      st_shared_f32x2(at + 8 * 128, acc_dq[i + 2], acc_dq[i + 3]);
    }
    fence_proxy_async_smem();  // the stores, seen by the TMA
    named_barrier_arrive(T::kDqFullBarrier + cw, T::kDqBarrierThreads);
  }

  // Every query block of the k-th tile's range; dK and dV accumulate in registers.
  __device__ __forceinline__ void run(const BwdParams& bp, const Work<T>& w, int k) {
    Barriers<T>& bars = Barriers<T>::shared();
#pragma unroll
    for (int i = 0; i < T::kDRegs; ++i) acc_dk[i] = acc_dv[i] = 0.f;
    const uint64_t desc_k = key_rows_desc(smem.k()), desc_v = key_rows_desc(smem.v());
    mbarrier_wait(&bars.bar_kv, k & 1);
    for (int m = w.m_begin; m < w.m_end; ++m, ++it) {
      const int stage = it % T::kStages, q0 = m * BM;
      mbarrier_wait(&bars.full[stage], (it / T::kStages) & 1);
      const unsigned char* q = smem.q(stage);
      const unsigned char* dout = smem.dout(stage);
      unsigned char* ds = smem.ds(it & 1);

      // Before the GEMMs: behind their operand reads, the LDS results came after S^T's wait
      // (short scoreboard on the first FFMAs, 8% of stall samples on an H100).
      load_stats(lse, smem.lse(stage));
      forget(acc_s);
      forget(acc_dp);
      wgmma_fence();
      issue_keys_by_queries(acc_s, desc_k, query_rows_desc(q));
      issue_keys_by_queries(acc_dp, desc_v, query_rows_desc(dout));
      wgmma_wait<1>();  // S^T
      fence_operands(acc_s);
      if (w.needs_mask(q0)) softmax_p<true>(w, bp.fwd.softmax_scale_log2, q0);
      else softmax_p<false>(w, bp.fwd.softmax_scale_log2, q0);
      pack(frag_p, acc_s);
      fence_operands(acc_dv);
      fence_operands(frag_p);
      wgmma_fence();
      issue_frag_by_rows(acc_dv, frag_p, dout);  // dV += P^T dO, under dS's arithmetic
      load_stats(dsum, smem.dsum(stage));
      wgmma_wait<1>();  // dP^T
      fence_operands(acc_dp);
      softmax_ds();
      pack(frag_ds, acc_dp);
      store_ds(ds);
      fence_proxy_async_smem();  // dS^T's stores, seen by the wgmma's reads
      named_barrier_sync(T::kDsBarrier, 128 * T::kConsumers);
      fence_operands(acc_dk);
      fence_operands(frag_ds);
      forget(acc_dq);
      wgmma_fence();
      issue_dq(ds);  // first: its piece goes out while dK's GEMM runs
      issue_frag_by_rows(acc_dk, frag_ds, q);  // dK += dS^T Q
      wgmma_wait<1>();  // dQ
      fence_operands(acc_dq);
      stage_dq(it == 0);
      wgmma_wait<0>();  // dK (and dV)
      fence_operands(acc_dv);
      fence_operands(acc_dk);
      fence_operands(frag_ds);
      mbarrier_arrive(&bars.empty[stage]);  // Q, dO and the statistics of this slot are read
    }
    mbarrier_arrive(&bars.kv_empty);  // every GEMM of the tile is complete: the next K and V may load
  }
};

}  // namespace sm90_bwd
}  // namespace flashtune
