"""Prometheus metrics of one server (its own registry: no process-global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Engine counters exported under deepinfer_engine_<name> (Engine.stats() keys).
ENGINE_COUNTERS = {
    "num_preemptions": "Sequences preempted to free KV blocks",
    "prompt_tokens_cached": "Prompt tokens served from the prefix cache (all tiers)",
    "generated_tokens": "Tokens generated",
    "draft_tokens": "Speculative drafts verified",
    "accepted_draft_tokens": "Speculative drafts accepted",
    "verify_rows": "Verify rows (one per request and decode step with drafts)",
    "drafter_errors": "Draft proposals dropped (drafter error or bad token)",
    "verify_steps": "Decode steps with at least one verify row",
    "device_carried_rows": "Decode rows planned while the step before ran (carried on the device)",
    "device_carried_verify_rows": "Rows carried on the device that verified drafts",
    "budget_step_times": "Decode step times the confidence budget's cost model observed",
    "host_hit_tokens": "Prompt tokens restored from the host-memory KV tier",
    "store_hit_tokens": "Prompt tokens restored from the KV store directory",
    "store_bytes_read": "Bytes of KV block files read from the store",
    "store_bytes_written": "Bytes of KV block files written to the store",
    "kv_blocks_written_through": "Full KV blocks written through to the tiers",
    "kv_tier_fetch_failures": "KV tier fetches that failed and fell back to recompute",
    "kv_fetches": "KV tier fetches that read the store in the background",
    "kv_fetch_waits": "Requests that waited for another request's KV tier fetch of their blocks",
    "kv_fetch_seconds_total": "Time of those fetches, admission to last block read",
    "dp_group_steps": "Steps a data-parallel group ran (0 for one rank)",
    "dp_idle_passes": "Rank-steps run without rows so the group's collectives line up",
    "eplb_rebalances": "EPLB rebalances of the expert placement (expert parallelism)",
}

# Engine values that can go down (Engine.stats() keys), exported under deepinfer_engine_<name>:
# the requests fetching now, the longest fetch, and the speculative-decoding values the engine
# derives from its counters (0 before the first verify row).
ENGINE_GAUGES = {
    "num_fetching": "Requests waiting for their KV blocks to be read from the tiers",
    "kv_host_pinned_bytes": "Pinned host memory of the KV host tier's arena (0: pageable)",
    "kv_fetch_seconds_max": "Longest KV tier fetch that read the store",
    "spec_mean_acceptance_length": "Mean tokens per verify row (accepted drafts + 1)",
    "spec_mean_verified_per_step": "Mean drafts verified per decode step with drafts",
    "spec_mean_accepted_per_step": "Mean drafts accepted per decode step with drafts",
    "spec_mean_estimate": "Mean acceptance estimate of the verified drafts",
    "spec_mean_acceptance": "Share of the verified drafts accepted",
    "spec_calibration_error": "Expected calibration error of the acceptance estimates (10 bins)",
    "eplb_last_pause_seconds": "Pause of the last EPLB rebalance (plan and weight shuffle)",
    "eplb_max_over_mean_before": "Max over mean rank load, last EPLB window, old placement",
    "eplb_max_over_mean_after": "Max over mean rank load, last EPLB window, new placement",
}

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "deepinfer_requests",
            "Requests by protocol and outcome",
            ["protocol", "outcome"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "deepinfer_prompt_tokens", "Prompt tokens of admitted requests", registry=r
        )
        self.cache_hit_tokens = Counter(
            "deepinfer_prompt_cache_hit_tokens",
            "Prompt tokens served from the prefix cache",
            registry=r,
        )
        self.generation_tokens = Counter(
            "deepinfer_generation_tokens", "Generated tokens", registry=r
        )
        self.ttft = Histogram(
            "deepinfer_time_to_first_token_seconds",
            "Time to first token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "deepinfer_time_per_output_token_seconds",
            "Mean time per output token after the first, per request",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.running = Gauge("deepinfer_num_requests_running", "Requests decoding", registry=r)
        self.waiting = Gauge(
            "deepinfer_num_requests_waiting", "Requests waiting or prefilling", registry=r
        )
        self.kv_usage = Gauge(
            "deepinfer_kv_cache_usage_ratio", "Share of KV blocks in use", registry=r
        )
        self.kv_free = Gauge(
            "deepinfer_kv_blocks_free", "Free KV blocks (cached ones included)", registry=r
        )
        self.kv_cached = Gauge(
            "deepinfer_kv_blocks_cached", "Free KV blocks still holding a prefix", registry=r
        )

        # Engine counters (monotonic in the engine; exported as their current values).
        self.engine = {
            name: Gauge(f"deepinfer_engine_{name}", help_text, registry=r)
            for name, help_text in (ENGINE_COUNTERS | ENGINE_GAUGES).items()
        }
        self.draft_position = Gauge(
            "deepinfer_spec_drafts_at_position",
            "Drafts proposed at each draft position of a verify row",
            ["position"],
            registry=r,
        )
        self.accepted_position = Gauge(
            "deepinfer_spec_accepted_at_position",
            "Drafts accepted at each draft position of a verify row",
            ["position"],
            registry=r,
        )
        self.acceptance_rate_position = Gauge(
            "deepinfer_spec_acceptance_rate_at_position",
            "Share of the drafts at each draft position of a verify row accepted",
            ["position"],
            registry=r,
        )

    def render(self, stats: dict) -> bytes:
        for name, gauge in self.engine.items():
            if name in stats:
                gauge.set(stats[name])
        for j, (drafted, accepted) in enumerate(
            zip(
                stats.get("drafts_at_position", []),
                stats.get("accepted_at_position", []),
                strict=True,
            )
        ):
            self.draft_position.labels(str(j)).set(drafted)
            self.accepted_position.labels(str(j)).set(accepted)
        for j, rate in enumerate(stats.get("spec_acceptance_rate_at_position", [])):
            self.acceptance_rate_position.labels(str(j)).set(rate)
        self.running.set(stats["num_running"])
        self.waiting.set(stats["num_waiting"])
        total = max(1, stats["num_blocks_total"])
        self.kv_usage.set((stats["num_blocks_total"] - stats["num_blocks_free"]) / total)
        self.kv_free.set(stats["num_blocks_free"])
        self.kv_cached.set(stats["num_blocks_cached"])
        return generate_latest(self.registry)
