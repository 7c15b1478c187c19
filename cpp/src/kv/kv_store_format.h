// The on-disk format of one KV block in the persistent store (docs/kv_store.md).
//
// A block file is a fixed 96-byte header, the block's tokens (int32, little-endian) and the
// payload (opaque bytes: the block's KV of all layers, optionally followed by a state snapshot).
// All integers are little-endian. Two checksums (XXH64): one over the header's first 88 bytes
// plus the tokens, one over the payload, so a flipped byte anywhere is detected and a header
// can be trusted before the payload is read.
//
//   off  size  field
//     0     8  magic "DIKVBLK\0"
//     8     4  format version (kKvStoreFormatVersion)
//    12     4  header bytes (96)
//    16     8  fingerprint (model + KV layout, KvStoreFingerprint)
//    24     8  block chain hash (kv::chain_hash)
//    32     8  parent chain hash
//    40     8  payload bytes
//    48     8  state bytes (the payload's trailing state snapshot; 0: none)
//    56     4  number of tokens
//    60     4  traffic class (TrafficClass)
//    64     8  created, unix milliseconds
//    72     8  expires, unix milliseconds
//    80     8  payload checksum: XXH64(payload, seed 0)
//    88     8  header checksum: XXH64(bytes [0, 88) ++ tokens, seed 0)
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kv/prefix_index.h"

namespace deepinfer::kv {

inline constexpr uint32_t kKvStoreFormatVersion = 1;
inline constexpr size_t kKvBlockHeaderBytes = 96;

// Retention classes; each has a default TTL in KvBlockStoreConfig, a request may override it.
enum class TrafficClass : uint32_t { kAgent = 0, kChat = 1 };
const char* traffic_class_name(TrafficClass cls);

// Model identity + KV layout. Two engines share blocks only when their fingerprints are equal:
// the digest of a canonical description, so any difference in model, dtype or layout separates
// them (a 64-bit digest: accidental equality of two distinct layouts is ~2^-64).
class KvStoreFingerprint {
 public:
  // The fields that decide whether one engine's KV bytes mean the same to another.
  struct Layout {
    std::string model;                  // model config hash or identity (e.g. hash of config.json)
    std::string kv_dtype;               // "bf16", "fp8_e4m3", ...
    int block_size = 0;                 // tokens per block
    std::vector<uint64_t> layer_bytes;  // KV bytes of one block, per layer, in payload order
    std::string extra;  // anything else that changes the bytes (state layout, TP rank)
  };

  // From a caller-built canonical description (the caller guarantees it is canonical).
  static KvStoreFingerprint from_description(std::string description);
  // From the layout fields, rendered to a canonical description first.
  static KvStoreFingerprint from_layout(const Layout& layout);

  uint64_t digest() const { return digest_; }
  std::string hex() const;  // 16 lowercase hex digits: the store's subdirectory name
  const std::string& description() const { return description_; }

  friend bool operator==(const KvStoreFingerprint& a, const KvStoreFingerprint& b) {
    return a.digest_ == b.digest_;
  }

 private:
  KvStoreFingerprint(std::string description, uint64_t digest)
      : description_(std::move(description)), digest_(digest) {}
  std::string description_;
  uint64_t digest_;
};

struct KvBlockHeader {
  uint32_t version = kKvStoreFormatVersion;
  uint64_t fingerprint = 0;
  BlockHash hash = 0;
  BlockHash parent = 0;
  uint64_t payload_bytes = 0;
  uint64_t state_bytes = 0;
  uint32_t num_tokens = 0;
  TrafficClass traffic_class = TrafficClass::kChat;
  int64_t created_ms = 0;
  int64_t expires_ms = 0;
  uint64_t payload_checksum = 0;
  uint64_t header_checksum = 0;

  // Bytes of the whole file this header describes.
  uint64_t file_bytes() const { return kKvBlockHeaderBytes + 4ULL * num_tokens + payload_bytes; }
};

// Serialises `header` + `tokens` (the file's prefix before the payload), filling in
// header_checksum; payload_checksum must already be set.
std::vector<uint8_t> encode_block_prefix(KvBlockHeader header, std::span<const int32_t> tokens);

// Parses and checks the fixed header: magic, version, header size, the checksum over header and
// `tokens_bytes` (the file's token section, 4 * num_tokens bytes, read by the caller after a first
// decode_block_header_fields). On failure returns nullopt and sets `why`.
std::optional<KvBlockHeader> decode_block_header_fields(std::span<const uint8_t> header_bytes,
                                                        std::string& why);
bool header_checksum_matches(std::span<const uint8_t> header_bytes,
                             std::span<const uint8_t> tokens_bytes, uint64_t expected);
std::vector<int32_t> decode_tokens(std::span<const uint8_t> tokens_bytes);

// "0123456789abcdef": 16 lowercase hex digits of `v`.
std::string hex64(uint64_t v);

}  // namespace deepinfer::kv
