#include <string>

#include "cuda/common/launch.cuh"

namespace deepinfer::cuda {

void throw_cuda_error(cudaError_t err, const std::string& what, const char* file, int line) {
  throw Error(ErrorCode::kInternal, std::string("CUDA error ") + cudaGetErrorName(err) + " (" +
                                        cudaGetErrorString(err) + ") in " + what + " at " + file +
                                        ":" + std::to_string(line));
}

}  // namespace deepinfer::cuda
