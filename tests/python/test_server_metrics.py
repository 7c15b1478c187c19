"""ServerMetrics.render exports the engine's counters (speculative decoding, KV tiers) next to
the server's own metrics."""

from __future__ import annotations

from deepinfer.server.metrics import ENGINE_COUNTERS, ServerMetrics


def test_engine_counters_and_per_position_acceptance_are_exported() -> None:
    stats = {
        "num_running": 1,
        "num_waiting": 0,
        "num_blocks_total": 10,
        "num_blocks_free": 7,
        "num_blocks_cached": 2,
        "draft_tokens": 30,
        "accepted_draft_tokens": 12,
        "store_hit_tokens": 512,
        "drafts_at_position": [10, 10, 10, 0, 0],
        "accepted_at_position": [7, 4, 1, 0, 0],
    }
    text = ServerMetrics().render(stats).decode()
    assert "deepinfer_engine_draft_tokens 30.0" in text
    assert "deepinfer_engine_accepted_draft_tokens 12.0" in text
    assert "deepinfer_engine_store_hit_tokens 512.0" in text
    assert 'deepinfer_spec_accepted_at_position{position="1"} 4.0' in text
    assert 'deepinfer_spec_drafts_at_position{position="0"} 10.0' in text
    assert "deepinfer_kv_cache_usage_ratio 0.3" in text
    # Every exported engine counter is one Engine.stats() has (a typo would export nothing).
    import deepinfer_core as dc
    from deepinfer.tiny import ensure_tiny_checkpoint

    keys = dc.Engine(str(ensure_tiny_checkpoint()), device="cpu").stats().keys()
    assert set(ENGINE_COUNTERS) <= set(keys)
