// How a KV cache row is stored, byte for byte (docs/model.md#kv-cache-dtypes). This is the one
// definition of the bf16 and fp8 KV formats: the CPU reference ops encode and decode through it,
// and the device kernels implement the same bytes.
//
// A cache row holds C channels of one key (K = V). By cache dtype:
//  - f32 / bf16: [.., C] of that dtype; bf16 is written rounded to nearest even, read widened.
//  - fp8, main KV (SWA ring, compressed entries; rope_dim R > 0), the V4 "MODEL1" record of
//    main_record_bytes(C, R) bytes (kU8):
//      [0, C-R)                 the C-R non-RoPE channels as e4m3, value / scale of its group
//      [C-R, C-R + 2R)          the R RoPE channels as bf16 (little endian)
//      [C+R, C+R + G)           G = ceil((C-R)/64) e8m0 scale bytes, group g covers channels
//                               [64g, 64g+64) of the non-RoPE part
//      then zero bytes up to a multiple of 8.
//    V4 (C 512, R 64): 448 + 128 + 7 = 583 -> 584 bytes.
//  - fp8, index keys (rope_dim 0): C e4m3 values, then one f32 scale (little endian) for the
//    whole key: C + 4 bytes (132 for Di 128).
// Every fp8 scale is the power of two 2^ceil(log2(max(amax, 1e-4) / 448)) over the channels it
// covers (the activation-quantization rule, weight.h), so value / scale fits e4m3 (|.| <= 448)
// and rounds to nearest even; decoding is e4m3 * scale, exact in f32.
#pragma once

#include <cstdint>

#include "deepinfer/dtype.h"

namespace deepinfer::kv_record {

inline constexpr int kFp8Group = 64;  // non-RoPE channels per e8m0 scale of the main record

// Bytes of one fp8 main-KV record of `dim` channels, the last `rope_dim` of them RoPE.
inline int64_t main_record_bytes(int64_t dim, int64_t rope_dim) {
  const int64_t nope = dim - rope_dim;
  const int64_t groups = (nope + kFp8Group - 1) / kFp8Group;
  return (nope + 2 * rope_dim + groups + 7) / 8 * 8;
}
// Bytes of one fp8 index-key record of `dim` channels.
inline int64_t index_record_bytes(int64_t dim) {
  return dim + 4;
}

// The power-of-two scale of a group whose largest magnitude is `amax`.
float fp8_scale(float amax);

void encode_main(const float* x, int64_t dim, int64_t rope_dim, uint8_t* record);
void decode_main(const uint8_t* record, int64_t dim, int64_t rope_dim, float* x);
void encode_index(const float* x, int64_t dim, uint8_t* record);
void decode_index(const uint8_t* record, int64_t dim, float* x);

// One cache's row format: f32, bf16, or kU8 records (the main record when rope_dim > 0, the
// index-key record when rope_dim == 0).
struct RowCodec {
  DType dtype = DType::kF32;
  int64_t dim = 0;
  int64_t rope_dim = 0;

  // What one row takes in the cache tensor's last dimension (elements of `dtype`).
  int64_t row_width() const;
  int64_t row_bytes() const { return row_width() * static_cast<int64_t>(dtype_size(dtype)); }
  // row points at the row in the cache (row_bytes() bytes).
  void encode(const float* x, void* row) const;
  void decode(const void* row, float* x) const;
};

// The row width a cache of `dtype` (f32, bf16 or kU8) needs for rows of `dim` channels.
inline int64_t row_width(DType dtype, int64_t dim, int64_t rope_dim) {
  return RowCodec{dtype, dim, rope_dim}.row_width();
}

}  // namespace deepinfer::kv_record
