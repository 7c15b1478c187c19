// The in-process ranks of a dist test: CpuRankGroup makes them, run_ranks runs one thread per
// rank under a watchdog (the communicator and expert-parallel tests share both).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "dist/communicator.h"
#include "dist/host_staged_communicator.h"
#include "dist/inprocess_communicator.h"

namespace deepinfer::testing {

using Comms = std::vector<std::unique_ptr<dist::Communicator>>;

// Runs fn(comm) on one thread per rank. Returns each rank's Error message ("" = no error). A
// watchdog aborts the group when the ranks have not finished within `timeout`.
inline std::vector<std::string> run_ranks(Comms& comms,
                                          const std::function<void(dist::Communicator&)>& fn,
                                          std::chrono::seconds timeout = std::chrono::seconds(60)) {
  const size_t n = comms.size();
  std::vector<std::string> errors(n);
  std::mutex mutex;
  std::condition_variable cv;
  size_t done = 0;
  std::vector<std::thread> threads;
  for (size_t r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(*comms[r]);
      } catch (const Error& e) {
        errors[r] = e.what();
      } catch (const std::exception& e) {
        errors[r] = std::string("non-Error exception: ") + e.what();
      }
      std::lock_guard lock(mutex);
      ++done;
      cv.notify_all();
    });
  }
  {
    std::unique_lock lock(mutex);
    if (!cv.wait_for(lock, timeout, [&] { return done == n; })) {
      ADD_FAILURE() << "ranks still running after the timeout: the group hangs";
      comms[0]->abort("watchdog");
    }
  }
  for (auto& t : threads) t.join();
  return errors;
}

// N in-process ranks, each with its own one-thread CPU backend; `staged`: through the
// host-staged communicator (dist/host_staged_communicator.h) instead of the in-process one.
struct CpuRankGroup {
  std::vector<std::unique_ptr<Backend>> backends;
  Comms comms;
  explicit CpuRankGroup(int n, bool staged = false) {
    std::vector<Backend*> raw;
    for (int r = 0; r < n; ++r) {
      backends.push_back(make_cpu_backend(1));
      raw.push_back(backends.back().get());
    }
    comms = staged ? dist::make_host_staged_group(raw) : dist::make_inprocess_group(raw);
  }
  Backend& backend(const dist::Communicator& c) { return *backends[static_cast<size_t>(c.rank())]; }
};

}  // namespace deepinfer::testing
