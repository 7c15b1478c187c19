// verify of the CUDA backend: not implemented yet. The engine refuses speculative decoding on a
// CUDA device at configuration (engine_config.cpp), so this is reached only by direct op calls.
#include "cuda/backend/cuda_backend.h"
#include "deepinfer/error.h"

namespace deepinfer::cuda {

VerifyResult CudaBackend::verify_impl(const Tensor&, const SamplingBatch&, const DraftBatch&) {
  throw Error(ErrorCode::kUnsupported,
              "verify: draft verification (speculative decoding) runs on the CPU backend only "
              "so far");
}

}  // namespace deepinfer::cuda
