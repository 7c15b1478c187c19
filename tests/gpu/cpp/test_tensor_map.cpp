// The tensor maps of the routed experts' tensor copies (cuda/common/tensor_map.h) on this device:
// the driver's encoder is found through the runtime and builds maps of byte matrices, rejects a
// row pitch the tensor memory accelerator cannot take, and the backend uploads a table of maps
// once per key, 64-byte aligned, and keeps "none" as well. Whether the expert kernels that read
// the maps give the right bits is tests/gpu/cpp/test_moe_quant_decode.cpp's (the lean kernel
// against the streaming one) and the op table's. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/tensor_map.h"
#include "cuda_test.h"
#include "deepinfer/backend.h"

namespace deepinfer::backend_ops {
namespace {

using TensorMaps = CudaTest;

TEST_F(TensorMaps, TheDeviceEncodesByteMatrixMapsAndTheBackendKeepsThem) {
  Backend* be = &gpu();
  auto& cuda_be = dynamic_cast<cuda::CudaBackend&>(*be);
  // Two matrices of 256 rows of 64 bytes (one MXFP4 slice of a row each), boxes of 64 x 64.
  const Tensor bytes = be->empty({2 * 256 * 64}, DType::kU8);
  const auto* base = static_cast<const uint8_t*>(bytes.raw_data());
  const std::vector<cuda::ByteMatrix> matrices = {{base, 256, 64}, {base + 256 * 64, 256, 64}};
  const std::vector<CUtensorMap> maps = cuda::encode_byte_matrix_maps(matrices, 64, 64);
  ASSERT_EQ(maps.size(), 2u) << "cuTensorMapEncodeTiled was not found or rejected the maps";
  // A row pitch that is not a multiple of 16 bytes: no maps (the kernels copy without them).
  const std::vector<cuda::ByteMatrix> odd = {{base, 256, 24}};
  EXPECT_TRUE(cuda::encode_byte_matrix_maps(odd, 16, 64).empty());

  // Keys no weight table has (tables key by a device address first).
  int encodes = 0;
  const void* table = cuda_be.tensor_map_table({-1, 256, 64}, [&] {
    ++encodes;
    return maps;
  });
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(table) % 64, 0u);
  be->synchronize();
  std::vector<CUtensorMap> back(2);
  ASSERT_EQ(cudaMemcpy(back.data(), table, 2 * sizeof(CUtensorMap), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(std::memcmp(back.data(), maps.data(), 2 * sizeof(CUtensorMap)), 0);
  EXPECT_EQ(cuda_be.tensor_map_table({-1, 256, 64},
                                     [&] {
                                       ++encodes;
                                       return maps;
                                     }),
            table);
  EXPECT_EQ(encodes, 1) << "the table is built once per key";
  EXPECT_EQ(cuda_be.tensor_map_table({-2, 256, 64},
                                     [&] {
                                       ++encodes;
                                       return std::vector<CUtensorMap>{};
                                     }),
            nullptr);
  EXPECT_EQ(cuda_be.tensor_map_table({-2, 256, 64},
                                     [&] {
                                       ++encodes;
                                       return std::vector<CUtensorMap>{};
                                     }),
            nullptr);
  EXPECT_EQ(encodes, 2) << "\"no maps\" is kept too";
}

}  // namespace
}  // namespace deepinfer::backend_ops
