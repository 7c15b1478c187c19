#include "common/xxh64.h"

#include <bit>
#include <cstring>

namespace deepinfer {

namespace {

constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kPrime3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kPrime4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kPrime5 = 0x27D4EB2F165667C5ULL;

// The specification reads lanes as little-endian integers.
inline uint64_t read_le64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}

inline uint64_t read_le32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap32(v);
  return v;
}

inline uint64_t round(uint64_t acc, uint64_t lane) {
  acc += lane * kPrime2;
  acc = std::rotl(acc, 31);
  return acc * kPrime1;
}

inline uint64_t merge_accumulator(uint64_t acc, uint64_t lane_acc) {
  acc ^= round(0, lane_acc);
  return acc * kPrime1 + kPrime4;
}

}  // namespace

uint64_t xxh64(const void* data, size_t size, uint64_t seed) {
  const auto* p = static_cast<const uint8_t*>(data);
  const uint8_t* const end = p + size;
  uint64_t acc;

  if (size >= 32) {
    // Four independent accumulators over 32-byte stripes.
    uint64_t v1 = seed + kPrime1 + kPrime2;
    uint64_t v2 = seed + kPrime2;
    uint64_t v3 = seed;
    uint64_t v4 = seed - kPrime1;
    const uint8_t* const last_stripe = end - 32;
    do {
      v1 = round(v1, read_le64(p));
      v2 = round(v2, read_le64(p + 8));
      v3 = round(v3, read_le64(p + 16));
      v4 = round(v4, read_le64(p + 24));
      p += 32;
    } while (p <= last_stripe);
    acc = std::rotl(v1, 1) + std::rotl(v2, 7) + std::rotl(v3, 12) + std::rotl(v4, 18);
    acc = merge_accumulator(acc, v1);
    acc = merge_accumulator(acc, v2);
    acc = merge_accumulator(acc, v3);
    acc = merge_accumulator(acc, v4);
  } else {
    acc = seed + kPrime5;
  }

  acc += static_cast<uint64_t>(size);

  // The remaining 0..31 bytes: 8-byte lanes, then one 4-byte lane, then single bytes.
  for (; p + 8 <= end; p += 8) {
    acc ^= round(0, read_le64(p));
    acc = std::rotl(acc, 27) * kPrime1 + kPrime4;
  }
  if (p + 4 <= end) {
    acc ^= read_le32(p) * kPrime1;
    acc = std::rotl(acc, 23) * kPrime2 + kPrime3;
    p += 4;
  }
  for (; p < end; ++p) {
    acc ^= static_cast<uint64_t>(*p) * kPrime5;
    acc = std::rotl(acc, 11) * kPrime1;
  }

  // Final avalanche.
  acc ^= acc >> 33;
  acc *= kPrime2;
  acc ^= acc >> 29;
  acc *= kPrime3;
  acc ^= acc >> 32;
  return acc;
}

}  // namespace deepinfer
