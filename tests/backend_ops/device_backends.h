// The backends the op tests compare with the CPU reference.
#pragma once

#include <string>
#include <vector>

#include "deepinfer/backend.h"

namespace deepinfer::backend_ops {

// The non-CPU backends this build has, by make_backend name: "cuda" when built with the CUDA
// backend (the Ascend backend joins here when the factory has it). DEEPINFER_OP_TEST_BACKENDS
// (comma-separated make_backend names) replaces the list: "cuda:1" for another GPU, "cpu" to run
// the table against the reference itself (a check of the rows that needs no device).
std::vector<std::string> device_backend_names();

// The backend `name`, created on first use and shared by every test of the binary; nullptr when
// it cannot be created here (no device), with the reason in *why.
Backend* shared_backend(const std::string& name, std::string* why);

// True when DEEPINFER_REQUIRE_DEVICE is set (not "0"): a backend that cannot be created then
// fails its tests instead of skipping them, so a GPU machine cannot pass by skipping everything.
bool device_required();

// The CPU reference backend, shared likewise.
Backend& cpu_reference();

}  // namespace deepinfer::backend_ops
