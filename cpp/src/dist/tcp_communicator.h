// The TCP communicator: one rank of a group whose ranks are processes, possibly on several hosts,
// connected over TCP in a star through rank 0.
//
// Setup: rank 0 listens (TcpListener, created first so that a parent process can read the port
// it picked before it starts the other ranks); ranks 1..N-1 connect, retrying until `timeout`,
// and announce their rank and the group size; rank 0 checks that every rank 1..N-1 arrives
// exactly once and then welcomes them all, so every rank returns from setup with a whole group or
// throws.
//
// How a collective runs (star, correctness and clear errors before bandwidth):
//   1. every rank waits for its stream (Backend::synchronize) and copies its inputs to the host;
//   2. ranks 1..N-1 send rank 0 the collective's name, their own argument errors, the signature
//      that must equal rank 0's (the same strings the in-process communicator compares) and the
//      payload;
//   3. rank 0 runs the in-process communicator's checks on all of them, computes every rank's
//      result (sums in rank order, so results are bit-identical to the in-process communicator's)
//      and sends each rank its result or the agreed error (Error(kInvalidArgument) on every rank;
//      the group stays usable);
//   4. every rank writes its result into its output (uploading it for a device tensor).
//
// Failure: abort(reason) on any rank, a peer's socket closing ("rank R disconnected") or an error
// inside a collective aborts the group: rank 0 forwards the reason to every other rank, and every
// rank's current and later collectives throw Error(kInternal) naming it. There is no timeout
// while waiting inside a collective (a hung peer is the launcher's problem); abort() may be called
// from another thread (a watchdog) to wake a rank that waits.
//
// A communicator is used by one thread at a time (abort() excepted); there is no global state.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/unique_fd.h"
#include "deepinfer/backend.h"
#include "dist/communicator.h"

namespace deepinfer::dist {

// Rank 0's listening socket, bound on construction. `port` 0 picks a free port, which port()
// then returns (hand it to the other ranks before make_tcp_rank0 waits for them).
class TcpListener {
 public:
  TcpListener(const std::string& address, int port);
  TcpListener(TcpListener&&) noexcept = default;
  TcpListener& operator=(TcpListener&&) noexcept = default;

  const std::string& address() const { return address_; }
  int port() const { return port_; }
  int fd() const { return fd_.get(); }

 private:
  std::string address_;
  int port_ = 0;
  UniqueFd fd_;
};

// Rank 0 of a group of `size` ranks: waits (up to `timeout`) for ranks 1..size-1 on `listener`.
// `backend` is the rank's backend (its tensors are staged through the host), or null for plain
// host tensors; it must outlive the communicator.
std::unique_ptr<Communicator> make_tcp_rank0(TcpListener&& listener, int size, Backend* backend,
                                             std::chrono::seconds timeout);

// Rank `rank` of a group of `size`: rank 0 listens on master_addr:master_port (port 0 cannot be
// learned by the others this way: use TcpListener and make_tcp_rank0); the others connect there,
// retrying until `timeout`.
std::unique_ptr<Communicator> make_tcp_rank(int rank, int size, const std::string& master_addr,
                                            int master_port, Backend* backend,
                                            std::chrono::seconds timeout);

}  // namespace deepinfer::dist
