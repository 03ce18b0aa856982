// Thin wrappers over the Hopper (sm_90a) PTX the sm90 family is built from: shared-memory
// matrix descriptors, wgmma, TMA bulk tensor loads and stores, mbarriers and named barriers.
// docs/design-sm90.md says how the kernel uses them.
#pragma once
#include <cuda.h>  // CUtensorMap (a plain struct; nothing links against libcuda)
#include <stdint.h>

namespace flashtune {
namespace sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Descriptor of a tile in shared memory written with the 128-byte swizzle (rows of 128 B,
// 8-row atoms of 1024 B) or the 64-byte one (rows of 64 B, atoms of 512 B): bits 62-63 = 1
// selects 128B, 2 selects 64B. The tile must start atom-aligned (base offset 0).
template <int kRowBytes = 128>
__device__ __forceinline__ uint64_t swizzled_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  static_assert(kRowBytes == 128 || kRowBytes == 64, "128B or 64B swizzle");
  uint64_t desc = 0;
  desc |= uint64_t((smem_addr & 0x3FFFF) >> 4);
  desc |= uint64_t((lbo_bytes >> 4) & 0x3FFF) << 16;
  desc |= uint64_t((sbo_bytes >> 4) & 0x3FFF) << 32;
  desc |= uint64_t(kRowBytes == 128 ? 1 : 2) << 62;
  return desc;
}
// A K-major operand (Q, K): LBO is unused; SBO = one 8-row atom between 8-row groups.
// Advance the start address by 32 B per k step (k16 of 16-bit, k32 of FP8).
template <int kRowBytes = 128>
__device__ __forceinline__ uint64_t kmajor_desc(uint32_t smem_addr) {
  return swizzled_desc<kRowBytes>(smem_addr, 16, 8 * kRowBytes);
}
__device__ __forceinline__ uint64_t kmajor_sw128_desc(uint32_t smem_addr) { return kmajor_desc<128>(smem_addr); }
// The same swizzled rows read as an MN-major B operand (V in O += P V: d contiguous, keys
// along K): 8-key groups 1024 B apart; `panel_bytes` between 64-column panels (d > 64).
// Advance the start address by 16 rows x 128 B = 2048 B per k16 step.
__device__ __forceinline__ uint64_t mnmajor_sw128_desc(uint32_t smem_addr, uint32_t panel_bytes) {
  return swizzled_desc<128>(smem_addr, panel_bytes, 1024);
}

// The descriptor of the tile `offset_bytes` on from `desc`'s: the start-address field (bits 0-13,
// the address >> 4) plus offset >> 4, added to the low word alone. Shared memory ends below
// 2^18 B, so the field never carries into LBO; each k step's descriptor is then one add to a
// descriptor built once, not the address masked, shifted and merged again (six uniform-datapath
// instructions per wgmma before). Offsets are multiples of 16 B.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t offset_bytes) {
  const uint32_t lo = uint32_t(desc) + (offset_bytes >> 4), hi = uint32_t(desc >> 32);
  return (uint64_t(hi) << 32) | lo;
}

// Four floats -> one 32-bit register of four e4m3 bytes (byte 0 = x0), rounded to nearest and
// saturated at +-448: an FP8 wgmma A fragment's register (P in FP8 P V). cvt's first source goes
// to the upper byte of each pair.
__device__ __forceinline__ uint32_t pack4_e4m3(float x0, float x1, float x2, float x3) {
  uint32_t packed;
  asm("{\n.reg .b16 lo, hi;\n"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      "mov.b32 %0, {lo, hi};\n}\n"
      : "=r"(packed)
      : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return packed;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Pin registers that an in-flight wgmma reads or writes: without these the compiler may
// move ordinary reads/writes of accumulators or A fragments across wgmma.fence/wait_group
// (CUTLASS's warpgroup_fence_operand). Use right before wgmma_fence and after wgmma_wait.
template <int N>
__device__ __forceinline__ void fence_operands(float (&regs)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(regs[i])::"memory");
}
template <int N, int M>
__device__ __forceinline__ void fence_operands(uint32_t (&regs)[N][M]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < M; ++j) asm volatile("" : "+r"(regs[i][j])::"memory");
}

// ---- mbarrier: one thread inits, everyone waits on a phase bit.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(arrivals));
}
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Arrive and announce how many bytes the TMA copies will deliver to this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, int phase) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_u32(bar)),
      "r"(phase)
      : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// ---- Named barriers (ids 1-15; 0 is __syncthreads): one warpgroup waits on `id` until another
// has arrived there, `threads` counting both sides.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Whether `x` holds for any of the `threads` threads that meet at named barrier `id` (every warp
// of them whole): a vote across warps, e.g. a warpgroup's before a wgmma that only some of its
// warps would want (wgmma is issued by all four warps of a warpgroup or it hangs).
__device__ __forceinline__ bool named_barrier_any(int id, int threads, bool x) {
  uint32_t any;
  asm volatile(
      "{\n\t.reg .pred p, q;\n\tsetp.ne.u32 q, %3, 0;\n\tbar.red.or.pred p, %1, %2, q;\n\tselp.u32 %0, 1, 0, p;\n\t}\n"
      : "=r"(any) : "r"(id), "r"(threads), "r"(uint32_t(x)) : "memory");
  return any != 0;
}

// `x` through an asm the compiler cannot see into: it neither recomputes the value from what it was
// made of nor merges it with an equal one made elsewhere (mainloop.cuh: a barrier id held once, a
// slot address made anew where its first copy would otherwise stay live).
__device__ __forceinline__ uint32_t opaque(uint32_t x) {
  uint32_t y;
  asm volatile("mov.b32 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

// ---- Register reallocation between warpgroups (needs __launch_bounds__(threads, 1)).
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---- TMA: a 4-D box (c0 innermost), completing on `bar`.
__device__ __forceinline__ void tma_load_4d(void* smem, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                            int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::
          "r"(smem_u32(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// ---- TMA: a 5-D box (c0 innermost), completing on `bar` (a KV-cache kernel's packed Q).
__device__ __forceinline__ void tma_load_5d(void* smem, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                            int c2, int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n" ::
          "r"(smem_u32(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}

// ---- TMA: a 2-D box (inner coordinate c0, outer c1) into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load_2d(void* smem, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::
          "r"(smem_u32(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}

// ---- TMA store: a 4-D box from shared memory to global, in this thread's bulk group. Rows
// outside the tensor map's bounds are not written.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* smem, int c0, int c1, int c2,
                                             int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_u32(smem)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
// ---- TMA reduce: a 4-D box from shared memory added (fp32 add) to global, in this thread's bulk
// group. Rows outside the tensor map's bounds are not touched.
__device__ __forceinline__ void tma_reduce_add_4d(const CUtensorMap* map, const void* smem, int c0, int c1, int c2,
                                                  int c3) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(smem_u32(smem)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// This thread's bulk stores have read their shared memory (it may be written again).
__device__ __forceinline__ void bulk_wait_group_read0() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// This thread's bulk operations are complete (their global writes done).
__device__ __forceinline__ void bulk_wait_group0() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Shared-memory writes of this thread become visible to the async proxy (the TMA).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void st_shared_f32(uint32_t addr, float x) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(x) : "memory");
}
__device__ __forceinline__ void st_shared_f32x2(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}
// Two adjacent floats from shared memory (an LDS.64: a generic load of a shared address waits on
// the L1TEX scoreboard, far longer).
__device__ __forceinline__ float2 ld_shared_f32x2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}
// Four 8x8 16-bit matrices from mma accumulator fragments (register i: matrix i's row lane / 4,
// columns 2 (lane % 4), +1) to shared memory; lane l gives the address of row l % 8 of matrix
// l / 8 (16 contiguous bytes): a warp stores 512 bytes in one instruction.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

}  // namespace sm90
}  // namespace flashtune
