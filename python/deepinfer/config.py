"""Run configuration: which model, engine options, default sampling, default prompts (YAML).

Example (configs/tiny.yaml)::

    model: tiny                 # the embedded tiny default, or a checkpoint directory
    engine:
      max_num_seqs: 16
    sampling:
      temperature: 0.0
      max_tokens: 32
    prompts:
      - "Hello"

Unknown keys and wrong types are errors that name the file and the key.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A run configuration is malformed; the message names the file and the key."""


@dataclass
class EngineOptions:
    """Mirror of deepinfer_core.Engine's keyword arguments (see cpp/include/deepinfer/engine.h)."""

    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    max_model_len: int = 0
    num_kv_blocks: int = 0
    num_prefix_snapshots: int = 0
    enable_prefix_cache: bool = True
    enable_chunked_prefill: bool = True
    zero_overhead: bool = True
    preemption: str = "recompute"
    kv_admission_watermark: float = 0.9
    prefill_steps_per_decode_step: int = 1
    num_threads: int = 0
    seed: int = 0
    device: str = "cpu"
    # Largest decode batch replayed as a CUDA graph: -1 = backend default (256 on CUDA, off on
    # the CPU), 0 = off (eager, e.g. for debugging).
    decode_graph_max_batch: int = -1


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

    def to_core(self) -> Any:
        import deepinfer_core

        return deepinfer_core.SamplingParams(**dataclasses.asdict(self))


@dataclass
class RunConfig:
    model: str = "tiny"
    engine: EngineOptions = field(default_factory=EngineOptions)
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
        else:
            kwargs[key] = _check_type(source, full, value, _TYPES[type_name])
    return cls(**kwargs)


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
    allowed = {"model", "engine", "sampling", "prompts", "served_model_names"}
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
    return RunConfig(
        served_model_names=names,
        model=model,
        engine=_fill(EngineOptions, data.get("engine"), source, "engine"),
        sampling=_fill(SamplingParams, data.get("sampling"), source, "sampling"),
        prompts=prompts,
        source=source,
    )
