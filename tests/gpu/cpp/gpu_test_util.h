// Helpers of the CUDA-vs-CPU op tests: the same random inputs on both backends, results compared
// on the host. A CUDA op is correct when it matches the CPU reference op (DESIGN.md section 6).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/tensor.h"

namespace deepinfer::gpu_test {

struct Backends {
  std::unique_ptr<Backend> cpu = make_cpu_backend(0);
  std::unique_ptr<Backend> cuda = make_backend("cuda");
};

// Skips the test when no GPU is there (so the binary also runs, skipping, on a CPU machine).
inline bool have_gpu() {
  try {
    auto b = make_backend("cuda");
    return true;
  } catch (const std::exception&) {
    return false;
  }
}
#define DEEPINFER_REQUIRE_GPU() \
  if (!::deepinfer::gpu_test::have_gpu()) GTEST_SKIP() << "no CUDA device"

inline Tensor random_f32(std::mt19937& rng, const Shape& shape, float scale = 1.0f) {
  Tensor t = Tensor::zeros(shape, DType::kF32);
  std::normal_distribution<float> d(0.0f, scale);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = d(rng);
  return t;
}

inline Tensor i32(const std::vector<int32_t>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
}

// The same host tensor uploaded to both backends (as `dtype` on the device for matrices).
struct Pair {
  Tensor cpu, cuda;
};
// Integer tensors go to both backends as i32 whatever `device_dtype` says.
inline Pair both(Backends& b, const Tensor& host, DType device_dtype = DType::kF32) {
  if (!host.defined()) return {};
  const bool integer = host.dtype() == DType::kI32 || host.dtype() == DType::kI64;
  if (integer || device_dtype == DType::kI32) {
    return {b.cpu->upload(host, DType::kI32), b.cuda->upload(host, DType::kI32)};
  }
  return {b.cpu->upload(host, DType::kF32), b.cuda->upload(host, device_dtype)};
}

// max |a - b| <= atol + rtol * max |b| over all elements (f32 or i32 tensors).
inline void expect_close(Backends& b, const Tensor& cpu, const Tensor& cuda, double rtol,
                         double atol, const std::string& what) {
  Tensor x = b.cpu->to_host(cpu);
  Tensor y = b.cuda->to_host(cuda);
  ASSERT_EQ(x.shape(), y.shape()) << what;
  ASSERT_EQ(x.dtype(), y.dtype()) << what;
  double max_ref = 0, max_err = 0;
  int64_t worst = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    double r = x.item(i), c = y.item(i);
    max_ref = std::max(max_ref, std::fabs(r));
    double e = std::fabs(r - c);
    if (std::isnan(c) != std::isnan(r)) e = INFINITY;
    if (e > max_err) {
      max_err = e;
      worst = i;
    }
  }
  EXPECT_LE(max_err, atol + rtol * max_ref)
      << what << ": max |cpu - cuda| = " << max_err << " at element " << worst << " (cpu "
      << x.item(worst) << ", cuda " << y.item(worst) << "), max |cpu| = " << max_ref;
}

}  // namespace deepinfer::gpu_test
