// The Backend front's memory, transfers and synchronisation (contract in deepinfer/backend.h):
// uploads and host copies, the copy stream, pinned host buffers and graph capture, each checking
// its arguments' metadata once for all backends before the backend's implementation. The ops'
// front is backend.cpp.
#include <cstdint>
#include <cstdio>
#include <new>
#include <string>
#include <utility>

#include "backend/op_checks.h"
#include "deepinfer/backend.h"
#include "deepinfer/error.h"

namespace deepinfer {

using checks::OpChecks;

namespace {

// A graph that re-issues its recorded calls: the same ops on the same tensors at every replay.
class ReissueGraph final : public Graph {
 public:
  explicit ReissueGraph(std::function<void()> body) : body_(std::move(body)) {}
  void replay() override { body_(); }

 private:
  std::function<void()> body_;
};

// The conversions upload does (those of convert_elements), refused before anything is copied.
void check_convertible(const char* op, const Tensor& host, DType to) {
  const DType from = host.dtype();
  const bool ok = from == to || (is_floating(from) && is_floating(to)) ||
                  (from == DType::kI64 && to == DType::kI32) ||
                  (from == DType::kI32 && to == DType::kI64);
  if (!ok) {
    throw Error(ErrorCode::kUnsupported,
                std::string(op) + ": cannot convert " + host.describe() + " to " + dtype_name(to));
  }
}

}  // namespace

bool Backend::set_host_sync_forbidden(bool forbidden) {
  return std::exchange(host_sync_forbidden_, forbidden);
}

void Backend::check_host_sync_allowed(const char* what) const {
  if (host_sync_forbidden_) {
    throw Error(ErrorCode::kInternal, std::string(what) +
                                          ": host sync while host syncs are forbidden (inside a "
                                          "forward or sampling launch)");
  }
}

Tensor Backend::upload(const Tensor& host, DType dtype) {
  OpChecks("upload", device_kind()).host("host", host, /*contiguous=*/false);
  check_convertible("upload", host, dtype);
  return upload_impl(host, dtype);
}

MatrixWeight Backend::upload_matrix_weight(const MatrixWeight& host) {
  const OpChecks c("upload_matrix_weight", device_kind());
  c.weight("host", host, {DType::kF32, DType::kBF16, DType::kF16}, -1, -1, /*on_host=*/true);
  return upload_matrix_weight_impl(host);
}

Tensor Backend::upload_weight(const Tensor& host, DType dtype) {
  OpChecks("upload_weight", device_kind()).host("host", host, /*contiguous=*/false);
  check_convertible("upload_weight", host, dtype);
  return upload_weight_impl(host, dtype);
}

Tensor Backend::upload_weight_mapped(const Tensor& host) {
  OpChecks("upload_weight_mapped", device_kind()).host("host", host, /*contiguous=*/false);
  if (!supports_mapped_host_weights()) {
    throw Error(ErrorCode::kUnsupported,
                "upload_weight_mapped: the " + name() +
                    " backend cannot read weights in host memory in place (" + host.describe() +
                    ")");
  }
  return upload_weight_mapped_impl(host);
}

Tensor Backend::upload_weight_mapped_impl(const Tensor&) {
  throw Error(ErrorCode::kInternal, "upload_weight_mapped: the " + name() +
                                        " backend claims mapped host weights but has no "
                                        "upload_weight_mapped_impl");
}

Tensor Backend::to_host(const Tensor& device) {
  OpChecks("to_host", device_kind()).on_device("device", device);
  check_host_sync_allowed("to_host");
  join_branches();  // "waits for all work enqueued so far": the side branch's too
  return to_host_impl(device);
}

void Backend::copy_to_host(const Tensor& device, const Tensor& host) {
  const OpChecks c("copy_to_host", device_kind());
  c.dense("device", device);
  c.host("host", host, /*contiguous=*/true);
  c.same_dtype_and_shape(device, host);
  copy_to_host_impl(device, host);
}

void Backend::synchronize() {
  check_host_sync_allowed("synchronize");
  join_branches();
  synchronize_impl();
}

void Backend::upload_into(const Tensor& dst, const Tensor& host) {
  const OpChecks c("upload_into", device_kind());
  c.dense("dst", dst);
  c.host("host", host, /*contiguous=*/false);
  if (host.shape() != dst.shape()) {
    c.fail("argument host must have dst's shape, got " + dst.describe() + " and " +
           host.describe());
  }
  check_convertible("upload_into", host, dst.dtype());
  upload_into_impl(dst, host);
}

void Backend::begin_copies() {
  begin_copies_impl();
}

void Backend::upload_into_on_copy_stream(const Tensor& dst, const Tensor& host) {
  const OpChecks c("upload_into_on_copy_stream", device_kind());
  c.dense("dst", dst);
  c.host("host", host, /*contiguous=*/false);
  if (host.shape() != dst.shape()) {
    c.fail("argument host must have dst's shape, got " + dst.describe() + " and " +
           host.describe());
  }
  check_convertible("upload_into_on_copy_stream", host, dst.dtype());
  upload_into_on_copy_stream_impl(dst, host);
}

void Backend::upload_pinned_into_on_copy_stream(const Tensor& dst, const Tensor& host) {
  const OpChecks c("upload_pinned_into_on_copy_stream", device_kind());
  c.dense("dst", dst);
  c.host("host", host, /*contiguous=*/false);
  if (host.shape() != dst.shape()) {
    c.fail("argument host must have dst's shape, got " + dst.describe() + " and " +
           host.describe());
  }
  check_convertible("upload_pinned_into_on_copy_stream", host, dst.dtype());
  upload_pinned_into_on_copy_stream_impl(dst, host);
}

void Backend::upload_pinned_batch_on_copy_stream(std::span<const Tensor> dsts,
                                                 std::span<const Tensor> hosts) {
  const OpChecks c("upload_pinned_batch_on_copy_stream", device_kind());
  if (dsts.size() != hosts.size()) {
    c.fail("dsts and hosts must have the same length, got " + std::to_string(dsts.size()) +
           " and " + std::to_string(hosts.size()));
  }
  // A layer's import checks hundreds of pairs: the names are formatted on the stack.
  char dst_name[32];
  char host_name[32];
  for (size_t i = 0; i < dsts.size(); ++i) {
    std::snprintf(dst_name, sizeof dst_name, "dsts[%zu]", i);
    std::snprintf(host_name, sizeof host_name, "hosts[%zu]", i);
    c.dense(dst_name, dsts[i]);
    c.host(host_name, hosts[i], /*contiguous=*/false);
    if (hosts[i].shape() != dsts[i].shape()) {
      c.fail(std::string("argument ") + host_name + " must have " + dst_name + "'s shape, got " +
             dsts[i].describe() + " and " + hosts[i].describe());
    }
    check_convertible("upload_pinned_batch_on_copy_stream", hosts[i], dsts[i].dtype());
  }
  upload_pinned_batch_on_copy_stream_impl(dsts, hosts);
}

void Backend::upload_pinned_batch_on_copy_stream_impl(std::span<const Tensor> dsts,
                                                      std::span<const Tensor> hosts) {
  for (size_t i = 0; i < dsts.size(); ++i)
    upload_pinned_into_on_copy_stream_impl(dsts[i], hosts[i]);
}

HostBuffer Backend::allocate_pinned_host(size_t bytes) {
  return allocate_pinned_host_impl(bytes);
}

HostBuffer Backend::allocate_pinned_host_impl(size_t bytes) {
  return HostBuffer::ordinary(bytes);
}

HostBuffer HostBuffer::ordinary(size_t bytes) {
  constexpr size_t kPage = 4096;
  void* p = ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t(kPage), std::nothrow);
  if (p == nullptr) {
    throw Error(ErrorCode::kIo,
                "HostBuffer: cannot allocate " + std::to_string(bytes) + " bytes of host memory");
  }
  return HostBuffer(p, bytes, /*pinned=*/false,
                    [](void* q) { ::operator delete(q, std::align_val_t(kPage)); });
}

HostBuffer::HostBuffer(void* data, size_t size, bool pinned, std::function<void(void*)> release)
    : data_(static_cast<uint8_t*>(data)),
      size_(size),
      pinned_(pinned),
      release_(std::move(release)) {}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      pinned_(std::exchange(other.pinned_, false)),
      release_(std::move(other.release_)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    pinned_ = std::exchange(other.pinned_, false);
    release_ = std::move(other.release_);
  }
  return *this;
}

HostBuffer::~HostBuffer() {
  reset();
}

void HostBuffer::reset() noexcept {
  if (data_ != nullptr && release_) release_(data_);
  data_ = nullptr;
  size_ = 0;
}

std::unique_ptr<Event> Backend::record_copy_event() {
  return record_copy_event_impl();
}

void Backend::wait_event(Event& event) {
  wait_event_impl(event);
}

void Backend::begin_branch() {
  join_branches();  // one at a time (a previous one an exception left open or unjoined)
  begin_branch_impl();
  branch_ = BranchState::kOpen;
}

void Backend::end_branch() noexcept {
  if (branch_ != BranchState::kOpen) return;
  end_branch_impl();
  branch_ = BranchState::kEnded;
}

void Backend::join_branches() {
  end_branch();
  if (branch_ == BranchState::kNone) return;
  branch_ = BranchState::kNone;
  join_branches_impl();
}

void Backend::copy_into(const Tensor& dst, const Tensor& src) {
  const OpChecks c("copy_into", device_kind());
  c.dense("dst", dst);
  c.dense("src", src);
  c.same_dtype_and_shape(dst, src);
  copy_into_impl(dst, src);
}

std::unique_ptr<Graph> Backend::capture(std::function<void()> body) {
  if (!body) checks::fail("capture", "body is empty");
  return std::make_unique<ReissueGraph>(std::move(body));
}

}  // namespace deepinfer
