// The NCCL communicator's factories: dist::Communicator over NCCL for ranks on CUDA devices
// (cuda/dist/nccl_communicator.cu). Declared here so the core can call them in every build; a
// build without the CUDA backend throws Error(kUnsupported) (dist/nccl_unavailable.cpp).
//
// NCCL itself is loaded at first use (dist/nccl_loader.h): a machine without it gets an error
// saying how to install it (python -m pip install nvidia-nccl-cu13), not a link failure.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "deepinfer/backend.h"
#include "dist/communicator.h"

namespace deepinfer::dist {

// NCCL's ncclUniqueId: rank 0 makes one (nccl_unique_id) and every rank of the group gets a copy
// out of band (a launcher, a file, a TCP store) before calling make_nccl_rank.
using NcclUniqueId = std::array<uint8_t, 128>;

// One process driving N CUDA devices: one communicator per entry of `ranks` (rank i on ranks[i],
// a CUDA backend on its own device; no two ranks may share a device). Hand each to its own
// thread; a communicator is used by one thread at a time. The backends must outlive them.
std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<Backend*>& ranks);

// One rank of a group of `size` ranks, one per process (or thread): every rank calls this with
// the same `unique_id` at about the same time (it blocks until all have joined). `backend` must
// be a CUDA backend and outlive the communicator.
std::unique_ptr<Communicator> make_nccl_rank(int rank, int size, const NcclUniqueId& unique_id,
                                             Backend& backend);

// A fresh unique id for make_nccl_rank (made by one rank, shared with the others).
NcclUniqueId nccl_unique_id();

}  // namespace deepinfer::dist
