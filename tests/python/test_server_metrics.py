"""ServerMetrics.render exports the engine's counters (speculative decoding, KV tiers) next to
the server's own metrics."""

from __future__ import annotations

from deepinfer.server.metrics import ENGINE_COUNTERS, ENGINE_GAUGES, ServerMetrics


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
    assert set(ENGINE_GAUGES) <= set(keys)


def test_speculative_acceptance_and_calibration_are_exported(tiny_checkpoint) -> None:
    """A real engine's speculative values reach /metrics as deepinfer_engine_<key> and per-position
    rates. The drafter repeats the last token: rejected after the prompt, accepted once logit_bias
    has made the output one token, so both outcomes occur."""
    import deepinfer_core as dc

    class Repeat(dc.Drafter):
        def propose(self, request_id, tokens, max_drafts):
            return [tokens[-1]] * max_drafts

    engine = dc.Engine(
        str(tiny_checkpoint), device="cpu", num_speculative_tokens=2, speculative_method="external"
    )
    engine.set_drafter(Repeat())
    params = dc.SamplingParams(
        temperature=0.0, max_tokens=12, ignore_eos=True, logit_bias={1000: 40.0}
    )
    engine.add_request([5, 6, 7], params)
    while engine.num_unfinished:
        engine.step()
    stats = engine.stats()
    assert stats["draft_tokens"] > 0 and stats["accepted_draft_tokens"] > 0
    assert 0 < stats["spec_calibration_error"] < 1
    text = ServerMetrics().render(stats).decode()
    for name in ENGINE_GAUGES:
        assert f"deepinfer_engine_{name} {float(stats[name])!r}" in text, name
    assert f"deepinfer_engine_verify_steps {float(stats['verify_steps'])!r}" in text
    rate = stats["spec_acceptance_rate_at_position"][0]
    assert 0 < rate <= 1
    assert f'deepinfer_spec_acceptance_rate_at_position{{position="0"}} {rate!r}' in text
