// Byte-level collectives over any Communicator: the engine ships requests and outputs between the
// processes of a group as opaque bytes. They pack the bytes into i32 host tensors (zero-padded to
// whole words) and use broadcast/all_gather, so they work wherever those do with plain host
// tensors: the in-process communicator without backends and the TCP communicator with backend
// null. Every rank of the group must call them in the same order, like any collective.
#pragma once

#include <cstdint>
#include <vector>

#include "dist/communicator.h"

namespace deepinfer::dist {

// Every rank returns root's `bytes_on_root` (the argument is ignored on the other ranks). The
// length goes first (a broadcast of two words), so the ranks need not know it; an empty payload
// costs only that.
std::vector<uint8_t> broadcast_bytes(Communicator& comm, std::vector<uint8_t> bytes_on_root,
                                     int root);

// Every rank returns every rank's `mine`, in rank order. Lengths may differ between ranks (and be
// zero): they are all-gathered first, then the payloads, each padded to the longest.
std::vector<std::vector<uint8_t>> gather_bytes(Communicator& comm,
                                               const std::vector<uint8_t>& mine);

}  // namespace deepinfer::dist
