// DEEPINFER_HOST_DEVICE marks a function that host C++ and CUDA device code both call: one
// definition, compiled for both sides by nvcc and as plain C++ by the host compiler.
#pragma once

#if defined(__CUDACC__)
#define DEEPINFER_HOST_DEVICE __host__ __device__
#else
#define DEEPINFER_HOST_DEVICE
#endif
