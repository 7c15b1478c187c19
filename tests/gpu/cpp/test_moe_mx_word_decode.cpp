// The lean MXFP4 decode (decode_mx_word, cuda/moe/sm80/experts_quant_tile.cuh: four bf16 pairs of
// a 32-bit word from two shared selects) against the per-pair decode of the default kernels
// (decode_pair), on the device for every one of the 2^32 words: the lean streaming kernel is bit
// for bit the default only if these agree everywhere. Compiled by nvcc (a kernel); skips without
// a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "cuda/moe/sm80/experts_quant_tile.cuh"
#include "device_backends.h"

namespace deepinfer::backend_ops {
namespace {

using cuda::QuantFormat;

// Counts the words of [0, 2^32) (grid-stride) whose four pairs differ between the two decodes;
// `first` keeps the smallest such word.
__global__ void count_decode_mismatches(unsigned long long* mismatches, uint32_t* first) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  unsigned long long local = 0;
  for (uint64_t w = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       w < (uint64_t{1} << 32); w += stride) {
    const uint32_t r = static_cast<uint32_t>(w);
    uint32_t lean[4];
    cuda::quant_tile::decode_mx_word(r, lean);
    const uint4 raw = make_uint4(r, 0u, 0u, 0u);
    bool differ = false;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      differ = differ || lean[p] != cuda::quant_tile::decode_pair<QuantFormat::kMxfp4>(raw, p);
    }
    if (differ) {
      ++local;
      atomicMin(first, r);
    }
  }
  if (local != 0) atomicAdd(mismatches, local);
}

TEST(MoeMxWordDecode, AgreesWithThePerPairDecodeOnEveryWord) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    if (device_required()) FAIL() << "no CUDA device";
    GTEST_SKIP() << "no CUDA device";
  }
  unsigned long long* mismatches = nullptr;
  uint32_t* first = nullptr;
  ASSERT_EQ(cudaMalloc(&mismatches, sizeof(*mismatches)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&first, sizeof(*first)), cudaSuccess);
  ASSERT_EQ(cudaMemset(mismatches, 0, sizeof(*mismatches)), cudaSuccess);
  ASSERT_EQ(cudaMemset(first, 0xff, sizeof(*first)), cudaSuccess);
  count_decode_mismatches<<<4096, 256>>>(mismatches, first);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  unsigned long long host_mismatches = 0;
  uint32_t host_first = 0;
  ASSERT_EQ(
      cudaMemcpy(&host_mismatches, mismatches, sizeof(host_mismatches), cudaMemcpyDeviceToHost),
      cudaSuccess);
  ASSERT_EQ(cudaMemcpy(&host_first, first, sizeof(host_first), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(cudaFree(mismatches), cudaSuccess);
  EXPECT_EQ(cudaFree(first), cudaSuccess);
  EXPECT_EQ(host_mismatches, 0u) << "words whose decoded pairs differ; the first: 0x" << std::hex
                                 << host_first;
}

}  // namespace
}  // namespace deepinfer::backend_ops
