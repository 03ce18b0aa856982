// The online softmax of one consumer warpgroup, on S's accumulators in place: the masks, each
// row's running maximum and sum of exps, and the factor O must be rescaled by. Owns the rescale
// policy (lazy: a row keeps its maximum until a block's exceeds it by more than 2^8) and the
// speculative step (spec_max). Waits on no mbarrier; the speculative step's vote is named
// barrier 13 + cw (the warpgroup's 128 threads).
//
// Accumulator layout (wgmma m64nN, fp32): thread (warp w, lane l) holds rows 16 w + l / 4 and +8
// of the warpgroup's 64; accumulator i is row +8 ((i >> 1) & 1), column 8 (i / 4) + 2 (l % 4) +
// i % 2. A row lives in one quad, so its maximum and sum take two shuffles.
#pragma once
#include <math.h>

#include "common/convert.cuh"
#include "sm90/ptx_sm90.cuh"

namespace flashtune {
namespace sm90 {

template <class T>
struct OnlineSoftmax {
  static constexpr int BN = T::kBlockN;
  float row_max[2], row_sum[2];  // this thread's two rows: raw-score maxima, sums of exps
  // The tile's masks: its first row, the keys it sees, and the bottom-right causal shift (key j is
  // visible to row i iff j <= i + causal_shift); the scale from scores to exp2's domain.
  int m_row0 = 0, seqlen_k = 0, causal_shift = 0;
  float scale_log2 = 0.f;
  int block0 = 0;  // the tile's first block (a window, a split); block j of the tile is block0 + j of the keys
  // The variants' values (common/variants.h), set per CTA where the kernel has the variant.
  float softcap_in = 0.f, softcap_out = 0.f;
  int window_left = -1, window_right = -1;
  float alibi = 0.f;  // the head's ALiBi slope in raw-score units, -slope / scale
  int row_in_tile = 0, t = 0;  // this thread's first row in the tile; its column pair in a quad
  // A KV-cache kernel's rows are packed (position x head_ratio + head): the causal mask's
  // positions of this thread's two rows and of the tile's first row, set per tile (set_positions).
  int row_pos[2] = {0, 0}, first_pos = 0;

  __device__ __forceinline__ void set_positions(int head_ratio) {
    if constexpr (T::kCache) {
      row_pos[0] = (m_row0 + row_in_tile) / head_ratio;
      row_pos[1] = (m_row0 + row_in_tile + 8) / head_ratio;
      first_pos = m_row0 / head_ratio;
    }
  }

  __device__ __forceinline__ void start() {
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;
  }

  // -inf where a row does not see the key: in the tail block and, causal, in blocks that cross the
  // diagonal. Per row, how many of the columns from this thread's first one on are visible;
  // accumulator i sits at the constant offset 8 (i / 4) + i % 2 from it: one compare and one
  // select per element.
  // With a window, also the blocks that cross a row's window edge: columns before the row's first
  // visible key too (a second compare per element). With a softcap, the scores are capped first.
  __device__ __forceinline__ void mask(float (&acc_s)[T::kSRegs], int j) const {
    if constexpr (T::kSoftcap) {
#pragma unroll
      for (int i = 0; i < T::kSRegs; ++i) acc_s[i] = softcap_out * fast_tanh(acc_s[i] * softcap_in);
    }
    const int key0 = ((T::kWindow || T::kCache ? block0 : 0) + j) * BN;
    if constexpr (T::kAlibi) {  // every block: the slope times each key's distance to the row's own
      // The distance from this thread's first element, as a float once; each accumulator's is a
      // constant away from it (one add and one FMA with |x| each).
      const float d0 = float(m_row0 + row_in_tile + causal_shift - key0 - 2 * t);
      if constexpr (T::kCausal) {  // every key a row sees is at or left of its own: no |x|
        const float base = alibi * d0;
#pragma unroll
        for (int i = 0; i < T::kSRegs; ++i)
          acc_s[i] = fmaf(alibi, float(8 * ((i >> 1) & 1) - 8 * (i >> 2) - (i & 1)), acc_s[i] + base);
      } else {
#pragma unroll
        for (int i = 0; i < T::kSRegs; ++i)
          acc_s[i] = fmaf(alibi, fabsf(d0 + float(8 * ((i >> 1) & 1) - 8 * (i >> 2) - (i & 1))), acc_s[i]);
      }
    }
    const bool tail = key0 + BN > seqlen_k;
    const bool diagonal = T::kCausal && key0 + BN - 1 > (T::kCache ? first_pos : m_row0) + causal_shift;
    bool edge = false;
    if constexpr (T::kWindow)
      edge = (window_left >= 0 && key0 < m_row0 + T::kBlockM - 1 + causal_shift - window_left) ||
             (window_right >= 0 && key0 + BN - 1 > m_row0 + causal_shift + window_right);
    if (tail || diagonal || edge) {
      int visible[2], first[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = T::kCache ? row_pos[r] : m_row0 + row_in_tile + 8 * r;  // its position
        int end = T::kCausal ? min(seqlen_k, row + causal_shift + 1) : seqlen_k;
        first[r] = 0;
        if constexpr (T::kWindow) {
          if (window_right >= 0) end = min(end, row + causal_shift + window_right + 1);
          if (window_left >= 0) first[r] = row + causal_shift - window_left - (key0 + 2 * t);
        }
        visible[r] = end - (key0 + 2 * t);
      }
#pragma unroll
      for (int i = 0; i < T::kSRegs; ++i) {
        const int offset = 8 * (i >> 2) + (i & 1);
        if (offset >= visible[(i >> 1) & 1] || (T::kWindow && offset < first[(i >> 1) & 1])) acc_s[i] = -INFINITY;
      }
    }
  }

  // Block j's step: masks, then P in place of S, new row maxima and sums, and alpha, the factor O
  // must be rescaled by. Returns whether O needs the rescale (the same for the whole warp); with
  // lazy rescaling, false while every row of the warp keeps its maximum (alpha = 1).
  __device__ __forceinline__ bool step(float (&acc_s)[T::kSRegs], int j, float (&alpha)[2]) {
    mask(acc_s, j);
    bool moved = false;
    float m_scaled[2];  // each row's maximum, scaled: the exps' offset
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = row_max[r];
#pragma unroll
      for (int i = 0; i < T::kSRegs; ++i)
        if (((i >> 1) & 1) == r) m = fmaxf(m, acc_s[i]);
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
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < T::kSRegs; ++i)
        if (((i >> 1) & 1) == r) {
          acc_s[i] = fast_exp2(fmaf(acc_s[i], scale_log2, -m_scaled[r]));
          sum += acc_s[i];
        }
      row_sum[r] = row_sum[r] * alpha[r] + sum;
    }
    return !T::kLazyRescale || __any_sync(0xffffffff, moved);
  }

  // spec_max: block j's exps against the rows' maxima as they stand (no block maximum). They
  // stand (true) if every thread's sum of a row's exps is at most 2^kRescaleLog2 throughout the
  // warpgroup: then every P is within lazy rescaling's bound and no maximum moves (alpha = 1).
  // Overflow and NaN fail the test, and so does a row without a maximum yet that sees a key (none
  // can from block 1 on: every row that sees a key sees key 0). The caller then computes S_j
  // again for the full step, which is a wgmma: the vote is the warpgroup's (named barrier
  // vote_barrier: 13 + cw).
  __device__ __forceinline__ bool speculative(float (&acc_s)[T::kSRegs], int j, int vote_barrier) {
    mask(acc_s, j);
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
          acc_s[i] = fast_exp2(fmaf(acc_s[i], scale_log2, -m_scaled));
          sum += acc_s[i];
        }
      small &= sum <= float(1 << int(T::kRescaleLog2)) && (!no_max || sum == 0.f);
      sums[r] = sum;
    }
    if (named_barrier_any(vote_barrier, 128, !small)) return false;
    row_sum[0] += sums[0], row_sum[1] += sums[1];
    return true;
  }
};

}  // namespace sm90
}  // namespace flashtune
