// A Communicator for ranks whose tensors live on a device but that share one process and cannot
// use NCCL between them (several ranks on one GPU: NCCL refuses two ranks on one device). Each
// collective copies the rank's device inputs to the host (waiting for its stream), runs the
// in-process collective on the host copies, and uploads the results into the output tensors
// (waiting again). Slow by design: it exists so the whole data-parallel, expert-parallel engine
// runs on one GPU for tests, with the in-process group's rank-order sums and abort semantics.
#pragma once

#include <memory>
#include <vector>

#include "deepinfer/backend.h"
#include "dist/communicator.h"

namespace deepinfer::dist {

// One communicator per entry of `backends` (any device kind; each must outlive its
// communicator). Host-synchronous: not for graph capture or under HostSyncForbidden.
std::vector<std::unique_ptr<Communicator>> make_host_staged_group(
    const std::vector<Backend*>& backends);

}  // namespace deepinfer::dist
