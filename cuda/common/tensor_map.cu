#include <cudaTypedefs.h>

#include "cuda/common/tensor_map.h"

namespace deepinfer::cuda {

std::vector<CUtensorMap> encode_byte_matrix_maps(std::span<const ByteMatrix> matrices,
                                                 uint32_t box_bytes, uint32_t box_rows,
                                                 TensorMapSwizzle swizzle) {
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found{};
  // The 12.0 ABI of cuTensorMapEncodeTiled: every driver that runs sm_90 code has it.
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || entry == nullptr) {
    cudaGetLastError();  // a failed query leaves no error for the next launch check
    return {};
  }
  const auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(entry);
  std::vector<CUtensorMap> maps(matrices.size());
  for (size_t i = 0; i < matrices.size(); ++i) {
    const ByteMatrix& m = matrices[i];
    const cuuint64_t dims[2] = {m.row_bytes, m.rows};
    const cuuint64_t row_stride[1] = {m.row_bytes};
    const cuuint32_t box[2] = {box_bytes, box_rows};
    const cuuint32_t element_strides[2] = {1, 1};
    if (encode(&maps[i], CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(m.base), dims,
               row_stride, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
               swizzle == TensorMapSwizzle::k128B ? CU_TENSOR_MAP_SWIZZLE_128B
                                                  : CU_TENSOR_MAP_SWIZZLE_NONE,
               CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
      return {};
    }
  }
  return maps;
}

}  // namespace deepinfer::cuda
