#include "device_backends.h"

#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <sstream>

namespace deepinfer::backend_ops {

std::vector<std::string> device_backend_names() {
  std::vector<std::string> names;
  if (const char* env = std::getenv("DEEPINFER_OP_TEST_BACKENDS"); env != nullptr && *env != '\0') {
    std::stringstream list(env);
    for (std::string name; std::getline(list, name, ',');) {
      if (!name.empty()) names.push_back(name);
    }
    return names;
  }
  for (const char* name : {"cuda"}) {
    if (backend_available(name)) names.emplace_back(name);
  }
  return names;
}

Backend* shared_backend(const std::string& name, std::string* why) {
  struct Slot {
    std::unique_ptr<Backend> backend;
    std::string error;
  };
  static std::map<std::string, Slot> slots;
  auto [it, fresh] = slots.try_emplace(name);
  if (fresh) {
    try {
      it->second.backend = make_backend(name);
    } catch (const std::exception& e) {
      it->second.error = e.what();
    }
  }
  if (!it->second.backend) *why = "backend \"" + name + "\" unavailable here: " + it->second.error;
  return it->second.backend.get();
}

bool device_required() {
  const char* env = std::getenv("DEEPINFER_REQUIRE_DEVICE");
  return env != nullptr && *env != '\0' && std::string(env) != "0";
}

Backend& cpu_reference() {
  static std::unique_ptr<Backend> cpu = make_cpu_backend(0);
  return *cpu;
}

}  // namespace deepinfer::backend_ops
