// Shared by the engine bindings and the testing submodule's bindings.
#pragma once

#include <nanobind/nanobind.h>

#include "deepinfer/engine_config.h"

// The EngineConfig with the C++ defaults and `options` set by flat name (max_num_seqs=8); raises
// TypeError naming an unknown option or an ill-typed value (engine_config_bindings.cpp).
deepinfer::EngineConfig engine_config_from(const nanobind::kwargs& options);

// SchedulerConfig, CacheConfig, PlacementConfig, EngineConfig.
void bind_engine_config(nanobind::module_& m);
void bind_engine(nanobind::module_& m);
// deepinfer_core.testing: the engine's test doubles (libdeepinfer_testing).
void bind_testing(nanobind::module_& m);
