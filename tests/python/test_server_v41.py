"""Prompt encoding by model type: a DeepSeek-V4.1 checkpoint (config.json model_type "deepseek_v41")
renders Chat Completions, Responses and Messages prompts with deepseek-recipe's V4.1 encoding, a V4
checkpoint with the V4 one, and the tokenizer must have every special token the encoding renders
(the packaged V4 tokenizer lacks V4.1's <｜System｜>: the checkpoint's tokenizer.json is used, and
without one the server refuses to start, naming the token).

The V4.1 model is a tiny random one (load_format dummy) with the tokenizer's vocabulary; its
tokenizer.json is the packaged one with a placeholder renamed to <｜System｜>, as a V4.1 release
ships it. The apps run in-process (FastAPI's TestClient) and the prompts the engine received are
recorded at the engine's add_samples.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import deepseek_recipe as dr
import pytest
import v41_reference as ref
from fastapi.testclient import TestClient

dc = pytest.importorskip("deepinfer_core")

from deepinfer.server.app import ServerConfig, create_app  # noqa: E402
from deepinfer.server.encoding import (  # noqa: E402
    TokenizerError,
    packaged_tokenizer_json,
    rendered_special_tokens,
)
from deepinfer.tiny import TOKENIZER_VOCAB  # noqa: E402

MODEL = "served-name"
SYSTEM = "<｜System｜>"
CHAT = {
    "model": MODEL,
    "max_tokens": 1,
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"},
    ],
}
RESPONSES = {
    "model": MODEL,
    "max_output_tokens": 1,
    "instructions": "Be brief.",
    "input": "What is 2 + 2?",
}
MESSAGES = {
    "model": MODEL,
    "max_tokens": 1,
    "system": "Be brief.",
    "messages": [{"role": "user", "content": "What is 2 + 2?"}],
}
ROUTES = [
    ("/v1/chat/completions", dr.ChatCompletionRequest, CHAT),
    ("/v1/responses", dr.ResponsesRequest, RESPONSES),
    ("/v1/messages", dr.MessagesRequest, MESSAGES),
]


def v41_tokenizer_json(path: Path) -> Path:
    """The packaged tokenizer.json with its first placeholder token renamed to <｜System｜>."""
    data = json.loads(packaged_tokenizer_json().read_text(encoding="utf-8"))
    placeholder = next(t for t in data["added_tokens"] if "place▁holder" in t["content"])
    placeholder["content"] = SYSTEM
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


def v41_checkpoint(directory: Path, tokenizer: bool) -> Path:
    """config.json of a tiny V4.1 model (every layer role of tiny config C) with the tokenizer's
    vocabulary, and a V4.1 tokenizer.json when `tokenizer`."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg = ref.tiny_config(
        vocab_size=TOKENIZER_VOCAB,
        num_hidden_layers=6,
        compress_ratios=(0, 0, 2, 2, 2, 2, 0),
        kv_source_layer_ids=(2,),
        index_source_layer_ids=(2, 3, 5),
        candidate_source_layer_id=3,
        index_topk=3,
        engram_layer_ids=(0, 1),
    )
    (directory / "config.json").write_text(json.dumps(cfg.to_hf_config()))
    if tokenizer:
        v41_tokenizer_json(directory / "tokenizer.json")
    return directory


def engine_config() -> dc.EngineConfig:
    return dc.EngineConfig(device="cpu", load_format="dummy", seed=1)


@pytest.fixture(scope="module")
def v41_dir(tmp_path_factory) -> Path:
    return v41_checkpoint(tmp_path_factory.mktemp("v41_served"), tokenizer=True)


def recorded_prompts(app) -> list[list[int]]:
    """Every prompt the app hands to its engine from now on."""
    engine = app.state.server.engine
    prompts: list[list[int]] = []
    add_samples = engine.add_samples

    def recording(prompt: list[int], params: list) -> list:
        prompts.append(list(prompt))
        return add_samples(prompt, params)

    engine.add_samples = recording
    return prompts


def expected(version, request_cls, body: dict, tokenizer_json: Path) -> list[int]:
    """The recipe's own encoding of `body` converted for `version`."""
    options = dr.ConversionOptions().with_model_versions_by_name({MODEL: version})
    conversation = request_cls(json.dumps(body)).convert(options).conversation
    encoding = (
        dr.DeepseekV41Encoding()
        if version == dr.ModelVersion.DeepseekV41Flash
        else dr.DeepseekV4Encoding()
    )
    return encoding.with_tokenizer(dr.Tokenizer.from_file(str(tokenizer_json))).encode(conversation)


@contextmanager
def served(model_path: Path) -> Iterator[tuple[TestClient, list[list[int]]]]:
    config = ServerConfig(model_path=model_path, engine=engine_config(), served_model_names=[MODEL])
    with TestClient(create_app(config)) as client:
        yield client, recorded_prompts(client.app)


def prompt_tokens(route: str, body: dict) -> int:
    usage = body["usage"]
    return usage["input_tokens"] if route != "/v1/chat/completions" else usage["prompt_tokens"]


def test_v41_encoding_renders_a_token_the_packaged_tokenizer_lacks() -> None:
    v41 = rendered_special_tokens(dr.ModelVersion.DeepseekV41Flash)
    v4 = rendered_special_tokens(dr.ModelVersion.DeepseekV4Pro)
    assert SYSTEM in v41 and SYSTEM not in v4
    packaged = {
        t["content"] for t in json.loads(packaged_tokenizer_json().read_text())["added_tokens"]
    }
    assert [t for t in v41 if t not in packaged] == [SYSTEM]
    assert all(t in packaged for t in v4)


def test_server_v41_checkpoint_renders_with_the_v41_encoding(v41_dir: Path) -> None:
    tokenizer_json = v41_dir / "tokenizer.json"
    with served(v41_dir) as (client, prompts):
        server = client.app.state.server
        assert server.model_version == dr.ModelVersion.DeepseekV41Flash
        assert str(tokenizer_json) in server.tokenizer_note
        system_id = dr.Tokenizer.from_file(str(tokenizer_json)).encode(SYSTEM)
        assert len(system_id) == 1
        for route, request_cls, body in ROUTES:
            r = client.post(route, json=body)
            assert r.status_code == 200, r.text
            want = expected(dr.ModelVersion.DeepseekV41Flash, request_cls, body, tokenizer_json)
            v4 = expected(dr.ModelVersion.DeepseekV4Pro, request_cls, body, tokenizer_json)
            assert want != v4
            assert prompts[-1] == want, route
            assert system_id[0] in prompts[-1], route
            assert prompt_tokens(route, r.json()) == len(want), route


def test_server_v4_checkpoint_keeps_the_v4_encoding(tiny_checkpoint: Path) -> None:
    tokenizer_json = packaged_tokenizer_json()
    with served(Path(tiny_checkpoint)) as (client, prompts):
        server = client.app.state.server
        assert server.model_version == dr.ModelVersion.DeepseekV4Pro
        assert str(tokenizer_json) in server.tokenizer_note
        for route, request_cls, body in ROUTES:
            r = client.post(route, json=body)
            assert r.status_code == 200, r.text
            want = expected(dr.ModelVersion.DeepseekV4Pro, request_cls, body, tokenizer_json)
            assert prompts[-1] == want, route
            assert prompt_tokens(route, r.json()) == len(want), route


def test_server_v41_without_tokenizer_json_names_the_missing_token(tmp_path: Path) -> None:
    bare = v41_checkpoint(tmp_path / "bare", tokenizer=False)
    config = ServerConfig(model_path=bare, engine=engine_config(), served_model_names=[MODEL])
    with pytest.raises(TokenizerError) as e:
        create_app(config)
    message = str(e.value)
    assert SYSTEM in message and "has no tokenizer.json" in message
    assert str(packaged_tokenizer_json()) in message


def test_server_v41_checkpoint_tokenizer_without_the_token_is_refused(tmp_path: Path) -> None:
    d = v41_checkpoint(tmp_path / "v4_tokenizer", tokenizer=False)
    (d / "tokenizer.json").write_bytes(packaged_tokenizer_json().read_bytes())
    config = ServerConfig(model_path=d, engine=engine_config(), served_model_names=[MODEL])
    with pytest.raises(TokenizerError, match=SYSTEM) as e:
        create_app(config)
    assert str(d / "tokenizer.json") in str(e.value)


def test_llm_structured_outputs_use_the_servers_tokenizer_rule(tmp_path: Path) -> None:
    """LLM's structured outputs pick the tokenizer as the server does: a V4.1 checkpoint without
    its own tokenizer.json is refused naming the token the packaged one lacks."""
    from deepinfer.config import SamplingParams
    from deepinfer.llm import LLM

    bare = v41_checkpoint(tmp_path / "bare", tokenizer=False)
    llm = LLM(str(bare), device="cpu", load_format="dummy", seed=1)
    params = SamplingParams(structured_outputs={"choice": ["yes", "no"]}, max_tokens=4)
    with pytest.raises(TokenizerError, match=SYSTEM):
        llm.generate([[5, 6, 7]], params, use_tqdm=False)
    assert not llm.engine.has_unfinished()
