#include <algorithm>
#include <bit>
#include <cstring>
#include <deque>

#include "cuda_backend.h"
#include "cuda_common.cuh"

namespace deepinfer {

std::unique_ptr<Backend> make_cuda_backend(int device_index) {
  return std::make_unique<cuda::CudaBackend>(device_index);
}

// GPUs the CUDA runtime sees; 0 without a GPU or driver (for device "auto").
int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear it, so a later call does not report it
    return 0;
  }
  return count;
}

namespace cuda {

void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  throw Error(ErrorCode::kInternal, std::string("CUDA error ") + cudaGetErrorName(err) + " (" +
                                        cudaGetErrorString(err) + ") in " + what + " at " + file +
                                        ":" + std::to_string(line));
}

void fail(const char* op, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": " + what);
}

void check_device(const char* op, const char* arg, const Tensor& t) {
  if (!t.defined()) fail(op, std::string("argument ") + arg + " must be a defined tensor");
  if (t.device().kind != DeviceKind::kCuda) {
    fail(op, std::string("argument ") + arg + " must be on the CUDA device, got " + t.describe());
  }
  if (!t.is_contiguous())
    fail(op, std::string("argument ") + arg + " must be contiguous, got " + t.describe());
}

void check_dtype(const char* op, const char* arg, const Tensor& t, DType dtype) {
  if (t.dtype() != dtype) {
    fail(op, std::string("argument ") + arg + " must be " + dtype_name(dtype) + ", got " +
                 t.describe());
  }
}

void check_rank(const char* op, const char* arg, const Tensor& t, int64_t rank) {
  if (t.dim() != rank) {
    fail(op, std::string("argument ") + arg + " must have rank " + std::to_string(rank) + ", got " +
                 t.describe());
  }
}

// A defined, contiguous CUDA tensor of `dtype` whose shape matches `shape` (-1: any size).
void check_tensor(const char* op, const char* arg, const Tensor& t, DType dtype,
                  const Shape& shape) {
  check_device(op, arg, t);
  check_dtype(op, arg, t, dtype);
  bool ok = t.dim() == static_cast<int64_t>(shape.size());
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 || shape[i] == t.shape()[i];
  if (!ok) {
    fail(op, std::string("argument ") + arg + " must have shape " + shape_str(shape) +
                 " (-1: any size), got " + t.describe());
  }
}

// Pinned host buffers reused once the copies that used them have completed.
class PinnedPool {
 public:
  struct Block {
    void* ptr = nullptr;
    size_t size = 0;
  };
  ~PinnedPool() {
    for (Block& b : free_) cudaFreeHost(b.ptr);
    for (Pending& p : pending_) {
      cudaEventSynchronize(p.event);
      cudaEventDestroy(p.event);
      cudaFreeHost(p.block.ptr);
    }
  }
  Block acquire(size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    reclaim_locked();
    for (size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].size >= n) {
        Block b = free_[i];
        free_.erase(free_.begin() + static_cast<ptrdiff_t>(i));
        return b;
      }
    }
    Block b;
    b.size = std::max<size_t>(4096, std::bit_ceil(n));
    DEEPINFER_CUDA_CHECK(cudaHostAlloc(&b.ptr, b.size, cudaHostAllocDefault));
    return b;
  }
  // The block is reused once `stream` has passed this point.
  void release_after(Block b, cudaStream_t stream) {
    cudaEvent_t e;
    DEEPINFER_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    DEEPINFER_CUDA_CHECK(cudaEventRecord(e, stream));
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back({b, e});
  }
  // Called from a stream callback, when the stream has passed the block's last use.
  void release_now(Block b) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(b);
  }

 private:
  struct Pending {
    Block block;
    cudaEvent_t event;
  };
  void reclaim_locked() {
    while (!pending_.empty() && cudaEventQuery(pending_.front().event) == cudaSuccess) {
      cudaEventDestroy(pending_.front().event);
      free_.push_back(pending_.front().block);
      pending_.pop_front();
    }
  }
  std::mutex mu_;
  std::vector<Block> free_;
  std::deque<Pending> pending_;
};

struct CudaContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  // cuBLAS's workspace, ours so that cuBLAS allocates nothing while a graph is captured.
  void* cublas_workspace = nullptr;
  PinnedPool pinned;
  ~CudaContext() {
    cudaSetDevice(device);
    if (stream != nullptr) cudaStreamSynchronize(stream);
    if (cublas != nullptr) cublasDestroy(cublas);
    if (cublas_workspace != nullptr) cudaFree(cublas_workspace);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

namespace {

class CudaEvent final : public Event {
 public:
  CudaEvent(std::shared_ptr<CudaContext> ctx) : ctx_(std::move(ctx)) {
    DEEPINFER_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    DEEPINFER_CUDA_CHECK(cudaEventRecord(event_, ctx_->stream));
  }
  ~CudaEvent() override { cudaEventDestroy(event_); }
  bool query() override {
    cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) return false;
    DEEPINFER_CUDA_CHECK(e);
    return true;
  }
  void wait() override { DEEPINFER_CUDA_CHECK(cudaEventSynchronize(event_)); }

 private:
  std::shared_ptr<CudaContext> ctx_;
  cudaEvent_t event_ = nullptr;
};

class CudaGraph final : public Graph {
 public:
  CudaGraph(std::shared_ptr<CudaContext> ctx, cudaGraph_t graph, cudaGraphExec_t exec)
      : ctx_(std::move(ctx)), graph_(graph), exec_(exec) {}
  ~CudaGraph() override {
    // A replay may still be running; its graph memory must not be torn down under it.
    cudaStreamSynchronize(ctx_->stream);
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  void replay() override { DEEPINFER_CUDA_CHECK(cudaGraphLaunch(exec_, ctx_->stream)); }

 private:
  std::shared_ptr<CudaContext> ctx_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// Device -> pinned -> pageable host: the last hop runs in a stream callback.
struct HostCopyJob {
  std::shared_ptr<CudaContext> ctx;
  PinnedPool::Block block;
  Tensor host;  // keeps the destination alive until the callback ran
  size_t nbytes = 0;
};

void CUDART_CB finish_host_copy(void* data) {
  auto* job = static_cast<HostCopyJob*>(data);
  std::memcpy(job->host.raw_data(), job->block.ptr, job->nbytes);
  job->ctx->pinned.release_now(job->block);
  delete job;
}

}  // namespace

CudaBackend::CudaBackend(int device_index)
    : device_(device_index), ctx_(std::make_shared<CudaContext>()) {
  int count = 0;
  DEEPINFER_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (device_index < 0 || device_index >= count) {
    throw Error(ErrorCode::kInvalidArgument, "cuda:" + std::to_string(device_index) +
                                                 " does not exist (" + std::to_string(count) +
                                                 " CUDA devices)");
  }
  ctx_->device = device_index;
  DEEPINFER_CUDA_CHECK(cudaSetDevice(device_index));
  cudaDeviceProp prop{};
  DEEPINFER_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_index));
  num_sms_ = prop.multiProcessorCount;
  max_smem_optin_ = prop.sharedMemPerBlockOptin;
  DEEPINFER_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_->stream, cudaStreamNonBlocking));
  if (cublasCreate(&ctx_->cublas) != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorCode::kInternal, "cublasCreate failed");
  }
  cublasSetStream(ctx_->cublas, ctx_->stream);
  constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
  DEEPINFER_CUDA_CHECK(cudaMalloc(&ctx_->cublas_workspace, kCublasWorkspaceBytes));
  if (cublasSetWorkspace(ctx_->cublas, ctx_->cublas_workspace, kCublasWorkspaceBytes) !=
      CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorCode::kInternal, "cublasSetWorkspace failed");
  }
  // fp32 GEMMs stay IEEE fp32 (no TF32): the CUDA backend must match the CPU reference.
  cublasSetMathMode(ctx_->cublas, CUBLAS_DEFAULT_MATH);
  // Cache freed blocks in the pool instead of returning them to the driver at every sync.
  cudaMemPool_t pool;
  DEEPINFER_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_index));
  uint64_t threshold = UINT64_MAX;
  DEEPINFER_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  cudaStreamSynchronize(ctx_->stream);
}

std::string CudaBackend::name() const {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, device_);
  return std::string("cuda:") + std::to_string(device_) + " (" + prop.name + ")";
}

DType CudaBackend::weight_dtype(DType stored) const {
  switch (stored) {
    case DType::kBF16:
    case DType::kF16:
      return DType::kBF16;
    default:
      return DType::kF32;
  }
}

cudaStream_t CudaBackend::stream() const {
  return ctx_->stream;
}
cublasHandle_t CudaBackend::cublas() const {
  return ctx_->cublas;
}

Tensor CudaBackend::empty(const Shape& shape, DType dtype) {
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0) fail("empty", "negative dimension in " + shape_str(shape));
    n *= s;
  }
  const size_t nbytes = static_cast<size_t>(n) * dtype_size(dtype);
  void* ptr = nullptr;
  if (nbytes > 0) {
    DEEPINFER_CUDA_CHECK(cudaSetDevice(device_));
    cudaError_t err = cudaMallocAsync(&ptr, nbytes, ctx_->stream);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw Error(ErrorCode::kIo, "out of CUDA memory allocating " + std::to_string(nbytes) +
                                      " bytes for " + std::string(dtype_name(dtype)) +
                                      shape_str(shape));
    }
    DEEPINFER_CUDA_CHECK(err);
  }
  std::shared_ptr<CudaContext> ctx = ctx_;
  auto storage = Storage::adopt(ptr, nbytes, Device{DeviceKind::kCuda, device_}, [ctx](void* p) {
    if (p != nullptr) cudaFreeAsync(p, ctx->stream);  // stream-ordered: after every earlier use
  });
  return Tensor(std::move(storage), dtype, shape, 0);
}

Tensor CudaBackend::scratch(size_t nbytes) {
  // A byte buffer: fp8 is the only 1-byte element type; its values are never read as fp8.
  return empty({static_cast<int64_t>(nbytes)}, DType::kF8E4M3);
}

Tensor CudaBackend::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  if (t.nbytes() > 0)
    DEEPINFER_CUDA_CHECK(cudaMemsetAsync(t.raw_data(), 0, t.nbytes(), ctx_->stream));
  return t;
}

Tensor CudaBackend::upload(const Tensor& host, DType dtype) {
  check_not_capturing("upload");
  if (!host.defined() || host.device().kind != DeviceKind::kCpu) {
    fail("upload", "argument host must be a host tensor, got " + host.describe());
  }
  Tensor converted = host.dtype() == dtype ? host.contiguous() : host.to(dtype);
  Tensor out = empty(host.shape(), dtype);
  if (out.nbytes() == 0) return out;
  // Pinned staging: the copy is asynchronous and the caller may reuse `host` at once.
  PinnedPool::Block b = ctx_->pinned.acquire(out.nbytes());
  std::memcpy(b.ptr, converted.raw_data(), out.nbytes());
  DEEPINFER_CUDA_CHECK(
      cudaMemcpyAsync(out.raw_data(), b.ptr, out.nbytes(), cudaMemcpyHostToDevice, ctx_->stream));
  ctx_->pinned.release_after(b, ctx_->stream);
  return out;
}

Tensor CudaBackend::upload_weight(const Tensor& host, DType dtype) {
  if (!host.defined() || host.device().kind != DeviceKind::kCpu) {
    fail("upload_weight", "argument host must be a host tensor, got " + host.describe());
  }
  Tensor converted = host.dtype() == dtype ? host.contiguous() : host.to(dtype);
  Tensor out = empty(host.shape(), dtype);
  if (out.nbytes() > 0) {
    // Weights load once, before any step: a plain (synchronous) copy is fine here.
    DEEPINFER_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), converted.raw_data(), out.nbytes(),
                                         cudaMemcpyHostToDevice, ctx_->stream));
    DEEPINFER_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));
  }
  return out;
}

void CudaBackend::check_not_capturing(const char* what) const {
  if (capturing_) {
    throw Error(ErrorCode::kInternal, std::string(what) +
                                          ": not allowed while a graph is captured (inputs of "
                                          "a graph are staged with upload_into before replay)");
  }
}

void CudaBackend::upload_into(const Tensor& dst, const Tensor& host) {
  check_not_capturing("upload_into");
  check_device("upload_into", "dst", dst);
  if (!host.defined() || host.device().kind != DeviceKind::kCpu || host.shape() != dst.shape()) {
    fail("upload_into",
         "needs a host tensor of dst's shape, got " + dst.describe() + " and " + host.describe());
  }
  Tensor converted = host.dtype() == dst.dtype() ? host.contiguous() : host.to(dst.dtype());
  if (dst.nbytes() == 0) return;
  PinnedPool::Block b = ctx_->pinned.acquire(dst.nbytes());
  std::memcpy(b.ptr, converted.raw_data(), dst.nbytes());
  DEEPINFER_CUDA_CHECK(
      cudaMemcpyAsync(dst.raw_data(), b.ptr, dst.nbytes(), cudaMemcpyHostToDevice, ctx_->stream));
  ctx_->pinned.release_after(b, ctx_->stream);
}

void CudaBackend::copy_into(const Tensor& dst, const Tensor& src) {
  check_device("copy_into", "dst", dst);
  check_device("copy_into", "src", src);
  if (dst.dtype() != src.dtype() || dst.shape() != src.shape()) {
    fail("copy_into",
         "needs tensors of one dtype and shape, got " + dst.describe() + " and " + src.describe());
  }
  if (dst.nbytes() == 0 || dst.raw_data() == src.raw_data()) return;
  DEEPINFER_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(),
                                       cudaMemcpyDeviceToDevice, ctx_->stream));
}

std::unique_ptr<Graph> CudaBackend::capture(std::function<void()> body) {
  if (!body) fail("capture", "body is empty");
  check_not_capturing("capture");
  DEEPINFER_CUDA_CHECK(cudaSetDevice(device_));
  DEEPINFER_CUDA_CHECK(cudaStreamBeginCapture(ctx_->stream, cudaStreamCaptureModeRelaxed));
  capturing_ = true;
  cudaGraph_t graph = nullptr;
  try {
    body();
  } catch (...) {
    capturing_ = false;
    if (cudaStreamEndCapture(ctx_->stream, &graph) == cudaSuccess && graph != nullptr)
      cudaGraphDestroy(graph);
    cudaGetLastError();
    throw;
  }
  capturing_ = false;
  DEEPINFER_CUDA_CHECK(cudaStreamEndCapture(ctx_->stream, &graph));
  cudaGraphExec_t exec = nullptr;
  cudaError_t err =
      cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch);
  if (err != cudaSuccess) {
    cudaGraphDestroy(graph);
    DEEPINFER_CUDA_CHECK(err);
  }
  return std::make_unique<CudaGraph>(ctx_, graph, exec);
}

const Tensor& CudaBackend::pointer_table(const std::vector<int64_t>& pointers) {
  auto it = pointer_tables_.find(pointers);
  if (it != pointer_tables_.end()) return it->second;
  check_not_capturing("pointer_table (first use of a weight table)");
  Tensor host = Tensor::from_vector(pointers, {static_cast<int64_t>(pointers.size())});
  return pointer_tables_.emplace(pointers, upload(host, DType::kI64)).first->second;
}

void CudaBackend::check_sync_allowed(const char* what) const {
  if (sync_forbidden_) {
    throw Error(ErrorCode::kInternal,
                std::string(what) +
                    ": host sync while host syncs are forbidden (inside a forward "
                    "or sampling launch)");
  }
}

Tensor CudaBackend::to_host(const Tensor& device) {
  check_device("to_host", "device", device);
  check_sync_allowed("to_host");
  check_not_capturing("to_host");
  Tensor out = Tensor::zeros(device.shape(), device.dtype());
  if (out.nbytes() > 0) {
    DEEPINFER_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), device.raw_data(), out.nbytes(),
                                         cudaMemcpyDeviceToHost, ctx_->stream));
  }
  DEEPINFER_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));
  return out;
}

void CudaBackend::copy_to_host(const Tensor& device, const Tensor& host) {
  check_not_capturing("copy_to_host");
  check_device("copy_to_host", "device", device);
  if (!host.defined() || host.device().kind != DeviceKind::kCpu || !host.is_contiguous() ||
      host.dtype() != device.dtype() || host.shape() != device.shape()) {
    fail("copy_to_host",
         "needs a contiguous host tensor of the device tensor's dtype and shape, got " +
             device.describe() + " and " + host.describe());
  }
  if (host.nbytes() == 0) return;
  auto* job = new HostCopyJob{ctx_, ctx_->pinned.acquire(host.nbytes()), host, host.nbytes()};
  DEEPINFER_CUDA_CHECK(cudaMemcpyAsync(job->block.ptr, device.raw_data(), job->nbytes,
                                       cudaMemcpyDeviceToHost, ctx_->stream));
  DEEPINFER_CUDA_CHECK(cudaLaunchHostFunc(ctx_->stream, finish_host_copy, job));
}

namespace {

__device__ __forceinline__ uint64_t splitmix64_dev(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Same formula as sample::normal (Box-Muller on two counter-based uniforms).
template <typename T>
__global__ void fill_normal_kernel(T* out, int64_t n, uint64_t seed_hash, float mean, float std) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = splitmix64_dev(seed_hash ^ static_cast<uint64_t>(i));
    const uint64_t g = splitmix64_dev(h);
    const double u1 = (static_cast<double>(h >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(g >> 11) * 0x1.0p-53;
    const float v =
        mean + std * static_cast<float>(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    if constexpr (sizeof(T) == 4) {
      out[i] = v;
    } else {
      out[i] = __float2bfloat16(v);
    }
  }
}

}  // namespace

void CudaBackend::fill_random_normal(const Tensor& t, uint64_t seed, float mean, float std) {
  check_device("fill_random_normal", "t", t);
  const int64_t n = t.numel();
  if (n == 0) return;
  const unsigned blocks =
      std::min<unsigned>(ceil_div(n, 256), static_cast<unsigned>(num_sms_) * 32);
  // splitmix64(seed) on the host, as sample::normal does first.
  uint64_t x = seed + 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  const uint64_t seed_hash = x ^ (x >> 31);
  if (t.dtype() == DType::kF32) {
    fill_normal_kernel<<<blocks, 256, 0, ctx_->stream>>>(t.data<float>(), n, seed_hash, mean, std);
  } else if (t.dtype() == DType::kBF16) {
    fill_normal_kernel<<<blocks, 256, 0, ctx_->stream>>>(t.data<__nv_bfloat16>(), n, seed_hash,
                                                         mean, std);
  } else {
    fail("fill_random_normal", "needs an f32 or bf16 tensor, got " + t.describe());
  }
  DEEPINFER_CUDA_LAUNCH_CHECK("fill_random_normal");
}

std::unique_ptr<Event> CudaBackend::record_event() {
  check_not_capturing("record_event");
  return std::make_unique<CudaEvent>(ctx_);
}

void CudaBackend::synchronize() {
  check_sync_allowed("synchronize");
  check_not_capturing("synchronize");
  DEEPINFER_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));
}

}  // namespace cuda
}  // namespace deepinfer
