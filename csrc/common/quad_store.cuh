// 16-bit rows out of mma / wgmma accumulators in whole 32-byte sectors. In both layouts thread t of
// a quad (t = lane % 4) holds columns 2t and 2t+1 of each n8 group of its row: stored as they lie,
// a quad writes 4 bytes a thread, 16 of each sector's 32, and a warp's stores cost twice the
// sectors (Nsight Compute on the Hopper backward's dK/dV: 47% excessive sectors, 11% of stall
// samples). Two shuffles trade the pairs of two adjacent groups so that thread t holds columns
// 4t..4t+3 of the 16: the quad then writes one whole sector, 8 bytes a thread.
#pragma once
#include <cstdint>

namespace flashtune {

// Columns 4t..4t+3 of a 16-column chunk from this row's pairs of its two n8 groups (group0: columns
// 0-7, group1: 8-15), packed two 16-bit values a word. Every lane of the warp must call it.
__device__ __forceinline__ uint2 quad_chunk_of_16(uint32_t group0, uint32_t group1, int lane) {
  const int t = lane & 3;
  // Round 1 brings a pair from thread [0, 2, 1, 3][t], round 2 from [1, 3, 0, 2][t]; an odd thread
  // sends its second group's pair first.
  const int from = (lane & ~3) | ((t & 1) << 1 | t >> 1);
  const uint32_t r1 = __shfl_sync(0xffffffffu, t & 1 ? group1 : group0, from);
  const uint32_t r2 = __shfl_sync(0xffffffffu, t & 1 ? group0 : group1, from ^ 1);
  return t >= 2 ? make_uint2(r2, r1) : make_uint2(r1, r2);
}

}  // namespace flashtune
