#include "deepinfer/testing/scripted_engine.h"

#include <algorithm>

#include "engine/engine_config.h"
#include "engine/engine_impl.h"
#include "sample/sampler.h"
#include "testing/scripted_executor.h"

namespace deepinfer::testing {

uint64_t ScriptedModel::feed(uint64_t hash, int32_t token) {
  return sample::splitmix64(
      hash ^ (static_cast<uint64_t>(static_cast<uint32_t>(token)) * 0x9e3779b97f4a7c15ULL));
}

int32_t ScriptedModel::token_after(uint64_t hash) const {
  const uint64_t h = sample::splitmix64(hash + 0x5851f42d4c957f2dULL);
  if (eos_probability > 0.0 && static_cast<double>(h >> 11) * 0x1.0p-53 < eos_probability) {
    return eos_token_ids[0];
  }
  // Never emit an EOS id by accident: outputs end by eos_probability or length only.
  int32_t t = static_cast<int32_t>((h >> 17) % static_cast<uint64_t>(vocab_size));
  auto is_eos = [this](int32_t x) {
    return std::find(eos_token_ids.begin(), eos_token_ids.end(), x) != eos_token_ids.end();
  };
  while (is_eos(t)) t = (t + 1) % vocab_size;
  return t;
}

int32_t ScriptedModel::next_token(std::span<const int32_t> context) const {
  uint64_t h = 0;
  for (int32_t t : context) h = feed(h, t);
  return token_after(h);
}

std::unique_ptr<Engine> make_scripted_engine(const EngineConfig& config,
                                             const ScriptedModel& model) {
  const EngineConfig resolved = engine::resolve_engine_config(config, model.max_position);
  ScriptedExecutorOptions o;
  o.model = model;
  o.num_kv_blocks = resolved.cache.num_kv_blocks;
  o.num_state_slots = engine::live_state_slots(resolved);
  o.num_snapshot_slots = resolved.cache.num_prefix_snapshots;
  return std::make_unique<engine::EngineImpl>(resolved, std::make_unique<ScriptedExecutor>(o));
}

}  // namespace deepinfer::testing
