// Launching a data-parallel group as processes, one rank each, joined over TCP
// (docs/parallel.md#one-process-per-rank): what the Python front ends (deepinfer/ranks.py) and a
// launcher such as torchrun use. Rank 0 is the front (Engine::create_front); ranks 1..N-1 serve
// it (Engine::serve_rank). The ranks' host traffic (the step-kind votes, the requests and
// outputs) goes over TCP through rank 0; the expert exchange goes over NCCL when every rank has
// its own GPU (device "cuda"), else over TCP too, device tensors staged through host memory.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "deepinfer/engine.h"

namespace deepinfer {

// Rank 0's listening socket, bound when made: port 0 picks a free port, which port() returns, so
// a launcher can hand it to the ranks it starts before create_tcp_front waits for them.
class RankListener {
 public:
  RankListener(const std::string& address, int port);
  RankListener(RankListener&&) noexcept;
  RankListener& operator=(RankListener&&) noexcept;
  ~RankListener();
  int port() const;

 private:
  friend std::unique_ptr<Engine> create_tcp_front(const EngineConfig&, RankListener,
                                                  std::chrono::seconds, const LoadProgress&);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Rank 0: waits up to `connect_timeout` for ranks 1..N-1 (N = data_parallel_size) on
// `listener`, loads its own rank on the device its config names (device "cuda": cuda:0), and
// returns the front engine. Throws Error(kIo) naming the ranks that did not connect.
std::unique_ptr<Engine> create_tcp_front(const EngineConfig& config, RankListener listener,
                                         std::chrono::seconds connect_timeout,
                                         const LoadProgress& progress = {});
// Rank `rank` (1..N-1): connects to rank 0 at address:port (retrying up to `connect_timeout`),
// loads on its device (device "cuda": cuda:<local_rank>, this process's GPU on its host) and
// serves rank 0's steps until rank 0 closes the group. Throws when the group fails.
void serve_tcp_rank(const EngineConfig& config, int rank, int local_rank,
                    const std::string& address, int port, std::chrono::seconds connect_timeout,
                    const LoadProgress& progress = {});

}  // namespace deepinfer
