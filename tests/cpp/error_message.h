// error_message: what an op's Error says, for tests that compare messages exactly (the CPU tests
// and the CUDA-vs-CPU tests share it).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "deepinfer/error.h"

namespace deepinfer::testing {

// The message of the Error `f` throws, which must have `code`; "" (and a test failure) when `f`
// throws none.
inline std::string error_message(const std::function<void()>& f,
                                 ErrorCode code = ErrorCode::kInvalidArgument) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected an Error";
  return "";
}

}  // namespace deepinfer::testing
