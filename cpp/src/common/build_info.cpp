#include "deepinfer/build_info.h"

namespace deepinfer {

BuildInfo build_info() {
  BuildInfo info;
  info.version = DEEPINFER_VERSION;
  info.backends.push_back("cpu");
#if DEEPINFER_WITH_CUDA
  info.backends.push_back("cuda");
#endif
#if DEEPINFER_WITH_ASCEND
  info.backends.push_back("ascend");
#endif
  info.compiler = DEEPINFER_COMPILER;
  info.build_type = DEEPINFER_BUILD_TYPE;
#ifdef DEEPINFER_DEBUG_INVARIANTS
  info.debug_invariants = true;
#endif
  return info;
}

}  // namespace deepinfer
