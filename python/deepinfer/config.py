"""Run configuration: which model, engine options, default sampling, default prompts (YAML).

Example (configs/tiny.yaml)::

    model: tiny                 # the embedded tiny default, or a checkpoint directory
    engine:                     # deepinfer_core.EngineConfig options by flat name
      max_num_seqs: 16
      device: cpu               # default "auto": the GPU if this build has CUDA and one is present
    sampling:
      temperature: 0.0
      max_tokens: 32
    prompts:
      - "Hello"
    parallel:                   # optional: ranks (docs/parallel.md)
      data: 2                   # data-parallel attention ranks
      expert: 2                 # 1 (replicas) or data: routed experts split across the ranks

The engine options and their defaults are those of the C++ EngineConfig
(cpp/include/deepinfer/engine_config.h); `engine:` sets them by their flat names (or, equally, by
part: `engine: {scheduler: {max_num_seqs: 16}}`). Unknown keys and wrong types are errors that name
the file and the key.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import deepinfer_core
import yaml


class ConfigError(ValueError):
    """A run configuration is malformed; the message names the file and the key."""


@dataclass
class SamplingParams:
    """Sampling and stopping parameters of a request (validated by the engine)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: int = 0
    # Test hook: output token i is forced_tokens[i] instead of a sampled one (see engine.h).
    forced_tokens: list[int] = field(default_factory=list)
    # token id -> additive bias; OpenAI's penalties over the generated tokens.
    logit_bias: dict[int, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # KV store retention of the prompt's blocks (kv_store_path): "agent" (3 days), "chat" (7
    # days), "" for the engine's kv_store_ttl_class.
    kv_retention: str = ""
    # vLLM-style output constraint, one of {"json": schema (dict or JSON text)}, {"regex": str},
    # {"choice": [str, ...]}, {"grammar": EBNF or Lark}, {"json_object": True} (LLM compiles it;
    # needs xgrammar).
    structured_outputs: dict[str, Any] | None = None

    def to_core(self) -> Any:
        kwargs = dataclasses.asdict(self)
        del kwargs["structured_outputs"]  # the LLM turns it into a per-request constraint
        # Passed only when set, so a core build without these fields still takes the rest.
        for name in ("logit_bias", "presence_penalty", "frequency_penalty", "kv_retention"):
            if not kwargs[name]:
                del kwargs[name]
        return deepinfer_core.SamplingParams(**kwargs)


@dataclass
class RunConfig:
    model: str = "tiny"
    # model_path is left empty here: `model` names the checkpoint (see engine_config()).
    engine: deepinfer_core.EngineConfig = field(default_factory=deepinfer_core.EngineConfig)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prompts: list[str] = field(default_factory=list)
    # Model names the HTTP server answers to (all served by this model).
    served_model_names: list[str] = field(default_factory=lambda: ["deepseek-v4"])
    source: str = "<defaults>"

    def model_path(self) -> Path:
        """The checkpoint directory; "tiny" is generated into the cache on first use."""
        if self.model == "tiny":
            from deepinfer.tiny import ensure_tiny_checkpoint

            return ensure_tiny_checkpoint()
        path = Path(os.path.expanduser(self.model))
        if not path.is_absolute() and self.source != "<defaults>":
            candidate = Path(self.source).parent / path
            if candidate.exists():
                path = candidate
        return path

    def engine_config(self, **overrides: Any) -> deepinfer_core.EngineConfig:
        """The engine options with `overrides` (flat names) applied and the model's checkpoint.

        Raises TypeError naming an unknown option (listing the known ones) or an ill-typed value.
        """
        config = copy.copy(self.engine)
        _check_no_model_path(overrides, "engine option 'model_path'")
        config.update(**overrides)
        config.model_path = str(self.model_path())
        return config


def _check_no_model_path(options: dict, what: str) -> None:
    if "model_path" in options:
        raise TypeError(f"{what}: the checkpoint is the run config's 'model'")


def _check_type(source: str, key: str, value: Any, want: type) -> Any:
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if want is bool and not isinstance(value, bool):
        raise ConfigError(f"{source}: '{key}' must be true or false, got {value!r}")
    if want is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{source}: '{key}' must be an integer, got {value!r}")
    if not isinstance(value, want):
        raise ConfigError(f"{source}: '{key}' must be a {want.__name__}, got {value!r}")
    return value


_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


def _fill(cls: type, data: Any, source: str, prefix: str) -> Any:
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: '{prefix}' must be a mapping, got {data!r}")
    known = {f.name: f for f in fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in known:
            raise ConfigError(
                f"{source}: unknown key '{prefix}.{key}' (known: {', '.join(sorted(known))})"
            )
        type_name = str(known[key].type)
        full = f"{prefix}.{key}"
        if type_name == "int | None":
            kwargs[key] = None if value is None else _check_type(source, full, value, int)
        elif type_name == "list[int]":
            if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value
            ):
                raise ConfigError(f"{source}: '{full}' must be a list of integers, got {value!r}")
            kwargs[key] = value
        elif type_name == "dict[int, float]":
            if not isinstance(value, dict) or not all(
                isinstance(k, int) and not isinstance(k, bool) for k in value
            ):
                raise ConfigError(f"{source}: '{full}' must map integers to numbers, got {value!r}")
            kwargs[key] = {
                k: _check_type(source, f"{full}.{k}", v, float) for k, v in value.items()
            }
        else:
            kwargs[key] = _check_type(source, full, value, _TYPES[type_name])
    return cls(**kwargs)


def _engine_config(data: Any, source: str) -> deepinfer_core.EngineConfig:
    """The `engine:` section over the C++ defaults; the C++ binding checks names and types."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: 'engine' must be a mapping, got {data!r}")
    try:
        _check_no_model_path(data, "'engine.model_path'")
        return deepinfer_core.EngineConfig(**data)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{source}: {e}") from None


# The run config's `parallel:` keys and the engine options they set.
_PARALLEL_KEYS = {
    "data": "data_parallel_size",
    "expert": "expert_parallel_size",
    "tensor": "tensor_parallel_size",
}


def _apply_parallel(engine: deepinfer_core.EngineConfig, data: Any, source: str) -> None:
    """`parallel: {data: N, expert: N, tensor: N}`: the engine's parallel sizes."""
    if data is None:
        return
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: 'parallel' must be a mapping, got {data!r}")
    options = {}
    for key, value in data.items():
        if key not in _PARALLEL_KEYS:
            raise ConfigError(
                f"{source}: unknown key 'parallel.{key}' (known: {', '.join(_PARALLEL_KEYS)})"
            )
        options[_PARALLEL_KEYS[key]] = _check_type(source, f"parallel.{key}", value, int)
    try:
        engine.update(**options)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{source}: {e}") from None


def load_config(path: str | os.PathLike) -> RunConfig:
    """Reads a YAML run configuration."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such config file") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: invalid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping")
    allowed = {"model", "engine", "sampling", "prompts", "served_model_names", "parallel"}
    for key in data:
        if key not in allowed:
            raise ConfigError(
                f"{source}: unknown key '{key}' (known: {', '.join(sorted(allowed))})"
            )
    model = data.get("model", "tiny")
    if not isinstance(model, str) or not model:
        raise ConfigError(f"{source}: 'model' must be \"tiny\" or a checkpoint directory")
    prompts = data.get("prompts", []) or []
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise ConfigError(f"{source}: 'prompts' must be a list of strings")
    names = data.get("served_model_names", ["deepseek-v4"])
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"{source}: 'served_model_names' must be a non-empty list of names")
    engine = _engine_config(data.get("engine"), source)
    _apply_parallel(engine, data.get("parallel"), source)
    return RunConfig(
        served_model_names=names,
        model=model,
        engine=engine,
        sampling=_fill(SamplingParams, data.get("sampling"), source, "sampling"),
        prompts=prompts,
        source=source,
    )


def add_override_arguments(parser: argparse.ArgumentParser) -> None:
    """--model, --device and the YOCO truncation, for the command lines that take a run config."""
    parser.add_argument(
        "--model",
        help='"tiny" or a checkpoint directory (overrides the config\'s model; a relative path is '
        "taken from the working directory)",
    )
    parser.add_argument(
        "--device",
        help='"auto", "cpu", "cuda" or "cuda:N" (overrides the config\'s engine.device; '
        '"auto", the default, picks the GPU when this build has the CUDA backend and a GPU is '
        "present, else the CPU)",
    )
    parser.add_argument(
        "--yoco-prefill-truncation",
        choices=("off", "mask", "compact"),
        help="DeepSeek-V4.1 YOCO prefill truncation (overrides the config's "
        "engine.yoco_prefill_truncation): off (exact, the default), mask or compact (the "
        "consumer layers keep only the last --yoco-keep-tokens positions of a prefill: about "
        "half the prefill FLOPs, an approximation of off; docs/model.md)",
    )
    parser.add_argument(
        "--yoco-keep-tokens",
        type=int,
        help="positions of a prefill the YOCO consumer layers keep under mask/compact (default "
        "140; at least sliding_window + num_speculative_tokens)",
    )
    parser.add_argument(
        "--engram-table-memory",
        choices=("auto", "device", "host"),
        help="where DeepSeek-V4.1's Engram tables live (overrides the config's "
        "engine.engram_table_memory): device memory, host memory the GPU reads in place "
        "(pinned; only the looked-up rows cross the bus), or auto (the default: host for a "
        "table over 1/8 of the device's memory, such as V4.1-Flash's ~98 GB ones)",
    )


def add_parallel_arguments(parser: argparse.ArgumentParser) -> None:
    """--data-parallel-size and --expert-parallel-size (vLLM's spellings)."""
    parser.add_argument(
        "--data-parallel-size",
        type=int,
        help="data-parallel attention ranks (overrides the config's parallel.data); on the CPU "
        "they are threads of this process, on CUDA rank r is a process of its own on cuda:r "
        "(engine option data_parallel_backend: threads keeps them in this process)",
    )
    parser.add_argument(
        "--expert-parallel-size",
        type=int,
        help="1 (every rank holds every expert) or the data-parallel size (the routed experts "
        "are split across the ranks); overrides the config's parallel.expert",
    )


def apply_override_arguments(config: RunConfig, args: argparse.Namespace) -> RunConfig:
    """The config with the command line's --model and --device (add_override_arguments)."""
    config = dataclasses.replace(config, engine=copy.copy(config.engine))
    if args.model is not None:
        config.model = (
            args.model if args.model == "tiny" else str(Path(args.model).expanduser().absolute())
        )
    if args.device is not None:
        config.engine.placement.device = args.device
    if getattr(args, "yoco_prefill_truncation", None) is not None:
        config.engine.placement.yoco_prefill_truncation = args.yoco_prefill_truncation
    if getattr(args, "yoco_keep_tokens", None) is not None:
        config.engine.placement.yoco_keep_tokens = args.yoco_keep_tokens
    if getattr(args, "engram_table_memory", None) is not None:
        config.engine.placement.engram_table_memory = args.engram_table_memory
    # add_parallel_arguments' flags, for the command lines that have them.
    if getattr(args, "data_parallel_size", None) is not None:
        config.engine.parallel.data_parallel_size = args.data_parallel_size
    if getattr(args, "expert_parallel_size", None) is not None:
        config.engine.parallel.expert_parallel_size = args.expert_parallel_size
    return config
