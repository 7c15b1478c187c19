// Element types a Tensor can hold, and scalar conversions to and from fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace deepinfer {

// kE8M0: an 8-bit power-of-two scale, value 2^(bits - 127) (0xff is NaN), as in the OCP MX
// spec. kE2M1x2: two fp4 e2m1 values packed in one byte (see docs/model.md#quantized-checkpoints
// for the nibble order); its shapes count bytes. kI8 / kU8 are raw bytes as a checkpoint stores
// them before the loader gives them a meaning.
enum class DType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kI32, kI64, kE8M0, kE2M1x2, kI8, kU8 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "f32", "bf16", ...
// The safetensors spelling ("F32", "BF16", "F16", "F8_E4M3", "F8_E8M0", "I32", "I64", "I8",
// "U8"); false when unknown. kE2M1x2 has none (checkpoints store packed fp4 as I8 or U8).
bool dtype_from_safetensors(std::string_view name, DType* out);
// f32, bf16, f16 and f8 e4m3: the dtypes convert_elements converts between. kE8M0 converts to
// them (exactly) but is a scale, not a value type.
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
// `value` rounded to the nearest e4m3 value (ties to even), saturating at +-448, as f32. The
// quantize-dequantize of activation emulation; f8e4m3_to_f32(f32_to_f8e4m3(v)).
float round_to_f8e4m3(float value);
// 2^(bits - 127); 0xff is NaN.
float e8m0_to_f32(uint8_t bits);
// The e8m0 code of a power of two in [2^-127, 2^127]; false for any other value.
bool f32_to_e8m0_exact(float value, uint8_t* bits);
// One e2m1 nibble (bit 3 sign, then 2 exponent and 1 mantissa bits): +-{0, .5, 1, 1.5, 2, 3, 4, 6}.
float e2m1_to_f32(uint8_t nibble);

// Converts `count` elements between any two floating dtypes (or between i32 and i64), and from
// e8m0 scales to a floating dtype.
void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t count);

}  // namespace deepinfer
