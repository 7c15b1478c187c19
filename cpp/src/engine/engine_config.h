// EngineConfig resolution: the "derive it" defaults filled in for a model, the device "auto"
// resolved, and the sizes of the state-slot pools an engine of that config needs.
#pragma once

#include <vector>

#include "deepinfer/config.h"
#include "deepinfer/engine_config.h"

namespace deepinfer::engine {

// The EngineConfig with every 0 ("derive it") field resolved for a model of `max_position`
// positions and placement.device "auto" resolved to a device; validates the rest. Throws
// Error(kInvalidArgument) naming the field by its flat name ('max_num_seqs'), the name the
// Python API and run configs use. With `kv_from_device_memory`, num_kv_blocks 0 on a GPU device
// stays 0: the model loader sizes the paged KV from the memory left after the weights (KvSizing)
// and the engine takes its count from there. `fp8_weights` (the checkpoint's weights are FP8)
// decides what kv_cache_dtype "auto" becomes on a device (resolve_kv_cache_dtype).
EngineConfig resolve_engine_config(const EngineConfig& config, int max_position,
                                   bool kv_from_device_memory = false, bool fp8_weights = false);
// speculative_method "mtp" with drafting on needs the checkpoint's MTP block: `num_mtp_blocks` is
// what config.json declares (before loading) or what was loaded. Throws Error(kInvalidArgument)
// naming 'speculative_method' when it is 0.
void check_mtp_blocks(const EngineConfig& config, int num_mtp_blocks);
// speculative_method "mtp" on a V4.1 checkpoint drafts whole DSpark blocks past the window: the
// rings' rollback slack (`max_backtrack`) must hold `block_size` positions. Throws
// Error(kInvalidArgument) naming 'speculative_method' and dspark_block_size otherwise.
void check_dspark_block_size(const EngineConfig& config, int block_size, int max_backtrack);
// The engine's MTP drafting keeps the block one position behind the main layers; a compressed
// MTP layer would pool an entry from a token past a shared prefix into a shared block
// (cpp/src/engine/README.md#mtp-drafts), so drafting takes sliding MTP layers only (V4's kind).
// Throws Error(kInvalidArgument) naming 'speculative_method' otherwise.
void check_mtp_layer_kinds(const EngineConfig& config, const std::vector<AttentionKind>& kinds);
// Whether the executor runs the MTP block and drafts with it.
bool uses_mtp_drafts(const EngineConfig& config);
// State slots an engine with `config` needs (including the reserved slot 0): every sequence
// holding KV plus headroom.
int live_state_slots(const EngineConfig& config);

}  // namespace deepinfer::engine
