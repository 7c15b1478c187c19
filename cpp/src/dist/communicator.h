// The Communicator is public (an embedding server may hand the engine its own): see
// deepinfer/communicator.h.
#pragma once

#include "deepinfer/communicator.h"
