// A read-only memory mapping of a whole file, unmapped when the last reference goes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace deepinfer {

class MappedFile {
 public:
  // Throws Error(kNotFound) when the file does not exist, Error(kIo) for other failures, both
  // naming the path and the OS reason. An empty file maps to data() == nullptr, size() == 0.
  static std::shared_ptr<const MappedFile> open(const std::string& path);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

}  // namespace deepinfer
