#include "deepinfer/tensor.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

#include "deepinfer/error.h"

namespace deepinfer {

const char* device_kind_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
    case DeviceKind::kAscend:
      return "ascend";
  }
  return "?";
}

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

std::vector<int64_t> contiguous_strides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

// ---- Storage ---------------------------------------------------------------------------------

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter,
                 std::shared_ptr<const void> keep_alive)
    : data_(data),
      nbytes_(nbytes),
      device_(device),
      deleter_(std::move(deleter)),
      keep_alive_(std::move(keep_alive)) {}

Storage::~Storage() {
  if (deleter_) deleter_(data_);
}

std::shared_ptr<Storage> Storage::allocate_host(size_t nbytes) {
  constexpr size_t kAlign = 64;
  if (nbytes > std::numeric_limits<size_t>::max() - kAlign) {
    throw Error(ErrorCode::kInvalidArgument,
                "host allocation of " + std::to_string(nbytes) + " bytes is too large");
  }
  size_t rounded = (nbytes + kAlign - 1) / kAlign * kAlign;
  if (rounded == 0) rounded = kAlign;
  void* p = std::aligned_alloc(kAlign, rounded);
  if (p == nullptr) {
    throw Error(ErrorCode::kIo,
                "out of host memory allocating " + std::to_string(nbytes) + " bytes");
  }
  std::memset(p, 0, rounded);
  return std::shared_ptr<Storage>(new Storage(
      p, nbytes, Device{}, [](void* q) { std::free(q); }, nullptr));
}

std::shared_ptr<Storage> Storage::borrow(void* data, size_t nbytes, Device device,
                                         std::shared_ptr<const void> keep_alive) {
  return std::shared_ptr<Storage>(
      new Storage(data, nbytes, device, nullptr, std::move(keep_alive)));
}

std::shared_ptr<Storage> Storage::adopt(void* data, size_t nbytes, Device device,
                                        std::function<void(void*)> deleter) {
  return std::shared_ptr<Storage>(new Storage(data, nbytes, device, std::move(deleter), nullptr));
}

// ---- Tensor ----------------------------------------------------------------------------------

Tensor::Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape, int64_t offset_bytes)
    : Tensor(std::move(storage), dtype, shape, contiguous_strides(shape), offset_bytes) {}

Tensor::Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape,
               std::vector<int64_t> strides, int64_t offset_bytes)
    : storage_(std::move(storage)),
      dtype_(dtype),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      offset_bytes_(offset_bytes) {
  if (strides_.size() != shape_.size()) {
    throw Error(ErrorCode::kInvalidArgument, "tensor strides rank does not match shape rank");
  }
  for (int64_t s : shape_) {
    if (s < 0)
      throw Error(ErrorCode::kInvalidArgument, "negative dimension in shape " + shape_str(shape_));
  }
  if (storage_) {
    // The furthest element reachable must lie inside the storage.
    int64_t last = 0;
    bool empty = false;
    for (size_t i = 0; i < shape_.size(); ++i) {
      if (shape_[i] == 0) empty = true;
      last += (shape_[i] - 1) * strides_[i];
    }
    int64_t end =
        offset_bytes_ + (empty ? 0 : (last + 1) * static_cast<int64_t>(dtype_size(dtype_)));
    if (offset_bytes_ < 0 || end > static_cast<int64_t>(storage_->nbytes())) {
      throw Error(ErrorCode::kInvalidArgument,
                  "tensor view " + std::string(dtype_name(dtype_)) + shape_str(shape_) +
                      " at byte offset " + std::to_string(offset_bytes_) +
                      " exceeds its storage of " + std::to_string(storage_->nbytes()) + " bytes");
    }
  }
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  // Validate before allocating: a negative or overflowing size would otherwise reach
  // allocate_host as a huge unsigned byte count.
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0) {
      throw Error(ErrorCode::kInvalidArgument, "negative dimension in shape " + shape_str(shape));
    }
    if (s != 0 && n > std::numeric_limits<int64_t>::max() / s) {
      throw Error(ErrorCode::kInvalidArgument,
                  "shape " + shape_str(shape) + " has more than 2^63 elements");
    }
    n *= s;
  }
  auto storage = Storage::allocate_host(static_cast<size_t>(n) * dtype_size(dtype));
  return Tensor(std::move(storage), dtype, std::move(shape), 0);
}

int64_t Tensor::size(int64_t d) const {
  int64_t r = dim();
  if (d < 0) d += r;
  if (d < 0 || d >= r) {
    throw Error(ErrorCode::kInvalidArgument,
                "dimension " + std::to_string(d) + " out of range for " + describe());
  }
  return shape_[static_cast<size_t>(d)];
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape_) n *= s;
  return n;
}

Device Tensor::device() const {
  return storage_ ? storage_->device() : Device{};
}

bool Tensor::is_contiguous() const {
  if (numel() <= 1) return true;
  // The stride of a size-1 dimension is never used to reach an element, so it does not matter
  // (narrow(d, i, 1) keeps the parent's stride there).
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  if (!storage_) throw Error(ErrorCode::kInvalidArgument, "access to an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_bytes_;
}

Tensor Tensor::reshape(Shape shape) const {
  if (!is_contiguous()) {
    throw Error(ErrorCode::kInvalidArgument, "reshape of a non-contiguous tensor " + describe());
  }
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < -1) {
      throw Error(ErrorCode::kInvalidArgument, "cannot reshape " + describe() + " to " +
                                                   shape_str(shape) +
                                                   ": dimensions must be non-negative or -1");
    }
    if (shape[i] == -1) {
      if (infer >= 0) throw Error(ErrorCode::kInvalidArgument, "reshape: more than one -1");
      infer = static_cast<int>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel() % known != 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  "cannot reshape " + describe() + " to " + shape_str(shape));
    }
    shape[static_cast<size_t>(infer)] = numel() / known;
    known *= shape[static_cast<size_t>(infer)];
  }
  if (known != numel()) {
    throw Error(ErrorCode::kInvalidArgument,
                "cannot reshape " + describe() + " to " + shape_str(shape));
  }
  return Tensor(storage_, dtype_, std::move(shape), offset_bytes_);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  int64_t r = dim();
  if (d < 0) d += r;
  if (d < 0 || d >= r || start < 0 || length < 0 ||
      start + length > shape_[static_cast<size_t>(d)]) {
    throw Error(ErrorCode::kInvalidArgument,
                "narrow(" + std::to_string(d) + ", " + std::to_string(start) + ", " +
                    std::to_string(length) + ") out of range for " + describe());
  }
  Shape shape = shape_;
  shape[static_cast<size_t>(d)] = length;
  int64_t offset = offset_bytes_ + start * strides_[static_cast<size_t>(d)] *
                                       static_cast<int64_t>(dtype_size(dtype_));
  return Tensor(storage_, dtype_, std::move(shape), strides_, offset);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  int64_t r = dim();
  int64_t dd = d < 0 ? d + r : d;
  // Checked here, not left to narrow(): narrow would wrap a still-negative dd a second time.
  if (dd < 0 || dd >= r) {
    throw Error(ErrorCode::kInvalidArgument, "select(" + std::to_string(d) + ", " +
                                                 std::to_string(index) + ") out of range for " +
                                                 describe());
  }
  Tensor t = narrow(dd, index, 1);
  Shape shape = t.shape_;
  std::vector<int64_t> strides = t.strides_;
  shape.erase(shape.begin() + dd);
  strides.erase(strides.begin() + dd);
  return Tensor(t.storage_, dtype_, std::move(shape), std::move(strides), t.offset_bytes_);
}

namespace {

// Calls fn(element_offset) for every element of a strided shape, in row-major order.
template <typename Fn>
void for_each_offset(const Shape& shape, const std::vector<int64_t>& strides, Fn&& fn) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  if (n == 0) return;
  std::vector<int64_t> index(shape.size(), 0);
  int64_t offset = 0;
  for (int64_t i = 0; i < n; ++i) {
    fn(offset);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++index[d] < shape[d]) {
        offset += strides[d];
        break;
      }
      offset -= (shape[d] - 1) * strides[d];
      index[d] = 0;
    }
  }
}

}  // namespace

Tensor Tensor::contiguous() const {
  if (device().kind != DeviceKind::kCpu) {
    throw Error(ErrorCode::kInvalidArgument, "contiguous() on a non-host tensor " + describe());
  }
  if (is_contiguous()) {
    if (strides_ == contiguous_strides(shape_)) return *this;
    return Tensor(storage_, dtype_, shape_, offset_bytes_);  // same bytes, canonical strides
  }
  Tensor out = zeros(shape_, dtype_);
  size_t item = dtype_size(dtype_);
  const char* src = static_cast<const char*>(raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for_each_offset(shape_, strides_, [&](int64_t off) {
    std::memcpy(dst, src + off * static_cast<int64_t>(item), item);
    dst += item;
  });
  return out;
}

Tensor Tensor::to(DType dtype) const {
  Tensor src = contiguous();
  Tensor out = zeros(shape_, dtype);
  convert_elements(src.raw_data(), dtype_, out.raw_data(), dtype, static_cast<size_t>(numel()));
  return out;
}

double Tensor::item(int64_t flat_index) const {
  if (!is_contiguous() || flat_index < 0 || flat_index >= numel()) {
    throw Error(ErrorCode::kInvalidArgument,
                "item(" + std::to_string(flat_index) + ") on " + describe());
  }
  const char* p =
      static_cast<const char*>(raw_data()) + flat_index * static_cast<int64_t>(dtype_size(dtype_));
  switch (dtype_) {
    case DType::kI32:
      return *reinterpret_cast<const int32_t*>(p);
    case DType::kI64:
      return static_cast<double>(*reinterpret_cast<const int64_t*>(p));
    default: {
      float f;
      convert_elements(p, dtype_, &f, DType::kF32, 1);
      return f;
    }
  }
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return std::string(dtype_name(dtype_)) + shape_str(shape_) + " on " +
         device_kind_name(device().kind);
}

}  // namespace deepinfer
