#include "deepinfer/dtype.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "deepinfer/error.h"

namespace deepinfer {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kF8E4M3:
      return 1;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kE8M0:
    case DType::kE2M1x2:
    case DType::kI8:
    case DType::kU8:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kF8E4M3:
      return "f8_e4m3";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kE8M0:
      return "e8m0";
    case DType::kE2M1x2:
      return "e2m1x2";
    case DType::kI8:
      return "i8";
    case DType::kU8:
      return "u8";
  }
  return "?";
}

bool dtype_from_safetensors(std::string_view name, DType* out) {
  struct Entry {
    std::string_view name;
    DType dtype;
  };
  static constexpr Entry kTable[] = {
      {"F32", DType::kF32},        {"BF16", DType::kBF16},    {"F16", DType::kF16},
      {"F8_E4M3", DType::kF8E4M3}, {"F8_E8M0", DType::kE8M0}, {"I32", DType::kI32},
      {"I64", DType::kI64},        {"I8", DType::kI8},        {"U8", DType::kU8}};
  for (const Entry& e : kTable) {
    if (e.name == name) {
      *out = e.dtype;
      return true;
    }
  }
  return false;
}

bool is_floating(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16 ||
         dtype == DType::kF8E4M3;
}

uint16_t f32_to_bf16(float value) {
  uint32_t u = std::bit_cast<uint32_t>(value);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

float f16_to_f32(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t out;
  if (exponent == 0) {
    if (mantissa == 0) {
      out = sign;
    } else {  // subnormal: value = mantissa * 2^-24
      float f = std::ldexp(static_cast<float>(mantissa), -24);
      return sign ? -f : f;
    }
  } else if (exponent == 31) {
    out = sign | 0x7f800000u | (mantissa << 13);
  } else {
    out = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  }
  return std::bit_cast<float>(out);
}

uint16_t f32_to_f16(float value) {
  uint32_t u = std::bit_cast<uint32_t>(value);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    float f = std::bit_cast<float>(abs);
    // Round f / 2^-24 to nearest even.
    float scaled = std::ldexp(f, 24);
    float rounded = std::nearbyint(scaled);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(rounded));
  }
  uint32_t rounding = 0xfffu + ((abs >> 13) & 1u);
  uint32_t r = (abs + rounding) >> 13;
  r -= 112u << 10;
  return static_cast<uint16_t>(sign | r);
}

float f8e4m3_to_f32(uint8_t bits) {
  uint32_t sign = bits & 0x80u;
  uint32_t exponent = (bits >> 3) & 0xfu;
  uint32_t mantissa = bits & 0x7u;
  if (exponent == 0xf && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  float value;
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: m/8 * 2^-6
  } else {
    value = std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, static_cast<int>(exponent) - 7);
  }
  return sign ? -value : value;
}

uint8_t f32_to_f8e4m3(float value) {
  if (std::isnan(value)) return 0x7f;
  const auto sign = static_cast<uint8_t>(std::signbit(value) ? 0x80 : 0x00);
  // The nearest e4m3 value (ties to the even code, saturating at 448), then its code, exactly.
  // Computed rather than found by a scan of the codes: the KV and weight encoders call this for
  // every value, and the scan made tens of millions of them take a minute.
  const float r = std::fabs(round_to_f8e4m3(value));
  if (r < 0x1p-6f) return static_cast<uint8_t>(sign | static_cast<uint8_t>(r * 512.0f));  // m 2^-9
  int e = 0;
  const float m = std::frexp(r, &e);  // r = m 2^e, m in [1/2, 1): exponent field e - 1 + 7
  const auto mantissa = static_cast<uint32_t>((2.0f * m - 1.0f) * 8.0f);
  return static_cast<uint8_t>(sign | (static_cast<uint32_t>(e + 6) << 3) | mantissa);
}

float round_to_f8e4m3(float value) {
  if (std::isnan(value)) return value;
  const float a = std::fabs(value);
  float r = 448.0f;
  if (a < 448.0f) {
    // The spacing of e4m3 values around a: 2^(e - 3) for a in [2^e, 2^(e+1)), e >= -6; the
    // subnormals below 2^-6 share the spacing 2^-9. a / quantum is exact (a power of two).
    int e = 0;
    std::frexp(a, &e);  // a in [2^(e-1), 2^e)
    const float quantum = std::ldexp(1.0f, std::max(e - 1, -6) - 3);
    r = std::min(448.0f, std::nearbyint(a / quantum) * quantum);
  }
  return std::signbit(value) ? -r : r;
}

float e8m0_to_f32(uint8_t bits) {
  if (bits == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(bits) - 127);
}

bool f32_to_e8m0_exact(float value, uint8_t* bits) {
  if (!(value > 0.0f) || std::isinf(value)) return false;
  int exponent = 0;
  const float mantissa = std::frexp(value, &exponent);  // value = mantissa * 2^exponent
  if (mantissa != 0.5f) return false;
  const int code = exponent - 1 + 127;
  if (code < 0 || code > 254) return false;
  *bits = static_cast<uint8_t>(code);
  return true;
}

float e2m1_to_f32(uint8_t nibble) {
  static constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMagnitude[nibble & 7u];
  return (nibble & 8u) != 0 ? -m : m;
}

namespace {

float load_as_f32(const void* src, DType dtype, size_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(src)[i];
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(src)[i]);
    case DType::kF8E4M3:
      return f8e4m3_to_f32(static_cast<const uint8_t*>(src)[i]);
    case DType::kE8M0:
      return e8m0_to_f32(static_cast<const uint8_t*>(src)[i]);
    default:
      break;
  }
  throw Error(ErrorCode::kInternal, "load_as_f32: not a floating dtype");
}

void store_f32(void* dst, DType dtype, size_t i, float v) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(dst)[i] = v;
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(dst)[i] = f32_to_bf16(v);
      return;
    case DType::kF16:
      static_cast<uint16_t*>(dst)[i] = f32_to_f16(v);
      return;
    case DType::kF8E4M3:
      static_cast<uint8_t*>(dst)[i] = f32_to_f8e4m3(v);
      return;
    default:
      break;
  }
  throw Error(ErrorCode::kInternal, "store_f32: not a floating dtype");
}

}  // namespace

void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t count) {
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, count * dtype_size(src_dtype));
    return;
  }
  if ((is_floating(src_dtype) || src_dtype == DType::kE8M0) && is_floating(dst_dtype)) {
    for (size_t i = 0; i < count; ++i) store_f32(dst, dst_dtype, i, load_as_f32(src, src_dtype, i));
    return;
  }
  if (src_dtype == DType::kI64 && dst_dtype == DType::kI32) {
    const auto* s = static_cast<const int64_t*>(src);
    auto* d = static_cast<int32_t*>(dst);
    for (size_t i = 0; i < count; ++i) {
      if (s[i] < std::numeric_limits<int32_t>::min() ||
          s[i] > std::numeric_limits<int32_t>::max()) {
        throw Error(ErrorCode::kInvalidArgument, "i64 value " + std::to_string(s[i]) +
                                                     " at index " + std::to_string(i) +
                                                     " does not fit in i32");
      }
      d[i] = static_cast<int32_t>(s[i]);
    }
    return;
  }
  if (src_dtype == DType::kI32 && dst_dtype == DType::kI64) {
    const auto* s = static_cast<const int32_t*>(src);
    auto* d = static_cast<int64_t*>(dst);
    for (size_t i = 0; i < count; ++i) d[i] = s[i];
    return;
  }
  throw Error(ErrorCode::kUnsupported, std::string("cannot convert ") + dtype_name(src_dtype) +
                                           " to " + dtype_name(dst_dtype));
}

}  // namespace deepinfer
