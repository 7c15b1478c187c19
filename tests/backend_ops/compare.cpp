#include "compare.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace deepinfer::backend_ops {
namespace {

::testing::AssertionResult same_layout(const Tensor& ref, const Tensor& got) {
  if (ref.shape() != got.shape() || ref.dtype() != got.dtype()) {
    return ::testing::AssertionFailure()
           << "reference " << ref.describe() << ", device " << got.describe();
  }
  return ::testing::AssertionSuccess();
}

}  // namespace

::testing::AssertionResult same_bytes(const Tensor& ref, const Tensor& got) {
  if (auto r = same_layout(ref, got); !r) return r;
  const Tensor a = ref.contiguous(), b = got.contiguous();
  const auto* pa = static_cast<const unsigned char*>(a.raw_data());
  const auto* pb = static_cast<const unsigned char*>(b.raw_data());
  if (std::memcmp(pa, pb, a.nbytes()) != 0) {
    // Where and how much: the first differing byte and the count, to tell a misplaced row from
    // a rounding difference.
    size_t first = 0, count = 0;
    for (size_t i = a.nbytes(); i-- > 0;) {
      if (pa[i] != pb[i]) {
        first = i;
        ++count;
      }
    }
    return ::testing::AssertionFailure()
           << count << " of " << a.nbytes() << " bytes differ, the first at byte " << first
           << " (ref 0x" << std::hex << int(pa[first]) << ", got 0x" << int(pb[first]) << ")";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult max_abs_close(const Tensor& ref, const Tensor& got, double rtol,
                                         double atol) {
  if (auto r = same_layout(ref, got); !r) return r;
  double max_ref = 0, max_err = 0;
  int64_t worst = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double r = ref.item(i), c = got.item(i);
    if (std::isfinite(r)) max_ref = std::max(max_ref, std::fabs(r));
    if (r == c) continue;  // equal infinities too (a masked logit), whose difference is NaN
    double e = std::fabs(r - c);
    if (std::isnan(e)) e = INFINITY;  // NaN on one side only, or opposite infinities
    if (e > max_err) {
      max_err = e;
      worst = i;
    }
  }
  if (max_err <= atol + rtol * max_ref) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "max |ref - dev| = " << max_err << " at element " << worst << " (ref "
         << ref.item(worst) << ", dev " << got.item(worst) << "), max |ref| = " << max_ref
         << ", allowed " << atol << " + " << rtol << " * max |ref|";
}

::testing::AssertionResult bf16_close(const Tensor& ref, const Tensor& got) {
  if (auto r = same_layout(ref, got); !r) return r;
  double max_ref = 0, max_err = 0, sum_ref = 0, sum_err = 0;
  int64_t worst = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double r = ref.item(i), c = got.item(i);
    double e = std::fabs(r - c);
    if (!std::isfinite(c) || std::isnan(r)) e = INFINITY;
    max_ref = std::max(max_ref, std::fabs(r));
    sum_ref += std::fabs(r);
    sum_err += e;
    if (e > max_err) {
      max_err = e;
      worst = i;
    }
  }
  const bool max_ok = max_err <= 2e-2 * max_ref;
  const bool mean_ok = sum_err <= 5e-3 * sum_ref;
  if (max_ok && mean_ok) return ::testing::AssertionSuccess();
  const auto n = static_cast<double>(std::max<int64_t>(ref.numel(), 1));
  return ::testing::AssertionFailure()
         << "max |ref - dev| = " << max_err << " at element " << worst << " (ref "
         << ref.item(worst) << ", dev " << got.item(worst) << "), max |ref| = " << max_ref
         << " (allowed 2e-2 of it); mean |ref - dev| = " << sum_err / n
         << ", mean |ref| = " << sum_ref / n << " (allowed 5e-3 of it)";
}

}  // namespace deepinfer::backend_ops
