// Test doubles of the engine, in libdeepinfer_testing (never in libdeepinfer): an Engine whose
// model is emulated by the scripted executor, for engine tests and benchmarks without a checkpoint.
//
// The emulation samples, after a context, a token that is a hash of that context (or an EOS id
// with probability eos_probability), so a request's outputs depend on its own tokens only, exactly
// as with a real model, and any scheduling mistake (a skipped or repeated position, a carried
// token taken from the wrong row, a wrong snapshot restored, a stale slot) changes the outputs or
// trips a check in the executor.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "deepinfer/engine.h"

namespace deepinfer::testing {

struct ScriptedModel {
  int vocab_size = 1000;
  std::vector<int> eos_token_ids = {1};
  double eos_probability = 0.0;  // chance that a sampled token is eos_token_ids[0]
  int max_position = 1 << 20;
  std::chrono::microseconds step_latency{0};  // sleep per step, standing in for device time
  // A planted fault, not part of the model: the executor's first `failing_imports` KV block
  // imports (KV tier hits) throw, as a device copy that fails would.
  int failing_imports = 0;

  // The token the emulation samples after `context` (the whole prompt plus outputs so far).
  int32_t next_token(std::span<const int32_t> context) const;
  // The same in rolling form, as the executor's state slots keep it: the context's hash is
  // feed(...feed(feed(0, t0), t1)..., tn) and the token after it is token_after(hash).
  static uint64_t feed(uint64_t hash, int32_t token);
  int32_t token_after(uint64_t hash) const;
};

// An engine over the scripted executor. `config.model_path` is ignored; the KV cache sizes come
// from `config` as for a real model whose max_position_embeddings is model.max_position.
std::unique_ptr<Engine> make_scripted_engine(const EngineConfig& config,
                                             const ScriptedModel& model);

}  // namespace deepinfer::testing
