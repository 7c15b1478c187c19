// ThreadPool and CpuStream: the execution machinery under the CPU backend.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "backend/cpu_stream.h"
#include "common/thread_pool.h"
#include "deepinfer/error.h"

namespace deepinfer {
namespace {

TEST(ThreadPool, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 7, 100, 1001}) {
      for (int64_t grain : {1, 3, 64}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(
            n,
            [&](int64_t begin, int64_t end) {
              EXPECT_LT(begin, end);
              for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)]++;
            },
            grain);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1)
              << "threads " << threads << " n " << n << " grain " << grain << " index " << i;
        }
      }
    }
  }
}

TEST(ThreadPool, RethrowsAChunkException) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(100,
                                 [](int64_t begin, int64_t end) {
                                   if (begin <= 50 && 50 < end) throw std::runtime_error("chunk");
                                 }),
               std::runtime_error);
  // Still usable afterwards.
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, [&](int64_t b, int64_t e) { sum += e - b; });
  EXPECT_EQ(sum.load(), 100);
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  pool.parallel_for(8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.parallel_for(10, [&](int64_t ib, int64_t ie) { total += ie - ib; });
    }
  });
  EXPECT_EQ(total.load(), 80);
}

TEST(ThreadPool, ConcurrentCallersBothComplete) {
  ThreadPool pool(3);
  std::atomic<int64_t> a{0}, b{0};
  std::thread other([&] {
    for (int r = 0; r < 50; ++r) pool.parallel_for(1000, [&](int64_t x, int64_t y) { a += y - x; });
  });
  for (int r = 0; r < 50; ++r) pool.parallel_for(1000, [&](int64_t x, int64_t y) { b += y - x; });
  other.join();
  EXPECT_EQ(a.load(), 50000);
  EXPECT_EQ(b.load(), 50000);
}

TEST(CpuStream, RunsTasksInOrder) {
  CpuStream stream;
  std::vector<int> order;  // only touched by the worker until synchronize()
  for (int i = 0; i < 100; ++i) stream.enqueue([&order, i] { order.push_back(i); });
  stream.synchronize();
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
}

TEST(CpuStream, EventQueryAndWait) {
  CpuStream stream;
  std::atomic<bool> release{false};
  std::atomic<int> done{0};
  stream.enqueue([&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    done = 1;
  });
  auto first = stream.record_event();
  stream.enqueue([&] { done = 2; });
  auto second = stream.record_event();
  EXPECT_FALSE(first->query());
  EXPECT_FALSE(second->query());
  release = true;
  first->wait();
  EXPECT_TRUE(first->query());
  EXPECT_GE(done.load(), 1);
  second->wait();
  EXPECT_TRUE(second->query());
  EXPECT_EQ(done.load(), 2);
  // An event on an idle stream is complete at once.
  EXPECT_TRUE(stream.record_event()->query());
}

TEST(CpuStream, ErrorSurfacesOnceAndSkipsDependentWork) {
  CpuStream stream;
  std::atomic<bool> release{false};
  std::vector<int> ran;
  stream.enqueue([&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ran.push_back(0);
  });
  auto before = stream.record_event();
  stream.enqueue([] { throw Error(ErrorCode::kInvalidArgument, "task failed"); });
  auto at_error = stream.record_event();
  stream.enqueue([&] { ran.push_back(2); });  // consumes the failed output: skipped
  release = true;
  EXPECT_NO_THROW(before->wait());  // the failure comes after this event
  try {
    at_error->wait();
    ADD_FAILURE() << "expected the task error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_STREQ(e.what(), "task failed");
  }
  // Reported once; work enqueued after the report runs.
  stream.enqueue([&] { ran.push_back(3); });
  EXPECT_NO_THROW(stream.synchronize());
  EXPECT_EQ(ran, (std::vector<int>{0, 3}));
}

TEST(CpuStream, SynchronizeRethrowsAndRecovers) {
  CpuStream stream;
  int value = 0;
  stream.enqueue([] { throw std::runtime_error("boom"); });
  stream.enqueue([&] { value = 1; });
  EXPECT_THROW(stream.synchronize(), std::runtime_error);
  EXPECT_EQ(value, 0);
  EXPECT_NO_THROW(stream.synchronize());
  stream.enqueue([&] { value = 2; });
  stream.synchronize();
  EXPECT_EQ(value, 2);
}

TEST(CpuStream, DestructorDrainsQueuedWork) {
  std::atomic<int> count{0};
  {
    CpuStream stream;
    for (int i = 0; i < 20; ++i) {
      stream.enqueue([&] {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        ++count;
      });
    }
  }
  EXPECT_EQ(count.load(), 20);
}

TEST(CpuStream, EventOutlivesStream) {
  std::unique_ptr<Event> event;
  {
    CpuStream stream;
    stream.enqueue([] {});
    event = stream.record_event();
  }
  EXPECT_TRUE(event->query());
  EXPECT_NO_THROW(event->wait());
}

}  // namespace
}  // namespace deepinfer
