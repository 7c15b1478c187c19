// KV cache inputs of the op tests in the bf16, fp8 and V4.1 formats (cpp/src/tensor/kv_record.h):
// f32 rows that exercise the encoders' rounding, caches of garbage records, and keys stored through
// the host codec.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "deepinfer/tensor.h"
#include "inputs.h"
#include "tensor/kv_record.h"

namespace deepinfer::backend_ops {

// The label prefix of a KV dtype variant: "" for f32, "kv_bf16_", "kv_fp8_" (kU8 records),
// "kv_v41_" (V4.1's kF8E4M3 FP8 records: also attention's FP8-keys / FP4-entries pair),
// "kv_v41fp4_" (V4.1's kE2M1x2 FP4 records).
inline std::string kv_label(DType dtype) {
  if (dtype == DType::kBF16) return "kv_bf16_";
  if (dtype == DType::kU8) return "kv_fp8_";
  if (dtype == DType::kF8E4M3) return "kv_v41_";
  if (dtype == DType::kE2M1x2) return "kv_v41fp4_";
  return "";
}

// n rows of dim f32 channels for the KV encoders. Half are N(0, 1); a quarter are integers in
// [-1023, 1023] times 2^-7, many of them halfway between two bf16 or two e4m3 values (ties to
// even); the rest are scaled by 2^30 (an fp8 scale far above 1), by 2^-30 (below the 1e-4 floor
// of the scale: e4m3 subnormals and zeros) or all zero.
inline Tensor random_kv_rows(std::mt19937& rng, int64_t n, int64_t dim) {
  Tensor t = random_f32(rng, {n, dim});
  std::uniform_int_distribution<int> ints(-1023, 1023);
  for (int64_t i = 0; i < n; ++i) {
    float* row = t.data<float>() + i * dim;
    const int64_t kind = i % 4 < 2 ? 0 : i % 4 == 2 ? 1 : 2 + i / 4 % 3;
    for (int64_t c = 0; c < dim; ++c) {
      switch (kind) {
        case 1:
          row[c] = static_cast<float>(ints(rng)) * 0x1p-7f;
          break;
        case 2:
          row[c] *= 0x1p30f;
          break;
        case 3:
          row[c] *= 0x1p-30f;
          break;
        case 4:
          row[c] = 0.0f;
          break;
        default:
          break;
      }
    }
  }
  return t;
}

// A KV cache of `dtype` with rows of dim channels (rope_dim selecting the fp8 record), shape
// lead + [row width], filled with random bytes so that a row stored to the wrong place shows.
inline Tensor random_kv_cache(std::mt19937& rng, Shape lead, DType dtype, int64_t dim,
                              int64_t rope_dim) {
  lead.push_back(kv_record::row_width(dtype, dim, rope_dim));
  return random_bytes(rng, lead, dtype);
}

// rows [.., dim] f32 as a KV cache of `dtype` [.., row width], encoded by the host codec.
inline Tensor encode_kv_rows(const Tensor& rows, DType dtype, int64_t rope_dim) {
  const int64_t dim = rows.shape().back();
  const kv_record::RowCodec codec{dtype, dim, rope_dim};
  Shape shape = rows.shape();
  shape.back() = codec.row_width();
  Tensor cache = Tensor::zeros(shape, dtype);
  auto* dst = static_cast<uint8_t*>(cache.raw_data());
  for (int64_t r = 0; r < rows.numel() / dim; ++r) {
    codec.encode(rows.data<float>() + r * dim, dst + r * codec.row_bytes());
  }
  return cache;
}

// The f32 rows [n, dim] a KV cache of encode_kv_rows holds, decoded by the host codec.
inline Tensor decode_kv_rows(const Tensor& cache, int64_t dim, int64_t rope_dim) {
  const kv_record::RowCodec codec{cache.dtype(), dim, rope_dim};
  Tensor rows = Tensor::zeros({cache.size(0), dim}, DType::kF32);
  const auto* src = static_cast<const uint8_t*>(cache.raw_data());
  for (int64_t i = 0; i < cache.size(0); ++i) {
    codec.decode(src + i * codec.row_bytes(), rows.data<float>() + i * dim);
  }
  return rows;
}

}  // namespace deepinfer::backend_ops
