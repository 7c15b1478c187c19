#include "deepinfer/error.h"

namespace deepinfer {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kInvalidConfig:
      return "invalid config";
    case ErrorCode::kNotFound:
      return "not found";
    case ErrorCode::kCorruptFile:
      return "corrupt file";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kIo:
      return "I/O error";
    case ErrorCode::kInternal:
      return "internal error";
  }
  return "unknown error";
}

}  // namespace deepinfer
