// error_message / error_code_of: what an Error says, for tests that compare messages or codes
// exactly (the CPU tests and the CUDA-vs-CPU tests share them).
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

// The code of the Error `fn` throws; kInternal (and a test failure) when it throws none.
template <typename Fn>
ErrorCode error_code_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "expected deepinfer::Error";
  return ErrorCode::kInternal;
}

}  // namespace deepinfer::testing
