#include "kv/kv_store_format.h"

#include <cstring>
#include <string_view>

#include "common/xxh64.h"

namespace deepinfer::kv {

namespace {

constexpr std::array<uint8_t, 8> kMagic = {'D', 'I', 'K', 'V', 'B', 'L', 'K', '\0'};
// Offset of the header checksum: it covers everything before it.
constexpr size_t kHeaderChecksumOffset = 88;

void put_le(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// XXH64 over two separate ranges, as if concatenated. The header and tokens are small, so a copy
// is cheaper than a streaming hash state.
uint64_t checksum_of(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  std::vector<uint8_t> joined(a.size() + b.size());
  if (!a.empty()) std::memcpy(joined.data(), a.data(), a.size());
  if (!b.empty()) std::memcpy(joined.data() + a.size(), b.data(), b.size());
  return xxh64(joined.data(), joined.size());
}

}  // namespace

const char* traffic_class_name(TrafficClass cls) {
  switch (cls) {
    case TrafficClass::kAgent:
      return "agent";
    case TrafficClass::kChat:
      return "chat";
  }
  return "unknown";
}

std::string hex64(uint64_t v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = kDigits[v & 0xf];
  return s;
}

KvStoreFingerprint KvStoreFingerprint::from_description(std::string description) {
  // A domain prefix in the hashed bytes keeps these digests apart from other uses of XXH64.
  const uint64_t digest = xxh64("deepinfer-kv-store-fingerprint\n" + description);
  return KvStoreFingerprint(std::move(description), digest);
}

KvStoreFingerprint KvStoreFingerprint::from_layout(const Layout& layout) {
  // One field per line, "name=value", sizes before contents so no two layouts render alike.
  std::string d;
  d += "format=" + std::to_string(kKvStoreFormatVersion) + "\n";
  d += "model=" + std::to_string(layout.model.size()) + ":" + layout.model + "\n";
  d += "kv_dtype=" + layout.kv_dtype + "\n";
  d += "block_size=" + std::to_string(layout.block_size) + "\n";
  d += "layers=" + std::to_string(layout.layer_bytes.size()) + ":";
  for (size_t i = 0; i < layout.layer_bytes.size(); ++i) {
    d += (i ? "," : "") + std::to_string(layout.layer_bytes[i]);
  }
  d += "\nextra=" + std::to_string(layout.extra.size()) + ":" + layout.extra + "\n";
  return from_description(std::move(d));
}

std::string KvStoreFingerprint::hex() const {
  return hex64(digest_);
}

std::vector<uint8_t> encode_block_prefix(KvBlockHeader h, std::span<const int32_t> tokens) {
  h.num_tokens = static_cast<uint32_t>(tokens.size());
  std::array<uint8_t, kKvBlockHeaderBytes> head{};
  uint8_t* p = head.data();
  std::memcpy(p, kMagic.data(), kMagic.size());
  put_le(p + 8, h.version, 4);
  put_le(p + 12, kKvBlockHeaderBytes, 4);
  put_le(p + 16, h.fingerprint, 8);
  put_le(p + 24, h.hash, 8);
  put_le(p + 32, h.parent, 8);
  put_le(p + 40, h.payload_bytes, 8);
  put_le(p + 48, h.state_bytes, 8);
  put_le(p + 56, h.num_tokens, 4);
  put_le(p + 60, static_cast<uint32_t>(h.traffic_class), 4);
  put_le(p + 64, static_cast<uint64_t>(h.created_ms), 8);
  put_le(p + 72, static_cast<uint64_t>(h.expires_ms), 8);
  put_le(p + 80, h.payload_checksum, 8);
  std::vector<uint8_t> out(head.begin(), head.end());
  out.resize(kKvBlockHeaderBytes + 4 * tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    put_le(&out[kKvBlockHeaderBytes + 4 * i], static_cast<uint32_t>(tokens[i]), 4);
  }
  const std::span<const uint8_t> bytes(out);
  const uint64_t sum =
      checksum_of(bytes.first(kHeaderChecksumOffset), bytes.subspan(kKvBlockHeaderBytes));
  put_le(&out[kHeaderChecksumOffset], sum, 8);
  return out;
}

std::optional<KvBlockHeader> decode_block_header_fields(std::span<const uint8_t> b,
                                                        std::string& why) {
  if (b.size() < kKvBlockHeaderBytes) {
    why = "header truncated: " + std::to_string(b.size()) + " of " +
          std::to_string(kKvBlockHeaderBytes) + " bytes";
    return std::nullopt;
  }
  const uint8_t* p = b.data();
  if (std::memcmp(p, kMagic.data(), kMagic.size()) != 0) {
    why = "bad magic (not a deepinfer KV block file)";
    return std::nullopt;
  }
  KvBlockHeader h;
  h.version = static_cast<uint32_t>(get_le(p + 8, 4));
  if (h.version != kKvStoreFormatVersion) {
    why = "format version " + std::to_string(h.version) + ", expected " +
          std::to_string(kKvStoreFormatVersion);
    return std::nullopt;
  }
  const auto header_bytes = get_le(p + 12, 4);
  if (header_bytes != kKvBlockHeaderBytes) {
    why = "header size " + std::to_string(header_bytes) + ", expected " +
          std::to_string(kKvBlockHeaderBytes);
    return std::nullopt;
  }
  h.fingerprint = get_le(p + 16, 8);
  h.hash = get_le(p + 24, 8);
  h.parent = get_le(p + 32, 8);
  h.payload_bytes = get_le(p + 40, 8);
  h.state_bytes = get_le(p + 48, 8);
  h.num_tokens = static_cast<uint32_t>(get_le(p + 56, 4));
  const auto cls = static_cast<uint32_t>(get_le(p + 60, 4));
  h.created_ms = static_cast<int64_t>(get_le(p + 64, 8));
  h.expires_ms = static_cast<int64_t>(get_le(p + 72, 8));
  h.payload_checksum = get_le(p + 80, 8);
  h.header_checksum = get_le(p + 88, 8);
  // Field ranges are only worth reporting once the checksum is known to be good; the caller
  // checks it, so range errors here are phrased as part of the same corruption.
  if (cls > static_cast<uint32_t>(TrafficClass::kChat)) {
    why = "unknown traffic class " + std::to_string(cls);
    return std::nullopt;
  }
  h.traffic_class = static_cast<TrafficClass>(cls);
  if (h.state_bytes > h.payload_bytes) {
    why = "state bytes " + std::to_string(h.state_bytes) + " exceed payload bytes " +
          std::to_string(h.payload_bytes);
    return std::nullopt;
  }
  return h;
}

bool header_checksum_matches(std::span<const uint8_t> header_bytes,
                             std::span<const uint8_t> tokens_bytes, uint64_t expected) {
  return checksum_of(header_bytes.first(kHeaderChecksumOffset), tokens_bytes) == expected;
}

std::vector<int32_t> decode_tokens(std::span<const uint8_t> b) {
  std::vector<int32_t> tokens(b.size() / 4);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(static_cast<uint32_t>(get_le(b.data() + 4 * i, 4)));
  }
  return tokens;
}

}  // namespace deepinfer::kv
