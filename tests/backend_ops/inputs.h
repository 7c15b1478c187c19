// Random host inputs of the op tests, and their upload to a backend.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/tensor.h"

namespace deepinfer::backend_ops {

// N(0, scale) f32 values.
inline Tensor random_f32(std::mt19937& rng, const Shape& shape, float scale = 1.0f) {
  Tensor t = Tensor::zeros(shape, DType::kF32);
  std::normal_distribution<float> d(0.0f, scale);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = d(rng);
  return t;
}

// Integers uniform in [lo, hi] as f32: sums of their products are exact in f32 as long as they
// stay below 2^24, whatever the summation order.
inline Tensor random_int_f32(std::mt19937& rng, const Shape& shape, int lo, int hi) {
  Tensor t = Tensor::zeros(shape, DType::kF32);
  std::uniform_int_distribution<int> d(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(d(rng));
  return t;
}

inline Tensor i32(const std::vector<int32_t>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
}

// n i32 values uniform in [lo, hi].
inline Tensor random_ids(std::mt19937& rng, int64_t n, int32_t lo, int32_t hi) {
  std::uniform_int_distribution<int32_t> d(lo, hi);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return i32(v);
}

// A tensor of `dtype` filled with random bytes (for byte-exact copy ops).
inline Tensor random_bytes(std::mt19937& rng, const Shape& shape, DType dtype) {
  Tensor t = Tensor::zeros(shape, dtype);
  auto* p = static_cast<unsigned char*>(t.raw_data());
  std::uniform_int_distribution<int> d(0, 255);
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>(d(rng));
  return t;
}

// A block-scaled FP8 weight [rows, cols] of random e4m3 codes with |v| < 2 (no NaN), every
// `block` x `block` scale 0.25, activations quantized per `act_group` columns: the weight of the
// GPU tests that compare a kernel's bytes across runs and batch sizes.
inline MatrixWeight random_fp8_block_weight(std::mt19937& rng, int64_t rows, int64_t cols,
                                            int block, int act_group) {
  MatrixWeight w;
  w.values = random_bytes(rng, {rows, cols}, DType::kF8E4M3);
  auto* bytes = static_cast<uint8_t*>(w.values.raw_data());
  for (size_t i = 0; i < w.values.nbytes(); ++i) bytes[i] &= 0xbf;  // clears the top exponent bit
  const int64_t sr = (rows + block - 1) / block, sc = (cols + block - 1) / block;
  w.scales = Tensor::from_vector(std::vector<float>(static_cast<size_t>(sr * sc), 0.25f), {sr, sc});
  w.format = WeightFormat::kFp8Block;
  w.block_rows = block;
  w.block_cols = block;
  w.act_group = act_group;
  return w;
}

// The f32 values a bf16 copy of `t` holds. A matrix a device keeps in bf16 is drawn rounded, so
// the f32 reference and the bf16 device copy hold the same values.
inline Tensor round_bf16(const Tensor& t) {
  return t.to(DType::kBF16).to(DType::kF32);
}

// `host` on `be`: integer tensors as i32, floating ones as f32. Undefined stays undefined.
inline Tensor up(Backend& be, const Tensor& host) {
  if (!host.defined()) return {};
  const bool integer = host.dtype() == DType::kI32 || host.dtype() == DType::kI64;
  return be.upload(host, integer ? DType::kI32 : DType::kF32);
}

// `host` on `be` in its own dtype (copy ops of any dtype, KV caches). Undefined stays undefined.
inline Tensor up_same(Backend& be, const Tensor& host) {
  if (!host.defined()) return {};
  return be.upload(host, host.dtype());
}

// A matrix weight stored as `stored` in a checkpoint, in the dtype `be` keeps it in.
inline Tensor up_weight(Backend& be, const Tensor& host, DType stored) {
  return be.upload_weight(host, be.weight_dtype(stored));
}

}  // namespace deepinfer::backend_ops
