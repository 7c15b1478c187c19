// A Communicator that sends device tensors through one communicator and host tensors (and the
// host all-reduce) through another: a rank process on its own GPU moves the expert exchange over
// NCCL while the votes, requests and outputs go over TCP (engine's process group). Both inner
// communicators join the same ranks in the same order; a collective's tensors must all be on one
// side (device or host), which is Error(kInvalidArgument) naming the collective otherwise.
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace deepinfer::dist {

std::unique_ptr<Communicator> make_split_communicator(std::unique_ptr<Communicator> device,
                                                      std::unique_ptr<Communicator> host);

}  // namespace deepinfer::dist
