#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "deepinfer/dtype.h"
#include "deepinfer/error.h"
#include "deepinfer/tensor.h"

namespace deepinfer {
namespace {

Tensor iota(Shape shape) {
  Tensor t = Tensor::zeros(std::move(shape), DType::kF32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(i);
  return t;
}

std::vector<double> values(const Tensor& t) {
  Tensor c = t.contiguous();
  std::vector<double> out;
  for (int64_t i = 0; i < c.numel(); ++i) out.push_back(c.item(i));
  return out;
}

void expect_error(ErrorCode code, const std::function<void()>& fn) {
  try {
    fn();
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
  }
}

// ---- Tensor ----------------------------------------------------------------------------------

TEST(Tensor, ShapeAndStrides) {
  Tensor t = Tensor::zeros({2, 3, 4}, DType::kBF16);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_EQ(t.strides(), (std::vector<int64_t>{12, 4, 1}));
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.size(-3), 2);
  expect_error(ErrorCode::kInvalidArgument, [&] { t.size(3); });
  expect_error(ErrorCode::kInvalidArgument, [&] { t.size(-4); });
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.device(), Device{});
  EXPECT_EQ(t.describe(), "bf16[2, 3, 4] on cpu");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u);
  EXPECT_EQ(contiguous_strides({}), (std::vector<int64_t>{}));
  EXPECT_EQ(shape_str({}), "[]");
  EXPECT_EQ(shape_str({2, 3}), "[2, 3]");

  Tensor scalar = Tensor::zeros({}, DType::kF32);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.item(), 0.0);
  Tensor empty = Tensor::zeros({3, 0}, DType::kI64);
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.nbytes(), 0u);
  Tensor undefined;
  EXPECT_FALSE(undefined.defined());
  EXPECT_EQ(undefined.describe(), "undefined tensor");
  expect_error(ErrorCode::kInvalidArgument, [&] { undefined.raw_data(); });
}

TEST(Tensor, ZerosValidatesShape) {
  expect_error(ErrorCode::kInvalidArgument, [] { Tensor::zeros({-1}, DType::kF32); });
  expect_error(ErrorCode::kInvalidArgument, [] { Tensor::zeros({2, -100}, DType::kF32); });
  expect_error(ErrorCode::kInvalidArgument, [] {
    Tensor::zeros({1LL << 40, 1LL << 40}, DType::kF32);
  });
}

TEST(Tensor, FromVector) {
  Tensor t = Tensor::from_vector<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.dtype(), DType::kI32);
  EXPECT_EQ(t.item(5), 6.0);
  expect_error(ErrorCode::kInvalidArgument, [] { Tensor::from_vector<float>({1, 2, 3}, {2, 2}); });
}

TEST(Tensor, ViewMustFitStorage) {
  auto storage = Storage::allocate_host(16);
  EXPECT_NO_THROW(Tensor(storage, DType::kF32, {4}));
  EXPECT_NO_THROW(Tensor(storage, DType::kF32, {2}, 8));
  expect_error(ErrorCode::kInvalidArgument, [&] { Tensor(storage, DType::kF32, {5}); });
  expect_error(ErrorCode::kInvalidArgument, [&] { Tensor(storage, DType::kF32, {3}, 8); });
  expect_error(ErrorCode::kInvalidArgument, [&] { Tensor(storage, DType::kF32, {1}, -4); });
  expect_error(ErrorCode::kInvalidArgument, [&] { Tensor(storage, DType::kF32, {-1}); });
  expect_error(ErrorCode::kInvalidArgument, [&] {
    Tensor(storage, DType::kF32, {2, 2}, {2}, 0);
  });                                                                // rank mismatch
  EXPECT_NO_THROW(Tensor(storage, DType::kF32, {2, 2}, {1, 2}, 0));  // transposed
  EXPECT_NO_THROW(Tensor(storage, DType::kF32, {0}, 16));            // empty at the end
}

TEST(Tensor, Reshape) {
  Tensor t = iota({2, 3, 4});
  Tensor r = t.reshape({6, 4});
  EXPECT_EQ(r.shape(), (Shape{6, 4}));
  EXPECT_EQ(r.raw_data(), t.raw_data());
  EXPECT_EQ(r.storage(), t.storage());
  EXPECT_EQ(t.reshape({-1, 4}).shape(), (Shape{6, 4}));
  EXPECT_EQ(t.reshape({2, -1, 2}).shape(), (Shape{2, 6, 2}));
  EXPECT_EQ(t.reshape({-1}).shape(), (Shape{24}));
  EXPECT_EQ(t.reshape({24, 1, 1}).strides(), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(Tensor::zeros({0, 3}, DType::kF32).reshape({3, 0}).shape(), (Shape{3, 0}));

  expect_error(ErrorCode::kInvalidArgument, [&] { t.reshape({5, 5}); });
  expect_error(ErrorCode::kInvalidArgument, [&] { t.reshape({-1, -1}); });
  expect_error(ErrorCode::kInvalidArgument, [&] { t.reshape({-1, 5}); });
  expect_error(ErrorCode::kInvalidArgument, [&] { t.reshape({0, -1}); });
  expect_error(ErrorCode::kInvalidArgument, [&] { t.reshape({-2, -12}); });
  expect_error(ErrorCode::kInvalidArgument, [&] { t.narrow(2, 0, 2).reshape({12}); });

  // A narrowed view that is still dense can be reshaped, and shares the parent's bytes.
  Tensor rows = t.narrow(0, 1, 1);
  Tensor flat = rows.reshape({12});
  EXPECT_EQ(flat.item(0), 12.0);
  EXPECT_EQ(flat.raw_data(), rows.raw_data());
}

TEST(Tensor, NarrowAndSelectShareStorage) {
  Tensor t = iota({3, 4});
  Tensor n = t.narrow(1, 1, 2);
  EXPECT_EQ(n.shape(), (Shape{3, 2}));
  EXPECT_EQ(n.strides(), (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(n.offset_bytes(), 4);
  EXPECT_EQ(n.storage(), t.storage());
  EXPECT_FALSE(n.is_contiguous());
  EXPECT_EQ(values(n), (std::vector<double>{1, 2, 5, 6, 9, 10}));

  Tensor rows = t.narrow(0, 1, 2);
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_EQ(rows.offset_bytes(), 16);
  EXPECT_EQ(t.narrow(-1, 3, 1).shape(), (Shape{3, 1}));
  EXPECT_EQ(t.narrow(0, 3, 0).numel(), 0);

  Tensor row = t.select(0, 2);
  EXPECT_EQ(row.shape(), (Shape{4}));
  EXPECT_EQ(row.storage(), t.storage());
  EXPECT_EQ(values(row), (std::vector<double>{8, 9, 10, 11}));
  Tensor col = t.select(-1, 1);
  EXPECT_EQ(col.shape(), (Shape{3}));
  EXPECT_EQ(col.strides(), (std::vector<int64_t>{4}));
  EXPECT_FALSE(col.is_contiguous());
  EXPECT_EQ(values(col), (std::vector<double>{1, 5, 9}));

  // Writes through a view are visible in the parent.
  row.data<float>()[0] = 100.0f;
  EXPECT_EQ(t.item(8), 100.0);

  expect_error(ErrorCode::kInvalidArgument, [&] { t.narrow(0, 2, 2); });
  expect_error(ErrorCode::kInvalidArgument, [&] { t.narrow(0, -1, 1); });
  expect_error(ErrorCode::kInvalidArgument, [&] { t.narrow(0, 0, -1); });
  expect_error(ErrorCode::kInvalidArgument, [&] { t.narrow(2, 0, 1); });
  expect_error(ErrorCode::kInvalidArgument, [&] { t.select(0, 3); });
  expect_error(ErrorCode::kInvalidArgument, [&] { t.select(-3, 0); });
}

TEST(Tensor, SizeOneDimensionsDoNotBreakContiguity) {
  Tensor t = iota({4, 3, 2});
  // narrow(1, 1, 1) keeps stride 2 on a size-1 dim; the view [1, 1, 2] is still dense.
  Tensor v = t.narrow(1, 1, 1).narrow(0, 2, 1);
  EXPECT_EQ(v.shape(), (Shape{1, 1, 2}));
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.reshape({2}).item(1), 15.0);
  Tensor c = v.contiguous();
  EXPECT_EQ(c.raw_data(), v.raw_data());  // no copy
  EXPECT_EQ(c.strides(), contiguous_strides(c.shape()));
  EXPECT_FALSE(t.narrow(1, 1, 1).is_contiguous());  // [4, 1, 2]: rows 6 apart
}

TEST(Tensor, ContiguousOfStridedView) {
  Tensor t = iota({2, 3, 4});
  Tensor v = t.narrow(2, 1, 2).narrow(1, 0, 2);  // [2, 2, 2]
  ASSERT_FALSE(v.is_contiguous());
  Tensor c = v.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_NE(c.storage(), t.storage());
  EXPECT_EQ(c.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(values(c), (std::vector<double>{1, 2, 5, 6, 13, 14, 17, 18}));
  // Transposed view through explicit strides.
  Tensor m = iota({2, 3});
  Tensor mt(m.storage(), DType::kF32, {3, 2}, {1, 3}, 0);
  EXPECT_EQ(values(mt), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  // Contiguous input comes back as is.
  EXPECT_EQ(t.contiguous().storage(), t.storage());
  expect_error(ErrorCode::kInvalidArgument, [&] { v.item(0); });
  expect_error(ErrorCode::kInvalidArgument, [&] { t.item(24); });
  expect_error(ErrorCode::kInvalidArgument, [&] { t.item(-1); });
}

TEST(Tensor, ToConvertsAndCopies) {
  Tensor t = Tensor::from_vector<float>({1.0f, -2.5f, 0.15625f, 65504.0f}, {2, 2});
  Tensor same = t.to(DType::kF32);
  EXPECT_NE(same.storage(), t.storage());
  EXPECT_EQ(values(same), values(t));
  EXPECT_EQ(values(t.to(DType::kBF16)), (std::vector<double>{1.0, -2.5, 0.15625, 65536.0}));
  EXPECT_EQ(values(t.to(DType::kF16)), (std::vector<double>{1.0, -2.5, 0.15625, 65504.0}));
  EXPECT_EQ(values(t.to(DType::kF8E4M3)), (std::vector<double>{1.0, -2.5, 0.15625, 448.0}));
  EXPECT_EQ(values(t.to(DType::kBF16).to(DType::kF16)),
            (std::vector<double>{1.0, -2.5, 0.15625, INFINITY}));
  // Strided source.
  EXPECT_EQ(values(t.select(1, 0).to(DType::kF16)), (std::vector<double>{1.0, 0.15625}));

  Tensor i = Tensor::from_vector<int32_t>({-7, 0, 2147483647}, {3});
  Tensor l = i.to(DType::kI64);
  EXPECT_EQ(l.dtype(), DType::kI64);
  EXPECT_EQ(values(l), (std::vector<double>{-7, 0, 2147483647}));
  EXPECT_EQ(values(l.to(DType::kI32)), values(i));
  Tensor big = Tensor::from_vector<int64_t>({1, 1LL << 31}, {2});
  expect_error(ErrorCode::kInvalidArgument, [&] { big.to(DType::kI32); });
  expect_error(ErrorCode::kUnsupported, [&] { t.to(DType::kI32); });
  expect_error(ErrorCode::kUnsupported, [&] { i.to(DType::kF32); });
}

TEST(Storage, OwnershipAndLifetime) {
  int deleted = 0;
  {
    static float buffer[4];
    auto s = Storage::adopt(buffer, sizeof buffer, Device{}, [&deleted](void*) { ++deleted; });
    EXPECT_EQ(s->data(), buffer);
    EXPECT_EQ(s->nbytes(), 16u);
  }
  EXPECT_EQ(deleted, 1);

  auto owner = std::make_shared<std::vector<float>>(8, 1.5f);
  std::weak_ptr<std::vector<float>> watch = owner;
  Tensor view;
  {
    auto s = Storage::borrow(owner->data(), 32, Device{}, owner);
    owner.reset();
    view = Tensor(s, DType::kF32, {8});
  }
  EXPECT_FALSE(watch.expired());  // the tensor keeps the owner alive
  EXPECT_EQ(view.item(7), 1.5);
  view = Tensor();
  EXPECT_TRUE(watch.expired());

  auto zero = Storage::allocate_host(0);
  EXPECT_NE(zero->data(), nullptr);
  EXPECT_EQ(zero->nbytes(), 0u);
  expect_error(ErrorCode::kInvalidArgument,
               [] { Storage::allocate_host(std::numeric_limits<size_t>::max() - 10); });
}

// ---- dtype -----------------------------------------------------------------------------------

TEST(DType, NamesAndSizes) {
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF8E4M3), 1u);
  EXPECT_EQ(dtype_size(DType::kI32), 4u);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
  EXPECT_STREQ(dtype_name(DType::kBF16), "bf16");
  EXPECT_STREQ(dtype_name(DType::kF8E4M3), "f8_e4m3");
  DType d = DType::kF32;
  EXPECT_TRUE(dtype_from_safetensors("BF16", &d));
  EXPECT_EQ(d, DType::kBF16);
  EXPECT_TRUE(dtype_from_safetensors("F8_E4M3", &d));
  EXPECT_EQ(d, DType::kF8E4M3);
  EXPECT_TRUE(dtype_from_safetensors("I64", &d));
  EXPECT_EQ(d, DType::kI64);
  EXPECT_TRUE(dtype_from_safetensors("F8_E8M0", &d));
  EXPECT_EQ(d, DType::kE8M0);
  EXPECT_FALSE(dtype_from_safetensors("F8_E5M2", &d));
  EXPECT_FALSE(dtype_from_safetensors("bf16", &d));
  EXPECT_TRUE(is_floating(DType::kF8E4M3));
  EXPECT_FALSE(is_floating(DType::kI32));
}

float from_bits(uint32_t u) {
  return std::bit_cast<float>(u);
}

TEST(DType, Bf16) {
  // Every non-NaN bf16 survives the round trip bit for bit, subnormals and infinities included.
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    auto bits = static_cast<uint16_t>(b);
    float f = bf16_to_f32(bits);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f)))) << b;
    } else {
      ASSERT_EQ(f32_to_bf16(f), bits) << b;
    }
  }
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  // Ties go to the even mantissa: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7.
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // above the tie
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000)), 0x0002);      // subnormal tie, to even
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008000)), 0x0000);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to infinity
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
  uint16_t nan = f32_to_bf16(from_bits(0x7f800001));  // payload only in the dropped bits
  EXPECT_TRUE(std::isnan(bf16_to_f32(nan))) << nan;
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(-NAN))));
}

TEST(DType, F16) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    auto bits = static_cast<uint16_t>(b);
    float f = f16_to_f32(bits);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f)))) << b;
    } else {
      ASSERT_EQ(f32_to_f16(f), bits) << b;
    }
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03ff), 1023 * 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x0400), 0x1p-14f);  // smallest normal
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x7c00), INFINITY);
  EXPECT_EQ(f16_to_f32(0x8001), -0x1p-24f);
  // Nearest even.
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);             // half the smallest subnormal
  EXPECT_EQ(f32_to_f16(3 * 0x1p-25f), 0x0002);         // 1.5 ulp -> 2
  EXPECT_EQ(f32_to_f16(5 * 0x1p-25f), 0x0002);         // 2.5 ulp -> 2
  EXPECT_EQ(f32_to_f16(0x1p-14f - 0x1p-25f), 0x0400);  // subnormal rounding up to the first normal
  EXPECT_EQ(f32_to_f16(1e-10f), 0x0000);
  EXPECT_EQ(f32_to_f16(-1e-10f), 0x8000);
  // Overflow: 65520 is the tie between 65504 and 2^16 and rounds to infinity.
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e9f), 0xfc00);
  EXPECT_EQ(f32_to_f16(INFINITY), 0x7c00);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
}

TEST(DType, F8E4M3) {
  for (uint32_t b = 0; b <= 0xff; ++b) {
    auto bits = static_cast<uint8_t>(b);
    float f = f8e4m3_to_f32(bits);
    if ((b & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f)) << b;
    } else {
      ASSERT_FALSE(std::isnan(f)) << b;
      ASSERT_EQ(f32_to_f8e4m3(f), bits) << b;
    }
  }
  EXPECT_EQ(f8e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x01), 0x1p-9f);  // smallest subnormal
  EXPECT_EQ(f8e4m3_to_f32(0x07), 7 * 0x1p-9f);
  EXPECT_EQ(f8e4m3_to_f32(0x08), 0x1p-6f);  // smallest normal
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0xfe), -448.0f);
  // Nearest even.
  EXPECT_EQ(f32_to_f8e4m3(1.0f + 1.0f / 16), 0x38);
  EXPECT_EQ(f32_to_f8e4m3(1.0f + 3.0f / 16), 0x3a);
  EXPECT_EQ(f32_to_f8e4m3(1.0f + 1.0f / 16 + 1e-4f), 0x39);
  EXPECT_EQ(f32_to_f8e4m3(0x1p-10f), 0x00);      // half the smallest subnormal
  EXPECT_EQ(f32_to_f8e4m3(3 * 0x1p-10f), 0x02);  // 1.5 ulp -> 2
  EXPECT_EQ(f32_to_f8e4m3(-3 * 0x1p-10f), 0x82);
  EXPECT_EQ(f32_to_f8e4m3(1e-6f), 0x00);
  // Saturation: no infinities in e4m3fn.
  EXPECT_EQ(f32_to_f8e4m3(440.0f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(464.0f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(1e6f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(-1e6f), 0xfe);
  EXPECT_EQ(f32_to_f8e4m3(INFINITY), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(-INFINITY), 0xfe);
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(f32_to_f8e4m3(NAN))));
  EXPECT_EQ(f32_to_f8e4m3(-0.0f), 0x80);
}

// f32_to_f8e4m3 computes its code; here the nearest code is found by exact (double) distance to
// every finite code, ties to the even one, saturating at 448: over every float with a stride, and
// around each code and midpoint. (All 2^31 non-negative floats agreed once, off the suite.)
TEST(DType, F8E4M3EncoderIsTheNearestCode) {
  std::vector<double> code_value(127);
  for (int c = 0; c < 127; ++c) code_value[size_t(c)] = f8e4m3_to_f32(static_cast<uint8_t>(c));
  const auto nearest = [&](float f) {
    const double a = std::fabs(double{f});
    if (a >= 448.0) return 0x7e;
    int best = 0;
    for (int c = 1; c < 127; ++c) {
      const double d = std::fabs(code_value[size_t(c)] - a);
      const double b = std::fabs(code_value[size_t(best)] - a);
      if (d < b || (d == b && (c & 1) == 0)) best = c;
    }
    return best;
  };
  std::vector<uint32_t> bits;
  for (uint64_t u = 0; u <= 0x7f800000u; u += 65521) bits.push_back(static_cast<uint32_t>(u));
  for (int c = 0; c < 127; ++c) {
    const float v = f8e4m3_to_f32(static_cast<uint8_t>(c));
    const float mid = c < 126 ? static_cast<float>((double{v} + code_value[size_t(c + 1)]) / 2) : v;
    for (const float x : {v, mid}) {
      const uint32_t b = std::bit_cast<uint32_t>(x);
      for (uint32_t d = 0; d <= 2; ++d) bits.insert(bits.end(), {b + d, b > d ? b - d : 0});
    }
  }
  for (const uint32_t b : bits) {
    const float f = std::bit_cast<float>(b);
    const int want = nearest(f);
    ASSERT_EQ(f32_to_f8e4m3(f), want) << f;
    ASSERT_EQ(f32_to_f8e4m3(-f), want | 0x80) << -f;
  }
}

TEST(DType, ConvertElements) {
  const float src[] = {0.0f, -1.0f, 3.0f, 0.1f};
  uint16_t half[4];
  convert_elements(src, DType::kF32, half, DType::kF16, 4);
  EXPECT_EQ(half[1], 0xbc00);
  uint8_t f8[4];
  convert_elements(half, DType::kF16, f8, DType::kF8E4M3, 4);
  float back[4];
  convert_elements(f8, DType::kF8E4M3, back, DType::kF32, 4);
  EXPECT_EQ(back[0], 0.0f);
  EXPECT_EQ(back[1], -1.0f);
  EXPECT_EQ(back[2], 3.0f);
  EXPECT_EQ(back[3], 0.1015625f);  // nearest e4m3 to 0.1
  EXPECT_THROW(convert_elements(src, DType::kF32, back, DType::kI64, 1), Error);
}

}  // namespace
}  // namespace deepinfer
