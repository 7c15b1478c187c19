// Errors thrown by the deepinfer core. Every message names what failed and why: the file, the
// tensor or config field, the value found and the value expected.
#pragma once

#include <stdexcept>
#include <string>

namespace deepinfer {

enum class ErrorCode {
  kInvalidArgument,  // a caller passed a bad value (shape, index, option)
  kInvalidConfig,    // config.json (or an engine config) is missing a field or holds a bad value
  kNotFound,         // a file or tensor that must exist does not
  kCorruptFile,      // a file exists but its contents are malformed or truncated
  kUnsupported,      // valid input that this build cannot handle yet (dtype, feature)
  kIo,               // an OS call failed
  kInternal,         // a broken invariant inside deepinfer: a bug
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

// Throws Error(kInternal) with the location when `cond` is false. For invariants, not input checks.
#define DEEPINFER_CHECK(cond, msg)                                                             \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      throw ::deepinfer::Error(::deepinfer::ErrorCode::kInternal,                              \
                               std::string("internal check failed: ") + #cond + " (" + (msg) + \
                                   ") at " + __FILE__ + ":" + std::to_string(__LINE__));       \
    }                                                                                          \
  } while (false)

}  // namespace deepinfer
