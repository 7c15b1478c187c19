// Reader for the safetensors format: an 8-byte little-endian header length N, N bytes of JSON
// describing each tensor (dtype, shape, data_offsets relative to the data section), then the data.
// The file is mmap-ed; tensors are views of the mapping (no copy) unless misaligned.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/mapped_file.h"
#include "deepinfer/tensor.h"

namespace deepinfer {

struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;        // as written in the file, e.g. "BF16", "F8_E8M0"
  bool dtype_supported = false;  // maps to a deepinfer DType (see dtype_from_safetensors)
  DType dtype = DType::kF32;     // valid when dtype_supported
  Shape shape;
  uint64_t begin = 0;  // byte offsets inside the data section
  uint64_t end = 0;
};

class SafetensorsFile {
 public:
  // Maps and validates the file. Errors (deepinfer::Error) name the path and, where it applies,
  // the tensor: missing file (kNotFound); file shorter than 8 bytes, header length beyond the
  // file, bad header JSON, an entry without dtype/shape/data_offsets, a dtype name that is not
  // a safetensors dtype, negative dims, offsets out of order or past the end of the file
  // ("truncated"), byte size != numel * element size (all kCorruptFile).
  static std::shared_ptr<const SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // A host tensor over the entry's bytes, sharing the mapping's lifetime. Throws
  // Error(kUnsupported) naming the tensor, its dtype and the file when the dtype has no DType.
  Tensor tensor(const SafetensorsEntry& entry) const;
  // Raw bytes of an entry (any dtype).
  const uint8_t* bytes(const SafetensorsEntry& entry) const;

  explicit SafetensorsFile(std::shared_ptr<const MappedFile> file) : file_(std::move(file)) {}

 private:
  std::shared_ptr<const MappedFile> file_;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
  friend class SafetensorsParser;
};

// Element size of a safetensors dtype name ("F64" 8, "BOOL" 1, "F8_E8M0" 1, ...); 0 if unknown.
size_t safetensors_dtype_size(std::string_view dtype_name);

// Writes a safetensors file (used by tests and tools). Tensors are written in the given order.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace deepinfer
