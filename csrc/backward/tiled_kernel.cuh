// The 8-warp dK/dV kernel in FlashAttention-2's warp grids (Traits::kTiled): the algorithm of
// bwd_kernel.cuh with each GEMM tiled over the 8 warps in pieces of 32 rows, where 16 keys a warp had
// every warp read all of each query block's Q and dO four times (about 750 KB of shared memory a
// block at hdim 128, 610 here). With BN keys a CTA, KW = BN / 32 warps along the keys and the 8 / KW
// warps of each key piece splitting the rest:
//   S^T, dP^T (BN keys x BM queries): KW x 8/KW warps of 32 keys x BM*KW/8 queries; P^T and dS^T go
//              to shared memory as 16-bit tiles [keys][queries]
//   dV, dK (BN keys x D):             KW x 8/KW warps of 32 keys x D*KW/8 columns, P^T and dS^T read back
//   dQ (BM queries x D):              BM/32 x 256/BM warps of 32 queries x BM*D/256 columns, added
//                                     to the fp32 dQ by atomic adds, between dV's GEMM and dK's;
//                                     that sum in strips (dq_layout.cuh), a warp's add two lines
// with BN x BM = 128 x 128 at hdim 64, 128 x 64 at 128 and 64 x 64 at 256 (FlashAttention-2's tiles
// and warp grids). A warp keeps its S^T keys for dK and dV, so dK and dV are never reduced across warps.
#pragma once

#include "backward/bwd_kernel.cuh"
#include "backward/dq_layout.cuh"

namespace flashtune {
namespace bwd {

// The warp's 16-column groups [first, first + kGroups) of a [rows][kHeadDim] tile as B fragments of
// transposed loads (k = rows, n = columns): the lane's row address, relative to the tile, for each
// group (bwd_body's bt_rows scheme at a column the warp knows only at run time).
template <class T, int kGroups>
__device__ __forceinline__ void column_group_lanes(uint32_t (&lanes)[kGroups], int first, int lane) {
  const int x = lane & 7, hi = lane >> 4, mid = (lane >> 3) & 1;
#pragma unroll
  for (int j = 0; j < kGroups; ++j) {
    const int group = first + j;
    lanes[j] = (mid * 8 + x) * T::kRowBytes + (((2 * (group % 4) + hi) ^ x) << 4) + (group / 4) * 128;
  }
}

template <class T>
__device__ __forceinline__ void tiled_body(const BwdParams& bp) {
  using Elem = typename T::Elem;
  constexpr int D = T::kHeadDim, BM = T::kBlockM, BN = T::kBlockN;
  constexpr uint32_t kRowBytes = T::kRowBytes, kScoreRowBytes = T::kdSRowBytes;
  // KW warps along the keys, PARTS warps sharing each 32 keys
  constexpr int KW = BN / 32, PARTS = 8 / KW;
  // S^T and dP^T: a warp's 32 keys x SQ queries (MT m16 tiles x QT n8 tiles)
  constexpr int MT = 2, SQ = BM / PARTS, QT = SQ / 8;
  // dK and dV: the warp's 32 keys x KVC columns
  constexpr int KVC = D / PARTS, KVT = KVC / 8;
  // dQ: DQR row warps of 32 queries, each with DQC columns
  constexpr int DQR = BM / 32, DQC = D / (8 / DQR), DQT = DQC / 8;
  static_assert(T::kWarps == 8 && (BN == 128 || BN == 64) && BM * D <= 16384, "8 warps, 128 or 64 keys");
  static_assert(KVT % 2 == 0 && DQT % 2 == 0 && QT % 2 == 0, "n8 tiles in pairs");
  // Live fp32 registers a thread: dK and dV throughout, with P^T and dP^T.
  static_assert(2 * MT * KVT * 4 + 2 * MT * QT * 4 <= 192, "accumulators would not fit in registers");
  const FwdParams& p = bp.fwd;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t sK = smem_addr(smem_raw), sV = sK + T::kVOffset, sdS = sK + T::kdSOffset, sP = sK + T::kPOffset;

  const KeyBlock<T> kb = key_block<T>(bp, blockIdx.x, blockIdx.y, blockIdx.z);
  const int seqlen_q = kb.seqlen_q, seqlen_k = kb.seqlen_k, key0 = kb.key0;
  if (key0 >= seqlen_k) return;  // uniform across the CTA
  float* const dq_sum = kb.dq - int64_t(kb.q_row0) * bp.dq_row_stride;  // dq_accum's row 0 (this head)
  const int causal_shift = kb.causal_shift, m_begin = kb.m_begin, m_end = kb.m_end;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int x = lane & 7, hi = lane >> 4, mid = (lane >> 3) & 1;
  // The warp's pieces: keys key_w .. + 32 (S^T, dP^T, dK, dV), queries s_q0 .. + SQ of S^T and
  // dP^T, columns kv_c0 .. + KVC of dK and dV, dQ's rows dq_r0 .. + 32 and columns dq_c0 .. + DQC.
  // part: the warp's share of S^T's queries and of dK/dV's columns
  const int key_w = (warp % KW) * 32, part = warp / KW;
  const int s_q0 = part * SQ, kv_c0 = part * KVC;
  const int dq_r0 = (warp % DQR) * 32, dq_c0 = (warp / DQR) * DQC;

  // ldmatrix lane addresses (bwd_body's schemes), per k step of 32 bytes one of 4 swizzled chunks:
  //   a_k, a_v:  A fragments of the warp's first 16 keys of K and V (absolute; the second: + 16 rows)
  //   b_rows:    B fragments, n = rows of Q or dO, k = head dim (relative to the tile)
  //   a_score:   A fragments of the warp's first 16 keys of P^T or dS^T, k = queries (relative)
  //   bt_kv:     B fragments of dO or Q, k = queries, n = the warp's dK/dV columns (relative)
  //   ds_dq:     A fragments of dS from dS^T by transposed loads, the warp's dQ rows (relative)
  //   bt_dq:     B fragments of K, k = keys, n = the warp's dQ columns (relative)
  uint32_t a_k[4], a_v[4], b_rows[4], a_score[4], bt_kv[KVT / 2], ds_dq[MT], bt_dq[DQT / 2];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t a_rel = (key_w + mid * 8 + x) * kRowBytes + (swizzle_chunk<D>(2 * i + hi, x) << 4);
    a_k[i] = sK + a_rel;
    a_v[i] = sV + a_rel;
    b_rows[i] = (hi * 8 + x) * kRowBytes + (swizzle_chunk<D>(2 * i + mid, x) << 4);
    a_score[i] = 2 * swizzled<BM>(key_w + mid * 8 + x, 16 * i + hi * 8);
  }
  column_group_lanes<T, KVT / 2>(bt_kv, kv_c0 / 16, lane);
  column_group_lanes<T, DQT / 2>(bt_dq, dq_c0 / 16, lane);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) ds_dq[mt] = 2 * swizzled<BM>(hi * 8 + x, dq_r0 + mt * 16 + mid * 8);

  auto load_block = [&](int q0, int stage) { load_query_block<T>(sK + stage * T::kStageBytes, kb, bp, q0, tid); };
  load_keys<T>(sK, sV, kb, p, tid);
  if (m_begin < m_end) load_block(m_begin * BM, 0);
  cp_async_commit();

  float acc_dk[MT][KVT][4], acc_dv[MT][KVT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int dt = 0; dt < KVT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[mt][dt][e] = acc_dv[mt][dt][e] = 0.f;

  // acc[MT][QT] = (the warp's 32 rows of the K or V tile at a_rows) times the transpose of the
  // warp's SQ rows of the Q or dO tile at `b_tile`.
  auto keys_times_queries_t = [&](float (&acc)[MT][QT][4], const uint32_t (&a_rows)[4], uint32_t b_tile) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < QT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(a[mt], a_rows[kk % 4] + mt * 16 * kRowBytes + (kk / 4) * 128);
#pragma unroll
      for (int nt = 0; nt < QT; nt += 2) {
        uint32_t b[4];
        ldmatrix_x4(b, b_tile + b_rows[kk % 4] + nt * 8 * kRowBytes + (kk / 4) * 128);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<Elem>(acc[mt][nt], a[mt], b[0], b[1]);
          mma_16816<Elem>(acc[mt][nt + 1], a[mt], b[2], b[3]);
        }
      }
    }
  };
  // acc[MT][KVT] += (the warp's 32 rows of the [BN][BM] score tile at `score`) times the warp's
  // columns of the [BM][D] tile at `rows` (dO or Q).
  auto scores_times_rows = [&](float (&acc)[MT][KVT][4], uint32_t score, uint32_t rows) {
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldmatrix_x4(a[mt], score + a_score[kk % 4] + mt * 16 * kScoreRowBytes + (kk / 4) * 128);
#pragma unroll
      for (int dt = 0; dt < KVT; dt += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, rows + bt_kv[dt / 2] + kk * 16 * kRowBytes);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<Elem>(acc[mt][dt], a[mt], b[0], b[1]);
          mma_16816<Elem>(acc[mt][dt + 1], a[mt], b[2], b[3]);
        }
      }
    }
  };

  constexpr float kLog2e = 1.4426950408889634f;
  for (int m = m_begin; m < m_end; ++m) {
    const int q0 = m * BM;
    const QueryStage block = begin_query_block<T>(smem_raw, m, m_begin, m_end, load_block);
    const uint32_t sQ = block.q, sdO = block.dout;

    // ---- P^T = exp2(scale_log2 S^T - LSE), S^T = K Q^T over the warp's keys and queries; the mask
    // only in blocks that need one (the keys' end, the causal diagonal; the same for the whole CTA)
    float acc_s[MT][QT][4];
    keys_times_queries_t(acc_s, a_k, sQ + s_q0 * kRowBytes);
    const bool unmasked = key0 + BN <= seqlen_k && (!T::kCausal || key0 + BN - 1 <= q0 + causal_shift);
#pragma unroll
    for (int nt = 0; nt < QT; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int col = s_q0 + nt * 8 + 2 * t + c;
        const float neg_lse = -block.lse[col] * kLog2e;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            float& s = acc_s[mt][nt][2 * r + c];
            s = fast_exp2(fmaf(s, p.softmax_scale_log2, neg_lse));
            const int key = key0 + key_w + mt * 16 + g + 8 * r;
            if (!unmasked && (key >= seqlen_k || (T::kCausal && key > q0 + col + causal_shift))) s = 0.f;
          }
      }
    // ---- P^T and dS^T to shared memory: the accumulator (mt, nt) holds rows g and g + 8 of its 16,
    // columns 2t and 2t + 1 of its 8; every row the thread writes is g modulo 8, so one swizzled
    // chunk serves them all. P^T goes before dP^T's GEMM so that its stores drain under it.
    auto score_at = [&](int mt, int nt, int r) {
      const int chunk = s_q0 / 8 + nt;
      return (key_w + g + mt * 16 + 8 * r) * BM + ((chunk & ~7) << 3) + (((chunk & 7) ^ g) << 3) + 2 * t;
    };
    {
      Elem* P_tile = reinterpret_cast<Elem*>(smem_raw + T::kPOffset);
#pragma unroll
      for (int nt = 0; nt < QT; ++nt)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int r = 0; r < 2; ++r)
            *reinterpret_cast<uint32_t*>(P_tile + score_at(mt, nt, r)) =
                pack2<Elem>(acc_s[mt][nt][2 * r], acc_s[mt][nt][2 * r + 1]);
    }
    // ---- dS^T = P^T (dP^T - rowsum(dO O)), dP^T = V dO^T
    {
      float acc_dp[MT][QT][4];
      keys_times_queries_t(acc_dp, a_v, sdO + s_q0 * kRowBytes);
      Elem* dS_tile = reinterpret_cast<Elem*>(smem_raw + T::kdSOffset);
#pragma unroll
      for (int nt = 0; nt < QT; ++nt) {
        const int col = s_q0 + nt * 8 + 2 * t;
        const float d0 = block.dsum[col], d1 = block.dsum[col + 1];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int r = 0; r < 2; ++r)
            *reinterpret_cast<uint32_t*>(dS_tile + score_at(mt, nt, r)) =
                pack2<Elem>(acc_s[mt][nt][2 * r] * (acc_dp[mt][nt][2 * r] - d0),
                            acc_s[mt][nt][2 * r + 1] * (acc_dp[mt][nt][2 * r + 1] - d1));
      }
    }
    __syncthreads();  // P^T and dS^T complete

    // ---- dV += P^T dO over the warp's keys and columns
    scores_times_rows(acc_dv, sP, sdO);

    // ---- dQ (the warp's 32 rows, DQC columns) += dS K, added to the fp32 sum in global memory
    // before dK's GEMM, so that the adds drain while it runs (as FlashAttention-2 orders them)
    float acc_dq[MT][DQT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int dt = 0; dt < DQT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dq[mt][dt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) ldmatrix_x4_trans(a[mt], sdS + ds_dq[mt] + kk * 16 * kScoreRowBytes);
#pragma unroll
      for (int dt = 0; dt < DQT; dt += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, sK + bt_dq[dt / 2] + kk * 16 * kRowBytes);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<Elem>(acc_dq[mt][dt], a[mt], b[0], b[1]);
          mma_16816<Elem>(acc_dq[mt][dt + 1], a[mt], b[2], b[3]);
        }
      }
    }
    // dQ's adds into dq_accum's strips (dq_layout.cuh): the 8 rows x 8 columns of each (mt, r, dt)
    // are one 256-byte piece, lane (g, t) at 8 g + 2 t.
    auto add_pair = [&](float* out, const float (&acc)[4], int r) {
#if __CUDA_ARCH__ >= 900  // two adjacent floats an instruction on sm_90 and sm_120 (bwd_body)
      atomicAdd(reinterpret_cast<float2*>(out), make_float2(acc[2 * r], acc[2 * r + 1]));
#else
      atomicAdd(out, acc[2 * r]);
      atomicAdd(out + 1, acc[2 * r + 1]);
#endif
    };
    // The warp's columns start a strip row's tiles, so tile dt of each (mt, r) is dt / kTilesPerRow
    // strip rows and dt % kTilesPerRow tiles on from its first. A row past the sequence's end has
    // dS = 0 (its dO and statistics arrived as zeros), so its zeros go to the last row instead of a
    // branch around the adds: no branch, so the compiler can place the adds among dK's HMMAs.
    using Strips = DqStrips<D>;
    static_assert(DQC % (8 * Strips::kTilesPerRow) == 0, "a warp's columns start a strip row");
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = kb.q_row0 + min(q0 + dq_r0 + mt * 16 + g + 8 * r, seqlen_q - 1);
        const auto place = Strips::place(row, dq_c0 + 2 * t, kb.q_rows, bp.dq_row_stride);
#pragma unroll
        for (int dt = 0; dt < DQT; ++dt) {
          const int64_t at =
              place.at + (dt / Strips::kTilesPerRow) * place.tiles + (dt % Strips::kTilesPerRow) * place.tile;
          add_pair(dq_sum + at, acc_dq[mt][dt], r);
        }
      }

    // ---- dK += dS^T Q over the warp's keys and columns
    scores_times_rows(acc_dk, sdS, sQ);
  }

  cp_async_wait<0>();  // K and V's loads complete where no query block came (varlen: no queries)

  // ---- Epilogue: dK (times the softmax scale) and dV of the warp's keys and columns, in whole
  // sectors (common/quad_store.cuh; every lane shuffles, then the rows in range store)
  Elem* gdK = static_cast<Elem*>(bp.dk) + kb.dkv;
  Elem* gdV = static_cast<Elem*>(bp.dv) + kb.dkv;
  const float sc = p.softmax_scale;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = key0 + key_w + mt * 16 + g + 8 * r;
      const int64_t row = int64_t(key) * bp.dkv_row_stride + kv_c0 + 4 * t;
#pragma unroll
      for (int dt = 0; dt < KVT; dt += 2) {
        const float (&k0)[4] = acc_dk[mt][dt], (&k1)[4] = acc_dk[mt][dt + 1];
        const float (&v0)[4] = acc_dv[mt][dt], (&v1)[4] = acc_dv[mt][dt + 1];
        const uint2 dk = quad_chunk_of_16(pack2<Elem>(k0[2 * r] * sc, k0[2 * r + 1] * sc),
                                          pack2<Elem>(k1[2 * r] * sc, k1[2 * r + 1] * sc), lane);
        const uint2 dv = quad_chunk_of_16(pack2<Elem>(v0[2 * r], v0[2 * r + 1]),
                                          pack2<Elem>(v1[2 * r], v1[2 * r + 1]), lane);
        if (key < seqlen_k) {
          *reinterpret_cast<uint2*>(gdK + row + dt * 8) = dk;
          *reinterpret_cast<uint2*>(gdV + row + dt * 8) = dv;
        }
      }
    }
}

// The dK/dV kernel's body for the traits' layout.
template <class T>
__device__ __forceinline__ void dkdv_body(const BwdParams& bp) {
  if constexpr (T::kTiled) tiled_body<T>(bp);
  else bwd_body<T>(bp);
}

}  // namespace bwd
}  // namespace flashtune
