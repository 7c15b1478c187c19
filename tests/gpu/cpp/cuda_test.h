// The fixture of the CUDA-only tests that run on the shared CUDA backend: skipped without a GPU,
// failed instead where DEEPINFER_REQUIRE_DEVICE is set (device_backends.h).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "deepinfer/backend.h"
#include "device_backends.h"

namespace deepinfer::backend_ops {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    cuda_ = shared_backend("cuda", &why);
    if (cuda_ == nullptr && device_required()) FAIL() << why;
    if (cuda_ == nullptr) GTEST_SKIP() << why;
  }

  Backend& gpu() { return *cuda_; }

  Backend* cuda_ = nullptr;
};

}  // namespace deepinfer::backend_ops
