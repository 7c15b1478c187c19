// Element types a Tensor can hold, and scalar conversions to and from fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace deepinfer {

enum class DType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kI32, kI64 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "f32", "bf16", ...
// The safetensors spelling ("F32", "BF16", "F16", "F8_E4M3", "I32", "I64"); false when unknown.
bool dtype_from_safetensors(std::string_view name, DType* out);
bool is_floating(DType dtype);

// Scalar conversions. bf16/f16 round to nearest even; fp8 e4m3 (the OCP "fn" variant: no
// infinities, 0x7f/0xff are NaN) saturates finite values to +-448.
inline float bf16_to_f32(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint16_t f32_to_bf16(float value);
float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);
float f8e4m3_to_f32(uint8_t bits);
uint8_t f32_to_f8e4m3(float value);

// Converts `count` elements between any two floating dtypes (or between i32 and i64).
void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t count);

}  // namespace deepinfer
