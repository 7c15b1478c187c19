"""Request fields the server handles itself, around deepseek-recipe's conversion.

The recipe follows DeepSeek's hosted API, which differs from the protocols in places: in thinking
mode it resets temperature and top_p to 1.0, it has no `n`, `logit_bias` or penalties, it ignores
`max_completion_tokens`, treats `developer` messages as user messages (or rejects them), replaces
images with placeholder text and answers a wrong model with 400. prepare_request() checks and
rewrites the parsed body before conversion; the engine's sampling fields are read from the body.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import deepinfer_core

IMAGE_PART_TYPES = frozenset({"image_url", "input_image", "image"})
MAX_N = 128  # OpenAI's bound for chat completions' `n`


class RequestError(Exception):
    """A request the server refuses before the engine sees it; status and message for the
    protocol's error body, and the offending field (OpenAI's `param`)."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


@dataclass
class RequestSampling:
    """The sampling fields as the request gave them (None: not given)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int = 0
    n: int = 1
    logit_bias: dict[int, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # KV store retention of the prompt's blocks: "agent" (3 days), "chat" (7 days), "" (default).
    kv_retention: str = ""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: dict, key: str, lo: float, hi: float, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if not _is_number(value) or not lo <= value <= hi:
        raise RequestError(400, f"'{key}' must be a number in [{lo:g}, {hi:g}], got {value!r}", key)
    return float(value)


def _optional_number(body: dict, key: str) -> float | None:
    # Range and type checks are the recipe's; this reads what it accepted.
    value = body.get(key)
    return float(value) if _is_number(value) else None


def _reject_images(items: Any, path: str) -> None:
    """Raises for the first image part in a message list (descending into tool results)."""
    if not isinstance(items, list):
        return
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        where = f"{path}[{i}]"
        if item.get("type") in IMAGE_PART_TYPES:
            raise RequestError(
                400,
                f"this engine is text-only: image input is not supported ({where})",
                path.split("[")[0],
            )
        for key in ("content", "output"):
            _reject_images(item.get(key), f"{where}.{key}")


def _developer_as_system(items: Any) -> None:
    if isinstance(items, list):
        for item in items:
            if isinstance(item, dict) and item.get("role") == "developer":
                item["role"] = "system"


def _logit_bias(body: dict, vocab_size: int) -> dict[int, float]:
    value = body.pop("logit_bias", None)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(400, "'logit_bias' must be an object of token id -> bias", "logit_bias")
    bias: dict[int, float] = {}
    for key, b in value.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) < vocab_size):
            raise RequestError(
                400,
                f"'logit_bias' key {key!r} is not a token id in [0, {vocab_size})",
                "logit_bias",
            )
        if not _is_number(b) or not -100 <= b <= 100:
            raise RequestError(
                400, f"'logit_bias' value for token {key} must be in [-100, 100]", "logit_bias"
            )
        bias[int(key)] = float(b)
    return bias


def _prepare_chat(body: dict, vocab_size: int) -> RequestSampling:
    _developer_as_system(body.get("messages"))
    # OpenAI: max_tokens is the deprecated alias of max_completion_tokens, which wins.
    mct = body.pop("max_completion_tokens", None)
    if mct is not None:
        if not _is_int(mct) or mct < 1:
            raise RequestError(
                400,
                f"'max_completion_tokens' must be a positive integer, got {mct!r}",
                "max_completion_tokens",
            )
        body["max_tokens"] = mct
    n = body.pop("n", None)
    if n is None:
        n = 1
    if not _is_int(n) or not 1 <= n <= MAX_N:
        raise RequestError(400, f"'n' must be an integer in [1, {MAX_N}], got {n!r}", "n")
    return RequestSampling(
        n=n,
        logit_bias=_logit_bias(body, vocab_size),
        presence_penalty=_number(body, "presence_penalty", -2, 2, 0.0),
        frequency_penalty=_number(body, "frequency_penalty", -2, 2, 0.0),
    )


def _prepare_messages(body: dict) -> RequestSampling:
    if body.get("max_tokens") is None:  # required in Anthropic's API
        raise RequestError(400, "max_tokens: Field required", "max_tokens")
    temperature = body.get("temperature")
    if temperature is not None and (not _is_number(temperature) or not 0 <= temperature <= 1):
        raise RequestError(400, "temperature: must be a number in [0, 1]", "temperature")
    top_k = body.get("top_k")
    if top_k is not None and (not _is_int(top_k) or top_k < 0):
        raise RequestError(400, "top_k: must be a non-negative integer", "top_k")
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive"):
        # Anthropic's rules for extended thinking; other values are refused, not ignored.
        if temperature is not None and temperature != 1:
            raise RequestError(
                400, "temperature: may only be set to 1 when thinking is enabled", "temperature"
            )
        if top_k is not None:
            raise RequestError(400, "top_k: may not be set when thinking is enabled", "top_k")
        top_p = body.get("top_p")
        if _is_number(top_p) and not 0.95 <= top_p <= 1:
            raise RequestError(
                400, "top_p: must be between 0.95 and 1 when thinking is enabled", "top_p"
            )
    return RequestSampling(top_k=top_k or 0)


def prepare_request(
    protocol: str, body: dict, served_models: Collection[str], vocab_size: int
) -> RequestSampling:
    """Checks what the recipe does not (served model, images, the fields it lacks) and rewrites
    `body` in place into what it accepts. Returns the request's sampling fields; raises
    RequestError."""
    model = body.get("model")
    if isinstance(model, str) and model not in served_models:
        raise RequestError(
            404,
            f"The model '{model}' does not exist (served: {', '.join(served_models)})",
            "model",
            "model_not_found",
        )
    if protocol == "responses":
        _reject_images(body.get("input"), "input")
        _developer_as_system(body.get("input"))
        sampling = RequestSampling()
    elif protocol == "chat":
        _reject_images(body.get("messages"), "messages")
        sampling = _prepare_chat(body, vocab_size)
    else:
        _reject_images(body.get("messages"), "messages")
        sampling = _prepare_messages(body)
    sampling.temperature = _optional_number(body, "temperature")
    sampling.top_p = _optional_number(body, "top_p")
    retention = body.pop("kv_retention", None)
    if retention is not None:
        if retention not in ("agent", "chat"):
            raise RequestError(
                400,
                f'\'kv_retention\' must be "agent" or "chat", got {retention!r}',
                "kv_retention",
            )
        sampling.kv_retention = retention
    return sampling


# The core fields added after the first build: passed only when set, so older builds still work.
_NEWER_CORE_FIELDS = ("logit_bias", "presence_penalty", "frequency_penalty", "kv_retention")


def core_params(
    sampling: RequestSampling, seed: int | None, **kwargs: Any
) -> list[deepinfer_core.SamplingParams]:
    """One engine SamplingParams per sample; with a seed, sample i uses seed + i so the samples
    differ. Raises RequestError for a field this engine build lacks, ValueError (from the core)
    for values it refuses."""
    probe = deepinfer_core.SamplingParams()
    for name in _NEWER_CORE_FIELDS:
        value = getattr(sampling, name)
        if value:
            if not hasattr(probe, name):
                raise RequestError(400, f"'{name}' is not supported by this engine build", name)
            kwargs[name] = value
    kwargs["top_k"] = sampling.top_k
    return [
        deepinfer_core.SamplingParams(seed=None if seed is None else seed + i, **kwargs)
        for i in range(sampling.n)
    ]
