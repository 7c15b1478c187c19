// Programmatic dependent launch (sm_90+; elsewhere each call is nothing). A kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization (launch_programmatic, launch_clustered) may
// start before the kernel launched ahead of it on the stream has finished, as soon as every block
// of that one has called let_dependents_launch (or exited). Its blocks are then resident while
// the previous grid drains, and what needs nothing of earlier kernels (weights, constants) can be
// read before the wait. In a decode step of ~150 short kernels that hides the launch and the
// first memory round trip of each one behind the one before it.
#pragma once

namespace deepinfer::cuda {

// Lets the grid launched after this one start before this grid ends.
__device__ __forceinline__ void let_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Waits until the grid this one was launched after has completed and its writes are visible (at
// once when this grid was an ordinary launch).
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// The start of a kernel that the backend may launch as a programmatic dependent (its `pdl`
// launches): the wait, then the next grid's launch. Call it before any read of another kernel's
// output, any global write and any early return. A grid none of whose blocks waited could finish
// before its predecessor, and a dependent of it, which waits for this grid only, would then read
// that predecessor's output too early; work done ahead of it may only read what no kernel of the
// stream writes.
__device__ __forceinline__ void enter_dependent_grid() {
  wait_for_previous_grid();
  let_dependents_launch();
}

}  // namespace deepinfer::cuda
