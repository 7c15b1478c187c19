"""The C++ V4.1 config parser (V41TextConfig, through deepinfer_core.v41_layer_roles) derives the
same layer roles as the torch reference's V41TextConfig, on V4.1-Flash's config and on every tiny
config the reference tests use, from the config.json the reference writes."""

from __future__ import annotations

import json

import deepinfer_core as dc
import pytest
import v41_reference as ref

CONFIGS = {"flash": ref.V41TextConfig(), **ref.TINY_CONFIGS}


def none_as(v: int | None) -> int:
    return -1 if v is None else v


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cpp_parser_derives_the_reference_roles(name: str) -> None:
    cfg = CONFIGS[name]
    roles = dc.v41_layer_roles(json.dumps(cfg.to_hf_config()), cfg.yoco_keep_tokens)
    layers = range(cfg.n_layers)
    assert roles["kv_source"][: cfg.n_layers] == [none_as(cfg.kv_source(i)) for i in layers]
    assert roles["index_source"][: cfg.n_layers] == [none_as(cfg.index_source(i)) for i in layers]
    assert roles["index_k_source"][: cfg.n_layers] == [
        none_as(cfg.index_k_source(i)) for i in layers
    ]
    assert roles["uses_candidates"] == [cfg.uses_candidates(i) for i in layers]
    assert roles["yoco_boundary"] == none_as(cfg.n_prefill_layer)
    assert roles["candidate_source"] == none_as(cfg.candidate_source_layer_id)
    assert roles["engram_layer_ids"] == list(cfg.engram_layer_ids)
    assert roles["engram_num_embeddings"] == list(cfg.engram_num_embeddings)


def test_cpp_parser_errors_name_the_field() -> None:
    config = ref.TINY_CONFIGS["A"].to_hf_config()
    config["text_config"]["kv_source_layer_ids"] = [0]  # a sliding layer cannot be a kv source
    with pytest.raises(ValueError, match="kv_source_layer_ids"):
        dc.v41_layer_roles(json.dumps(config))


@pytest.mark.parametrize("targets", [[7, 5], [5, 5]])
def test_cpp_parser_refuses_unordered_dspark_targets(targets: list[int]) -> None:
    """The forward collects DSpark's target features in layer order and main_proj's columns
    follow the list, so a permuted or repeated list would feed main_proj the wrong features."""
    config = ref.TINY_CONFIGS["A"].to_hf_config()
    config["text_config"]["dspark_target_layer_ids"] = targets
    with pytest.raises(ValueError, match=r"dspark_target_layer_ids\[1\].*strictly increasing"):
        dc.v41_layer_roles(json.dumps(config))
