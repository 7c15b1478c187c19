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
//
// DeepSeek-V4.1's shipped formats (model.md C.3, D.3), one record per cache dtype:
//  - kF8E4M3, the V4.1 FP8 record (SWA ring; v41_fp8_record_bytes(C) bytes):
//      [0, C)                   every channel as e4m3 (RoPE channels included), value / scale
//      [C, C + ceil(C/32))      one UE8M0 scale per 32 channels, fp8_scale of the group
//    V4.1 (C 512): 512 + 16 = 528 bytes, token-interleaved [data | scales].
//  - kE2M1x2 with rope_dim > 0, the V4.1 FP4 main record (compressed entries;
//    v41_fp4_main_record_bytes(C) bytes):
//      [0, ceil(C/2))           e2m1 pairs, channel 2i in the low nibble of byte i
//      then ceil(C/16)          one e4m3 scale per 16 channels, fp4_e4m3_scale of the group
//    V4.1 (C 512): 256 + 32 = 288 bytes.
//  - kE2M1x2 with rope_dim == 0, the V4.1 FP4 index-key record (v41_fp4_index_record_bytes(C)):
//      [0, ceil(C/2))           e2m1 pairs as above
//      then ceil(C/32)          one UE8M0 scale per 32 channels, fp4_ue8m0_scale of the group
//    V4.1 (Di 128): 64 + 4 = 68 bytes. DeepInfer lays a block's index keys out block-wide (all
//    tokens' data, then all scales); ours stay token-interleaved: the layout is internal to the
//    engine (no kernel of DeepInfer's reads our caches), the bytes per token are the same.
// A last group may be partial (tiny test models); it takes one scale like a whole one. Every
// e2m1 value is value / scale rounded to the nearest of +-{0, .5, 1, 1.5, 2, 3, 4, 6}, ties to
// the even code, saturating at 6; decoding is e2m1 * scale, exact in f32.
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

inline constexpr int kV41Fp8Group = 32;       // channels per UE8M0 scale of the V4.1 FP8 record
inline constexpr int kV41Fp4MainGroup = 16;   // channels per e4m3 scale of the FP4 main record
inline constexpr int kV41Fp4IndexGroup = 32;  // channels per UE8M0 scale of the FP4 index record

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
inline int64_t v41_fp8_record_bytes(int64_t dim) {
  return dim + ceil_div(dim, kV41Fp8Group);
}
inline int64_t v41_fp4_main_record_bytes(int64_t dim) {
  return ceil_div(dim, 2) + ceil_div(dim, kV41Fp4MainGroup);
}
inline int64_t v41_fp4_index_record_bytes(int64_t dim) {
  return ceil_div(dim, 2) + ceil_div(dim, kV41Fp4IndexGroup);
}

// Spec reading ("round_sf", model.md C.3.2): the UE8M0 scale of an e2m1 group is the power of two
// 2^ceil(log2(max(amax, 1e-4) / 6)), the FP8 rule (fp8_scale) with 6, e2m1's largest magnitude,
// in place of 448: the group never saturates.
float fp4_ue8m0_scale(float amax);
// Spec reading (model.md C.3.3 says only "e4m3 scale per 16 channels"): the smallest e4m3 value
// >= max(amax, 1e-4) / 6 (amax / 6 rounded up, not to nearest, so that no value of the group
// exceeds 6 * scale and saturates), at most 448.
float fp4_e4m3_scale(float amax);
// The e2m1 nibble nearest to v (ties to the even code, saturating at +-6); bit 3 is v's sign
// (v < 0).
uint8_t f32_to_e2m1(float v);

void encode_v41_fp8(const float* x, int64_t dim, uint8_t* record);
void decode_v41_fp8(const uint8_t* record, int64_t dim, float* x);
void encode_v41_fp4_main(const float* x, int64_t dim, uint8_t* record);
void decode_v41_fp4_main(const uint8_t* record, int64_t dim, float* x);
void encode_v41_fp4_index(const float* x, int64_t dim, uint8_t* record);
void decode_v41_fp4_index(const uint8_t* record, int64_t dim, float* x);

void encode_main(const float* x, int64_t dim, int64_t rope_dim, uint8_t* record);
void decode_main(const uint8_t* record, int64_t dim, int64_t rope_dim, float* x);
void encode_index(const float* x, int64_t dim, uint8_t* record);
void decode_index(const uint8_t* record, int64_t dim, float* x);

// One cache's row format: f32, bf16, kU8 records (V4's main record when rope_dim > 0, V4's
// index-key record when rope_dim == 0), kF8E4M3 V4.1 FP8 records, or kE2M1x2 V4.1 FP4 records
// (the main record when rope_dim > 0, the index-key record when rope_dim == 0).
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

// Whether `dtype` is a KV cache dtype (f32, bf16, kU8, kF8E4M3, kE2M1x2).
bool is_kv_cache_dtype(DType dtype);

// The row width a cache of `dtype` (a KV cache dtype) needs for rows of `dim` channels.
inline int64_t row_width(DType dtype, int64_t dim, int64_t rope_dim) {
  return RowCodec{dtype, dim, rope_dim}.row_width();
}

}  // namespace deepinfer::kv_record
