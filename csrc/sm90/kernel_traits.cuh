// Every size of an sm90-family kernel, derived from its template parameters: the tile (head dim,
// block_m x block_n, ring stages), the dtypes, causal, and the Schedule it runs (below). The
// Python side mirrors the sizes in flashtune/kernels/tiles.py and the schedule's defaults and rules in
// flashtune/kernels/schedule.py; the static_asserts here hold both to the kernel.
#pragma once
#include "common/variants.h"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

namespace flashtune {
namespace sm90 {

// The schedule: which of the family's measured steps a kernel takes (docs/design-sm90.md gives
// each one's gain). A kernel's generated source defines one as a struct of static constexpr bools
// named as here, from its KernelSpec's Schedule; the kernel's name spells every field that differs
// from the family's default for its tile, so a name determines its code.
//   overlap       the softmax of S_j runs while P_(j-1) V_(j-1) is on the tensor cores
//   pingpong      the consumer warpgroups take turns issuing their wgmmas (2-3 consumers)
//   persistent    one CTA per SM loops over the tiles (causal and varlen ones from a counter)
//   lazy_rescale  a row keeps its running maximum until a block's exceeds it by more than 2^8
//   spec_max      from block 1 on, a block's exps are taken against the maxima as they stand;
//                 S is computed again in a block that moves one, and the tile takes the full
//                 step from then on
//   tma_store     O is staged in shared memory (stmatrix) and stored by the TMA; else each thread
//                 stores 16-byte chunks (and varlen calls always do)
//   defer         a tile's epilogue runs under the next tile's S_0 (brings a second Q buffer)
//   flat          a tile's last P V goes with the next tile's S_0 instead of alone (needs defer)

// Elem: V, P and O (16-bit). Fp8Qk: Q and K are e4m3 and S = Q K^T runs on FP8 wgmma (k32).
// KvCache: a prefill kernel (kNone), or one that reads a KV cache (decode's entry point, from few
// query tokens to chunked prefill): the query rows of one KV head packed as position x head in
// group, keys up to each sequence's cache_seqlens, split across CTAs (decode's combine merges).
enum class KvCache : int { kNone = 0, kContiguous = 1, kPages = 2 };

// Narrow: q/k and v/o narrower than kHeadDim (params.h: head_dim_qk, head_dim_v), read by the TMA
// with the columns past their head dims zero-filled in shared memory (zero q.k terms, zero O
// columns) and O stored up to v's (the TMA store clips; direct stores skip the chunks past it).
// Fp8Pv (with Fp8Qk): O += P V on FP8 wgmma too, P packed to e4m3 from S's registers and V read as
// V^T [head dim][keys], K-major (FP8 wgmma has no transpose), which the launcher lays out first with
// each 32 keys permuted to match P's registers (sm90/v_transpose.cuh); O stays 16-bit.
// kHeadDimV: V's and O's head dim where it is below Q/K's (DeepSeek's MLA prefill: 192/128), so that
// P V multiplies only V's columns and O holds only its own (0: Q/K's).
template <typename Elem_, int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_, bool kCausal_, bool kFp8Qk_,
          class Schedule_, class Variants_ = Variants<>, KvCache kKvCache_ = KvCache::kNone, bool kNarrow_ = false,
          bool kFp8Pv_ = false, int kHeadDimV_ = 0>
struct Traits {
  using Elem = Elem_;
  static constexpr bool kFp8Pv = kFp8Pv_;
  using PVElem = std::conditional_t<kFp8Pv_, __nv_fp8_e4m3, Elem_>;
  static constexpr bool kNarrow = kNarrow_;
  static constexpr KvCache kKvCache = kKvCache_;
  static constexpr bool kCache = kKvCache != KvCache::kNone;
  static constexpr bool kPaged = kKvCache == KvCache::kPages;
  static constexpr bool kSoftcap = Variants_::softcap;  // common/variants.h
  static constexpr bool kWindow = Variants_::window;
  static constexpr bool kSinks = Variants_::sinks;
  static constexpr bool kAlibi = Variants_::alibi;
  using Schedule = Schedule_;
  using QKElem = std::conditional_t<kFp8Qk_, __nv_fp8_e4m3, Elem>;
  static constexpr bool kFp8Qk = kFp8Qk_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_ ? kHeadDimV_ : kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  // Buffers on each of the K and V mbarrier rings.
  static constexpr int kStages = kStages_;
  static constexpr bool kCausal = kCausal_;
  static constexpr int kSmemLimit = 227 * 1024;  // per block, opt-in (sm_90)

  static constexpr bool kOverlap = Schedule::overlap;
  static constexpr bool kPingpong = Schedule::pingpong;
  static constexpr bool kPersistent = Schedule::persistent;
  static constexpr bool kLazyRescale = Schedule::lazy_rescale;
  static constexpr bool kSpecMax = Schedule::spec_max;
  static constexpr bool kTmaStore = Schedule::tma_store;
  static constexpr bool kDeferEpilogue = Schedule::defer;
  static constexpr bool kFlatTiles = Schedule::flat;
  static constexpr float kRescaleLog2 = 8.f;  // lazy: rescale once the maximum grew by more than 2^8

  static constexpr int kConsumers = kBlockM / 64;  // one warpgroup per 64 query rows
  static constexpr int kThreads = 128 * (kConsumers + 1);  // + the producer warpgroup
  static constexpr int kSRegs = kBlockN / 2;  // accumulators per thread: S is 64 x kBlockN per warpgroup
  static constexpr int kORegs = kHeadDimV / 2;

  // Tiles are column panels of [rows][row bytes], swizzled by the TMA as wgmma reads them:
  // 128-byte rows (128B swizzle), or 64-byte rows for an FP8 head dim of 64 (64B swizzle).
  static constexpr int kQKElemBytes = int(sizeof(QKElem));
  static constexpr int kQKRowBytes = kHeadDim * kQKElemBytes < 128 ? kHeadDim * kQKElemBytes : 128;
  static constexpr int kQKPanels = kHeadDim * kQKElemBytes / kQKRowBytes;
  static constexpr int kQKBoxCols = kQKRowBytes / kQKElemBytes;  // elements per TMA box row
  static constexpr int kKSteps = kHeadDim * kQKElemBytes / 32;   // wgmma k16 (16-bit) or k32 (FP8): 32 bytes
  // V: 16-bit, panels of 64 head-dim columns x kBlockN keys (MN-major for P V); FP8, V^T: panels of
  // kVtRowBytes keys x kHeadDim rows (K-major), 128B-swizzled where block_n allows, else 64B.
  static constexpr int kVtRowBytes = kBlockN % 128 == 0 ? 128 : 64;
  static constexpr int kVPanels = kFp8Pv ? kBlockN / kVtRowBytes : kHeadDimV / 64;
  static constexpr int kVBoxCols = kFp8Pv ? kVtRowBytes : 64;   // elements per TMA box row
  static constexpr int kPvSteps = kFp8Pv ? kBlockN / 32 : kBlockN / 16;  // P V's wgmma k steps (k32 or k16)

  // Shared memory: kQBuffers Q tiles, then kStages K and kStages V tiles, each 1024-byte aligned
  // (rows are multiples of 16, so every panel stays aligned for its swizzle), then the O tile of
  // the TMA store. A deferred epilogue needs the next tile's Q early: a second Q buffer.
  static constexpr int kQBytes = kBlockM * kHeadDim * kQKElemBytes;
  static constexpr int kKBytes = kBlockN * kHeadDim * kQKElemBytes;
  static constexpr int kVBytes = kBlockN * kHeadDimV * int(sizeof(PVElem));
  static constexpr int kPanelBytesQ = kBlockM * kQKRowBytes;
  static constexpr int kPanelBytesK = kBlockN * kQKRowBytes;
  static constexpr int kPanelBytesV = kFp8Pv ? kHeadDim * kVtRowBytes : kBlockN * 128;
  static constexpr int kOBytes = kBlockM * kHeadDimV * 2;  // O staged as 64-column panels of [rows][128 B]
  static constexpr int kPanelBytesO = kBlockM * 128;
  static constexpr int kRingBytes = kStages * (kKBytes + kVBytes) + 1024;  // + alignment slack
  static constexpr int kQBuffers = kDeferEpilogue ? 2 : 1;
  static constexpr int kSmemBytes = kQBuffers * kQBytes + kRingBytes + (kTmaStore ? kOBytes : 0);

  // Register split (setmaxnreg): the producer issues TMA and walks the tiles; with 2 consumers
  // it keeps 40 (FA3's 24 spills our persistent tile loop), the consumers 232.
  static constexpr int kProducerRegs = kConsumers == 3 ? 32 : (kConsumers == 2 ? 40 : 56);
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : (kConsumers == 2 ? 232 : 240);

  static_assert(sizeof(Elem) == 2, "16-bit V, P and O");
  static_assert(kQKRowBytes == 128 || kQKRowBytes == 64, "Q/K rows of 64 or 128 bytes per swizzle panel");
  static_assert(kKBytes % 1024 == 0 && kQBytes % 1024 == 0 && kVBytes % 1024 == 0, "tiles stay 1024-byte aligned");
  static_assert(kHeadDim % 64 == 0 && kHeadDim <= 256, "head dim 64, 128, 192 or 256");
  static_assert(kHeadDim * kQKElemBytes % kQKRowBytes == 0, "Q/K rows of whole swizzle panels (no FP8 at 192)");
  static_assert(kBlockM % 64 == 0 && kConsumers >= 1 && kConsumers <= 3, "block_m = 64, 128 or 192");
  static_assert(kBlockN % 16 == 0 && kBlockN >= 16 && kBlockN <= 256, "block_n: multiple of 16, <= 256");
  static_assert(kStages >= 1 && kStages <= 4, "1 to 4 stages");
  static_assert(kSmemBytes <= kSmemLimit, "over the 227 KB per-block limit (a second Q or the O tile that does not fit)");
  // The schedule's rules (flashtune/kernels/schedule.py says each in words).
  static_assert(!kPingpong || (kOverlap && kConsumers > 1), "pingpong: 2-3 consumer warpgroups, with the overlap");
  static_assert(!kSpecMax || (kOverlap && kLazyRescale), "spec_max: with the overlap and lazy rescaling");
  static_assert(!kDeferEpilogue || (kOverlap && kPersistent), "defer: with the overlap, on the persistent grid");
  static_assert(!kFlatTiles || kDeferEpilogue, "flat: with the deferred epilogue");
  // A KV-cache kernel: one tile per CTA (grid: splits x row blocks, KV heads, sequences), direct
  // stores (a packed row's place is its head's), the overlap's schedule (mainloop.cuh's
  // last_pv_alone zeroes the cache's rows past a sequence's end there), and no per-head variant.
  static_assert(!kCache || (kOverlap && !kPersistent && !kTmaStore && !kDeferEpilogue && !kFp8Qk),
                "a KV-cache kernel: overlap, one tile per CTA, direct stores, 16-bit");
  static_assert(!kCache || (!kSinks && !kAlibi && !kWindow && !kSoftcap), "a KV-cache kernel has no variant yet");
  static_assert(!kNarrow || (!kCache && !kFp8Qk), "narrow: a 16-bit prefill kernel");
  static_assert(!kFp8Pv || (kFp8Qk && !kCache && kBlockN % 64 == 0),
                "FP8 P V: with FP8 Q/K, a prefill kernel, block_n a multiple of 64 (V^T's swizzle panels)");
  // P is packed to e4m3 as it stands: lazy rescaling lets it reach 2^kRescaleLog2, which must stay
  // within e4m3's largest finite value (448), or P would saturate.
  static_assert(!kFp8Pv || kRescaleLog2 <= 8.f, "FP8 P V: P up to 2^kRescaleLog2 must fit e4m3 (448)");
  static_assert(kHeadDimV == kHeadDim || (kHeadDimV % 64 == 0 && kHeadDimV < kHeadDim && !kCache && !kFp8Qk),
                "a V head dim of its own: whole 64-column panels below Q/K's, a 16-bit prefill kernel");
  // setmaxnreg moves registers within the CTA's pool: what the launch gives every thread
  // (65536 / threads, rounded down to 8). Asking for more makes setmaxnreg.inc wait forever.
  static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <= ((65536 / kThreads) & ~7) * kThreads,
                "register split over the CTA's pool");
};

}  // namespace sm90
}  // namespace flashtune
