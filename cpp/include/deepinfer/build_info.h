// Facts about this build of libdeepinfer.
#pragma once

#include <string>
#include <vector>

namespace deepinfer {

struct BuildInfo {
  std::string version;
  std::vector<std::string> backends;  // compiled backends, "cpu" always first
  std::string compiler;
  std::string build_type;
  bool debug_invariants = false;
};

BuildInfo build_info();

}  // namespace deepinfer
