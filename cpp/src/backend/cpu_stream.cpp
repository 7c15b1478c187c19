#include "backend/cpu_stream.h"

#include <utility>

namespace deepinfer {

class CpuStream::CpuEvent final : public Event {
 public:
  CpuEvent(std::shared_ptr<State> state, uint64_t ticket)
      : state_(std::move(state)), ticket_(ticket) {}

  bool query() override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->completed >= ticket_;
  }

  void wait() override { state_->wait_for(ticket_); }

 private:
  std::shared_ptr<State> state_;
  uint64_t ticket_;
};

void CpuStream::State::wait_for(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mutex);
  done_cv.wait(lock, [&] { return completed >= ticket; });
  if (error && error_ticket <= ticket) {
    std::exception_ptr e = std::exchange(error, nullptr);
    // Everything already enqueued was built on the failed result; skip it. Work enqueued after
    // this report runs again.
    skip_through = enqueued;
    std::rethrow_exception(e);
  }
}

CpuStream::CpuStream() : state_(std::make_shared<State>()) {
  worker_ = std::thread([this] { worker_loop(); });
}

CpuStream::~CpuStream() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->work_cv.notify_all();
  worker_.join();
}

void CpuStream::worker_loop() {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mutex);
  for (;;) {
    s.work_cv.wait(lock, [&] { return s.stop || !s.queue.empty(); });
    if (s.queue.empty()) return;  // stop requested and drained
    std::function<void()> task = std::move(s.queue.front());
    s.queue.pop_front();
    const uint64_t ticket = s.completed + 1;
    const bool skip = s.error != nullptr || ticket <= s.skip_through;
    lock.unlock();
    std::exception_ptr failure;
    if (!skip) {
      try {
        task();
      } catch (...) {
        failure = std::current_exception();
      }
    }
    // Release the task's captures (tensors) before reporting completion, so a waiter that
    // drops its last reference sees the memory freed.
    task = nullptr;
    lock.lock();
    if (failure) {
      s.error = failure;
      s.error_ticket = ticket;
    }
    s.completed = ticket;
    s.done_cv.notify_all();
  }
}

void CpuStream::enqueue(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->queue.push_back(std::move(task));
    ++state_->enqueued;
  }
  state_->work_cv.notify_one();
}

std::unique_ptr<Event> CpuStream::record_event() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return std::make_unique<CpuEvent>(state_, state_->enqueued);
}

void CpuStream::synchronize() {
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    ticket = state_->enqueued;
  }
  state_->wait_for(ticket);
}

}  // namespace deepinfer
