// The CUDA backend's device plumbing: construction, uploads and host copies, events. Device memory
// and graph capture: cuda_memory.cu. The ops live in the kernel families (cuda/<family>/).
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cuda/backend/backend_switches.h"
#include "cuda/backend/cuda_backend.h"
#include "cuda/backend/cuda_context.h"
#include "cuda/common/launch.cuh"
#include "cuda/gemm/gemm_launch.h"
#include "cuda/hc/hc_launch.h"

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

namespace {

class CudaEvent final : public Event {
 public:
  // Recorded on `stream`: CudaBackend passes stream() (the side stream inside a branch) or the
  // copy stream.
  CudaEvent(std::shared_ptr<CudaContext> ctx, cudaStream_t stream) : ctx_(std::move(ctx)) {
    DEEPINFER_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    DEEPINFER_CUDA_CHECK(cudaEventRecord(event_, stream));
  }
  cudaEvent_t get() const { return event_; }
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

// Whether `p` is page-locked host memory the device can copy from and to directly.
bool is_pinned_host(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // pageable memory on an old driver: not an error to keep
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
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
  // The A/B switches (backend_switches.h), read once here.
  const BackendSwitches switches = read_backend_switches();
  moe_quant_decode_ = switches.moe_quant_decode;
  moe_quant_prefill_ = switches.moe_quant_prefill;
  fp8_linear_ = switches.fp8_linear;
  fp8_wgmma_math_ = switches.fp8_wgmma_math;
  cublaslt_tune_ = switches.cublaslt_tune;
  hc_pre_choice_ = switches.hc_pre;
  pdl_ = switches.pdl;
  attention_mma_choice_ = switches.attention_mma;
  attention_kernel_ = switches.attention_kernel;
  indexer_fp8_scores_ = switches.indexer_fp8_scores;
  programmatic_launch_device_ = prop.major >= 9;
  if (programmatic_launch_device_) hc_fused_clusters_ = hc_fused_max_cluster(smem_limits_);
  hc_cluster_choice_ = switches.hc_cluster;
  // wgmma kernels have bodies only in sm_90a code (cuda/CMakeLists.txt), and run on sm_90 only.
#ifdef DEEPINFER_HAVE_SM90A
  wgmma_device_ = prop.major == 9;
#endif
  DEEPINFER_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_->stream, cudaStreamNonBlocking));
  DEEPINFER_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_->copy_stream, cudaStreamNonBlocking));
  branches_ = switches.branches;
  if (branches_) {
    DEEPINFER_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_->side_stream, cudaStreamNonBlocking));
    DEEPINFER_CUDA_CHECK(cudaEventCreateWithFlags(&ctx_->fork_event, cudaEventDisableTiming));
    DEEPINFER_CUDA_CHECK(cudaEventCreateWithFlags(&ctx_->join_event, cudaEventDisableTiming));
  }
  if (cublasCreate(&ctx_->cublas) != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorCode::kInternal, "cublasCreate failed");
  }
  cublasSetStream(ctx_->cublas, ctx_->stream);
  constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
  DEEPINFER_CUDA_CHECK(cudaMalloc(&ctx_->cublas_workspace, kCublasWorkspaceBytes));
  ctx_->cublas_workspace_bytes = kCublasWorkspaceBytes;
  if (branches_) DEEPINFER_CUDA_CHECK(cudaMalloc(&ctx_->side_workspace, kCublasWorkspaceBytes));
  if (cublasSetWorkspace(ctx_->cublas, ctx_->cublas_workspace, kCublasWorkspaceBytes) !=
      CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorCode::kInternal, "cublasSetWorkspace failed");
  }
  if (cublasLtCreate(&ctx_->cublaslt) != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorCode::kInternal, "cublasLtCreate failed");
  }
  // fp32 GEMMs stay IEEE fp32 (no TF32): the CUDA backend must match the CPU reference.
  cublasSetMathMode(ctx_->cublas, CUBLAS_DEFAULT_MATH);
  // Cache freed blocks in the pool instead of returning them to the driver at every sync.
  cudaMemPool_t pool;
  DEEPINFER_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_index));
  uint64_t threshold = UINT64_MAX;
  DEEPINFER_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  // Zeroed once; the fused attention combine leaves every counter at zero after each launch.
  attention_counters_ = zeros({kAttentionCounterSlots}, DType::kI32);
}

void CudaBackend::make_current() {
  DEEPINFER_CUDA_CHECK(cudaSetDevice(device_));
}

DeviceMemory CudaBackend::memory_info() {
  check_not_capturing("memory_info");
  join_branches();
  DEEPINFER_CUDA_CHECK(cudaSetDevice(device_));
  DEEPINFER_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));
  // Freed blocks the pool keeps (release threshold) count as free: hand them back first.
  cudaMemPool_t pool;
  DEEPINFER_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_));
  DEEPINFER_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
  size_t free_bytes = 0, total_bytes = 0;
  DEEPINFER_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return {static_cast<int64_t>(total_bytes), static_cast<int64_t>(free_bytes)};
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  try {
    join_branches();        // frees what an unjoined branch held
  } catch (const Error&) {  // a failed stream: nothing to wait for
  }
  cudaStreamSynchronize(ctx_->stream);
  // The pool keeps freed blocks (release threshold above); hand the unused ones back to the
  // driver so a destroyed backend does not keep holding the model's memory. Blocks of tensors
  // that outlive the backend stay theirs.
  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, device_) == cudaSuccess) cudaMemPoolTrimTo(pool, 0);
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
  return ctx_->on_side ? ctx_->side_stream : ctx_->stream;
}
bool CudaBackend::on_side_branch() const {
  return ctx_->on_side;
}
std::string CudaBackend::last_cublaslt_algo() const {
  const cublasLtMatmulAlgo_t& algo = last_cublaslt_algo_.algo;
  int32_t id = 0, splits = 1;
  uint32_t tile = 0, stages = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), nullptr);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile),
                                       nullptr);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                       sizeof(stages), nullptr);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                       sizeof(splits), nullptr);
  return "id " + std::to_string(id) + " tile " + std::to_string(tile) + " stages " +
         std::to_string(stages) + " splits " + std::to_string(splits);
}
cublasHandle_t CudaBackend::cublas() const {
  return ctx_->cublas;
}
cublasLtHandle_t CudaBackend::cublaslt() const {
  return ctx_->cublaslt;
}
void* CudaBackend::cublas_workspace() const {
  return ctx_->on_side ? ctx_->side_workspace : ctx_->cublas_workspace;
}

namespace {

// cuBLAS on `stream` with `workspace` (cublasSetStream resets the workspace to cuBLAS's pool).
bool cublas_on(CudaContext& ctx, cudaStream_t stream, void* workspace) {
  return cublasSetStream(ctx.cublas, stream) == CUBLAS_STATUS_SUCCESS &&
         cublasSetWorkspace(ctx.cublas, workspace, ctx.cublas_workspace_bytes) ==
             CUBLAS_STATUS_SUCCESS;
}

}  // namespace

void CudaBackend::begin_branch_impl() {
  if (!branches_) return;
  DEEPINFER_CUDA_CHECK(cudaEventRecord(ctx_->fork_event, ctx_->stream));
  DEEPINFER_CUDA_CHECK(cudaStreamWaitEvent(ctx_->side_stream, ctx_->fork_event, 0));
  if (!cublas_on(*ctx_, ctx_->side_stream, ctx_->side_workspace)) {
    cublas_on(*ctx_, ctx_->stream, ctx_->cublas_workspace);
    throw Error(ErrorCode::kInternal, "begin_branch: cuBLAS could not take the side stream");
  }
  {
    std::lock_guard<std::mutex> lock(ctx_->held_mu);
    ctx_->holding = true;
  }
  ctx_->on_side = true;
}

void CudaBackend::end_branch_impl() noexcept {
  if (!ctx_->on_side) return;
  ctx_->on_side = false;
  if (!cublas_on(*ctx_, ctx_->stream, ctx_->cublas_workspace)) ctx_->branch_failed = true;
  if (cudaEventRecord(ctx_->join_event, ctx_->side_stream) != cudaSuccess) {
    ctx_->branch_failed = true;
  }
}

void CudaBackend::join_branches_impl() {
  std::vector<HeldBlock> held;
  {
    std::lock_guard<std::mutex> lock(ctx_->held_mu);
    if (!ctx_->holding) return;
    ctx_->holding = false;
    held.swap(ctx_->held);
  }
  const cudaError_t err = cudaStreamWaitEvent(ctx_->stream, ctx_->join_event, 0);
  // After the wait the compute stream is behind the side branch: what the branch's tensors and
  // those that died meanwhile held may be reused (a failed wait leaves a sticky error; the
  // stream runs nothing more either way).
  for (const HeldBlock& b : held) release_block(*ctx_, b);
  DEEPINFER_CUDA_CHECK(err);
  if (std::exchange(ctx_->branch_failed, false)) {
    throw Error(ErrorCode::kInternal,
                "join_branches: the side branch could not be ended (cuBLAS stream or join event)");
  }
}
size_t CudaBackend::cublas_workspace_bytes() const {
  return ctx_->cublas_workspace_bytes;
}

Tensor CudaBackend::upload_impl(const Tensor& host, DType dtype) {
  check_not_capturing("upload");
  Tensor converted = host.dtype() == dtype ? host.contiguous() : host.to(dtype);
  Tensor out = empty(host.shape(), dtype);
  if (out.nbytes() == 0) return out;
  // Pinned staging: the copy is asynchronous and the caller may reuse `host` at once.
  PinnedPool::Block b = ctx_->pinned.acquire(out.nbytes());
  std::memcpy(b.ptr, converted.raw_data(), out.nbytes());
  DEEPINFER_CUDA_CHECK(
      cudaMemcpyAsync(out.raw_data(), b.ptr, out.nbytes(), cudaMemcpyHostToDevice, stream()));
  ctx_->pinned.release_after(b, stream());
  return out;
}

Tensor CudaBackend::upload_weight_impl(const Tensor& host, DType dtype) {
  Tensor converted = host.dtype() == dtype ? host.contiguous() : host.to(dtype);
  Tensor out = empty(host.shape(), dtype);
  if (out.nbytes() > 0) {
    // Weights load once, before any step: a plain (synchronous) copy is fine here.
    DEEPINFER_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), converted.raw_data(), out.nbytes(),
                                         cudaMemcpyHostToDevice, stream()));
    DEEPINFER_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  return out;
}

Tensor CudaBackend::upload_weight_mapped_impl(const Tensor& host) {
  const Tensor src = host.contiguous();
  const size_t nbytes = src.nbytes();
  const Device device{DeviceKind::kCuda, device_};
  if (nbytes == 0) return empty(host.shape(), host.dtype());
  DEEPINFER_CUDA_CHECK(cudaSetDevice(device_));
  // Pinned and mapped: kernels read it over the bus through its device-side address, so only
  // the bytes they touch move (a copy, not a registration of `host`: a checkpoint's read-only
  // file mapping cannot be pinned in place everywhere).
  void* ptr = nullptr;
  const cudaError_t err = cudaHostAlloc(&ptr, nbytes, cudaHostAllocMapped);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorCode::kIo, "upload_weight_mapped: cannot allocate " + std::to_string(nbytes) +
                                    " bytes of pinned, mapped host memory for " + host.describe() +
                                    " (cudaHostAlloc: " + cudaGetErrorString(err) + ")");
  }
  // Owns the allocation from here on, so a failure below frees it.
  auto pinned = std::shared_ptr<void>(ptr, [](void* p) { cudaFreeHost(p); });
  std::memcpy(ptr, src.raw_data(), nbytes);
  void* mapped = nullptr;
  DEEPINFER_CUDA_CHECK(cudaHostGetDevicePointer(&mapped, ptr, 0));
  return Tensor(Storage::borrow(mapped, nbytes, device, std::move(pinned)), host.dtype(),
                host.shape(), 0);
}

MatrixWeight CudaBackend::upload_matrix_weight_impl(const MatrixWeight& host) {
  MatrixWeight out;
  out.act_group = host.act_group;
  if (!host.quantized()) {
    out.values = upload_weight_impl(host.values, weight_dtype(host.values.dtype()));
    return out;
  }
  if (host.format == WeightFormat::kMxfp4) {
    // Kept as shipped (e2m1 pairs + e8m0 scales, 0.53 bytes per weight: V4-Flash's experts fit
    // on two H200s only so): moe_experts decodes them in registers (moe/sm80/experts_quant.cu).
    out.values = upload_weight_impl(host.values, DType::kE2M1x2);
    out.scales = upload_weight_impl(host.scales, DType::kE8M0);
    out.format = host.format;
    out.block_rows = host.block_rows;
    out.block_cols = host.block_cols;
    return out;
  }
  // kFp8Block: the shipped bytes, e4m3 values and f32 block scales (gemm/gemm_fp8_heuristics.h
  // and moe/sm80/experts_quant.cu read them).
  out.format = host.format;
  out.block_rows = host.block_rows;
  out.block_cols = host.block_cols;
  out.values = upload_weight_impl(host.values, DType::kF8E4M3);
  out.scales = upload_weight_impl(host.scales, DType::kF32);
  // Under "wgmma" the weight stream's map of every FP8 weight now; by default each is made on the
  // weight's first linear at kFp8WgmmaAutoMinTokens tokens or more (a decode graph's eager
  // warm-up step, perhaps inside a side branch: upload enqueues on stream()), so routed-expert
  // tables, which never take the stream, get none.
  if (fp8_linear_ == Fp8LinearChoice::kWgmma) prepare_fp8_wgmma_map(*this, out);
  return out;
}

void CudaBackend::check_not_capturing(const char* what) const {
  if (capturing_) {
    throw Error(ErrorCode::kInternal, std::string(what) +
                                          ": not allowed while a graph is captured (inputs of "
                                          "a graph are staged with upload_into before replay)");
  }
}

void CudaBackend::upload_into_impl(const Tensor& dst, const Tensor& host) {
  check_not_capturing("upload_into");
  Tensor converted = host.dtype() == dst.dtype() ? host.contiguous() : host.to(dst.dtype());
  if (dst.nbytes() == 0) return;
  PinnedPool::Block b = ctx_->pinned.acquire(dst.nbytes());
  std::memcpy(b.ptr, converted.raw_data(), dst.nbytes());
  DEEPINFER_CUDA_CHECK(
      cudaMemcpyAsync(dst.raw_data(), b.ptr, dst.nbytes(), cudaMemcpyHostToDevice, stream()));
  ctx_->pinned.release_after(b, stream());
}

void CudaBackend::begin_copies_impl() {
  check_not_capturing("begin_copies");
  ctx_->pinned.reclaim();  // host tier payloads that earlier copies no longer read
  CudaEvent compute_tail(ctx_, stream());
  DEEPINFER_CUDA_CHECK(cudaStreamWaitEvent(ctx_->copy_stream, compute_tail.get(), 0));
}

void CudaBackend::upload_into_on_copy_stream_impl(const Tensor& dst, const Tensor& host) {
  check_not_capturing("upload_into_on_copy_stream");
  Tensor converted = host.dtype() == dst.dtype() ? host.contiguous() : host.to(dst.dtype());
  if (dst.nbytes() == 0) return;
  // Staged through the pinned pool (the host tier's memory is pageable): the caller may reuse
  // `host` at once, and the copy itself is asynchronous.
  PinnedPool::Block b = ctx_->pinned.acquire(dst.nbytes());
  std::memcpy(b.ptr, converted.raw_data(), dst.nbytes());
  DEEPINFER_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), b.ptr, dst.nbytes(), cudaMemcpyHostToDevice,
                                       ctx_->copy_stream));
  ctx_->pinned.release_after(b, ctx_->copy_stream);
}

void CudaBackend::upload_pinned_into_on_copy_stream_impl(const Tensor& dst, const Tensor& host) {
  check_not_capturing("upload_pinned_into_on_copy_stream");
  if (dst.nbytes() == 0) return;
  if (host.dtype() != dst.dtype() || !host.is_contiguous() || !is_pinned_host(host.raw_data())) {
    upload_into_on_copy_stream_impl(dst, host);  // a conversion or pageable bytes: staged
    return;
  }
  DEEPINFER_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), host.raw_data(), dst.nbytes(),
                                       cudaMemcpyHostToDevice, ctx_->copy_stream));
  ctx_->pinned.retain_until(host.storage(), ctx_->copy_stream);
}

void CudaBackend::upload_pinned_batch_on_copy_stream_impl(std::span<const Tensor> dsts,
                                                          std::span<const Tensor> hosts) {
  check_not_capturing("upload_pinned_batch_on_copy_stream");
  std::vector<void*> to;
  std::vector<const void*> from;
  std::vector<size_t> sizes;
  auto owners = std::make_shared<std::vector<std::shared_ptr<const void>>>();
  for (size_t i = 0; i < dsts.size(); ++i) {
    const Tensor& dst = dsts[i];
    const Tensor& host = hosts[i];
    if (dst.nbytes() == 0) continue;
    if (host.dtype() != dst.dtype() || !host.is_contiguous() || !is_pinned_host(host.raw_data())) {
      upload_into_on_copy_stream_impl(dst, host);  // a conversion or pageable bytes: staged
      continue;
    }
    to.push_back(dst.raw_data());
    from.push_back(host.raw_data());
    sizes.push_back(dst.nbytes());
    owners->push_back(host.storage());
  }
  if (to.empty()) return;
  cudaError_t err = cudaErrorNotSupported;
#if CUDART_VERSION >= 13000  // the signature without failIdx (CUDA 12.8 and 12.9 have one more)
  // The sources are read in stream order (after what the copy stream waits for), like
  // cudaMemcpyAsync; one attribute entry, applying from copy 0, covers the whole batch.
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  size_t attr_from_copy = 0;
  err = cudaMemcpyBatchAsync(to.data(), from.data(), sizes.data(), to.size(), &attr,
                             &attr_from_copy, 1, ctx_->copy_stream);
#endif
  if (err == cudaErrorNotSupported) {
    cudaGetLastError();  // no batched copies (driver or toolkit): one copy per view
    try {
      for (size_t i = 0; i < to.size(); ++i) {
        DEEPINFER_CUDA_CHECK(
            cudaMemcpyAsync(to[i], from[i], sizes[i], cudaMemcpyHostToDevice, ctx_->copy_stream));
      }
    } catch (...) {
      // The copies queued before the failure still read the owners' memory.
      ctx_->pinned.retain_until(std::move(owners), ctx_->copy_stream);
      throw;
    }
  } else {
    DEEPINFER_CUDA_CHECK(err);
  }
  ctx_->pinned.retain_until(std::move(owners), ctx_->copy_stream);
}

HostBuffer CudaBackend::allocate_pinned_host_impl(size_t bytes) {
  DEEPINFER_CUDA_CHECK(cudaSetDevice(device_));
  void* ptr = nullptr;
  // Portable: page-locked for every CUDA context of the process, not only this device's.
  const cudaError_t err = cudaHostAlloc(&ptr, bytes == 0 ? 1 : bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorCode::kIo,
                "allocate_pinned_host: cannot pin " + std::to_string(bytes) +
                    " bytes of host memory (cudaHostAlloc: " + cudaGetErrorString(err) + ")");
  }
  return HostBuffer(ptr, bytes, /*pinned=*/true, [](void* p) { cudaFreeHost(p); });
}

std::unique_ptr<Event> CudaBackend::record_copy_event_impl() {
  check_not_capturing("record_copy_event");
  return std::make_unique<CudaEvent>(ctx_, ctx_->copy_stream);
}

void CudaBackend::wait_event_impl(Event& event) {
  check_not_capturing("wait_event");
  auto* e = dynamic_cast<CudaEvent*>(&event);
  if (e == nullptr) fail("wait_event", "the event is not one of this backend's");
  DEEPINFER_CUDA_CHECK(cudaStreamWaitEvent(stream(), e->get(), 0));
}

void CudaBackend::copy_into_impl(const Tensor& dst, const Tensor& src) {
  if (dst.nbytes() == 0 || dst.raw_data() == src.raw_data()) return;
  DEEPINFER_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(),
                                       cudaMemcpyDeviceToDevice, stream()));
}

const Tensor& CudaBackend::pointer_table(const std::vector<int64_t>& pointers) {
  auto it = pointer_tables_.find(pointers);
  if (it != pointer_tables_.end()) return it->second;
  check_not_capturing("pointer_table (first use of a weight table)");
  Tensor host = Tensor::from_vector(pointers, {static_cast<int64_t>(pointers.size())});
  return pointer_tables_.emplace(pointers, upload(host, DType::kI64)).first->second;
}

const void* CudaBackend::tensor_map_table(const std::vector<int64_t>& key,
                                          const std::function<std::vector<CUtensorMap>()>& encode) {
  auto it = tensor_map_tables_.find(key);
  if (it == tensor_map_tables_.end()) {
    check_not_capturing("tensor_map_table (first use of a weight table)");
    const std::vector<CUtensorMap> maps = encode();
    Tensor table;
    if (!maps.empty()) {
      static_assert(sizeof(CUtensorMap) % sizeof(int64_t) == 0);
      std::vector<int64_t> words(maps.size() * sizeof(CUtensorMap) / sizeof(int64_t));
      std::memcpy(words.data(), maps.data(), maps.size() * sizeof(CUtensorMap));
      table = upload(Tensor::from_vector(words, {static_cast<int64_t>(words.size())}), DType::kI64);
      // The pool's blocks are 256-byte aligned; a map needs 64.
      if (reinterpret_cast<uintptr_t>(table.raw_data()) % alignof(CUtensorMap) != 0) {
        table = Tensor();
      }
    }
    it = tensor_map_tables_.emplace(key, std::move(table)).first;
  }
  return it->second.defined() ? it->second.raw_data() : nullptr;
}

Tensor CudaBackend::to_host_impl(const Tensor& device) {
  // One cudaMemcpy copies a dense range; a strided view would need a gather kernel first.
  if (!device.is_contiguous()) {
    fail("to_host", "the CUDA backend copies contiguous tensors only, got a strided view " +
                        device.describe());
  }
  check_not_capturing("to_host");
  Tensor out = Tensor::zeros(device.shape(), device.dtype());
  if (out.nbytes() > 0) {
    DEEPINFER_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), device.raw_data(), out.nbytes(),
                                         cudaMemcpyDeviceToHost, ctx_->stream));
  }
  DEEPINFER_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));
  return out;
}

void CudaBackend::copy_to_host_impl(const Tensor& device, const Tensor& host) {
  check_not_capturing("copy_to_host");
  if (host.nbytes() == 0) return;
  if (is_pinned_host(host.raw_data())) {
    // Pinned (the KV host tier's arena): the copy lands there directly, no staging hop.
    DEEPINFER_CUDA_CHECK(cudaMemcpyAsync(host.raw_data(), device.raw_data(), host.nbytes(),
                                         cudaMemcpyDeviceToHost, stream()));
    ctx_->pinned.retain_until(host.storage(), stream());
    return;
  }
  auto* job = new HostCopyJob{ctx_, ctx_->pinned.acquire(host.nbytes()), host, host.nbytes()};
  DEEPINFER_CUDA_CHECK(cudaMemcpyAsync(job->block.ptr, device.raw_data(), job->nbytes,
                                       cudaMemcpyDeviceToHost, stream()));
  DEEPINFER_CUDA_CHECK(cudaLaunchHostFunc(stream(), finish_host_copy, job));
}

std::unique_ptr<Event> CudaBackend::record_event() {
  check_not_capturing("record_event");
  return std::make_unique<CudaEvent>(ctx_, stream());
}

void CudaBackend::synchronize_impl() {
  check_not_capturing("synchronize");
  DEEPINFER_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));
}

}  // namespace cuda
}  // namespace deepinfer
