// Tensor: a typed, strided view of a reference-counted byte buffer on one device.
//
// Storage is shared: views (reshape, narrow, select) alias it and keep it alive. A Tensor created
// over an mmap-ed checkpoint keeps the mapping alive the same way, so weights load without a copy.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/dtype.h"
#include "deepinfer/error.h"

namespace deepinfer {

enum class DeviceKind : uint8_t { kCpu, kCuda, kAscend };
const char* device_kind_name(DeviceKind kind);

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;
  bool operator==(const Device&) const = default;
};

// Owns (or borrows, through `keep_alive`) `nbytes` of memory on a device.
class Storage {
 public:
  // Allocates zero-initialised, 64-byte aligned host memory.
  static std::shared_ptr<Storage> allocate_host(size_t nbytes);
  // Wraps memory owned by someone else; `keep_alive` holds the owner until the storage dies.
  static std::shared_ptr<Storage> borrow(void* data, size_t nbytes, Device device,
                                         std::shared_ptr<const void> keep_alive);
  // Wraps memory whose release is `deleter(data)`.
  static std::shared_ptr<Storage> adopt(void* data, size_t nbytes, Device device,
                                        std::function<void(void*)> deleter);

  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter,
          std::shared_ptr<const void> keep_alive);
  void* data_;
  size_t nbytes_;
  Device device_;
  std::function<void(void*)> deleter_;
  std::shared_ptr<const void> keep_alive_;
};

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& shape);  // "[2, 3]"

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false; used for "no tensor"
  Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape, int64_t offset_bytes = 0);
  Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape, std::vector<int64_t> strides,
         int64_t offset_bytes);

  // Zero-filled contiguous host tensor.
  static Tensor zeros(Shape shape, DType dtype);
  // Host tensor holding a copy of `values` with the given shape (numel must match).
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, Shape shape);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }  // in elements
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  Device device() const;
  bool is_contiguous() const;
  int64_t offset_bytes() const { return offset_bytes_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* raw_data() const;
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw_data());
  }

  // Views (share storage). reshape needs a contiguous tensor; -1 infers one dimension.
  Tensor reshape(Shape shape) const;
  Tensor narrow(int64_t d, int64_t start, int64_t length) const;
  Tensor select(int64_t d, int64_t index) const;  // drops dimension d

  // Copies into a fresh contiguous host tensor of `dtype` (host tensors only).
  Tensor to(DType dtype) const;
  Tensor contiguous() const;
  // Reads element `flat_index` of a contiguous host tensor as double; for tests and messages.
  double item(int64_t flat_index = 0) const;

  std::string describe() const;  // "f32[2, 3] on cpu"

 private:
  std::shared_ptr<Storage> storage_;
  DType dtype_ = DType::kF32;
  Shape shape_;
  std::vector<int64_t> strides_;
  int64_t offset_bytes_ = 0;
};

std::vector<int64_t> contiguous_strides(const Shape& shape);

template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kI32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kI64;
};

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, Shape shape) {
  Tensor t = zeros(std::move(shape), DTypeOf<T>::value);
  if (static_cast<size_t>(t.numel()) != values.size()) {
    throw Error(ErrorCode::kInvalidArgument,
                "Tensor::from_vector: " + std::to_string(values.size()) +
                    " values do not fill shape " + shape_str(t.shape()));
  }
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
  return t;
}

}  // namespace deepinfer
