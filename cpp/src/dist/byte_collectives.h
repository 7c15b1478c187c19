// Byte messages over any Communicator that takes host tensors (the in-process, host-staged and
// TCP ones): the requests and outputs a process group's ranks exchange each step
// (engine/process_group.h). The sizes are agreed over the host channel first, then the bytes
// travel as i32 words through broadcast / all_gather.
#pragma once

#include <cstdint>
#include <vector>

#include "deepinfer/communicator.h"

namespace deepinfer::dist {

// Every rank returns `root`'s bytes (the others pass anything; it is ignored).
std::vector<uint8_t> broadcast_bytes(Communicator& comm, const std::vector<uint8_t>& bytes,
                                     int root);
// Every rank returns every rank's bytes, in rank order.
std::vector<std::vector<uint8_t>> gather_bytes(Communicator& comm,
                                               const std::vector<uint8_t>& mine);

}  // namespace deepinfer::dist
