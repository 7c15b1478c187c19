// Shared by the engine bindings and the testing submodule's bindings.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <string>

#include "deepinfer/engine.h"

// Engine options shared by the model-backed and the scripted constructors.
deepinfer::EngineConfig make_engine_config(
    const std::string& model_path, int max_num_seqs, int max_num_batched_tokens, int max_model_len,
    int num_kv_blocks, int num_prefix_snapshots, bool enable_prefix_cache,
    bool enable_chunked_prefill, bool zero_overhead, const std::string& preemption,
    double kv_admission_watermark, int prefill_steps_per_decode_step, int num_threads,
    uint64_t seed, const std::string& device = "cpu", int decode_graph_max_batch = -1);

void bind_engine(nanobind::module_& m);
// deepinfer_core.testing: the engine's test doubles (libdeepinfer_testing).
void bind_testing(nanobind::module_& m);
