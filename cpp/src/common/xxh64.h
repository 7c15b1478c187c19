// XXH64: the 64-bit xxHash, written from its published specification (xxhash_spec.md, "XXH64
// algorithm description"). Used where a fast non-cryptographic checksum of large buffers is
// needed (the KV store's payload check runs at memory speed, unlike a table-driven CRC).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace deepinfer {

uint64_t xxh64(const void* data, size_t size, uint64_t seed = 0);

inline uint64_t xxh64(std::span<const uint8_t> bytes, uint64_t seed = 0) {
  return xxh64(bytes.data(), bytes.size(), seed);
}
inline uint64_t xxh64(std::string_view text, uint64_t seed = 0) {
  return xxh64(text.data(), text.size(), seed);
}

}  // namespace deepinfer
