// Communicator: the collectives of one rank of a group of `size()` ranks (DP attention, EP).
//
// Public so that an embedding server can hand the engine its own (Engine::create_rank). The
// engine's implementations (cpp/src/dist/, cuda/dist/): NCCL for CUDA devices; the in-process
// one (inprocess_communicator.h), where the N ranks are threads of one process over CPU backends,
// so every parallel code path runs in CI; and the host-staged one (host_staged_communicator.h)
// for several ranks sharing one GPU.
//
// Contract shared by every implementation:
//  - Every rank of the group calls the same collectives in the same order, each with matching
//    arguments (the shapes and dtypes named below, the same root, op and counts). A mismatch is
//    Error(kInvalidArgument) on *every* rank, naming the collective, the rank that reports it and
//    the mismatch, e.g. "all_reduce_sum on rank 2: rank 1 passed f32[4, 9] but rank 0 passed
//    f32[4, 8]"; the group stays usable for the next collective. (The in-process communicator
//    checks all of this; NCCL cannot see other ranks' arguments and checks what it can.)
//  - Device tensors live on the rank's backend, are contiguous, f32 (sums) or f32/i32 (data
//    movement: all_gather, all_to_all, broadcast). Shapes have at least one dimension where rows
//    are involved; a "row" is one index of dim 0.
//  - Order of the data: all_gather and all_to_all concatenate in source-rank order; sums add in
//    rank order, ((x0 + x1) + x2) + ..., so a result is bit-identical on every rank and on every
//    run, whatever the thread scheduling. (NCCL's ring/tree orders differ; its results are
//    identical across ranks of one call but not to the in-process order.)
//  - Stream order: a collective reads its inputs after all work enqueued before it on the rank's
//    backend and writes its outputs before any work enqueued after it. The in-process
//    communicator does this by waiting for the rank's stream (Backend::synchronize), so it cannot
//    be called under HostSyncForbidden; NCCL enqueues on the stream.
//  - Failure: when a rank aborts (abort(), its communicator destroyed, or an error inside a
//    collective), every rank waiting in or later entering a collective of the group throws
//    Error(kInternal) naming the reason instead of waiting forever. An aborted group stays
//    aborted. (NCCL's abort is local: a peer already waiting in a device collective with the
//    aborted rank needs its own abort, e.g. from a watchdog thread.)
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "deepinfer/tensor.h"

namespace deepinfer::dist {

// Ops of the host-side small all-reduce (votes, DpVote's ballots, agreed step counts).
enum class HostReduceOp { kOr, kAnd, kSum, kMax };
const char* host_reduce_op_name(HostReduceOp op);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // t (f32, any shape, identical on every rank) = sum over ranks of t, in place.
  virtual void all_reduce_sum(const Tensor& t) = 0;
  // input [R, ...] (identical on every rank) -> output [size * R, ...] of the same dtype: rank
  // r's rows at [r * R, (r + 1) * R).
  virtual void all_gather(const Tensor& input, const Tensor& output) = 0;
  // input [size * R, ...] f32 (identical on every rank) -> output [R, ...]: on rank r, the sum
  // over ranks of their rows [r * R, (r + 1) * R).
  virtual void reduce_scatter_sum(const Tensor& input, const Tensor& output) = 0;
  // Variable-size exchange of rows (MoE dispatch and combine). send [sum(send_rows), ...] holds
  // the rows for peer p at rows [sum(send_rows[:p]), +send_rows[p]) (grouped by destination,
  // in rank order); recv [sum(recv_rows), ...] receives peer p's rows at [sum(recv_rows[:p]),
  // +recv_rows[p]). Both count vectors have size() entries (zeros allowed) and are known on the
  // host: recv_rows[p] on rank q must equal send_rows[q] on rank p (exchange the counts first,
  // e.g. with all_gather). send and recv have one dtype and the same trailing shape on every
  // rank. A device-count, graph-safe variant (counts in a device tensor) is later work.
  virtual void all_to_all(const Tensor& send, std::span<const int64_t> send_rows,
                          const Tensor& recv, std::span<const int64_t> recv_rows) = 0;
  // t (same shape and dtype on every rank) = root's t.
  virtual void broadcast(const Tensor& t, int root) = 0;
  // Returns once every rank has called it (and every rank's stream is done with earlier work).
  virtual void barrier() = 0;
  // Host-side element-wise all-reduce of a small vector (same length and op on every rank);
  // returns the result, the same on every rank. kOr/kAnd are bitwise; kSum wraps modulo 2^64;
  // kMax compares as signed (i64) or unsigned (u64) values. No device work, no stream wait.
  virtual std::vector<int64_t> all_reduce_host(std::span<const int64_t> values,
                                               HostReduceOp op) = 0;
  virtual std::vector<uint64_t> all_reduce_host(std::span<const uint64_t> values,
                                                HostReduceOp op) = 0;
  // Marks the group failed: every rank waiting in or entering a collective throws, naming
  // `reason`. For a rank that cannot reach its next collective (its step threw).
  virtual void abort(const std::string& reason) = 0;
};

}  // namespace deepinfer::dist
