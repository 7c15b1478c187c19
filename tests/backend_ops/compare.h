// Comparisons of a device result with the CPU reference result, both copied to the host.
#pragma once

#include <gtest/gtest.h>

#include "deepinfer/tensor.h"

namespace deepinfer::backend_ops {

// Same dtype, shape and bytes.
::testing::AssertionResult same_bytes(const Tensor& ref, const Tensor& got);

// max |ref - got| <= atol + rtol * max |ref| over all elements (any dtype Tensor::item reads); a
// NaN on one side only is an infinite error.
::testing::AssertionResult max_abs_close(const Tensor& ref, const Tensor& got, double rtol,
                                         double atol);

// For results of bf16 tensor-core math (attention with bf16_math, the experts' prefill path): q,
// keys, probabilities or activations are rounded to bf16 (relative error 2^-9 each) and
// accumulated in f32, so with unit-normal inputs an output is off by about 0.2% of its size. The
// worst element must be within 2% of the largest reference value and the mean error within 0.5%
// of the mean reference value (a wrong fragment, mask or rescale is off by O(1)). A non-finite
// device value (or NaN reference) is an infinite error.
::testing::AssertionResult bf16_close(const Tensor& ref, const Tensor& got);

}  // namespace deepinfer::backend_ops
