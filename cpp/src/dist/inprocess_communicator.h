// The in-process communicator: N ranks are N threads of one process, each with its own (CPU)
// backend, sharing one rendezvous object owned by the group's communicators (no global state;
// it dies with the last of them).
//
// How a collective runs (every rank, the same steps):
//   1. wait for the rank's stream (Backend::synchronize), so the inputs are final;
//   2. post the arguments and wait until every rank has posted (the first barrier);
//   3. check every rank's arguments against rank 0's (the same check on every rank, so they all
//      agree on the error), then compute this rank's result into a private buffer, reading the
//      other ranks' inputs directly (host memory) and summing in rank order;
//   4. wait until every rank has computed (the second barrier: nobody writes an output another
//      rank may still be reading, e.g. an in-place all_reduce_sum);
//   5. write the result into the output tensor, or throw the agreed error.
// Each rank computes its own result, so a sum is done N times; that is the price of a result that
// does not depend on which thread arrives first.
//
// A communicator destroyed before its peers aborts the group (a rank that died cannot join again):
// destroy a group's communicators together, after the ranks' last collective.
#pragma once

#include <memory>
#include <vector>

#include "deepinfer/backend.h"
#include "dist/communicator.h"

namespace deepinfer::dist {

// One communicator per entry of `backends` (rank i uses backends[i], which must be CPU backends
// and outlive the communicators). Hand each to its own thread; a communicator is used by one
// thread at a time.
std::vector<std::unique_ptr<Communicator>> make_inprocess_group(
    const std::vector<Backend*>& backends);
// N ranks without backends: the tensors are plain host tensors (Tensor::zeros, from_vector) with
// no stream to wait for.
std::vector<std::unique_ptr<Communicator>> make_inprocess_group(int n);

}  // namespace deepinfer::dist
