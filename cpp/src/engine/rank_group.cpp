// The TCP launch of a process group (deepinfer/rank_group.h) over dist::TcpCommunicator.
#include "deepinfer/rank_group.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "dist/byte_collectives.h"
#include "dist/nccl_group.h"
#include "dist/split_communicator.h"
#include "dist/tcp_communicator.h"
#include "engine/dp_group.h"

namespace deepinfer {
namespace {

// The backend of a rank process on `local_rank`'s device. The CPU ranks of one host share its
// cores: without a thread count each takes its share.
std::unique_ptr<Backend> rank_backend(const EngineConfig& config, int local_rank) {
  const std::string device =
      engine::rank_device(resolve_device(config.placement.device), local_rank);
  int threads = config.placement.num_threads;
  if (threads == 0 && device == "cpu") {
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                              config.parallel.data_parallel_size);
  }
  return make_backend(device, threads);
}

// With every rank on its own GPU (device "cuda"), the device tensors (the expert exchange) go
// over NCCL, whose unique id rank 0 sends over TCP; the host traffic (votes, requests, outputs)
// stays on TCP. Ranks sharing a device, or on the CPU, keep TCP for everything.
std::unique_ptr<dist::Communicator> with_nccl(const EngineConfig& config,
                                              std::unique_ptr<dist::Communicator> tcp,
                                              Backend& backend) {
  if (resolve_device(config.placement.device) != "cuda") return tcp;
  std::vector<uint8_t> id;
  if (tcp->rank() == 0) {
    const dist::NcclUniqueId made = dist::nccl_unique_id();
    id.assign(made.begin(), made.end());
  }
  id = dist::broadcast_bytes(*tcp, std::move(id), 0);
  dist::NcclUniqueId unique_id{};
  if (id.size() != unique_id.size()) {
    throw Error(ErrorCode::kInternal,
                "the NCCL unique id from rank 0 has " + std::to_string(id.size()) + " bytes");
  }
  std::copy(id.begin(), id.end(), unique_id.begin());
  std::unique_ptr<dist::Communicator> nccl =
      dist::make_nccl_rank(tcp->rank(), tcp->size(), unique_id, backend);
  return dist::make_split_communicator(std::move(nccl), std::move(tcp));
}

}  // namespace

struct RankListener::Impl {
  dist::TcpListener listener;
};

RankListener::RankListener(const std::string& address, int port)
    : impl_(std::make_unique<Impl>(Impl{dist::TcpListener(address, port)})) {}
RankListener::RankListener(RankListener&&) noexcept = default;
RankListener& RankListener::operator=(RankListener&&) noexcept = default;
RankListener::~RankListener() = default;
int RankListener::port() const {
  if (!impl_) {
    throw Error(ErrorCode::kInvalidArgument,
                "RankListener: this listener was handed to create_tcp_front already");
  }
  return impl_->listener.port();
}

std::unique_ptr<Engine> create_tcp_front(const EngineConfig& config, RankListener listener,
                                         std::chrono::seconds connect_timeout,
                                         const LoadProgress& progress) {
  if (!listener.impl_) {
    throw Error(ErrorCode::kInvalidArgument,
                "create_tcp_front: the listener was handed to create_tcp_front already");
  }
  const int size = config.parallel.data_parallel_size;
  std::unique_ptr<Backend> backend = rank_backend(config, 0);
  std::unique_ptr<dist::Communicator> comm =
      with_nccl(config,
                dist::make_tcp_rank0(std::move(listener.impl_->listener), size, backend.get(),
                                     connect_timeout),
                *backend);
  return Engine::create_front(config, std::move(backend), std::move(comm), progress);
}

void serve_tcp_rank(const EngineConfig& config, int rank, int local_rank,
                    const std::string& address, int port, std::chrono::seconds connect_timeout,
                    const LoadProgress& progress) {
  if (rank < 1 || rank >= config.parallel.data_parallel_size) {
    throw Error(ErrorCode::kInvalidArgument,
                "serve_tcp_rank: rank " + std::to_string(rank) + " is not in 1.." +
                    std::to_string(config.parallel.data_parallel_size - 1));
  }
  std::unique_ptr<Backend> backend = rank_backend(config, local_rank);
  std::unique_ptr<dist::Communicator> comm =
      with_nccl(config,
                dist::make_tcp_rank(rank, config.parallel.data_parallel_size, address, port,
                                    backend.get(), connect_timeout),
                *backend);
  Engine::serve_rank(config, std::move(backend), *comm, progress);
}

}  // namespace deepinfer
