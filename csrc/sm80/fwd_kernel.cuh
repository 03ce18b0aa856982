// FlashAttention-2-style forward for sm_80 and newer: mma.sync m16n8k16, ldmatrix, a cp.async
// K/V ring in swizzled shared memory, online softmax in the exp2 domain. With T::kFp8Qk, Q and K
// are e4m3 and S = Q K^T runs on mma m16n8k32 (sm_89+); P V and O stay 16-bit.
//
// One CTA computes kBlockM query rows of one (batch, head); each warp owns kRowsPerWarp of them,
// so the softmax needs no cross-warp communication. The generated translation unit wraps
// fwd_body<Traits> in an extern "C" kernel whose name spells out the configuration.
#pragma once
#include <math.h>

#include "common/params.h"
#include "common/row_lse.cuh"
#include "common/ptx_sm80.cuh"
#include "sm80/kernel_traits.cuh"

namespace flashtune {
namespace sm80 {

// Copies `kRows` rows of a [rows][kHeadDim] tile of E (16-bit, or e4m3 for FP8 Q/K) into
// swizzled shared memory; rows at or beyond `rows_valid` are zero-filled (their source address
// is clamped to row 0 and never read).
// Each thread keeps one column chunk and walks rows kRowsPerPass apart, so its addresses are a
// base plus compile-time steps rather than one live register pair per chunk.
template <class T, int kRows, typename E>
__device__ __forceinline__ void load_tile_async(uint32_t smem, const E* gmem, int64_t row_stride,
                                                int rows_valid, int tid) {
  constexpr int kRowUnits = T::kHeadDim * int(sizeof(E)) / 2;  // the row in 16-bit units
  constexpr int kChunks = kRowUnits / 8;
  constexpr int kRowsPerPass = T::kThreads / kChunks;
  // 16-bit tiles split evenly (Traits); an FP8 K tile may not (BN=48 at D=64): the last pass
  // then leaves the threads past the tile's end idle.
  constexpr int kPasses = (kRows + kRowsPerPass - 1) / kRowsPerPass;
  constexpr bool kEven = kRows % kRowsPerPass == 0;
  static_assert(T::kThreads % kChunks == 0, "whole rows per pass");
  const int row0 = tid / kChunks;
  const int chunk = tid % kChunks;
  const int col = chunk * (16 / int(sizeof(E)));  // in elements of E
  // 32-bit in-tile offsets (a tile spans < 2^31 elements); the tile base pointer is 64-bit.
  const int step = kRowsPerPass * int(row_stride);
  int offset = row0 * int(row_stride) + col;
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int row = row0 + i * kRowsPerPass;
    const bool valid = row < rows_valid;
    if (kEven || row < kRows)
      cp_async_16(smem + 2 * swizzled<kRowUnits>(row, chunk * 8), gmem + (valid ? offset : col),
                  valid);
    offset += step;
  }
}

template <class T>
__device__ __forceinline__ void fwd_body(const FwdParams& p) {
  using Elem = typename T::Elem;
  using QKElem = typename T::QKElem;
  constexpr int D = T::kHeadDim, BM = T::kBlockM, BN = T::kBlockN;
  constexpr int MT = T::kMTiles;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  static_assert(!T::kFp8Qk, "FP8 Q/K needs sm_89 or newer (mma.m16n8k32 e4m3)");
#endif

  extern __shared__ __align__(128) unsigned char smem_raw[];
  // 32-bit shared addresses, in bytes: Q [BM][D], then kStages K and kStages V buffers [BN][D].
  constexpr uint32_t kKBytes = T::kKBytes, kVBytes = T::kVBytes;
  const uint32_t sQ = smem_addr(smem_raw);
  const uint32_t sK = sQ + T::kQBytes;
  const uint32_t sV = sK + T::kStages * kKBytes;

  // Causal CTAs run heaviest (longest rows) first so the tail of the grid is short.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int kv_head = head / p.head_ratio;

  // Sequence extents and offsets of this batch entry (varlen reads them from cu_seqlens).
  int seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k;
  int64_t q_off = int64_t(batch) * p.q_batch_stride, k_off = int64_t(batch) * p.k_batch_stride;
  int64_t v_off = int64_t(batch) * p.v_batch_stride, o_off = int64_t(batch) * p.o_batch_stride;
  int64_t lse_off = int64_t(batch) * p.lse_batch_stride;
  if (p.cu_seqlens_q != nullptr) {
    const int q_start = p.cu_seqlens_q[batch], k_start = p.cu_seqlens_k[batch];
    seqlen_q = p.cu_seqlens_q[batch + 1] - q_start;
    seqlen_k = p.cu_seqlens_k[batch + 1] - k_start;
    q_off = int64_t(q_start) * p.q_row_stride;
    o_off = int64_t(q_start) * p.o_row_stride;
    k_off = int64_t(k_start) * p.k_row_stride;
    v_off = int64_t(k_start) * p.v_row_stride;
    lse_off = q_start;
  }
  if (m_block * BM >= seqlen_q) return;  // uniform across the CTA: no barrier is skipped

  const QKElem* gQ = static_cast<const QKElem*>(p.q) + q_off + int64_t(head) * p.q_head_stride +
                     int64_t(m_block) * BM * p.q_row_stride;
  const QKElem* gK = static_cast<const QKElem*>(p.k) + k_off + int64_t(kv_head) * p.k_head_stride;
  const Elem* gV = static_cast<const Elem*>(p.v) + v_off + int64_t(kv_head) * p.v_head_stride;

  // Bottom-right causal: key j is visible to query i iff j <= i + seqlen_k - seqlen_q.
  const int causal_shift = seqlen_k - seqlen_q;
  int n_blocks = (seqlen_k + BN - 1) / BN;
  if (T::kCausal) {
    const int last_visible = (m_block + 1) * BM - 1 + causal_shift;  // of the CTA's last row
    n_blocks = min(n_blocks, last_visible < 0 ? 0 : last_visible / BN + 1);
  }
  // A window: the CTA's keys start at block jb, the first any of its rows sees, and end at the
  // last its last row sees; blocks outside are never loaded. The loop below counts blocks from jb
  // (K and V's bases moved there); masks use absolute key indices.
  int jb = 0;
  if constexpr (T::kWindow) {
    if (p.window_right >= 0) {
      const int last_visible = (m_block + 1) * BM - 1 + causal_shift + p.window_right;
      n_blocks = min(n_blocks, last_visible < 0 ? 0 : last_visible / BN + 1);
    }
    if (p.window_left >= 0) jb = min(n_blocks, max(0, m_block * BM + causal_shift - p.window_left) / BN);
    gK += int64_t(jb) * BN * p.k_row_stride;
    gV += int64_t(jb) * BN * p.v_row_stride;
    n_blocks -= jb;
  }
  const int kv_rows = seqlen_k - jb * BN;  // keys from the first block the loop loads

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;  // MMA fragment coordinates
  const int warp_row = warp * T::kRowsPerWarp;

  // ldmatrix row addresses. Every row a lane addresses is (lane & 7) modulo 8, which fixes its
  // swizzle, so within a 128-byte group the swizzled chunk takes one of 4 lane-dependent values
  // per operand (2 for 64-byte FP8 rows); everything else is a compile-time offset. Precomputing
  // them keeps the address math to 12 registers instead of one per (k step, tile) that the
  // compiler would otherwise spill.
  constexpr uint32_t kRowBytes = T::kRowBytes, kQKRowBytes = T::kQKRowBytes;
  constexpr int kQKLane = T::kQKSteps < 4 ? T::kQKSteps : 4;
  const int x = lane & 7, hi = lane >> 4, mid = (lane >> 3) & 1;
  uint32_t q_addr[kQKLane], k_lane[kQKLane], v_lane[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // one loop: split in two, the 16-bit SASS changed (sm_120)
    if (i < kQKLane) {
      q_addr[i] = sQ + (warp_row + mid * 8 + x) * kQKRowBytes +
                  (swizzle_chunk<T::kQKRowUnits>(2 * i + hi, x) << 4);
      k_lane[i] = (hi * 8 + x) * kQKRowBytes + (swizzle_chunk<T::kQKRowUnits>(2 * i + mid, x) << 4);
    }
    v_lane[i] = (mid * 8 + x) * kRowBytes + (((2 * i + hi) ^ x) << 4);
  }

  // ---- Prologue: groups [Q + K0], V0, K1, V1, ..., K(S-1). Empty groups keep counts uniform.
  const int rows_q = seqlen_q - m_block * BM;
  load_tile_async<T, BM>(sQ, gQ, p.q_row_stride, rows_q, tid);
#pragma unroll
  for (int s = 0; s < T::kStages; ++s) {
    if (s > 0) {
      if (s - 1 < n_blocks)
        load_tile_async<T, BN>(sV + (s - 1) * kVBytes, gV + int64_t(s - 1) * BN * p.v_row_stride,
                               p.v_row_stride, kv_rows - (s - 1) * BN, tid);
      cp_async_commit();
    }
    if (s < n_blocks)
      load_tile_async<T, BN>(sK + s * kKBytes, gK + int64_t(s) * BN * p.k_row_stride,
                             p.k_row_stride, kv_rows - s * BN, tid);
    cp_async_commit();
  }

  float acc_o[MT][T::kOTiles][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int dt = 0; dt < T::kOTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mt][dt][e] = 0.f;
  float row_max[MT][2], row_sum[MT][2];  // rows g and g+8 of each m tile
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[mt][r] = -INFINITY;
      row_sum[mt][r] = 0.f;
    }
  // FP8: S is in units of q_descale * k_descale; fold them into the scales once per CTA.
  float scale_log2 = p.softmax_scale_log2;
  float qk_descale = 1.f;
  if constexpr (T::kFp8Qk) {
    const int64_t idx = int64_t(batch) * p.descale_batch_stride + kv_head;
    qk_descale = p.q_descale[idx] * p.k_descale[idx];
    scale_log2 *= qk_descale;
  }
  // The softcap is on the true scores (FP8: raw x descales x scale).
  const float softcap_in = p.softcap_in * qk_descale, softcap_out = p.softcap_out / qk_descale;
  // ALiBi: the head's slope in raw-score units (-slope / scale, FP8: / descales too).
  // (a zero descale makes every score 0: no bias then, rather than -inf x 0)
  const float alibi = T::kAlibi && qk_descale > 0.f
                          ? -p.alibi_slopes[batch * p.alibi_batch_stride + head] / (p.softmax_scale * qk_descale)
                          : 0.f;

  for (int j = 0; j < n_blocks; ++j) {
    const int stage = j % T::kStages;
    const uint32_t sKj = sK + stage * kKBytes;
    const uint32_t sVj = sV + stage * kVBytes;

    cp_async_wait<T::kPendingGroups>();  // K_j (and Q) landed
    __syncthreads();                     // ... for every thread; and P V_(j-1) is done everywhere
    {
      const int jv = j + T::kStages - 1;  // refill the V buffer that P V_(j-1) just released
      if (jv < n_blocks)
        load_tile_async<T, BN>(sV + (jv % T::kStages) * kVBytes,
                               gV + int64_t(jv) * BN * p.v_row_stride, p.v_row_stride,
                               kv_rows - jv * BN, tid);
      cp_async_commit();
    }

    // ---- S = Q K_j^T, in k steps of 32 bytes (16 dims, or 32 for FP8)
    float acc_s[MT][T::kSTiles][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < T::kQKSteps; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)  // rows warp_row + mt*16 + 0..15, bytes kk*32 + 0..31
        ldmatrix_x4(a[mt], q_addr[kk % kQKLane] + mt * 16 * kQKRowBytes + (kk / 4) * 128);
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; nt += 2) {
        uint32_t b[4];  // b0,b1 of n tile nt, then of nt+1: keys nt*8 + 0..15, bytes kk*32 + 0..31
        ldmatrix_x4(b, sKj + k_lane[kk % kQKLane] + nt * 8 * kQKRowBytes + (kk / 4) * 128);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (T::kFp8Qk) {
            mma_16832_e4m3(acc_s[mt][nt], a[mt], b[0], b[1]);
            mma_16832_e4m3(acc_s[mt][nt + 1], a[mt], b[2], b[3]);
          } else {
            mma_16816<Elem>(acc_s[mt][nt], a[mt], b[0], b[1]);
            mma_16816<Elem>(acc_s[mt][nt + 1], a[mt], b[2], b[3]);
          }
        }
      }
    }

    if constexpr (T::kSoftcap) {  // on the scaled scores, kept raw: s * scale = cap * tanh(s * scale / cap)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < T::kSTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = softcap_out * fast_tanh(acc_s[mt][nt][e] * softcap_in);
    }

    const int ja = jb + j;  // the block's absolute index
    if constexpr (T::kAlibi) {  // every block: the slope times each key's distance to the row's own
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < T::kSTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = ja * BN + nt * 8 + 2 * t + (e & 1);
            const int row = m_block * BM + warp_row + mt * 16 + g + 8 * (e >> 1);
            acc_s[mt][nt][e] += alibi * float(abs(row + causal_shift - col));
          }
    }

    // ---- Masks: only the last (tail) block, for causal, blocks crossing the diagonal, and with a
    // window, blocks crossing a row's window edge.
    const bool tail = (ja + 1) * BN > seqlen_k;
    const bool diagonal = T::kCausal && (ja + 1) * BN - 1 > m_block * BM + causal_shift;
    bool edge = false;
    if constexpr (T::kWindow)
      edge = (p.window_left >= 0 && ja * BN < (m_block + 1) * BM - 1 + causal_shift - p.window_left) ||
             (p.window_right >= 0 && (ja + 1) * BN - 1 > m_block * BM + causal_shift + p.window_right);
    if (tail || diagonal || edge) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < T::kSTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = ja * BN + nt * 8 + 2 * t + (e & 1);
            const int row = m_block * BM + warp_row + mt * 16 + g + 8 * (e >> 1);
            bool masked = col >= seqlen_k || (T::kCausal && col > row + causal_shift);
            if constexpr (T::kWindow)
              masked = masked || (p.window_left >= 0 && col < row + causal_shift - p.window_left) ||
                       (p.window_right >= 0 && col > row + causal_shift + p.window_right);
            if (masked) acc_s[mt][nt][e] = -INFINITY;
          }
    }

    // ---- Online softmax (exp2 domain, scale folded into one FMA per score).
    float alpha[MT][2];
    bool rescale = false;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float m = row_max[mt][r];
#pragma unroll
        for (int nt = 0; nt < T::kSTiles; ++nt)
          m = fmaxf(m, fmaxf(acc_s[mt][nt][2 * r], acc_s[mt][nt][2 * r + 1]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 1));  // a row lives in one quad
        m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 2));
        // A row that has seen only masked keys keeps max -inf: subtract 0, not -inf (no NaN).
        const float m_scaled = (m == -INFINITY) ? 0.f : m * scale_log2;
        alpha[mt][r] = fast_exp2(row_max[mt][r] * scale_log2 - m_scaled);
        rescale |= m != row_max[mt][r];
        row_max[mt][r] = m;
        row_sum[mt][r] *= alpha[mt][r];
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < T::kSTiles; ++nt)
#pragma unroll
          for (int e = 2 * r; e < 2 * r + 2; ++e) {
            acc_s[mt][nt][e] = fast_exp2(fmaf(acc_s[mt][nt][e], scale_log2, -m_scaled));
            sum += acc_s[mt][nt][e];
          }
        row_sum[mt][r] += sum;  // per-thread partial; reduced across the quad at the end
      }
    // Rescaling O costs one multiply per accumulator; once the row maxima settle it is a no-op
    // (alpha is exactly 1) for the whole warp, so skip it then (a warp-uniform branch).
    if (__any_sync(0xffffffff, rescale)) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int dt = 0; dt < T::kOTiles; ++dt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_o[mt][dt][e] *= alpha[mt][e >> 1];
    }

    // P in 16 bits as MMA A fragments: two adjacent n8 tiles of S form one k16 fragment, so this
    // is a pure reshape, and the f32 scores die here rather than living through P V.
    uint32_t frag_p[MT][BN / 16][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        frag_p[mt][kk][0] = pack2<Elem>(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
        frag_p[mt][kk][1] = pack2<Elem>(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
        frag_p[mt][kk][2] = pack2<Elem>(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
        frag_p[mt][kk][3] = pack2<Elem>(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
      }

    cp_async_wait<T::kPendingGroups>();  // V_j landed
    __syncthreads();                     // ... for every thread; and every warp is done with K_j
    {
      const int jk = j + T::kStages;  // refill the K buffer that S_j just released
      if (jk < n_blocks)
        load_tile_async<T, BN>(sK + stage * kKBytes, gK + int64_t(jk) * BN * p.k_row_stride,
                               p.k_row_stride, kv_rows - jk * BN, tid);
      cp_async_commit();
    }

    // ---- O += P V_j
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
      for (int dt = 0; dt < T::kOTiles; dt += 2) {
        uint32_t b[4];  // transposed (key 2t.., dim g) fragments: keys kk*16 + 0..15, d tiles dt, dt+1
        ldmatrix_x4_trans(b, sVj + v_lane[(dt / 2) % 4] + kk * 16 * kRowBytes + (dt / 8) * 128);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<Elem>(acc_o[mt][dt], frag_p[mt][kk], b[0], b[1]);
          mma_16816<Elem>(acc_o[mt][dt + 1], frag_p[mt][kk], b[2], b[3]);
        }
      }
    }
  }

  // ---- Epilogue: normalise, stage O through shared memory (Q's buffer), 16-byte stores.
  cp_async_wait<0>();
  __syncthreads();  // every warp is done reading sQ and sK; no copy is still landing
  // O is staged from offset 0: Q's buffer and, with FP8 Q (half the size), the K ring after it
  // (T::kOStageBytes <= T::kSmemBytes is asserted in Traits).
  Elem* sO = reinterpret_cast<Elem*>(smem_raw);
  Elem* gO = static_cast<Elem*>(p.o) + o_off + int64_t(head) * p.o_head_stride +
             int64_t(m_block) * BM * p.o_row_stride;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = row_sum[mt][r];
      l += __shfl_xor_sync(0xffffffff, l, 1);
      l += __shfl_xor_sync(0xffffffff, l, 2);
      // A row that sees no key (causal with seqlen_k < seqlen_q, or seqlen_k = 0): O = 0, LSE = +inf.
      float inv = l > 0.f ? 1.f / l : 0.f;
      float lse_sink = 0.f;
      if constexpr (T::kSinks) {  // the head's sink logit joins the sum (LSE = its sink if no key)
        const float sink = p.sinks[head];
        const float lse_keys = l > 0.f ? __fmaf_rn(row_max[mt][r], p.softmax_scale * qk_descale, logf(l)) : -INFINITY;
        lse_sink = lse_with_sink(lse_keys, sink);
        inv = l > 0.f ? expf(lse_keys - lse_sink) / l : 0.f;
        if (lse_sink == -INFINITY) lse_sink = INFINITY;
      }
      const int row = warp_row + mt * 16 + g + 8 * r;
#pragma unroll
      for (int dt = 0; dt < T::kOTiles; ++dt) {
        const uint32_t packed =
            pack2<Elem>(acc_o[mt][dt][2 * r] * inv, acc_o[mt][dt][2 * r + 1] * inv);
        *reinterpret_cast<uint32_t*>(sO + swizzled<D>(row, dt * 8 + 2 * t)) = packed;
      }
      if (p.lse != nullptr && t == 0 && m_block * BM + row < seqlen_q) {
        p.lse[lse_off + int64_t(head) * p.lse_head_stride + m_block * BM + row] =
            T::kSinks ? lse_sink : row_lse(row_max[mt][r], p.softmax_scale * qk_descale, l);
      }
    }
  __syncwarp();  // each warp stores only the rows it wrote
#pragma unroll
  for (int i = 0; i < T::kRowsPerWarp * T::kChunksPerRow / 32; ++i) {
    const int c = lane + 32 * i;
    const int row = warp_row + c / T::kChunksPerRow;
    const int col = (c % T::kChunksPerRow) * 8;
    if (m_block * BM + row < seqlen_q)
      *reinterpret_cast<uint4*>(gO + int64_t(row) * p.o_row_stride + col) =
          *reinterpret_cast<const uint4*>(sO + swizzled<D>(row, col));
  }
}

}  // namespace sm80
}  // namespace flashtune
