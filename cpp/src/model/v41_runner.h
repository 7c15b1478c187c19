// ModelRunner over a DeepSeek-V4.1 checkpoint (config.json model_type "deepseek_v41"): the V4.1
// text graph, its caches and one backend. ModelRunner::load picks it by model_type.
#pragma once

#include <memory>
#include <string>

#include "deepinfer/model_runner.h"

namespace deepinfer {

// Loads <dir> (config.json + safetensors + engram_tables.json when the model has Engram layers).
// Eager only (no decode graphs), f32 KV caches, no drafter (the MTP calls throw
// Error(kInvalidArgument)).
//
// The Engram n-grams need each sequence's previous tokens: the runner keeps, per state slot, the
// token ids the slot's caches were computed from (host side, like the caches the caller places),
// so a chunk at start_pos p reads positions p-1, p-2, ... from there. A chunk must start at or
// before the slot's end (earlier starts roll back, as the caches do).
std::unique_ptr<ModelRunner> load_v41_runner(const std::string& checkpoint_dir,
                                             const RunnerOptions& options);

}  // namespace deepinfer
