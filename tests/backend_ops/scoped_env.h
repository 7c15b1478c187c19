// An environment variable set (or unset, for nullptr or "") for the life of the object, and put
// back as it was afterwards: a test that creates a backend under one of its switches leaves the
// process's environment as it found it (the op table itself may run under such a switch).
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace deepinfer::backend_ops {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value == nullptr || *value == '\0') {
      unsetenv(name);
    } else {
      setenv(name, value, 1);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace deepinfer::backend_ops
