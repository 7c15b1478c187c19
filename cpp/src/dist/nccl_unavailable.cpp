// The NCCL factories of a build without the CUDA backend: every entry point says why it cannot
// work here (the CUDA build defines them in cuda/dist/nccl_communicator.cu).
#include "dist/nccl_group.h"

#if !DEEPINFER_WITH_CUDA

#include <string>

#include "deepinfer/error.h"

namespace deepinfer::dist {

namespace {

[[noreturn]] void unsupported(const char* what) {
  throw Error(ErrorCode::kUnsupported,
              std::string(what) +
                  ": this deepinfer build has no CUDA backend, so no NCCL communicator (build "
                  "with -DDEEPINFER_CUDA=ON on a machine with nvcc and cuBLAS)");
}

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<Backend*>&) {
  unsupported("make_nccl_group");
}

std::unique_ptr<Communicator> make_nccl_rank(int, int, const NcclUniqueId&, Backend&) {
  unsupported("make_nccl_rank");
}

NcclUniqueId nccl_unique_id() {
  unsupported("nccl_unique_id");
}

}  // namespace deepinfer::dist

#endif  // !DEEPINFER_WITH_CUDA
