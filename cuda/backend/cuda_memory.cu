// The CUDA backend's device memory and graph capture: tensors from the stream-ordered pool, or
// from the capture arena while a graph is captured (cuda_context.h: CaptureArena), and the
// graphs that own what their capture left behind.
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda/backend/cuda_backend.h"
#include "cuda/backend/cuda_context.h"
#include "cuda/common/launch.cuh"

namespace deepinfer::cuda {

namespace {

class CudaGraph final : public Graph {
 public:
  CudaGraph(std::shared_ptr<CudaContext> ctx, cudaGraph_t graph, cudaGraphExec_t exec,
            std::vector<void*> dropped, uint64_t capture_id)
      : ctx_(std::move(ctx)),
        graph_(graph),
        exec_(exec),
        dropped_(std::move(dropped)),
        capture_id_(capture_id) {}
  ~CudaGraph() override {
    // A replay may still be running; its graph memory must not be torn down under it.
    cudaStreamSynchronize(ctx_->stream);
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
    for (void* p : dropped_) cudaFreeAsync(p, ctx_->stream);
    ctx_->capture_arena.release_graph(capture_id_);
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  void replay() override { DEEPINFER_CUDA_CHECK(cudaGraphLaunch(exec_, ctx_->stream)); }

 private:
  std::shared_ptr<CudaContext> ctx_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  std::vector<void*> dropped_;  // buffers dropped during the capture that the graph may read
  uint64_t capture_id_;         // its blocks of the capture arena
};

// The buffers allocated before the capture and dropped during it (CudaContext::capture_id).
std::vector<void*> take_dropped_in_capture(CudaContext& ctx) {
  std::lock_guard<std::mutex> lock(ctx.dropped_mu);
  return std::exchange(ctx.dropped_in_capture, {});
}

void free_now(CudaContext& ctx, const std::vector<void*>& buffers) {
  for (void* p : buffers) cudaFreeAsync(p, ctx.stream);
}

}  // namespace

Tensor CudaBackend::empty(const Shape& shape, DType dtype) {
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0) fail("empty", "negative dimension in " + shape_str(shape));
    n *= s;
  }
  const size_t nbytes = static_cast<size_t>(n) * dtype_size(dtype);
  const uint64_t allocated_in = ctx_->capture_id;
  const bool from_arena = allocated_in != 0 && nbytes > 0;
  void* ptr = nullptr;
  if (nbytes > 0) {
    DEEPINFER_CUDA_CHECK(cudaSetDevice(device_));
    cudaError_t err = cudaSuccess;
    if (from_arena) {
      ptr = ctx_->capture_arena.take(nbytes, allocated_in);
      if (ptr == nullptr) err = cudaErrorMemoryAllocation;
    } else {
      err = cudaMallocAsync(&ptr, nbytes, stream());  // the side branch's stream inside it
    }
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw Error(ErrorCode::kIo, "out of CUDA memory allocating " + std::to_string(nbytes) +
                                      " bytes for " + std::string(dtype_name(dtype)) +
                                      shape_str(shape));
    }
    DEEPINFER_CUDA_CHECK(err);
  }
  std::shared_ptr<CudaContext> ctx = ctx_;
  auto storage = Storage::adopt(ptr, nbytes, Device{DeviceKind::kCuda, device_},
                                [ctx, allocated_in, from_arena](void* p) {
                                  if (p == nullptr) return;
                                  const HeldBlock b{p, from_arena, allocated_in};
                                  // A side branch may still use it (or, unjoined, run alongside a
                                  // reuse): at the join.
                                  if (ctx->hold_if_branching(b)) return;
                                  release_block(*ctx, b);
                                });
  return Tensor(std::move(storage), dtype, shape, 0);
}

Tensor CudaBackend::scratch(size_t nbytes) {
  // A byte buffer: fp8 is the only 1-byte element type; its values are never read as fp8.
  return empty({static_cast<int64_t>(nbytes)}, DType::kF8E4M3);
}

Tensor CudaBackend::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  if (t.nbytes() > 0) DEEPINFER_CUDA_CHECK(cudaMemsetAsync(t.raw_data(), 0, t.nbytes(), stream()));
  return t;
}

std::unique_ptr<Graph> CudaBackend::capture(std::function<void()> body) {
  if (!body) fail("capture", "body is empty");
  check_not_capturing("capture");
  DEEPINFER_CUDA_CHECK(cudaSetDevice(device_));
  DEEPINFER_CUDA_CHECK(cudaStreamBeginCapture(ctx_->stream, cudaStreamCaptureModeRelaxed));
  capturing_ = true;
  const uint64_t capture_id = ++ctx_->captures;
  ctx_->capture_id = capture_id;
  cudaGraph_t graph = nullptr;
  try {
    body();
    join_branches();  // the side stream rejoins the capture before it ends
  } catch (...) {
    try {
      join_branches();
    } catch (...) {  // the capture fails anyway; its error is the one to report
    }
    capturing_ = false;
    ctx_->capture_id = 0;
    if (cudaStreamEndCapture(ctx_->stream, &graph) == cudaSuccess && graph != nullptr)
      cudaGraphDestroy(graph);
    cudaGetLastError();
    free_now(*ctx_, take_dropped_in_capture(*ctx_));
    ctx_->capture_arena.release_graph(capture_id);
    throw;
  }
  capturing_ = false;
  ctx_->capture_id = 0;
  const bool exclusive = ctx_->capture_arena.keep_live_blocks(capture_id);
  std::vector<void*> dropped = take_dropped_in_capture(*ctx_);
  cudaError_t err = cudaStreamEndCapture(ctx_->stream, &graph);
  if (err == cudaSuccess && !exclusive) {
    cudaGraphDestroy(graph);
    free_now(*ctx_, dropped);
    ctx_->capture_arena.release_graph(capture_id);
    throw Error(ErrorCode::kInternal,
                "capture: a tensor allocated while the graph was captured outlives the capture in "
                "memory another graph replays into (graph outputs go to tensors allocated before "
                "the capture)");
  }
  cudaGraphExec_t exec = nullptr;
  if (err == cudaSuccess) {
    err = cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch);
    if (err != cudaSuccess) cudaGraphDestroy(graph);
  }
  if (err != cudaSuccess) {
    free_now(*ctx_, dropped);
    ctx_->capture_arena.release_graph(capture_id);
    DEEPINFER_CUDA_CHECK(err);
  }
  return std::make_unique<CudaGraph>(ctx_, graph, exec, std::move(dropped), capture_id);
}

}  // namespace deepinfer::cuda
