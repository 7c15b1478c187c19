#include <memory>
#include <string>

#include "deepinfer/backend.h"
#include "deepinfer/error.h"

namespace deepinfer {

#if DEEPINFER_WITH_CUDA
std::unique_ptr<Backend> make_cuda_backend(int device_index);  // cuda/cuda_backend.cu
int cuda_device_count();                                       // cuda/cuda_backend.cu
#endif

namespace {

// "cuda" -> 0, "cuda:3" -> 3, anything else -> -1.
int cuda_index(const std::string& device) {
  if (device == "cuda") return 0;
  if (device.rfind("cuda:", 0) != 0 || device.size() == 5) return -1;
  int index = 0;
  for (size_t i = 5; i < device.size(); ++i) {
    if (device[i] < '0' || device[i] > '9') return -1;
    index = index * 10 + (device[i] - '0');
  }
  return index;
}

}  // namespace

std::string resolve_device(const std::string& device) {
  if (device != "auto") return device;
#if DEEPINFER_WITH_CUDA
  if (cuda_device_count() > 0) return "cuda";
#endif
  return "cpu";
}

bool backend_available(const std::string& device) {
  if (device == "cpu" || device == "auto") return true;
#if DEEPINFER_WITH_CUDA
  return cuda_index(device) >= 0;
#else
  return false;
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& name, int num_threads) {
  const std::string device = resolve_device(name);
  if (device == "cpu") return make_cpu_backend(num_threads);
  const int index = cuda_index(device);
  if (index < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "device must be \"auto\", \"cpu\", \"cuda\" or \"cuda:N\", got \"" + device + "\"");
  }
#if DEEPINFER_WITH_CUDA
  return make_cuda_backend(index);
#else
  throw Error(ErrorCode::kUnsupported,
              "device \"" + device +
                  "\": this deepinfer build has no CUDA backend (build with "
                  "-DDEEPINFER_CUDA=ON on a machine with nvcc and cuBLAS)");
#endif
}

}  // namespace deepinfer
