// Programmatic dependent launch (sm_90 and newer): a kernel launched with the programmatic
// stream-serialization attribute (launch.cuh) may start before the kernel ahead of it in the stream
// has finished, once every CTA of that kernel has called launch_dependents() (or exited); it must
// call grid_dependency_wait() before it reads what that kernel writes, which returns once that
// kernel has finished and its writes are visible. What it saves is the dependent's launch latency,
// a few microseconds, which is much of a short decode call. Compiled for an arch without it, both
// are no-ops, and launch.cuh does not set the attribute.
#pragma once

namespace flashtune {

__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace flashtune
