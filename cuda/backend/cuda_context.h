// The backend's device plumbing in one place: the compute stream, the cuBLAS and cuBLASLt
// handles and their workspace, and the pinned host staging of uploads and host copies. Shared (a
// shared_ptr) by the backend, its tensors' deleters, events, graphs and host callbacks, which may
// outlive it.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda/common/launch.cuh"

namespace deepinfer::cuda {

// Pinned host buffers reused once the copies that used them have completed, and the owners of
// pinned memory that copies read or write directly (the KV host tier's arena), held until those
// copies have completed.
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
    for (auto& [stream, retained] : retained_) {
      for (Retained& r : retained) {
        cudaEventSynchronize(r.event);
        cudaEventDestroy(r.event);
      }
    }
  }
  Block acquire(size_t n) {
    std::vector<std::shared_ptr<const void>> done;  // released after the lock
    std::lock_guard<std::mutex> lock(mu_);
    reclaim_locked(done);
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
  // Keeps `owner` alive until `stream` has passed this point: a copy enqueued on it reads or
  // writes the owner's pinned memory directly, so that memory must not be freed (and reused by
  // another block of its arena) before the copy ran.
  void retain_until(std::shared_ptr<const void> owner, cudaStream_t stream) {
    cudaEvent_t e;
    DEEPINFER_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    const cudaError_t err = cudaEventRecord(e, stream);
    if (err != cudaSuccess) {
      cudaEventDestroy(e);
      DEEPINFER_CUDA_CHECK(err);
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [s, retained] : retained_) {
      if (s == stream) {
        retained.push_back({std::move(owner), e});
        return;
      }
    }
    retained_.emplace_back(stream, std::deque<Retained>{});
    retained_.back().second.push_back({std::move(owner), e});
  }
  // Releases what the completed copies no longer need (owners are dropped outside the lock: an
  // owner's release may take its arena's lock).
  void reclaim() {
    std::vector<std::shared_ptr<const void>> done;
    std::lock_guard<std::mutex> lock(mu_);
    reclaim_locked(done);
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
  struct Retained {
    std::shared_ptr<const void> owner;
    cudaEvent_t event;
  };
  // `done` receives the owners to drop; the caller declares it before its lock, so they are
  // released after the lock is.
  void reclaim_locked(std::vector<std::shared_ptr<const void>>& done) {
    while (!pending_.empty() && cudaEventQuery(pending_.front().event) == cudaSuccess) {
      cudaEventDestroy(pending_.front().event);
      free_.push_back(pending_.front().block);
      pending_.pop_front();
    }
    // Per stream, events complete in the order they were recorded: stop at the first pending.
    for (auto& [stream, retained] : retained_) {
      while (!retained.empty() && cudaEventQuery(retained.front().event) == cudaSuccess) {
        cudaEventDestroy(retained.front().event);
        done.push_back(std::move(retained.front().owner));
        retained.pop_front();
      }
    }
  }
  std::mutex mu_;
  std::vector<Block> free_;
  std::deque<Pending> pending_;
  // By stream (the compute and the copy stream: a short list).
  std::vector<std::pair<cudaStream_t, std::deque<Retained>>> retained_;
};

// The device memory of tensors allocated while a graph is captured. Stream-ordered allocations
// there would become memory nodes of the graph, and a kernel launched after such a node is no
// longer a programmatic dependent of the kernel before it (measured on an H100: a chain of short
// kernels lost all of PDL's gain). So a capture takes plain cudaMalloc blocks instead, and a
// block whose tensor died is reused by a later allocation of the same capture or of a later one:
// everything a graph runs is ordered on the one compute stream (a kernel that may start early
// waits before it writes, cuda/common/pdl.cuh), and graphs replay one at a time on it. A block
// still live when its capture ends is kept by that graph, for it alone, until the graph is
// destroyed and the tensor died.
class CaptureArena {
 public:
  CaptureArena() = default;
  CaptureArena(const CaptureArena&) = delete;
  CaptureArena& operator=(const CaptureArena&) = delete;
  ~CaptureArena() {
    for (const Block& b : blocks_) cudaFree(b.ptr);
  }
  // A block of at least `nbytes` for capture `capture_id`: the smallest free one that fits, else
  // a new one. Returns nullptr when the device has no memory left.
  void* take(size_t nbytes, uint64_t capture_id) {
    const size_t size = (std::max<size_t>(nbytes, 1) + kAlign - 1) / kAlign * kAlign;
    std::lock_guard<std::mutex> lock(mu_);
    Block* best = nullptr;
    for (Block& b : blocks_) {
      if (b.free() && b.size >= size && (best == nullptr || b.size < best->size)) best = &b;
    }
    if (best == nullptr) {
      void* p = nullptr;
      if (cudaMalloc(&p, size) != cudaSuccess) {
        cudaGetLastError();
        return nullptr;
      }
      blocks_.push_back({p, size});
      best = &blocks_.back();
    }
    best->live = true;
    if (std::find(best->graphs.begin(), best->graphs.end(), capture_id) == best->graphs.end()) {
      best->graphs.push_back(capture_id);
    }
    return best->ptr;
  }
  // The tensor of block `p` died.
  void give_back(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Block& b : blocks_) {
      if (b.ptr == p) b.live = false;
    }
  }
  // Capture `capture_id` ended: its graph keeps the blocks still live. Returns false when one of
  // them is also a block another graph still replays into (a tensor of this capture outlived it
  // in memory that graph may overwrite).
  bool keep_live_blocks(uint64_t capture_id) {
    std::lock_guard<std::mutex> lock(mu_);
    bool exclusive = true;
    for (Block& b : blocks_) {
      if (b.live && b.used_by(capture_id)) {
        b.kept_by = capture_id;
        exclusive = exclusive && b.graphs.size() == 1;
      }
    }
    return exclusive;
  }
  // The graph of capture `capture_id` was destroyed, or its capture failed.
  void release_graph(uint64_t capture_id) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Block& b : blocks_) {
      std::erase(b.graphs, capture_id);
      if (b.kept_by == capture_id) b.kept_by = 0;
    }
  }

 private:
  static constexpr size_t kAlign = 256;
  struct Block {
    void* ptr = nullptr;
    size_t size = 0;
    bool live = false;             // its tensor exists
    uint64_t kept_by = 0;          // the capture (live graph) whose tensor outlived it in it
    std::vector<uint64_t> graphs;  // the captures (live graphs) that replay into it
    bool free() const { return !live && kept_by == 0; }
    bool used_by(uint64_t capture_id) const {
      return std::find(graphs.begin(), graphs.end(), capture_id) != graphs.end();
    }
  };
  std::mutex mu_;
  std::deque<Block> blocks_;  // a deque: pointers into it stay valid as it grows
};

// A block of a tensor that died while a side branch was open or unjoined (Backend::begin_branch):
// freed at the join, as its deleter would have freed it (CudaBackend::empty).
struct HeldBlock {
  void* ptr = nullptr;
  bool from_arena = false;
  uint64_t allocated_in = 0;  // the capture it was allocated in (0: none)
};

struct CudaContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  // The side branch (Backend::begin_branch): its stream, the events that fork it from and join
  // it to `stream`, its own cuBLAS / cuBLASLt workspace (the two streams may run cuBLAS at the
  // same time), whether ops go to it now, and the blocks held until the join. `held_mu` guards
  // `holding` and `held`: a tensor may die on another thread.
  cudaStream_t side_stream = nullptr;
  cudaEvent_t fork_event = nullptr;
  cudaEvent_t join_event = nullptr;
  void* side_workspace = nullptr;
  bool on_side = false;
  bool branch_failed = false;  // end_branch could not switch back or record the join
  std::mutex held_mu;
  bool holding = false;
  std::vector<HeldBlock> held;
  // Whether `b` is held for the join (a branch is open or unjoined).
  bool hold_if_branching(const HeldBlock& b) {
    std::lock_guard<std::mutex> lock(held_mu);
    if (!holding) return false;
    held.push_back(b);
    return true;
  }
  // The copy stream (Backend::begin_copies): KV tier imports, overlapped with the forward.
  cudaStream_t copy_stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublaslt = nullptr;  // the FP8 block-scaled GEMMs (gemm/gemm_fp8.cu)
  // cuBLAS's workspace, ours so that cuBLAS allocates nothing while a graph is captured. cuBLASLt
  // shares it: both run on `stream`, never at the same time (a side branch has its own).
  void* cublas_workspace = nullptr;
  size_t cublas_workspace_bytes = 0;
  PinnedPool pinned;
  // The graph capture in progress (0: none) and the last one begun. A captured free may only free
  // the graph's own allocations: a buffer allocated outside the capture and dropped during it is
  // set aside in `dropped_in_capture` (the graph may read it) and freed with the graph.
  uint64_t capture_id = 0;
  uint64_t captures = 0;
  std::mutex dropped_mu;
  std::vector<void*> dropped_in_capture;
  CaptureArena capture_arena;
  ~CudaContext() {
    cudaSetDevice(device);
    if (stream != nullptr) cudaStreamSynchronize(stream);
    if (side_stream != nullptr) cudaStreamSynchronize(side_stream);
    if (copy_stream != nullptr) cudaStreamSynchronize(copy_stream);
    if (cublas != nullptr) cublasDestroy(cublas);
    if (cublaslt != nullptr) cublasLtDestroy(cublaslt);
    if (cublas_workspace != nullptr) cudaFree(cublas_workspace);
    if (side_workspace != nullptr) cudaFree(side_workspace);
    if (fork_event != nullptr) cudaEventDestroy(fork_event);
    if (join_event != nullptr) cudaEventDestroy(join_event);
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (side_stream != nullptr) cudaStreamDestroy(side_stream);
    if (copy_stream != nullptr) cudaStreamDestroy(copy_stream);
  }
};

// Frees the block of a tensor that died (CudaBackend::empty's deleter, or the join of a side
// branch for a block held until then): back to the capture arena; set aside with the graph being
// captured when it was allocated before that capture (a captured free may only free the graph's
// own allocations); else stream-ordered, after every earlier use on the compute stream.
inline void release_block(CudaContext& ctx, const HeldBlock& b) {
  if (b.from_arena) {
    ctx.capture_arena.give_back(b.ptr);
    return;
  }
  if (ctx.capture_id != 0 && ctx.capture_id != b.allocated_in) {
    std::lock_guard<std::mutex> lock(ctx.dropped_mu);
    ctx.dropped_in_capture.push_back(b.ptr);
    return;
  }
  cudaFreeAsync(b.ptr, ctx.stream);
}

}  // namespace deepinfer::cuda
