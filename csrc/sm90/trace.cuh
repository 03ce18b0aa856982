// A timeline of each CTA's tiles, for finding where a short sequence's time goes
// (tools/tile_trace.py). Compiled in only with -DFLASHTUNE_SM90_TRACE=1 (an experiment profile,
// tools/experiments/exp-sm90-trace.yaml); by default every mark is empty and nothing is defined.
// One thread of each role stamps clock64() at a tile's steps: the producer and thread 0 of each
// consumer warpgroup, for the first kTraceTiles tiles of each of the first kTraceCtas CTAs.
#pragma once
#include <stdint.h>

#ifndef FLASHTUNE_SM90_TRACE
#define FLASHTUNE_SM90_TRACE 0
#endif
// A diagnostic only, for timing the epilogue without O's stores: the kernel then writes no O
// (its results are wrong). Never in a profile that serves calls.
#ifndef FLASHTUNE_SM90_TRACE_SKIP_O
#define FLASHTUNE_SM90_TRACE_SKIP_O 0
#endif

namespace flashtune {
namespace sm90 {

// The steps, in the order a tile passes them. Consumer steps are per warpgroup:
// kTraceConsumer0 + kTraceConsumerSteps * cw + step.
enum TraceStep : int {
  kTraceTileIndex = 0,  // the tile's index (a value, not a time), written by the producer
  kTraceQIssued,        // producer: Q's load issued (its buffer was free)
  kTraceKvIssued,       // producer: the tile's last K/V block issued
  kTraceConsumer0,
};
enum TraceConsumerStep : int {
  kTraceQLanded = 0,  // the tile's Q (and its Tile) arrived
  kTraceK0Landed,     // K_0 arrived
  kTraceTurn,         // S_0 issued (in this warpgroup's pingpong turn)
  kTraceS0Done,       // S_0 complete
  kTraceLastPvDone,   // the last P V complete
  kTraceEpilogueReady,  // the tile looked up again (and, for the TMA store, sO free again)
  kTraceOWritten,     // O in sO (TMA store) or its global stores issued, and the LSE's
  kTraceStored,       // the epilogue done (the TMA store issued)
  kTraceConsumerSteps,
};
constexpr bool kTraceSkipO = FLASHTUNE_SM90_TRACE_SKIP_O != 0;
constexpr int kTraceCtas = 132, kTraceTiles = 64, kTraceSteps = kTraceConsumer0 + 3 * kTraceConsumerSteps;

#if FLASHTUNE_SM90_TRACE
// [cta][tile of that CTA][step]; and per CTA (globaltimer, clock64) at its start and its end,
// which give the SM clock's rate.
__device__ long long flashtune_trace[kTraceCtas][kTraceTiles][kTraceSteps];
__device__ long long flashtune_trace_clock[kTraceCtas][4];

__device__ __forceinline__ long long global_ns() {
  long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}
__device__ __forceinline__ void trace_mark(int tile, int step, long long value) {
  if (blockIdx.x < kTraceCtas && tile < kTraceTiles) flashtune_trace[blockIdx.x][tile][step] = value;
}
__device__ __forceinline__ void trace_clock(int at) {  // at 0: the CTA's start, 2: its end
  if (blockIdx.x < kTraceCtas) {
    flashtune_trace_clock[blockIdx.x][at] = global_ns();
    flashtune_trace_clock[blockIdx.x][at + 1] = clock64();
  }
}
#define FT_TRACE(tile, step) ::flashtune::sm90::trace_mark(tile, step, clock64())
#define FT_TRACE_VALUE(tile, step, value) ::flashtune::sm90::trace_mark(tile, step, value)
#define FT_TRACE_CLOCK(at) ::flashtune::sm90::trace_clock(at)
#else
#define FT_TRACE(tile, step)
#define FT_TRACE_VALUE(tile, step, value)
#define FT_TRACE_CLOCK(at)
#endif

}  // namespace sm90
}  // namespace flashtune

#if FLASHTUNE_SM90_TRACE
// Host side, one per kernel library (ctypes finds them by name): clear before a call, copy
// after it. Both return a cudaError_t value.
extern "C" int flashtune_trace_clear() {  // -1 everywhere: not reached (a CTA that did not run, a step not taken)
  void *steps = nullptr, *clocks = nullptr;
  cudaError_t err = cudaGetSymbolAddress(&steps, flashtune::sm90::flashtune_trace);
  if (err == cudaSuccess) err = cudaGetSymbolAddress(&clocks, flashtune::sm90::flashtune_trace_clock);
  if (err == cudaSuccess) err = cudaMemset(steps, 0xff, sizeof(flashtune::sm90::flashtune_trace));
  if (err == cudaSuccess) err = cudaMemset(clocks, 0xff, sizeof(flashtune::sm90::flashtune_trace_clock));
  return int(err);
}
extern "C" int flashtune_trace_copy(long long* steps, long long* clocks) {
  cudaError_t err = cudaMemcpyFromSymbol(steps, flashtune::sm90::flashtune_trace, sizeof(flashtune::sm90::flashtune_trace));
  if (err == cudaSuccess)
    err = cudaMemcpyFromSymbol(clocks, flashtune::sm90::flashtune_trace_clock,
                               sizeof(flashtune::sm90::flashtune_trace_clock));
  return int(err);
}
#endif
