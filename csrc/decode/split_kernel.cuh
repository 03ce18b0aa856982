// The decode split kernel: one CTA computes its Work (work.cuh): the packed query rows of one KV
// head against one split's share of the keys. Parts, in order:
//   1. Q, gathered row by row from the heads of the group, into shared memory (all threads);
//   2. each warp's mainloop over its own key blocks: a private cp.async ring of kStages K/V tiles
//      (kv_loader.cuh), S = Q K^T on mma.sync, the online softmax in the exp2 domain, O += P V;
//      the only synchronisation is the warp's own (cp.async groups, __syncwarp); with row groups
//      (kernel_traits.cuh) a key group's warps share the ring and a named barrier;
//   3. the merge: every warp's (max, sum, O) through shared memory after one __syncthreads, then
//      the rows normalised and written: to o (and lse) with one split (output.cuh); with several,
//      as fp32 partials and their LSE for the combine kernel (combine_kernel.cuh), or, when the
//      row block's splits are one cluster, merged in it (cluster_merge.cuh).
// An FP8 cache (kKvFp8): Q is stored once in f16 with a power-of-two scale and the head dims in the
// order the K fragments take (load_q_fp8), each step reads its e4m3 K and V from the ring into
// fragments converted in registers (fp8_fragments.cuh), and the merge puts O's permuted columns back;
// the (sequence, KV head)'s K descale and Q's scale scale the scores (with the softmax scale), its V
// descale the output.
#pragma once
#include <math.h>

#include "common/convert.cuh"
#include "common/pdl.cuh"
#include "common/ptx_sm80.cuh"
#include "common/row_lse.cuh"
#include "decode/cluster_merge.cuh"
#include "decode/fp8_fragments.cuh"
#include "decode/kernel_traits.cuh"
#include "decode/kv_loader.cuh"
#include "decode/output.cuh"
#include "decode/params.h"
#include "decode/work.cuh"
#include "sm80/kernel_traits.cuh"

namespace flashtune {
namespace decode {

// One warp's running softmax state over its keys: rows g and g+8 of each m16 tile.
template <class T>
struct WarpState {
  float o[T::kMTiles][T::kOTiles][4];
  float row_max[T::kMTiles][2];  // raw scores
  float row_sum[T::kMTiles][2];  // this thread's partial sum (its quad completes it at the end)
};

// S = Q K^T, mask, online softmax, O += P V for one key block already in shared memory.
template <class T>
__device__ __forceinline__ void warp_step(WarpState<T>& st, uint32_t sK, uint32_t sV, const uint32_t (&q_addr)[4],
                                          const uint32_t (&k_lane)[4], const uint32_t (&v_lane)[4],
                                          const Fp8Lanes<T>& fp8, int block, const Work& w,
                                          const int (&row_pos)[T::kMTiles][2], float scale_log2,
                                          const float (&alibi)[T::kMTiles][2], int lane) {
  using Elem = typename T::MmaElem;
  constexpr int MT = T::kMTiles, BN = T::kBlockN;
  constexpr uint32_t kRowBytes = T::kRowBytes;
  float s[MT][T::kSTiles][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < T::kSTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
  if constexpr (T::kKvFp8) {
    scores_fp8<T>(s, sK, q_addr, fp8);
  } else {
#pragma unroll
    for (int kk = 0; kk < T::kHeadDim / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(a[mt], q_addr[kk % 4] + mt * 16 * kRowBytes + (kk / 4) * 128);
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; nt += 2) {
        uint32_t b[4];
        ldmatrix_x4(b, sK + k_lane[kk % 4] + nt * 8 * kRowBytes + (kk / 4) * 128);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<Elem>(s[mt][nt], a[mt], b[0], b[1]);
          mma_16816<Elem>(s[mt][nt + 1], a[mt], b[2], b[3]);
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
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = w.softcap_out * fast_tanh(s[mt][nt][e] * w.softcap_in);
  }

  if constexpr (T::kAlibi) {  // every block: the row's raw slope (-slope / scale) times the distance to its key
    const int t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = block * BN + key_col<T>(nt, t, e);
          s[mt][nt][e] += alibi[mt][e >> 1] * float(abs(row_pos[mt][e >> 1] + w.causal_shift - col));
        }
  }

  // Masks: keys past the sequence's end (the last block), causal, past a row's position, and
  // with a window, outside the row's window (any block may cross a row's window edge).
  const int t = lane & 3;
  const bool tail = (block + 1) * BN > w.seqlen_k;
  const bool diagonal = T::kCausal && (block + 1) * BN - 1 > w.causal_shift + row_pos[0][0];
  if constexpr (T::kWindow) {  // apart from the plain mask below, which keeps the plain kernels' exact SASS
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = block * BN + key_col<T>(nt, t, e);
          const int diag = row_pos[mt][e >> 1] + w.causal_shift;  // the row's own key
          if (col >= w.seqlen_k || (T::kCausal && col > diag) || (w.window_left >= 0 && col < diag - w.window_left) ||
              (w.window_right >= 0 && col > diag + w.window_right))
            s[mt][nt][e] = -INFINITY;
        }
  } else if (tail || diagonal) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = block * BN + key_col<T>(nt, t, e);
          if (col >= w.seqlen_k || (T::kCausal && col > row_pos[mt][e >> 1] + w.causal_shift))
            s[mt][nt][e] = -INFINITY;
        }
  }

  float alpha[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = st.row_max[mt][r];
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt) m = fmaxf(m, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      const float m_scaled = (m == -INFINITY) ? 0.f : m * scale_log2;
      alpha[mt][r] = fast_exp2(st.row_max[mt][r] * scale_log2 - m_scaled);
      st.row_max[mt][r] = m;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < T::kSTiles; ++nt)
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          s[mt][nt][e] = fast_exp2(fmaf(s[mt][nt][e], scale_log2, -m_scaled));
          sum += s[mt][nt][e];
        }
      st.row_sum[mt][r] = st.row_sum[mt][r] * alpha[mt][r] + sum;
    }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int dt = 0; dt < T::kOTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st.o[mt][dt][e] *= alpha[mt][e >> 1];

#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    uint32_t p[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      p[mt][0] = pack2<Elem>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
      p[mt][1] = pack2<Elem>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
      p[mt][2] = pack2<Elem>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
      p[mt][3] = pack2<Elem>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
    }
    if constexpr (T::kKvFp8) {
      accumulate_pv_fp8<T>(st.o, p, sV, kk, fp8);
    } else {
#pragma unroll
      for (int dt = 0; dt < T::kOTiles; dt += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, sV + v_lane[(dt / 2) % 4] + kk * 16 * kRowBytes + (dt / 8) * 128);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<Elem>(st.o[mt][dt], p[mt], b[0], b[1]);
          mma_16816<Elem>(st.o[mt][dt + 1], p[mt], b[2], b[3]);
        }
      }
    }
  }
}

// kPdl: the combine kernel is launched as this kernel's programmatic dependent (launch.cuh); each
// CTA lets it launch at once, and it waits for this kernel's end before it reads the partials.
// kCluster: built for an arch with thread block clusters; with p.cluster_merge the launcher made
// each row block's splits one cluster, and they merge in it (cluster_merge.cuh), no partials.
template <class T, bool kPdl = false, bool kCluster = false>
__device__ __forceinline__ void split_body(const DecodeParams& p) {
  if constexpr (kPdl) launch_dependents();
  using Elem = typename T::Elem;
  constexpr int D = T::kHeadDim, MT = T::kMTiles, W = T::kWarps, S = T::kStages;
  constexpr int G = T::kRowGroups, KG = T::kKeyGroups, WR = T::kWarpRows;
  constexpr uint32_t kRowBytes = T::kRowBytes;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t sQ = smem_addr(smem_raw);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int key_group = warp / G, row_group = warp % G;  // G == 1: every warp its own keys, all rows
  const uint32_t sRing = sQ + T::kQBytes + key_group * T::kWarpRingBytes;

  Work w = schedule_work<T>(p);
  const int first_row = w.row_block * T::kRows;
  if (first_row >= w.packed_rows) return;  // CTA-uniform: no barrier is skipped

  // ---- 1. Q: packed row r is position (first_row + r) / ratio of head kv_head * ratio + (.. % ratio);
  // with an FP8 cache after the ring's first copies are out (load_q_fp8, below)
  if constexpr (!T::kKvFp8) {
    const Elem* q = static_cast<const Elem*>(p.q) + w.q_offset;
    for (int c = tid; c < T::kRows * T::kChunksPerRow; c += T::kThreads) {
      const int r = c / T::kChunksPerRow, chunk = c % T::kChunksPerRow;
      const int packed = first_row + r;
      const bool ok = packed < w.packed_rows && (T::kDim == D || chunk < T::kDimChunks);  // zeros past kDim
      const int pos = packed / p.head_ratio, head = w.kv_head * p.head_ratio + packed % p.head_ratio;
      const int64_t src = ok ? int64_t(pos) * p.q_row_stride + int64_t(head) * p.q_head_stride + chunk * 8 : 0;
      cp_async_16(sQ + 2 * sm80::swizzled<D>(r, chunk * 8), q + src, ok);
    }
    cp_async_commit();
  }

  // ---- 2. This warp's keys: its key group's blocks block_begin + key_group, + KG, ...
  const int first_block = w.block_begin + key_group;
  const int steps = first_block < w.block_end ? (w.block_end - first_block + KG - 1) / KG : 0;
  KvRows<T> k_rows, v_rows;
  const bool paged = T::kPaging != Paging::kContiguous;
  const int32_t* pages = paged ? p.block_table + int64_t(w.batch) * p.block_table_batch_stride : nullptr;
  k_rows.head_offset = int64_t(w.kv_head) * p.k_head_stride +
                       (paged ? 0 : int64_t(w.cache_batch) * p.k_batch_stride + int64_t(w.leftpad) * p.k_row_stride);
  v_rows.head_offset = int64_t(w.kv_head) * p.v_head_stride +
                       (paged ? 0 : int64_t(w.cache_batch) * p.v_batch_stride + int64_t(w.leftpad) * p.v_row_stride);
  k_rows.row_stride = p.k_row_stride, v_rows.row_stride = p.v_row_stride;
  k_rows.page_stride = p.k_batch_stride, v_rows.page_stride = p.v_batch_stride;
  k_rows.page_size = v_rows.page_size = p.page_size;
  using KvElem = typename T::KvElem;
  const KvElem* k = static_cast<const KvElem*>(p.k);
  const KvElem* v = static_cast<const KvElem*>(p.v);
  auto block_j0 = [&](int step) { return (first_block + step * KG) * T::kBlockN; };
  // The pages of the block the next issue copies, read by the issue before it once its own copies
  // are out: the registers are overwritten in place, so nothing waits for the read until the next
  // issue uses it, a step of math later.
  BlockPages<T> block;
  if (paged && steps > 0) block.read(pages, p.page_size, block_j0(0), w.seqlen_k, lane);
  auto issue = [&](int step) {  // K and V of the warp's step-th block (its share) into slot step % S: one group
    if (step < steps) {
      const int j0 = block_j0(step);
      const uint32_t slot = sRing + (step % S) * 2 * T::kKvTileBytes;
      load_kv_tile<T, G>(slot, k, k_rows, block, j0, w.seqlen_k, lane, row_group);
      load_kv_tile<T, G>(slot + T::kKvTileBytes, v, v_rows, block, j0, w.seqlen_k, lane, row_group);
      if (paged && step + 1 < steps) block.read(pages, p.page_size, block_j0(step + 1), w.seqlen_k, lane);
    }
    cp_async_commit();
  };
  // The ring's first blocks: all S with a warp's own ring; S - 1 with a shared one, whose slot S - 1
  // is filled at the first step (below).
#pragma unroll
  for (int s = 0; s < (G == 1 ? S : S - 1); ++s) issue(s);
  // The scores' scale in the exp2 domain, and the output's: an FP8 cache's descales for this
  // sequence and KV head (k_descale, v_descale: (batch, heads_kv), contiguous), and Q's scale.
  float scale_log2 = p.softmax_scale_log2, scale = p.softmax_scale, out_scale = 1.f;
  if constexpr (T::kKvFp8) {
    const int q_exp = load_q_fp8<T>(p, w, first_row, sQ, reinterpret_cast<float*>(smem_raw + T::kQBytes + T::kAfterQ),
                                    tid);
    const int at = w.batch * p.heads_kv + w.kv_head;
    const float k_scale = ldexpf(p.k_descale[at], -q_exp);
    scale_log2 *= k_scale, scale *= k_scale;
    out_scale = p.v_descale[at];
    if constexpr (T::kSoftcap) w.softcap_in = ldexpf(w.softcap_in, -q_exp), w.softcap_out = ldexpf(w.softcap_out, q_exp);
  }

  // ldmatrix lane addresses (sm80/fwd_kernel.cuh explains the swizzle algebra).
  const int x = lane & 7, hi = lane >> 4, mid = (lane >> 3) & 1, g = lane >> 2;
  uint32_t q_addr[4], k_lane[4], v_lane[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // this warp's rows start at row_group * WR (a multiple of 8: the swizzle's period)
    q_addr[i] = sQ + (row_group * WR + mid * 8 + x) * kRowBytes + (sm80::swizzle_chunk<D>(2 * i + hi, x) << 4);
    k_lane[i] = (hi * 8 + x) * kRowBytes + (sm80::swizzle_chunk<D>(2 * i + mid, x) << 4);
    v_lane[i] = (mid * 8 + x) * kRowBytes + (((2 * i + hi) ^ x) << 4);
  }
  const Fp8Lanes<T> fp8(lane);  // FP8: where the lane's K and V fragments lie in a slot
  int row_pos[MT][2];  // the query position of this thread's rows (causal masks)
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) row_pos[mt][r] = (first_row + row_group * WR + mt * 16 + g + 8 * r) / p.head_ratio;
  float alibi[MT][2];  // ALiBi: each row's slope in raw-score units, -slope / scale (its head's)
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      alibi[mt][r] = 0.f;
      if constexpr (T::kAlibi) {
        const int head = w.kv_head * p.head_ratio + (first_row + row_group * WR + mt * 16 + g + 8 * r) % p.head_ratio;
        alibi[mt][r] = scale > 0.f ? -p.alibi_slopes[w.batch * p.alibi_batch_stride + head] / scale : 0.f;
      }
    }

  WarpState<T> st;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) st.row_max[mt][r] = -INFINITY, st.row_sum[mt][r] = 0.f;
#pragma unroll
    for (int dt = 0; dt < T::kOTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st.o[mt][dt][e] = 0.f;
  }

  cp_async_wait<S - 1>();  // Q landed for this thread (and, with its own ring, the warp's first block; FP8: Q is
                           // stored, the first block landed)
  __syncthreads();         // ... and Q for every thread
  if constexpr (G > 1) {
    // A shared ring: each warp waits for its own share of the step's tile, then the key group's
    // named barrier says every share landed and every warp of the group is done with the slot of
    // the step before, which is refilled at once (FlashAttention-2's order: one barrier a step).
    for (int step = 0; step < steps; ++step) {
      cp_async_wait<S - 2>();
      named_barrier_sync(1 + key_group, 32 * G);
      issue(step + S - 1);
      const uint32_t slot = sRing + (step % S) * 2 * T::kKvTileBytes;
      warp_step<T>(st, slot, slot + T::kKvTileBytes, q_addr, k_lane, v_lane, fp8, first_block + step * KG, w,
                   row_pos, scale_log2, alibi, lane);
    }
    // Key groups' step counts differ by at most one; a group with one step fewer passes its barrier
    // once more, so every warp has passed as many barriers at the __syncthreads below (racecheck
    // orders shared accesses by barrier counts and reported hazards across it without this).
    const int most_steps = (w.block_end - w.block_begin + KG - 1) / KG;
    if (steps < most_steps) named_barrier_sync(1 + key_group, 32 * G);
  } else for (int step = 0; step < steps; ++step) {
    cp_async_wait<S - 1>();  // the step's group landed for this thread
    __syncwarp();            // ... and for the warp
    const uint32_t slot = sRing + (step % S) * 2 * T::kKvTileBytes;
    warp_step<T>(st, slot, slot + T::kKvTileBytes, q_addr, k_lane, v_lane, fp8, first_block + step * KG, w,
                 row_pos, scale_log2, alibi, lane);
    __syncwarp();  // every lane is done with the slot before it is refilled
    issue(step + S);
  }

  // ---- 3. Merge the warps' states: maxima and sums, then O, through shared memory (each warp
  // leaves its WR rows; a row's warps are those of its row group, one per key group).
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with its ring, which the merge's O buffer overlays
  float* merge_o = reinterpret_cast<float*>(smem_raw + T::kQBytes);
  float* merge_max = reinterpret_cast<float*>(smem_raw + T::kQBytes + T::kAfterQ);
  float* merge_sum = merge_max + W * WR;
  const int t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = st.row_sum[mt][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = mt * 16 + g + 8 * r;  // of this warp's rows
      if (t == 0) {
        merge_max[warp * WR + row] = st.row_max[mt][r];
        merge_sum[warp * WR + row] = l;
      }
      if constexpr (T::kKvFp8) {  // O's n-tile 4q + j, column 2t + e is dim 32q + 8t + 4e + j (fp8_fragments.cuh)
        float* dst = merge_o + (warp * WR + row) * T::kMergeRowFloats + 8 * t;
#pragma unroll
        for (int q4 = 0; q4 < T::kOTiles; q4 += 4)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            *reinterpret_cast<float4*>(dst + 8 * q4 + 4 * e) =
                make_float4(st.o[mt][q4][2 * r + e], st.o[mt][q4 + 1][2 * r + e], st.o[mt][q4 + 2][2 * r + e],
                            st.o[mt][q4 + 3][2 * r + e]);
      } else {
        float* dst = merge_o + (warp * WR + row) * T::kMergeRowFloats + 2 * t;
#pragma unroll
        for (int dt = 0; dt < T::kOTiles; ++dt)
          *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(st.o[mt][dt][2 * r], st.o[mt][dt][2 * r + 1]);
      }
    }
  __syncthreads();

  // Each thread finishes 4 columns of one row at a time: cell c = tid + i * kThreads.
  constexpr int kQuads = D / 4, kCells = T::kRows * kQuads;
  constexpr int kItems = (kCells + T::kThreads - 1) / T::kThreads;
  const bool in_cluster = kCluster && p.cluster_merge;
  float4 kept_o[kItems];  // in_cluster: the cells' normalised O and LSE, for cluster_merge
  float kept_lse[kItems];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int c = tid + i * T::kThreads;
    const int row = c / kQuads, col = (c % kQuads) * 4;
    const int packed = first_row + row;
    kept_o[i] = make_float4(0.f, 0.f, 0.f, 0.f), kept_lse[i] = -INFINITY;
    if (c >= kCells || packed >= w.packed_rows || (T::kDim != D && col >= T::kDim)) continue;  // columns past kDim: zeros
    // The row's entry in warp kg * G + (row / WR)'s rows, for key group kg.
    auto at = [&](int kg) { return G == 1 ? kg * WR + row : (kg * G + row / WR) * WR + row % WR; };
    float m = -INFINITY;
#pragma unroll
    for (int kg = 0; kg < KG; ++kg) m = fmaxf(m, merge_max[at(kg)]);
    float l = 0.f;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int kg = 0; kg < KG; ++kg) {
      const float mi = merge_max[at(kg)];
      // A warp that saw no key of this row (max -inf) adds nothing.
      const float f = mi == -INFINITY ? 0.f : fast_exp2((mi - m) * scale_log2);
      l += f * merge_sum[at(kg)];
      const float4 oi = *reinterpret_cast<const float4*>(merge_o + at(kg) * T::kMergeRowFloats + col);
      o.x += f * oi.x, o.y += f * oi.y, o.z += f * oi.z, o.w += f * oi.w;
    }
    float inv = l > 0.f ? out_scale / l : 0.f;
    float lse_sink = 0.f;  // with sinks and one split: the row's LSE, its sink included
    if constexpr (T::kSinks) {
      // One split: the head's sink logit joins the sum, in units of the scaled scores (several
      // splits: the combine adds it once, to the merged LSE).
      if (p.num_splits == 1) {
        const float sink = p.sinks[w.kv_head * p.head_ratio + packed % p.head_ratio];
        const float lse_keys = l > 0.f ? __fmaf_rn(m, scale, logf(l)) : -INFINITY;
        lse_sink = lse_with_sink(lse_keys, sink);
        inv = l > 0.f ? out_scale * expf(lse_keys - lse_sink) / l : 0.f;
        if (lse_sink == -INFINITY) lse_sink = INFINITY;
      }
    }
    o.x *= inv, o.y *= inv, o.z *= inv, o.w *= inv;
    // A split that saw no key of the row weighs nothing in the combine: LSE -inf.
    const float split_lse = l > 0.f ? row_lse(m, scale, l) : -INFINITY;
    if (p.num_splits == 1) {
      store_output<T>(p, w, packed, col, o, T::kSinks ? lse_sink : row_lse(m, scale, l));
    } else if (in_cluster) {
      kept_o[i] = o, kept_lse[i] = split_lse;
    } else {
      const int pos = packed / p.head_ratio, head = w.kv_head * p.head_ratio + packed % p.head_ratio;
      const int64_t at = (int64_t(w.split) * p.total_q + w.row0 + pos) * p.heads_q + head;
      *reinterpret_cast<float4*>(p.o_partial + at * T::kDim + col) = o;
      if (col == 0) p.lse_partial[at] = split_lse;
    }
  }
  if constexpr (kCluster) {
    if (in_cluster) cluster_merge<T>(p, w, first_row, smem_raw, kept_o, kept_lse);  // CTA-uniform
  }
}

}  // namespace decode
}  // namespace flashtune
