// Every size of the decode kernel, derived from its template parameters.
// flashtune/kernels/decode_spec.py mirrors these rules so impossible configs never reach nvcc.
//
// The decode kernel packs the query rows that share a KV head (GQA: head_ratio heads x seqlen_q
// positions) into kRows rows of one tile, so each K/V byte is read once per KV head, and gives
// each warp its own keys (kBlockN per step, warp w taking steps w, w + kWarps, ...) with its own
// cp.async ring: a warp never waits for another until the end, where their partial softmax
// states are merged through shared memory.
//
// Row groups: where a warp cannot hold the O accumulators of all kRows rows (32 rows at hdim 256),
// the CTA's warps form kRowGroups groups of kWarpRows rows each, and the kRowGroups warps of one
// key group (warps kg * kRowGroups + rg) share one ring: each copies a share of every tile, a named
// barrier of those warps tells them the tile landed and that the slot before it is free, and each
// computes its own rows against it. The keys are then read once per KV head for 32 rows, where two
// 16-row CTAs read them twice.
//
// A head dim other than 64, 128 or 256 (any multiple of 8 from 32 to 256) is computed at the next
// of those (kHeadDim): its rows in shared memory are zero beyond kDim, so the MMAs and the
// swizzle are the built sizes' own, while global memory is read and written at kDim only (the
// cache's bytes, which bound decode, are the head dim's).
//
// With kKvFp8 the cache holds e4m3 keys and values (one byte each, a descale per sequence and KV
// head): the ring holds the bytes as they are in memory, which the warps read into MMA fragments
// and convert in registers (fp8_fragments.cuh); the MMAs run in f16 (MmaElem), Q converted once
// (exactly, with a power-of-two scale), P in f16.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <type_traits>

#include "common/variants.h"

namespace flashtune {
namespace decode {

// How a key row's address is found.
enum class Paging : int {
  kContiguous = 0,  // (batch, capacity, heads_kv, hdim), rows at a stride
  kPages = 1,       // pages of a multiple of kBlockN rows: one block_table lookup per tile
  kGather = 2,      // any page size: one lookup per row
};

template <typename Elem_, int kDim_, int kRows_, int kBlockN_, int kWarps_, int kStages_, Paging kPaging_,
          bool kCausal_, bool kKvFp8_ = false, class Variants_ = Variants<>>
struct Traits {
  static constexpr bool kSoftcap = Variants_::softcap;  // S = cap * tanh(S / cap), scaled scores
  static constexpr bool kWindow = Variants_::window;    // keys outside [i - left, i + right] masked, skipped
  static constexpr bool kSinks = Variants_::sinks;      // exp(sink of the head) joins each row's sum
  static constexpr bool kAlibi = Variants_::alibi;      // -slope * |i' - j| added to the scores
  using Elem = Elem_;  // q, o and what the MMAs take
  static constexpr bool kKvFp8 = kKvFp8_;
  using KvElem = std::conditional_t<kKvFp8, uint8_t, Elem>;  // the cache's element (e4m3 bytes)
  using MmaElem = std::conditional_t<kKvFp8, __half, Elem>;   // Q, K, P and V as the MMAs take them
  static constexpr int kDim = kDim_;  // the head dim of q, the cache and o
  static constexpr int kHeadDim = kDim <= 64 ? 64 : kDim <= 128 ? 128 : 256;  // computed at
  static constexpr int kRows = kRows_;      // packed query rows per CTA (heads x positions)
  static constexpr int kBlockN = kBlockN_;  // keys per warp step
  static constexpr int kWarps = kWarps_;
  static constexpr int kStages = kStages_;  // K/V tiles in each warp's ring
  static constexpr Paging kPaging = kPaging_;
  static constexpr bool kCausal = kCausal_;  // bottom-right aligned, per packed row's position

  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpRows = kHeadDim > 128 ? 16 : kRows;  // rows a warp computes: 16 at hdim 256
  static constexpr int kRowGroups = kRows / kWarpRows;  // warps sharing each key group's ring
  static constexpr int kKeyGroups = kWarps / kRowGroups;  // rings: warp w walks key group w / kRowGroups
  static constexpr int kMTiles = kWarpRows / 16;    // m16 MMA tiles of a warp
  static constexpr int kSTiles = kBlockN / 8;       // n8 tiles of S per m tile
  static constexpr int kOTiles = kHeadDim / 8;      // n8 tiles of O per m tile
  static constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks of a row
  static constexpr int kRowBytes = kHeadDim * 2;

  static constexpr int kKvRowBytes = kHeadDim * int(sizeof(KvElem));  // a cache row
  static constexpr int kKvChunksPerRow = kKvRowBytes / 16;
  static constexpr int kDimChunks = kDim / 8;  // 16-byte chunks of a q or o row in global memory
  static constexpr int kKvDimChunks = kDim * int(sizeof(KvElem)) / 16;  // ... of a cache row
  static constexpr int kKvChunkElems = 16 / int(sizeof(KvElem));

  static constexpr int kQBytes = kRows * kRowBytes;
  static constexpr int kTileBytes = kBlockN * kRowBytes;            // one 16-bit K or V tile
  static constexpr int kKvTileBytes = kBlockN * kKvRowBytes;        // one as the cache holds it
  static constexpr int kWarpRingBytes = kStages * 2 * kKvTileBytes;  // K and V per stage
  static constexpr int kRingBytes = kKeyGroups * kWarpRingBytes;
  // The merge: each warp's O of its rows (fp32, rows padded against bank conflicts: 8 floats for
  // the 16-bit path's 8-byte stores, 4 for the FP8 path's 16-byte ones) over the idle rings, then
  // the rows' maxima and sums per warp after it.
  static constexpr int kMergeRowFloats = kHeadDim + (kKvFp8 ? 4 : 8);
  static constexpr int kMergeOBytes = kWarps * kWarpRows * kMergeRowFloats * 4;
  static constexpr int kMergeStatBytes = 2 * kWarps * kWarpRows * 4;
  static constexpr int kAfterQ = kRingBytes > kMergeOBytes ? kRingBytes : kMergeOBytes;
  static constexpr int kSmemBytes = kQBytes + kAfterQ + kMergeStatBytes;

  static_assert(sizeof(Elem) == 2, "16-bit elements");
  static_assert(kDim % 8 == 0 && kDim >= 32 && kDim <= 256, "head dim: a multiple of 8 from 32 to 256");
  static_assert(!kKvFp8 || kDim % 16 == 0, "an e4m3 cache's rows are whole 16-byte chunks: head dim % 16 == 0");
  static_assert(kRows == 16 || kRows == 32, "16 or 32 packed rows");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 64, "kBlockN: 16, 32, 48 or 64 keys");
  static_assert(kStages >= 2 && kStages <= 8, "2 to 8 stages per warp");
  static_assert(kWarps == 2 || kWarps == 4 || kWarps == 8, "2, 4 or 8 warps");
  static_assert((kBlockN * kKvChunksPerRow) % 32 == 0, "a warp loads its tiles in whole passes");
  static_assert(kMTiles * (kHeadDim + kBlockN) / 2 <= 192, "O and S accumulators fit in registers");
  static_assert(kWarps % kRowGroups == 0, "whole key groups of kRowGroups warps");
  static_assert(kRowGroups == 1 || !kKvFp8, "row groups read 16-bit caches (an e4m3 cache's 16 rows fit a warp)");
};

}  // namespace decode
}  // namespace flashtune
