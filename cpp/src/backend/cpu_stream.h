// An in-order work queue served by one worker thread: the CPU backend's "device stream".
//
// Tasks run in the order they were enqueued. When a task throws, the exception is kept and every
// task enqueued before the error is reported (by synchronize() or an Event::wait() that covers
// the failed task) is skipped: those tasks consume the failed task's outputs. Reporting clears
// the error, so work enqueued afterwards runs normally.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "deepinfer/backend.h"

namespace deepinfer {

class CpuStream {
 public:
  CpuStream();
  CpuStream(const CpuStream&) = delete;
  CpuStream& operator=(const CpuStream&) = delete;
  // Runs (or skips, after an unreported error) the queued tasks, then joins the worker.
  ~CpuStream();

  void enqueue(std::function<void()> task);
  // An event that completes once every task enqueued so far has run (or been skipped).
  std::unique_ptr<Event> record_event();
  // Waits for every task enqueued so far; rethrows (and clears) a pending task error.
  void synchronize();

 private:
  class CpuEvent;

  // Shared with events, which may outlive the stream.
  struct State {
    std::mutex mutex;
    std::condition_variable work_cv;  // the worker waits for tasks (or stop)
    std::condition_variable done_cv;  // waiters wait for `completed` to advance
    std::deque<std::function<void()>> queue;
    uint64_t enqueued = 0;   // tickets handed out; task i (1-based) has ticket i
    uint64_t completed = 0;  // tickets finished, run or skipped
    std::exception_ptr error;
    uint64_t error_ticket = 0;  // ticket of the task that failed
    // Tasks with a ticket <= skip_through are skipped: they were enqueued before the error was
    // reported, so they may read outputs the failed task never wrote.
    uint64_t skip_through = 0;
    bool stop = false;

    // Waits until `ticket` completed; rethrows the pending error when it belongs to a task at or
    // before `ticket`.
    void wait_for(uint64_t ticket);
  };

  void worker_loop();

  std::shared_ptr<State> state_;
  std::thread worker_;
};

}  // namespace deepinfer
