// A small fixed pool of worker threads for data-parallel loops.
//
// parallel_for splits [0, n) into contiguous chunks and runs them on the pool's threads and on the
// calling thread, returning when every chunk is done. The split never changes what a chunk
// computes, so callers that write disjoint outputs per index get results independent of the
// thread count.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace deepinfer {

class ThreadPool {
 public:
  // `num_threads` counts the calling thread: a pool of 4 starts 3 workers. 0 picks the hardware
  // concurrency; 1 starts none and runs every loop inline.
  explicit ThreadPool(int num_threads = 0);
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool();

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint chunks covering [0, n), each at least `grain` long (except
  // the last). Runs inline when n <= grain, when the pool has one thread, or when another
  // parallel_for is already running on this pool (nested or concurrent calls), so it never
  // deadlocks. The first exception thrown by a chunk is rethrown here once all chunks stopped.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 1);

 private:
  struct Job;

  void worker_loop();
  static void run_chunks(Job& job);

  std::vector<std::thread> workers_;
  // Set while a parallel_for owns the workers; a call that finds it set (nested, even on the
  // owning thread, or concurrent) runs inline. An atomic flag rather than a mutex because the
  // owner itself may ask again from inside a chunk.
  std::atomic<bool> busy_{false};

  std::mutex mutex_;
  std::condition_variable work_cv_;  // workers wait here for a new job (or stop)
  std::condition_variable done_cv_;  // the caller waits here for workers to leave the job
  Job* job_ = nullptr;               // guarded by mutex_; null when no job is open
  uint64_t generation_ = 0;          // guarded by mutex_; bumped for every job
  int active_ = 0;                   // guarded by mutex_; workers currently inside job_
  bool stop_ = false;                // guarded by mutex_
};

}  // namespace deepinfer
