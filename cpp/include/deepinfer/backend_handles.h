// What a Backend hands out besides tensors: completion events, captured graphs, the device's
// memory figures and host buffers the device copies from and to (deepinfer/backend.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace deepinfer {

// Completion marker recorded on a backend stream.
class Event {
 public:
  virtual ~Event() = default;
  // True once all work enqueued before the event was recorded has finished.
  virtual bool query() = 0;
  // Blocks until then. Rethrows the error of failed work enqueued before the event.
  virtual void wait() = 0;
};

// A recorded sequence of backend ops, replayed as a unit on the same tensors: a CUDA graph on
// the CUDA backend; the CPU backend re-issues the recorded calls. See Backend::capture.
class Graph {
 public:
  virtual ~Graph() = default;
  // Enqueues the recorded ops again. They read their inputs' contents at replay time (in stream
  // order), so a caller refreshes the inputs (upload_into, copy_into) and replays.
  virtual void replay() = 0;
};

// A device's memory; zeros where the backend does not size it (the CPU backend: host memory is
// not the engine's to fill).
struct DeviceMemory {
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;
};

// Host memory that the device copies from and to directly: page-locked (pinned) on a backend
// whose copy engine needs it (CUDA), ordinary page-aligned memory elsewhere. Owns its bytes and
// frees them through the backend's release function when it dies; move-only.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(void* data, size_t size, bool pinned, std::function<void(void*)> release);
  // Ordinary page-aligned host memory (what a backend without pinned memory hands out).
  // Error(kIo) naming the bytes when it cannot be had.
  static HostBuffer ordinary(size_t bytes);
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Whether the memory is page-locked for the device (false on the CPU backend).
  bool pinned() const { return pinned_; }

 private:
  void reset() noexcept;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool pinned_ = false;
  std::function<void(void*)> release_;
};

}  // namespace deepinfer
