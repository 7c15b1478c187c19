#include "model/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <system_error>

#include "common/json.h"
#include "common/text.h"
#include "deepinfer/error.h"

namespace deepinfer {

namespace {

struct DTypeSize {
  std::string_view name;
  size_t size;
};

constexpr DTypeSize kSafetensorsDTypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
    {"F32", 4},  {"F64", 8}, {"I64", 8}, {"U64", 8},
};

// The safetensors spelling of a DType; the inverse of dtype_from_safetensors.
const char* safetensors_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kE8M0:
      return "F8_E8M0";
    case DType::kI8:
    case DType::kE2M1x2:
      return "I8";
    case DType::kU8:
      return "U8";
  }
  return "?";
}

// A JSON value as text for a message, cut short: a corrupt header can hold anything.
std::string brief(const json::Value& v) {
  constexpr size_t kMaxShown = 64;
  std::string s = v.dump();
  if (s.size() > kMaxShown) s = s.substr(0, kMaxShown - 3) + "...";
  return s;
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

size_t safetensors_dtype_size(std::string_view dtype_name) {
  for (const DTypeSize& d : kSafetensorsDTypes) {
    if (d.name == dtype_name) return d.size;
  }
  return 0;
}

// Validates the header of a mapped file and fills a SafetensorsFile. Every check that fails
// throws Error(kCorruptFile) starting with the path, so a bad file never yields entries that
// point outside the mapping.
class SafetensorsParser {
 public:
  explicit SafetensorsParser(SafetensorsFile& out) : out_(out), path_(out.path()) {}

  void parse() {
    const MappedFile& file = *out_.file_;
    if (file.size() < 8) {
      fail("truncated safetensors file: " + std::to_string(file.size()) +
           " bytes, expected at least 8 for the header length");
    }
    uint64_t header_len = read_u64_le(file.data());
    uint64_t after_len = file.size() - 8;
    if (header_len > after_len) {
      fail("truncated safetensors file: header length " + std::to_string(header_len) +
           " exceeds the " + std::to_string(after_len) + " bytes after the length field");
    }
    out_.data_start_ = 8 + header_len;
    data_size_ = after_len - header_len;

    std::string_view text(reinterpret_cast<const char*>(file.data()) + 8,
                          static_cast<size_t>(header_len));
    json::Value header = json::parse(text, path_ + " header");
    if (!header.is_object()) {
      fail(std::string("safetensors header is a JSON ") + header.type_name() +
           ", expected an object");
    }
    for (const auto& [key, value] : header.as_object()) {
      if (key == "__metadata__") {
        parse_metadata(value);
      } else {
        out_.entries_.push_back(parse_entry(key, value));
      }
    }
    std::stable_sort(out_.entries_.begin(), out_.entries_.end(),
                     [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                       return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                     });
    check_overlaps();
    for (size_t i = 0; i < out_.entries_.size(); ++i) out_.index_.emplace(out_.entries_[i].name, i);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(ErrorCode::kCorruptFile, path_ + ": " + what);
  }

  void parse_metadata(const json::Value& value) {
    if (!value.is_object()) {
      fail(std::string("__metadata__ is a JSON ") + value.type_name() +
           ", expected an object of strings");
    }
    for (const auto& [k, v] : value.as_object()) {
      if (!v.is_string()) {
        fail("__metadata__ key " + in_quotes(k) + " holds a " + v.type_name() +
             ", expected a string");
      }
      out_.metadata_.emplace(k, v.as_string());
    }
  }

  const json::Value& field(const std::string& name, const json::Value& entry,
                           std::string_view key) const {
    const json::Value* v = entry.find(key);
    if (v == nullptr)
      fail("tensor " + in_quotes(name) + " has no \"" + std::string(key) + "\" field");
    return *v;
  }

  // A non-negative integer element of `what` (a shape dim or an offset).
  uint64_t non_negative(const std::string& name, const json::Value& v, const char* what) const {
    if (!v.is_integer() || v.as_int() < 0) {
      fail("tensor " + in_quotes(name) + " has " + what + " " + brief(v) +
           ", expected a non-negative integer");
    }
    return static_cast<uint64_t>(v.as_int());
  }

  SafetensorsEntry parse_entry(const std::string& name, const json::Value& value) const {
    if (!value.is_object()) {
      fail("tensor " + in_quotes(name) + " is described by a JSON " + value.type_name() +
           ", expected an object with dtype, shape and data_offsets");
    }
    SafetensorsEntry e;
    e.name = name;

    const json::Value& dtype = field(name, value, "dtype");
    if (!dtype.is_string()) {
      fail("tensor " + in_quotes(name) + " has dtype " + brief(dtype) + ", expected a string");
    }
    e.dtype_name = dtype.as_string();
    size_t element_size = safetensors_dtype_size(e.dtype_name);
    if (element_size == 0) {
      fail("tensor " + in_quotes(name) + " has unknown dtype \"" + e.dtype_name +
           "\", expected a safetensors dtype such as F32, BF16, F16, F8_E4M3, I64");
    }
    e.dtype_supported = dtype_from_safetensors(e.dtype_name, &e.dtype);

    const json::Value& shape = field(name, value, "shape");
    if (!shape.is_array()) {
      fail("tensor " + in_quotes(name) + " has shape " + brief(shape) + ", expected an array");
    }
    uint64_t expected_bytes = element_size;
    bool overflow = false;
    for (const json::Value& d : shape.as_array()) {
      uint64_t dim = non_negative(name, d, "shape dimension");
      e.shape.push_back(static_cast<int64_t>(dim));
      if (dim != 0 && expected_bytes > std::numeric_limits<uint64_t>::max() / dim) overflow = true;
      expected_bytes *= dim;
    }

    const json::Value& offsets = field(name, value, "data_offsets");
    if (!offsets.is_array() || offsets.as_array().size() != 2) {
      fail("tensor " + in_quotes(name) + " has data_offsets " + brief(offsets) +
           ", expected [begin, end]");
    }
    e.begin = non_negative(name, offsets.as_array()[0], "data offset");
    e.end = non_negative(name, offsets.as_array()[1], "data offset");
    std::string range = "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
    if (e.begin > e.end) {
      fail("tensor " + in_quotes(name) + " has data_offsets " + range + " with begin after end");
    }
    if (e.end > data_size_) {
      fail("truncated: tensor " + in_quotes(name) + " has data_offsets " + range +
           " but the data section holds only " + std::to_string(data_size_) + " bytes");
    }
    uint64_t nbytes = e.end - e.begin;
    if (overflow || nbytes != expected_bytes) {
      fail("tensor " + in_quotes(name) + " (" + e.dtype_name + " " + shape_str(e.shape) + ") has " +
           std::to_string(nbytes) + " bytes in data_offsets " + range + ", expected " +
           (overflow ? std::string("more than 2^64") : std::to_string(expected_bytes)) +
           " (elements x " + std::to_string(element_size) + " bytes)");
    }
    return e;
  }

  // Entries are sorted by begin; a tensor overlaps when it starts before the furthest end seen
  // so far. Empty tensors cover no bytes and cannot overlap anything.
  void check_overlaps() const {
    const SafetensorsEntry* furthest = nullptr;
    for (const SafetensorsEntry& e : out_.entries_) {
      if (e.begin == e.end) continue;
      if (furthest != nullptr && e.begin < furthest->end) {
        fail("tensors " + in_quotes(furthest->name) + " [" + std::to_string(furthest->begin) +
             ", " + std::to_string(furthest->end) + "] and " + in_quotes(e.name) + " [" +
             std::to_string(e.begin) + ", " + std::to_string(e.end) + "] overlap");
      }
      if (furthest == nullptr || e.end > furthest->end) furthest = &e;
    }
  }

  SafetensorsFile& out_;
  std::string path_;
  uint64_t data_size_ = 0;
};

std::shared_ptr<const SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto file = std::make_shared<SafetensorsFile>(MappedFile::open(path));
  SafetensorsParser(*file).parse();
  return file;
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const uint8_t* SafetensorsFile::bytes(const SafetensorsEntry& entry) const {
  // Guards against an entry taken from another file.
  uint64_t data_size = file_->size() - data_start_;
  if (entry.begin > entry.end || entry.end > data_size) {
    throw Error(ErrorCode::kInvalidArgument,
                path() + ": entry " + in_quotes(entry.name) + " with data_offsets [" +
                    std::to_string(entry.begin) + ", " + std::to_string(entry.end) +
                    "] does not belong to this file (data section of " + std::to_string(data_size) +
                    " bytes)");
  }
  return file_->data() + data_start_ + entry.begin;
}

Tensor SafetensorsFile::tensor(const SafetensorsEntry& entry) const {
  if (!entry.dtype_supported) {
    throw Error(ErrorCode::kUnsupported, path() + ": tensor " + in_quotes(entry.name) +
                                             " has dtype " + entry.dtype_name +
                                             ", which deepinfer cannot load as a tensor "
                                             "(supported: F32, BF16, F16, F8_E4M3, I32, I64)");
  }
  const uint8_t* data = bytes(entry);
  auto nbytes = static_cast<size_t>(entry.end - entry.begin);
  if (reinterpret_cast<uintptr_t>(data) % dtype_size(entry.dtype) == 0) {
    // The mapping is read-only: writing through this tensor faults, which is what we want for
    // weights. The storage keeps the mapping alive.
    auto storage = Storage::borrow(const_cast<uint8_t*>(data), nbytes, Device{}, file_);
    return Tensor(std::move(storage), entry.dtype, entry.shape);
  }
  // Misaligned data (the format does not require alignment): copy into aligned host memory.
  Tensor copy = Tensor::zeros(entry.shape, entry.dtype);
  if (nbytes != 0) std::memcpy(copy.raw_data(), data, nbytes);
  return copy;
}

namespace {

// Writes all of `data`, retrying short writes; throws kIo naming the path.
void write_all(int fd, const std::string& path, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorCode::kIo,
                  path + ": cannot write: " + std::generic_category().message(errno));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

class OutputFile {
 public:
  explicit OutputFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      throw Error(errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
                  path + ": cannot create: " + std::generic_category().message(errno));
    }
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  void write(const void* data, size_t size) { write_all(fd_, path_, data, size); }
  // Closing reports errors (e.g. a full disk on NFS) that write() may not.
  void close() {
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) {
      throw Error(ErrorCode::kIo,
                  path_ + ": cannot close: " + std::generic_category().message(errno));
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json::Value::Object header;
  if (!metadata.empty()) {
    json::Value::Object meta;
    for (const auto& [k, v] : metadata) meta.emplace_back(k, json::Value::make_string(v));
    header.emplace_back("__metadata__", json::Value::make_object(std::move(meta)));
  }
  std::vector<Tensor> contiguous;
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (!t.defined() || t.device().kind != DeviceKind::kCpu) {
      throw Error(ErrorCode::kInvalidArgument, path + ": tensor " + in_quotes(name) + " is " +
                                                   t.describe() + ", expected a host tensor");
    }
    if (name == "__metadata__") {
      throw Error(ErrorCode::kInvalidArgument,
                  path + ": \"__metadata__\" is reserved and cannot name a tensor");
    }
    if (!names.insert(name).second) {
      throw Error(ErrorCode::kInvalidArgument,
                  path + ": tensor " + in_quotes(name) + " given twice");
    }
    contiguous.push_back(t.contiguous());
    json::Value::Array shape;
    for (int64_t d : t.shape()) shape.push_back(json::Value::make_int(d));
    uint64_t end = offset + t.nbytes();
    json::Value::Object entry;
    entry.emplace_back("dtype", json::Value::make_string(safetensors_name(t.dtype())));
    entry.emplace_back("shape", json::Value::make_array(std::move(shape)));
    entry.emplace_back("data_offsets",
                       json::Value::make_array({json::Value::make_int(static_cast<int64_t>(offset)),
                                                json::Value::make_int(static_cast<int64_t>(end))}));
    header.emplace_back(name, json::Value::make_object(std::move(entry)));
    offset = end;
  }
  std::string text = json::Value::make_object(std::move(header)).dump();
  // Pad with spaces (allowed by the format) so the data section starts 8-byte aligned.
  while ((8 + text.size()) % 8 != 0) text += ' ';

  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(text.size() >> (8 * i));
  OutputFile out(path);
  out.write(len, sizeof len);
  out.write(text.data(), text.size());
  for (const Tensor& t : contiguous) {
    if (t.nbytes() != 0) out.write(t.raw_data(), t.nbytes());
  }
  out.close();
}

}  // namespace deepinfer
