// dist::Communicator over NCCL: one rank per CUDA device (dist/nccl_group.h has the factories).
//
// Device collectives are enqueued on the rank's compute stream (CudaBackend::stream()), so they
// are ordered with the backend's ops exactly as the contract asks, without a host wait; only
// barrier() waits (a one-float all-reduce, then the compute stream's synchronize).
//
// all_reduce_host, the vote channel, must never wait on the compute stream (a vote decides what
// the next step enqueues while the current one still runs). It has its own NCCL communicator
// (make_nccl_rank splits it from the main one, so a rank needs one unique id; make_nccl_group
// inits it from a second id), its own non-blocking,
// highest-priority side stream and small pinned host buffers: values go host -> device, one
// ncclAllGather on the side stream, device -> host, and the host waits for the side stream alone.
// Every op (or, and, sum, max) reduces the gathered values on the host in rank order: NCCL has no
// bitwise reductions, and one path gives the in-process communicator's exact semantics (sum wraps
// modulo 2^64, max signed for i64 and unsigned for u64). The wait polls, so an abort() from
// another thread (a watchdog) or an asynchronous NCCL error ends it with an Error.
//
// What NCCL cannot do that the contract asks: it cannot see other ranks' arguments, so each rank
// checks its own (dtypes, contiguity, device, shapes against size(), count vectors, root) and a
// rank whose arguments are wrong throws without entering the collective, leaving its peers
// waiting; and abort() is local (ncclCommAbort on this rank's communicators), so peers stuck in a
// collective with it need their own abort (a watchdog) or NCCL's own timeout.
//
// NVLink SHARP (NVLS, multicast objects) is switched off before the first communicator is made
// (NCCL_NVLS_ENABLE=0 unless the user set it): deepinfer uses no NVLink multicast, and NVLS
// reserves device memory per communicator and fails on machines whose fabric manager or driver
// does not lend multicast objects.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/backend/cuda_backend.h"
#include "deepinfer/error.h"
#include "dist/communicator.h"
#include "dist/nccl_group.h"
#include "dist/nccl_loader.h"

namespace deepinfer::dist {

namespace {

std::string on_rank(const char* what, int rank) {
  return std::string(what) + " on rank " + std::to_string(rank);
}

void check_cuda(cudaError_t e, const char* call, int rank) {
  if (e == cudaSuccess) return;
  throw Error(ErrorCode::kInternal,
              on_rank(call, rank) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// Before the first communicator: NCCL reads its environment at initialization.
void prepare_nccl_environment() {
  static std::once_flag once;
  std::call_once(once, [] { setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0); });
}

cuda::CudaBackend& cuda_backend_of(Backend* backend, const char* who, int rank) {
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(backend);
  if (cuda == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string(who) + ": rank " + std::to_string(rank) + "'s backend is " +
                    (backend == nullptr ? std::string("null") : backend->name()) +
                    "; the NCCL communicator needs a CUDA backend");
  }
  return *cuda;
}

// Makes `device` current for a scope and restores the caller's device after.
class DeviceGuard {
 public:
  DeviceGuard(int device, int rank) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice", rank);
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice", rank);
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// An NCCL communicator handle: destroyed with the owner, or aborted earlier (then gone).
class CommOwner {
 public:
  CommOwner() = default;
  explicit CommOwner(nccl::Comm comm) : comm_(comm) {}
  CommOwner(CommOwner&& o) noexcept : comm_(std::exchange(o.comm_, nullptr)) {}
  CommOwner& operator=(CommOwner&&) = delete;
  void adopt(CommOwner&& o) {
    abort();
    comm_ = std::exchange(o.comm_, nullptr);
  }
  CommOwner(const CommOwner&) = delete;
  ~CommOwner() {
    if (comm_ != nullptr) nccl::api().comm_destroy(comm_);
  }
  nccl::Comm get() const { return comm_; }
  nccl::Comm* out() { return &comm_; }
  void abort() {
    if (comm_ != nullptr) nccl::api().comm_abort(std::exchange(comm_, nullptr));
  }

 private:
  nccl::Comm comm_ = nullptr;
};

struct StreamDestroy {
  void operator()(CUstream_st* s) const { cudaStreamDestroy(s); }
};
struct PinnedFree {
  void operator()(void* p) const { cudaFreeHost(p); }
};
// Also frees cudaMallocAsync memory (after a device sync: only at destruction).
struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
using StreamPtr = std::unique_ptr<CUstream_st, StreamDestroy>;
using PinnedPtr = std::unique_ptr<void, PinnedFree>;
using DevicePtr = std::unique_ptr<void, DeviceFree>;

std::string sig(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + shape_str(t.shape());
}

Shape trailing(const Tensor& t) {
  return Shape(t.shape().begin() + 1, t.shape().end());
}

size_t row_bytes(const Tensor& t) {
  size_t bytes = dtype_size(t.dtype());
  for (int64_t d : trailing(t)) bytes *= static_cast<size_t>(d);
  return bytes;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, cuda::CudaBackend& backend, CommOwner main, CommOwner side)
      : nccl_(nccl::api()),
        rank_(rank),
        size_(size),
        backend_(backend),
        device_(backend.device_index()) {
    DeviceGuard guard(device_, rank_);
    cudaStream_t stream = nullptr;
    int least = 0;
    int greatest = 0;
    check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest),
               "cudaDeviceGetStreamPriorityRange", rank_);
    check_cuda(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest),
               "cudaStreamCreateWithPriority", rank_);
    side_stream_.reset(stream);
    void* one = nullptr;
    check_cuda(cudaMalloc(&one, sizeof(float)), "cudaMalloc", rank_);
    barrier_value_.reset(one);
    grow_host_buffers(kInitialHostValues);
    // The communicators last: destroyed first (members go in reverse order), before the stream
    // and buffers their work may use.
    main_.adopt(std::move(main));
    side_.adopt(std::move(side));
  }

  // The communicators (the last members) are destroyed first, or were aborted; then the
  // buffers and the side stream go.
  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(side_stream_.get());
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(const Tensor& t) override {
    const Call call = begin("all_reduce_sum");
    check_tensor(call, "tensor", t, /*sum=*/true, /*rows=*/false);
    launch(call, "ncclAllReduce",
           nccl_.all_reduce(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()),
                            nccl::kFloat32, nccl::kSum, main_.get(), stream()));
  }

  void all_gather(const Tensor& input, const Tensor& output) override {
    const Call call = begin("all_gather");
    check_tensor(call, "input", input, false, true);
    check_tensor(call, "output", output, false, true);
    Shape want = input.shape();
    want[0] *= size_;
    if (output.dtype() != input.dtype() || output.shape() != want) {
      invalid(call, "output is " + sig(output) + " but must be " + dtype_name(input.dtype()) +
                        shape_str(want) + " for input " + sig(input));
    }
    launch(call, "ncclAllGather",
           nccl_.all_gather(input.raw_data(), output.raw_data(), input.nbytes(), nccl::kUint8,
                            main_.get(), stream()));
  }

  void reduce_scatter_sum(const Tensor& input, const Tensor& output) override {
    const Call call = begin("reduce_scatter_sum");
    check_tensor(call, "input", input, true, true);
    check_tensor(call, "output", output, true, true);
    Shape want = output.shape();
    want[0] *= size_;
    if (input.shape() != want) {
      invalid(call, "input is " + sig(input) + " but must be f32" + shape_str(want) +
                        " for output " + sig(output));
    }
    launch(call, "ncclReduceScatter",
           nccl_.reduce_scatter(input.raw_data(), output.raw_data(),
                                static_cast<size_t>(output.numel()), nccl::kFloat32, nccl::kSum,
                                main_.get(), stream()));
  }

  void all_to_all(const Tensor& send, std::span<const int64_t> send_rows, const Tensor& recv,
                  std::span<const int64_t> recv_rows) override {
    const Call call = begin("all_to_all");
    check_tensor(call, "send", send, false, true);
    check_tensor(call, "recv", recv, false, true);
    check_counts(call, "send", send, send_rows);
    check_counts(call, "recv", recv, recv_rows);
    if (recv.dtype() != send.dtype() || trailing(recv) != trailing(send)) {
      invalid(call, "recv " + sig(recv) + " does not match send " + sig(send) +
                        " in dtype and trailing shape");
    }
    const auto self = static_cast<size_t>(rank_);
    if (send_rows[self] != recv_rows[self]) {
      invalid(call, "it sends " + std::to_string(send_rows[self]) + " rows to itself but expects " +
                        std::to_string(recv_rows[self]));
    }
    // Rows are moved as bytes: one path for f32 and i32, any trailing shape.
    const size_t rb = row_bytes(send);
    const auto* send_base = static_cast<const uint8_t*>(send.raw_data());
    auto* recv_base = static_cast<uint8_t*>(recv.raw_data());
    launch(call, "ncclGroupStart", nccl_.group_start());
    // Every send and receive of the exchange in one group, so NCCL runs them concurrently; the
    // group is always closed, also when an enqueue in it fails.
    nccl::Result failed = nccl::kSuccess;
    const char* failed_call = "";
    size_t send_at = 0;
    size_t recv_at = 0;
    for (int peer = 0; peer < size_ && failed == nccl::kSuccess; ++peer) {
      const auto p = static_cast<size_t>(peer);
      const size_t out_bytes = static_cast<size_t>(send_rows[p]) * rb;
      const size_t in_bytes = static_cast<size_t>(recv_rows[p]) * rb;
      if (out_bytes > 0) {
        failed =
            nccl_.send(send_base + send_at, out_bytes, nccl::kUint8, peer, main_.get(), stream());
        failed_call = "ncclSend";
      }
      if (failed == nccl::kSuccess && in_bytes > 0) {
        failed =
            nccl_.recv(recv_base + recv_at, in_bytes, nccl::kUint8, peer, main_.get(), stream());
        failed_call = "ncclRecv";
      }
      send_at += out_bytes;
      recv_at += in_bytes;
    }
    const nccl::Result ended = nccl_.group_end();
    launch(call, failed_call, failed);
    launch(call, "ncclGroupEnd", ended);
  }

  void broadcast(const Tensor& t, int root) override {
    const Call call = begin("broadcast");
    check_tensor(call, "tensor", t, false, false);
    if (root < 0 || root >= size_) {
      invalid(call, "root " + std::to_string(root) + " is not a rank of a group of " +
                        std::to_string(size_));
    }
    launch(call, "ncclBroadcast",
           nccl_.broadcast(t.raw_data(), t.raw_data(), t.nbytes(), nccl::kUint8, root, main_.get(),
                           stream()));
  }

  // A one-float all-reduce on the compute stream completes on a rank only once every rank has
  // enqueued it behind its earlier work; waiting for the stream then returns once every rank got
  // there and this rank's earlier work is done. (Like every host wait, not under
  // HostSyncForbidden.)
  void barrier() override {
    const Call call = begin("barrier");
    launch(call, "ncclAllReduce",
           nccl_.all_reduce(barrier_value_.get(), barrier_value_.get(), 1, nccl::kFloat32,
                            nccl::kSum, main_.get(), stream()));
    backend_.synchronize();
  }

  std::vector<int64_t> all_reduce_host(std::span<const int64_t> values, HostReduceOp op) override {
    return host_reduce<int64_t>(values, op);
  }
  std::vector<uint64_t> all_reduce_host(std::span<const uint64_t> values,
                                        HostReduceOp op) override {
    return host_reduce<uint64_t>(values, op);
  }

  // May be called from another thread (a watchdog) while this rank waits in all_reduce_host,
  // which then throws. NCCL allows ncclCommAbort while another thread is blocked in the
  // communicator's calls; that is how a hung collective is ended.
  void abort(const std::string& reason) override {
    std::lock_guard lock(abort_mutex_);
    abort_locked("rank " + std::to_string(rank_) + " aborted: " + reason);
  }

 private:
  static constexpr size_t kInitialHostValues = 64;  // per rank; votes are a few values

  // The collective in progress, for error messages.
  struct Call {
    const char* name;
  };

  cudaStream_t stream() const { return backend_.stream(); }

  // Every collective starts here: an aborted group stays aborted, and the rank's device becomes
  // the calling thread's current device (a rank's thread works on its device only, so it is not
  // restored).
  Call begin(const char* name) {
    if (aborted_.load()) {
      std::lock_guard lock(abort_mutex_);
      throw_aborted_locked(Call{name});
    }
    check_cuda(cudaSetDevice(device_), "cudaSetDevice", rank_);
    return Call{name};
  }

  [[noreturn]] void throw_aborted_locked(const Call& call) const {
    throw Error(ErrorCode::kInternal,
                on_rank(call.name, rank_) + ": the group was aborted: " + reason_);
  }

  // Marks the group failed and aborts both communicators (idempotent: the first reason stays).
  void abort_locked(const std::string& reason) {
    if (aborted_.load()) return;
    reason_ = reason;
    aborted_.store(true);
    DeviceGuard guard(device_, rank_);
    side_.abort();
    main_.abort();
  }

  // A failed NCCL call inside a collective: the group is aborted (a rank whose collective failed
  // cannot take part in the next) and the error names the collective, rank and call.
  [[noreturn]] void fail_locked(const Call& call, const char* nccl_call, nccl::Result result,
                                nccl::Comm comm) {
    const std::string message =
        on_rank(call.name, rank_) + ": " + nccl_call + " failed: " + nccl::error_text(result, comm);
    abort_locked("rank " + std::to_string(rank_) + " failed: " + message);
    throw Error(ErrorCode::kInternal, message);
  }

  [[noreturn]] void invalid(const Call& call, const std::string& what) const {
    throw Error(ErrorCode::kInvalidArgument, on_rank(call.name, rank_) + ": " + what);
  }

  void check_tensor(const Call& call, const char* arg, const Tensor& t, bool sum, bool rows) const {
    if (!t.defined()) invalid(call, std::string(arg) + " is undefined");
    const Device d = t.device();
    if (d.kind != DeviceKind::kCuda || d.index != device_) {
      invalid(call, std::string(arg) + " is " + t.describe() +
                        ": the NCCL communicator of this rank takes tensors on cuda:" +
                        std::to_string(device_));
    }
    if (!t.is_contiguous())
      invalid(call, std::string(arg) + " " + t.describe() + " is not contiguous");
    if (sum ? t.dtype() != DType::kF32 : (t.dtype() != DType::kF32 && t.dtype() != DType::kI32)) {
      invalid(call,
              std::string(arg) + " is " + sig(t) + " but must be f32" + (sum ? "" : " or i32"));
    }
    if (rows && t.dim() < 1)
      invalid(call, std::string(arg) + " " + sig(t) + " has no rows (dim 0)");
  }

  void check_counts(const Call& call, const char* arg, const Tensor& t,
                    std::span<const int64_t> rows) const {
    if (static_cast<int>(rows.size()) != size_) {
      invalid(call, std::string(arg) + "_rows has " + std::to_string(rows.size()) + " counts for " +
                        std::to_string(size_) + " ranks");
    }
    int64_t total = 0;
    for (int64_t n : rows) {
      if (n < 0)
        invalid(call, std::string(arg) + "_rows holds a negative count " + std::to_string(n));
      total += n;
    }
    if (total != t.size(0)) {
      invalid(call, std::string(arg) + " " + sig(t) + " has " + std::to_string(t.size(0)) +
                        " rows but " + arg + "_rows sum to " + std::to_string(total));
    }
  }

  // The result of an NCCL call on the main communicator.
  void launch(const Call& call, const char* nccl_call, nccl::Result result) {
    if (result == nccl::kSuccess) return;
    std::lock_guard lock(abort_mutex_);
    if (aborted_.load()) throw_aborted_locked(call);  // failed because another thread aborted
    fail_locked(call, nccl_call, result, main_.get());
  }

  void grow_host_buffers(size_t values) {
    const size_t send_bytes = values * sizeof(uint64_t);
    const size_t recv_bytes = send_bytes * static_cast<size_t>(size_);
    void* p = nullptr;
    check_cuda(cudaMallocHost(&p, send_bytes), "cudaMallocHost", rank_);
    PinnedPtr host_send(p);
    check_cuda(cudaMallocHost(&p, recv_bytes), "cudaMallocHost", rank_);
    PinnedPtr host_recv(p);
    // Stream-ordered on the side stream: no device-wide synchronization, as cudaFree would do.
    check_cuda(cudaMallocAsync(&p, send_bytes + recv_bytes, side_stream_.get()), "cudaMallocAsync",
               rank_);
    DevicePtr device_buffer(p);
    if (device_buffer_) {
      check_cuda(cudaFreeAsync(device_buffer_.release(), side_stream_.get()), "cudaFreeAsync",
                 rank_);
    }
    device_buffer_ = std::move(device_buffer);
    // Old pinned buffers are kept until destruction: cudaFreeHost may wait for the device.
    if (host_send_) retired_.push_back(std::move(host_send_));
    if (host_recv_) retired_.push_back(std::move(host_recv_));
    host_send_ = std::move(host_send);
    host_recv_ = std::move(host_recv);
    host_capacity_ = values;
  }

  // Waits for the side stream alone, polling so an abort or an NCCL error ends the wait.
  void wait_side(const Call& call) {
    for (;;) {
      const cudaError_t e = cudaStreamQuery(side_stream_.get());
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) check_cuda(e, "cudaStreamQuery (side stream)", rank_);
      {
        std::lock_guard lock(abort_mutex_);
        if (aborted_.load()) throw_aborted_locked(call);
        nccl::Result async = nccl::kSuccess;
        const nccl::Result r = nccl_.comm_get_async_error(side_.get(), &async);
        if (r != nccl::kSuccess) async = r;
        if (async != nccl::kSuccess && async != nccl::kInProgress) {
          fail_locked(call, "ncclAllGather (host channel)", async, side_.get());
        }
      }
      std::this_thread::yield();
    }
  }

  template <typename T>
  std::vector<T> host_reduce(std::span<const T> values, HostReduceOp op) {
    const Call call = begin("all_reduce_host");
    const size_t n = values.size();
    if (n > host_capacity_) grow_host_buffers(std::max(n, 2 * host_capacity_));
    cudaStream_t side = side_stream_.get();
    auto* dev_send = static_cast<uint8_t*>(device_buffer_.get());
    uint8_t* dev_recv = dev_send + host_capacity_ * sizeof(uint64_t);
    if (n > 0) std::memcpy(host_send_.get(), values.data(), n * sizeof(T));
    check_cuda(
        cudaMemcpyAsync(dev_send, host_send_.get(), n * sizeof(T), cudaMemcpyHostToDevice, side),
        "cudaMemcpyAsync (host channel)", rank_);
    // Not under abort_mutex_: the first collective of a communicator connects to the peers and
    // may block until they come, and an abort() from another thread (ncclCommAbort, which NCCL
    // lets another thread call to end a blocked call) must still get through.
    const nccl::Result r =
        nccl_.all_gather(dev_send, dev_recv, n, nccl::kUint64, side_.get(), side);
    if (r != nccl::kSuccess) {
      std::lock_guard lock(abort_mutex_);
      if (aborted_.load()) throw_aborted_locked(call);
      fail_locked(call, "ncclAllGather (host channel)", r, side_.get());
    }
    const size_t gathered = n * static_cast<size_t>(size_);
    check_cuda(cudaMemcpyAsync(host_recv_.get(), dev_recv, gathered * sizeof(T),
                               cudaMemcpyDeviceToHost, side),
               "cudaMemcpyAsync (host channel)", rank_);
    wait_side(call);
    const T* all = static_cast<const T*>(host_recv_.get());
    std::vector<T> out(all, all + n);
    using U = std::make_unsigned_t<T>;
    for (int r = 1; r < size_; ++r) {
      const T* x = all + static_cast<size_t>(r) * n;
      for (size_t i = 0; i < n; ++i) {
        switch (op) {
          case HostReduceOp::kOr:
            out[i] = static_cast<T>(static_cast<U>(out[i]) | static_cast<U>(x[i]));
            break;
          case HostReduceOp::kAnd:
            out[i] = static_cast<T>(static_cast<U>(out[i]) & static_cast<U>(x[i]));
            break;
          case HostReduceOp::kSum:
            out[i] = static_cast<T>(static_cast<U>(out[i]) + static_cast<U>(x[i]));
            break;
          case HostReduceOp::kMax:
            out[i] = std::max(out[i], x[i]);
            break;
        }
      }
    }
    return out;
  }

  const nccl::Api& nccl_;
  const int rank_;
  const int size_;
  cuda::CudaBackend& backend_;
  const int device_;
  StreamPtr side_stream_;
  DevicePtr barrier_value_;
  DevicePtr device_buffer_;  // host channel: send [capacity] then recv [size * capacity]
  PinnedPtr host_send_;
  PinnedPtr host_recv_;
  std::vector<PinnedPtr> retired_;
  size_t host_capacity_ = 0;
  std::mutex abort_mutex_;
  std::atomic<bool> aborted_{false};
  std::string reason_;
  CommOwner main_;
  CommOwner side_;
};

// The side communicator of the host channel, split from `main` (collective: every rank calls it).
CommOwner split_side(const CommOwner& main, int rank) {
  CommOwner side;
  nccl::check(nccl::api().comm_split(main.get(), /*color=*/0, /*key=*/rank, side.out(),
                                     /*config=*/nullptr),
              "ncclCommSplit", rank, main.get());
  return side;
}

}  // namespace

NcclUniqueId nccl_unique_id() {
  const nccl::Api& api = nccl::api();
  prepare_nccl_environment();
  nccl::UniqueId id{};
  nccl::check(api.get_unique_id(&id), "ncclGetUniqueId", 0);
  NcclUniqueId out{};
  static_assert(sizeof(id.internal) == std::tuple_size_v<NcclUniqueId>);
  std::memcpy(out.data(), id.internal, out.size());
  return out;
}

std::unique_ptr<Communicator> make_nccl_rank(int rank, int size, const NcclUniqueId& unique_id,
                                             Backend& backend) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error(ErrorCode::kInvalidArgument, "make_nccl_rank: rank " + std::to_string(rank) +
                                                 " is not a rank of a group of " +
                                                 std::to_string(size));
  }
  cuda::CudaBackend& cuda = cuda_backend_of(&backend, "make_nccl_rank", rank);
  const nccl::Api& api = nccl::api();
  prepare_nccl_environment();
  DeviceGuard guard(cuda.device_index(), rank);
  nccl::UniqueId id{};
  std::memcpy(id.internal, unique_id.data(), unique_id.size());
  CommOwner main;
  nccl::check(api.comm_init_rank(main.out(), size, id, rank), "ncclCommInitRank", rank);
  CommOwner side = split_side(main, rank);
  return std::make_unique<NcclCommunicator>(rank, size, cuda, std::move(main), std::move(side));
}

std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<Backend*>& ranks) {
  if (ranks.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "make_nccl_group: a group needs at least one rank");
  }
  const int n = static_cast<int>(ranks.size());
  std::vector<cuda::CudaBackend*> cudas;
  for (int r = 0; r < n; ++r) {
    cuda::CudaBackend& c = cuda_backend_of(ranks[static_cast<size_t>(r)], "make_nccl_group", r);
    for (int q = 0; q < r; ++q) {
      if (cudas[static_cast<size_t>(q)]->device_index() == c.device_index()) {
        throw Error(ErrorCode::kInvalidArgument,
                    "make_nccl_group: ranks " + std::to_string(q) + " and " + std::to_string(r) +
                        " are both on cuda:" + std::to_string(c.device_index()) +
                        "; NCCL needs one device per rank");
      }
    }
    cudas.push_back(&c);
  }
  const nccl::Api& api = nccl::api();
  prepare_nccl_environment();
  nccl::UniqueId main_id{};
  nccl::UniqueId side_id{};
  nccl::check(api.get_unique_id(&main_id), "ncclGetUniqueId", 0);
  nccl::check(api.get_unique_id(&side_id), "ncclGetUniqueId", 0);
  std::vector<CommOwner> mains(static_cast<size_t>(n));
  std::vector<CommOwner> sides(static_cast<size_t>(n));
  int previous = 0;
  check_cuda(cudaGetDevice(&previous), "cudaGetDevice", 0);
  // One thread initializes every rank, so the inits must be one NCCL group (each would otherwise
  // wait for the others). The host channel's communicators get their own id here rather than a
  // split: both are plain grouped inits, each on its rank's device.
  for (auto* which : {&mains, &sides}) {
    const nccl::UniqueId& id = which == &mains ? main_id : side_id;
    nccl::check(api.group_start(), "ncclGroupStart", 0);
    nccl::Result failed = nccl::kSuccess;
    int failed_rank = 0;
    for (int r = 0; r < n && failed == nccl::kSuccess; ++r) {
      const cudaError_t e = cudaSetDevice(cudas[static_cast<size_t>(r)]->device_index());
      if (e != cudaSuccess) {
        api.group_end();
        cudaSetDevice(previous);
        check_cuda(e, "cudaSetDevice", r);
      }
      failed = api.comm_init_rank((*which)[static_cast<size_t>(r)].out(), n, id, r);
      failed_rank = r;
    }
    const nccl::Result ended = api.group_end();
    cudaSetDevice(previous);
    nccl::check(failed, "ncclCommInitRank", failed_rank);
    nccl::check(ended, "ncclGroupEnd (ncclCommInitRank)", 0);
  }
  std::vector<std::unique_ptr<Communicator>> group;
  for (int r = 0; r < n; ++r) {
    const auto i = static_cast<size_t>(r);
    group.push_back(std::make_unique<NcclCommunicator>(r, n, *cudas[i], std::move(mains[i]),
                                                       std::move(sides[i])));
  }
  return group;
}

}  // namespace deepinfer::dist
