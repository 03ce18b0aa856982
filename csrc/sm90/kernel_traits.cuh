// Every size of the sm90-family kernel, derived from its template parameters.
// flashtune/tiles.py mirrors these rules (block_m = 64 x consumer warpgroups, ...).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace flashtune {
namespace sm90 {

template <typename Elem_, int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_, bool kCausal_>
struct Traits {
  using Elem = Elem_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;  // K/V buffers on the mbarrier ring
  static constexpr bool kCausal = kCausal_;

  static constexpr int kConsumers = kBlockM / 64;  // one warpgroup per 64 query rows
  static constexpr int kThreads = 128 * (kConsumers + 1);  // + the producer warpgroup
  static constexpr int kPanels = kHeadDim / 64;  // 128-byte (64-element) column panels (TMA boxes)
  static constexpr int kSRegs = kBlockN / 2;  // accumulators per thread: S is 64 x kBlockN per warpgroup
  static constexpr int kORegs = kHeadDim / 2;

  // Shared memory: Q, then kStages K and kStages V tiles; each tile is kPanels panels of
  // [rows][64] 128B-swizzled, 1024-byte aligned (rows are multiples of 8, so panels stay aligned).
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kPanelBytesQ = kBlockM * 128;
  static constexpr int kPanelBytesKV = kBlockN * 128;
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKVBytes + 1024;  // + alignment slack

  // Register split (setmaxnreg): the producer only issues TMA.
  static constexpr int kProducerRegs = kConsumers == 3 ? 32 : (kConsumers == 2 ? 24 : 56);
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : 240;

  static_assert(sizeof(Elem) == 2, "16-bit elements");
  static_assert(kHeadDim % 64 == 0 && kHeadDim <= 256, "head dim 64, 128 or 256");
  static_assert(kBlockM % 64 == 0 && kConsumers >= 1 && kConsumers <= 3, "block_m = 64, 128 or 192");
  static_assert(kBlockN % 16 == 0 && kBlockN >= 16 && kBlockN <= 256, "block_n: multiple of 16, <= 256");
  static_assert(kStages >= 2 && kStages <= 4, "2 to 4 stages");
  static_assert(kSmemBytes <= 227 * 1024, "over the 227 KB per-block limit");
  // setmaxnreg moves registers within the CTA's pool: what the launch gives every thread
  // (65536 / threads, rounded down to 8). Asking for more makes setmaxnreg.inc wait forever.
  static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <= ((65536 / kThreads) & ~7) * kThreads,
                "register split over the CTA's pool");
};

}  // namespace sm90
}  // namespace flashtune
