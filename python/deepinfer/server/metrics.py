"""Prometheus metrics of one server (its own registry: no process-global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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

    def render(self, stats: dict) -> bytes:
        self.running.set(stats["num_running"])
        self.waiting.set(stats["num_waiting"])
        total = max(1, stats["num_blocks_total"])
        self.kv_usage.set((stats["num_blocks_total"] - stats["num_blocks_free"]) / total)
        self.kv_free.set(stats["num_blocks_free"])
        self.kv_cached.set(stats["num_blocks_cached"])
        return generate_latest(self.registry)
