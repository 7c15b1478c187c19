#include "kv/kv_store_writer.h"

#include <exception>
#include <utility>

namespace deepinfer::kv {

KvStoreWrite KvStoreWrite::owning(BlockHash hash, BlockHash parent, std::vector<int32_t> tokens,
                                  std::vector<uint8_t> payload, KvPutOptions options) {
  auto owner = std::make_shared<const std::vector<uint8_t>>(std::move(payload));
  KvStoreWrite w;
  w.hash = hash;
  w.parent = parent;
  w.tokens = std::move(tokens);
  w.payload = std::span<const uint8_t>(*owner);
  w.payload_owner = std::move(owner);
  w.options = options;
  return w;
}

KvStoreWriter::KvStoreWriter(KvBlockStore& store, KvStoreWriterConfig config)
    : KvStoreWriter(
          [&store](const KvStoreWrite& w) { return store.put(w.key(), w.payload, w.options); },
          config) {}

KvStoreWriter::KvStoreWriter(PutFn put, KvStoreWriterConfig config)
    : put_(std::move(put)), config_(config), worker_([this] { worker_loop(); }) {}

KvStoreWriter::~KvStoreWriter() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  worker_.join();
}

bool KvStoreWriter::submit(KvStoreWrite write) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t bytes = write.payload.size();
    const bool full = queue_.size() >= config_.max_queue_blocks ||
                      (!queue_.empty() && queued_bytes_ + bytes > config_.max_queue_bytes);
    if (stop_ || full) {
      ++stats_.dropped;
      return false;
    }
    queued_bytes_ += bytes;
    queue_.push_back(std::move(write));
    ++accepted_;
    ++stats_.submitted;
  }
  work_cv_.notify_one();
  return true;
}

void KvStoreWriter::flush() {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t ticket = accepted_;
  done_cv_.wait(lock, [&] { return completed_ >= ticket; });
}

KvStoreWriterStats KvStoreWriter::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  KvStoreWriterStats s = stats_;
  s.queued_blocks = queue_.size();
  s.queued_bytes = queued_bytes_;
  return s;
}

void KvStoreWriter::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and drained: what was accepted has been written
    KvStoreWrite write = std::move(queue_.front());
    queue_.pop_front();
    queued_bytes_ -= write.payload.size();
    lock.unlock();
    PutResult result = PutResult::kFailed;
    try {
      result = put_(write);
    } catch (const std::exception&) {
      // A bad block (e.g. state_bytes past the payload) must not end the worker; the block is
      // lost to the cache, which is what a failed write means.
    }
    write = KvStoreWrite{};  // release the payload before waking flush()
    lock.lock();
    switch (result) {
      case PutResult::kWritten:
        ++stats_.written;
        break;
      case PutResult::kAlreadyPresent:
        ++stats_.already_present;
        break;
      case PutResult::kFailed:
        ++stats_.failed;
        break;
    }
    ++completed_;
    done_cv_.notify_all();
  }
}

KvStoreSweeper::KvStoreSweeper(KvBlockStore& store, std::chrono::milliseconds interval)
    : store_(store), interval_(interval), thread_([this] {
        std::unique_lock<std::mutex> lock(mutex_);
        while (!cv_.wait_for(lock, interval_, [&] { return stop_; })) {
          lock.unlock();
          try {
            store_.sweep();
          } catch (const std::exception&) {
            // Out of memory while listing a huge store: skip this round, try again later.
          }
          lock.lock();
          ++sweeps_;
        }
      }) {}

KvStoreSweeper::~KvStoreSweeper() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t KvStoreSweeper::sweeps() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sweeps_;
}

}  // namespace deepinfer::kv
