// BatchPlan: everything the graph needs to know about one forward call, computed on the host
// from the sequence chunks and uploaded before the first op, so the graph never reads the device.
#pragma once

#include <map>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/config.h"
#include "deepinfer/model_runner.h"
#include "model/cache_tensors.h"

namespace deepinfer {

struct BatchPlan {
  BatchLayout layout;
  // Entries closing in this call, per compression ratio used by the model.
  std::map<int, EntryBatch> entries;
  Tensor last_rows;  // [B] i32, the last row of each sequence (for LogitsMode::kLast)
};

// Validates the chunks against the config and cache shape: every error (Error(kInvalidArgument))
// names the sequence index and the offending field. Returns the longest block table's length
// (at least 1).
size_t validate_batch(const std::vector<SequenceChunk>& batch, const ModelConfig& config,
                      const CacheShape& caches);

// The distinct compression ratios of the model's compressed layers, ascending.
std::vector<int> compress_ratios(const ModelConfig& config);

// Validates the chunks (validate_batch) and builds the plan on `backend`.
BatchPlan build_batch_plan(const std::vector<SequenceChunk>& batch, const ModelConfig& config,
                           const CacheShape& caches, Backend& backend);

}  // namespace deepinfer
