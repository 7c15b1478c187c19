"""KV tiers beyond the GPU on the real tiny model (docs/kv_store.md): prompts' blocks written
through to the host tier and the store come back as prefix hits that are bit-identical to a cold
run, through the host tier, through the store (read in the background while the request waits
fetching), across an engine restart and between two engines sharing one directory; a corrupt or
truncated file is a miss that recomputes; a request without a hit goes on while another one's
fetch is held; an abort while fetching frees everything; concurrent hits on one prefix read it
once (the later ones wait for the first fetch, holding nothing, also when it is aborted);
nothing leaks."""

from __future__ import annotations

import os
import random
from pathlib import Path

import deepinfer_core as dc
import pytest
from engine_helpers import Trace, assert_pools_full, cpu_engine, drain, run_all

GREEDY = dc.SamplingParams(temperature=0.0, max_tokens=12)
HOST = 1 << 30
# 7 usable blocks: an unrelated 800-token prompt reuses every cached block, so a later hit can
# only come from the tiers.
SMALL_GPU = {"num_kv_blocks": 8}


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(2, 129000) for _ in range(n)]


SHARED = tokens(600, 1)  # 4 full blocks before the last prompt token: checkpoint at 512
VARIANTS = [SHARED + [11, 12, 13], SHARED + [21, 22]]
UNRELATED = tokens(800, 2)


@pytest.fixture(scope="module")
def cold(tiny_checkpoint) -> list[list[int]]:
    return [run_all(cpu_engine(tiny_checkpoint), [p], GREEDY)[0][0] for p in VARIANTS]


def hit_tokens(trace) -> list[int]:
    return [trace.ready(rid).prompt_cache_hit_tokens for rid in sorted(trace.outputs)]


def store_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.kvb"))


def test_host_tier_hit_equals_cold(tiny_checkpoint, cold) -> None:
    engine = cpu_engine(tiny_checkpoint, kv_host_cache_bytes=HOST, **SMALL_GPU)
    run_all(engine, [SHARED + [99]], GREEDY)
    run_all(engine, [UNRELATED], GREEDY)  # evicts the shared prefix from the GPU
    assert engine.stats()["prompt_tokens_cached"] == 0
    warm, trace = run_all(engine, VARIANTS, GREEDY)
    assert hit_tokens(trace) == [512, 512]
    assert warm == cold
    s = engine.stats()
    # The first variant fetches 4 blocks and the snapshot; the second finds the KV on the GPU
    # again and takes only the snapshot from the host.
    assert s["host_hit_tokens"] == 1024 and s["store_hit_tokens"] == 0, s
    assert s["prompt_tokens_cached"] == 1024
    assert s["kv_blocks_written_through"] == 4 + 6, s  # checkpoints at 512 and 768
    assert s["store_bytes_written"] == 0 and s["kv_tier_fetch_failures"] == 0
    # The CPU backend's host tier arena is ordinary memory (Backend::allocate_pinned_host).
    assert s["kv_host_pinned_bytes"] == 0
    assert_pools_full(engine)


def test_store_tier_hit_equals_cold(tiny_checkpoint, cold, tmp_path) -> None:
    engine = cpu_engine(tiny_checkpoint, kv_store_path=str(tmp_path), **SMALL_GPU)
    run_all(engine, [SHARED + [99]], GREEDY)
    run_all(engine, [UNRELATED], GREEDY)
    engine.flush_kv_tiers()
    assert len(store_files(tmp_path)) == 4 + 6
    warm, trace = run_all(engine, VARIANTS, GREEDY)
    assert hit_tokens(trace) == [512, 512]
    assert warm == cold
    s = engine.stats()
    assert s["store_hit_tokens"] == 1024 and s["host_hit_tokens"] == 0, s
    assert s["store_bytes_read"] > 0 and s["store_bytes_written"] > 0, s
    # Both variants read the store in the background (the second at least the snapshot).
    assert s["kv_fetches"] == 2 and s["num_fetching"] == 0, s
    assert 0 < s["kv_fetch_seconds_max"] <= s["kv_fetch_seconds_total"], s
    assert_pools_full(engine)


def test_store_survives_an_engine_restart(tiny_checkpoint, cold, tmp_path) -> None:
    first = cpu_engine(tiny_checkpoint, kv_store_path=str(tmp_path))
    run_all(first, [SHARED + [99]], GREEDY)
    first.flush_kv_tiers()
    written = first.stats()["store_bytes_written"]
    assert written == sum(f.stat().st_size for f in store_files(tmp_path))
    del first
    # A new engine, host tier off: everything comes from the files.
    second = cpu_engine(tiny_checkpoint, kv_store_path=str(tmp_path))
    warm, trace = run_all(second, VARIANTS, GREEDY)
    assert hit_tokens(trace) == [512, 512]
    assert warm == cold
    s = second.stats()
    assert s["store_hit_tokens"] == 1024 and s["store_bytes_read"] > 0, s
    assert s["kv_fetches"] == 2 and s["kv_tier_fetch_failures"] == 0, s
    assert s["kv_blocks_written_through"] == 0, s  # every block was already stored
    assert_pools_full(second)


@pytest.mark.parametrize("kv_cache_dtype", ["bf16", "fp8"])
def test_store_hit_equals_cold_in_every_kv_dtype(tiny_checkpoint, tmp_path, kv_cache_dtype) -> None:
    # The tiers move the caches' raw bytes (bf16 rows, fp8 records), so a hit stays exact.
    kv = {"kv_cache_dtype": kv_cache_dtype}
    cold = run_all(cpu_engine(tiny_checkpoint, **kv), [VARIANTS[0]], GREEDY)[0]
    writer = cpu_engine(tiny_checkpoint, kv_store_path=str(tmp_path), **kv)
    run_all(writer, [SHARED + [99]], GREEDY)
    writer.flush_kv_tiers()
    del writer
    reader = cpu_engine(tiny_checkpoint, kv_store_path=str(tmp_path), **kv)
    warm, trace = run_all(reader, [VARIANTS[0]], GREEDY)
    assert hit_tokens(trace) == [512]
    assert warm == cold
    assert_pools_full(reader)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_store_file_is_a_miss(tiny_checkpoint, cold, tmp_path, damage) -> None:
    writer = cpu_engine(tiny_checkpoint, kv_store_path=str(tmp_path))
    run_all(writer, [SHARED + [99]], GREEDY)
    writer.flush_kv_tiers()
    del writer
    files = store_files(tmp_path)
    assert len(files) == 4
    # The checkpoint block carries the snapshot, so it is the largest file.
    target = max(files, key=lambda f: f.stat().st_size)
    times = target.stat()
    data = bytearray(target.read_bytes())
    if damage == "flip":
        data[-100] ^= 0xFF  # in the payload: the header stays valid, the checksum fails
    else:
        data = data[: len(data) // 2]
    target.write_bytes(bytes(data))
    # mtime is the block's expiry: keep it, so only the damage decides.
    os.utime(target, ns=(times.st_atime_ns, times.st_mtime_ns))
    reader = cpu_engine(tiny_checkpoint, kv_store_path=str(tmp_path))
    warm, trace = run_all(reader, [VARIANTS[0]], GREEDY)
    assert hit_tokens(trace) == [0]
    assert warm == [cold[0]]
    s = reader.stats()
    assert s["store_hit_tokens"] == 0
    if damage == "flip":
        # Planned from the file's size, refused by the payload checksum when the fetch pool read
        # it, removed, recomputed.
        assert s["kv_tier_fetch_failures"] == 1 and s["kv_fetches"] == 1, s
    # The recomputed prefix is written again, so the next request hits.
    reader.flush_kv_tiers()
    again, trace = run_all(reader, [VARIANTS[1]], GREEDY)
    assert hit_tokens(trace) == [512] and again == [cold[1]]
    assert_pools_full(reader)


def stored_reader(checkpoint, root: Path) -> dc.Engine:
    """A fresh engine over a store that holds SHARED's blocks (written by another engine)."""
    writer = cpu_engine(checkpoint, kv_store_path=str(root))
    run_all(writer, [SHARED + [99]], GREEDY)
    writer.flush_kv_tiers()
    del writer
    return cpu_engine(checkpoint, kv_store_path=str(root))


def test_a_request_without_a_hit_goes_on_while_a_fetch_is_held(
    tiny_checkpoint, cold, tmp_path
) -> None:
    reader = stored_reader(tiny_checkpoint, tmp_path)
    reader.hold_kv_fetches(True)  # the store hit's read cannot start: it stays fetching
    trace = Trace()
    fetching = reader.add_request(VARIANTS[0], GREEDY)
    other = reader.add_request(tokens(40, 9), dc.SamplingParams(temperature=0.0, max_tokens=6))
    for _ in range(20):
        trace.record(reader.step())
        reader.check_invariants()
        if trace.finish(other) is not None:
            break
    assert trace.finish(other) == "length" and len(trace.tokens(other)) == 6
    assert reader.stats()["num_fetching"] == 1
    assert not trace.outputs[fetching]  # not even ready: its hit is not known yet
    reader.hold_kv_fetches(False)
    drain(reader, trace)
    trace.check_contract(fetching)
    assert trace.ready(fetching).prompt_cache_hit_tokens == 512
    assert trace.tokens(fetching) == cold[0]
    s = reader.stats()
    assert s["num_fetching"] == 0 and s["kv_fetches"] == 1 and s["store_hit_tokens"] == 512, s
    assert_pools_full(reader)


def test_abort_while_fetching_frees_everything(tiny_checkpoint, cold, tmp_path) -> None:
    reader = stored_reader(tiny_checkpoint, tmp_path)
    slots = reader.stats()["num_state_slots_free"]
    reader.hold_kv_fetches(True)
    trace = Trace()
    rid = reader.add_request(VARIANTS[0], GREEDY)
    for _ in range(3):
        trace.record(reader.step())
        reader.check_invariants()
    s = reader.stats()
    # Fetching: the hit's blocks (all 5 of the prompt) and a slot are reserved for it.
    assert s["num_fetching"] == 1 and s["num_blocks_total"] - s["num_blocks_free"] == 5, s
    assert s["num_state_slots_free"] == slots - 1, s
    reader.abort(rid)
    trace.record(reader.step())
    reader.check_invariants()
    assert trace.finish(rid) == "abort" and trace.ready(rid) is None and not trace.tokens(rid)
    s = reader.stats()
    assert s["num_fetching"] == 0 and s["kv_fetches"] == 0 and s["store_hit_tokens"] == 0, s
    assert_pools_full(reader, slots)
    # The dropped read harms nothing: the next request fetches the same blocks and matches cold.
    reader.hold_kv_fetches(False)
    warm, trace = run_all(reader, [VARIANTS[1]], GREEDY)
    assert hit_tokens(trace) == [512] and warm == [cold[1]]
    # Shutdown with a fetch held in flight joins the pool cleanly.
    reader.hold_kv_fetches(True)
    reader.add_request(VARIANTS[0], GREEDY)
    reader.step()
    assert reader.stats()["num_fetching"] == 1
    del reader


def start_two_on_one_prefix(reader: dc.Engine) -> tuple[Trace, int, int]:
    """Submits both VARIANTS together while fetches are held and steps until the second waits."""
    reader.hold_kv_fetches(True)
    trace = Trace()
    first = reader.add_request(VARIANTS[0], GREEDY)
    second = reader.add_request(VARIANTS[1], GREEDY)
    for _ in range(3):
        trace.record(reader.step())
        reader.check_invariants()
    s = reader.stats()
    # One fetch reads the shared prefix; the second request waits for it holding nothing: the
    # blocks and the slot in use are the first one's (its 5 prompt blocks).
    assert s["num_fetching"] == 2 and s["kv_fetch_waits"] == 1, s
    assert s["num_blocks_total"] - s["num_blocks_free"] == 5, s
    assert not trace.outputs[first] and not trace.outputs[second]
    return trace, first, second


def test_concurrent_hits_on_one_prefix_fetch_it_once(tiny_checkpoint, cold, tmp_path) -> None:
    reader = stored_reader(tiny_checkpoint, tmp_path)
    sizes = [f.stat().st_size for f in store_files(tmp_path)]
    assert len(sizes) == 4  # SHARED's 4 blocks, the last with the snapshot (the largest file)
    slots = reader.stats()["num_state_slots_free"]
    trace, first, second = start_two_on_one_prefix(reader)
    assert reader.stats()["num_state_slots_free"] == slots - 1
    reader.hold_kv_fetches(False)
    drain(reader, trace)
    for rid, want in ((first, cold[0]), (second, cold[1])):
        trace.check_contract(rid)
        assert trace.ready(rid).prompt_cache_hit_tokens == 512
        assert trace.tokens(rid) == want
    s = reader.stats()
    # The prefix was read once; the second request took its KV from the GPU index and read only
    # the snapshot's file again (the GPU keeps no snapshot at 512 for the first request).
    assert s["store_bytes_read"] == sum(sizes) + max(sizes), (s, sizes)
    assert s["kv_fetches"] == 2 and s["kv_fetch_waits"] == 1 and s["num_fetching"] == 0, s
    assert_pools_full(reader, slots)


def test_abort_of_the_fetch_a_request_waits_for(tiny_checkpoint, cold, tmp_path) -> None:
    reader = stored_reader(tiny_checkpoint, tmp_path)
    sizes = [f.stat().st_size for f in store_files(tmp_path)]
    slots = reader.stats()["num_state_slots_free"]
    trace, first, second = start_two_on_one_prefix(reader)
    reader.abort(first)
    # The waiting one starts its own fetch of the whole prefix (held still).
    for _ in range(3):
        trace.record(reader.step())
        reader.check_invariants()
    s = reader.stats()
    assert s["num_fetching"] == 1 and s["num_blocks_total"] - s["num_blocks_free"] == 5, s
    assert trace.finish(first) == "abort" and not trace.tokens(first)
    reader.hold_kv_fetches(False)
    drain(reader, trace)
    trace.check_contract(second)
    assert trace.ready(second).prompt_cache_hit_tokens == 512
    assert trace.tokens(second) == cold[1]
    s = reader.stats()
    assert s["kv_fetches"] == 1 and s["store_bytes_read"] == sum(sizes), s
    assert_pools_full(reader, slots)


def test_two_engines_share_one_store(tiny_checkpoint, tmp_path) -> None:
    a = cpu_engine(tiny_checkpoint, kv_store_path=str(tmp_path))
    b = cpu_engine(tiny_checkpoint, kv_store_path=str(tmp_path))
    p1, p2 = tokens(300, 5), tokens(420, 6)
    cold = [run_all(cpu_engine(tiny_checkpoint), [p], GREEDY)[0][0] for p in (p1, p2)]
    run_all(a, [p1 + [7]], GREEDY)
    a.flush_kv_tiers()
    out_b, trace_b = run_all(b, [p1], GREEDY)  # served by a's blocks
    run_all(b, [p2 + [7]], GREEDY)
    b.flush_kv_tiers()
    out_a, trace_a = run_all(a, [p2], GREEDY)  # served by b's blocks
    assert hit_tokens(trace_b) == [256] and hit_tokens(trace_a) == [384]
    assert out_b == [cold[0]] and out_a == [cold[1]]
    assert a.stats()["store_hit_tokens"] == 384 and b.stats()["store_hit_tokens"] == 256
    assert_pools_full(a)
    assert_pools_full(b)


def test_store_is_keyed_by_kv_dtype(tiny_checkpoint, tmp_path) -> None:
    f32 = cpu_engine(tiny_checkpoint, kv_store_path=str(tmp_path), kv_cache_dtype="f32")
    run_all(f32, [SHARED + [99]], GREEDY)
    f32.flush_kv_tiers()
    bf16 = cpu_engine(tiny_checkpoint, kv_store_path=str(tmp_path), kv_cache_dtype="bf16")
    _, trace = run_all(bf16, [VARIANTS[0]], GREEDY)
    assert hit_tokens(trace) == [0]
    bf16.flush_kv_tiers()
    assert len([d for d in tmp_path.iterdir() if d.is_dir()]) == 2  # one fingerprint each


def test_tier_options_are_checked(tiny_checkpoint, tmp_path) -> None:
    with pytest.raises(ValueError, match="kv_store_ttl_class"):
        cpu_engine(tiny_checkpoint, kv_store_path=str(tmp_path), kv_store_ttl_class="forever")
    with pytest.raises(ValueError, match="enable_prefix_cache"):
        cpu_engine(tiny_checkpoint, kv_host_cache_bytes=HOST, enable_prefix_cache=False)
    with pytest.raises(ValueError, match="fetch_threads"):
        cpu_engine(tiny_checkpoint, kv_store_path=str(tmp_path), fetch_threads=0)
    config = dc.EngineConfig(kv_store_path="/x", kv_host_cache_bytes=5, kv_store_ttl_class="agent")
    assert config.cache.kv_store_path == "/x" and config.cache.kv_host_cache_bytes == 5
    assert config.cache.fetch_threads == 2
    assert dc.EngineConfig(fetch_threads=4).cache.fetch_threads == 4


@pytest.mark.parametrize(("retention", "days"), [("agent", 3), ("chat", 7), ("", 7)])
def test_per_request_retention_sets_the_files_expiry(tiny_checkpoint, tmp_path, retention, days):
    """A request's kv_retention picks its blocks' TTL (the file's mtime holds the expiry); empty
    takes the engine's kv_store_ttl_class (chat)."""
    import time

    engine = cpu_engine(tiny_checkpoint, kv_store_path=str(tmp_path))
    params = dc.SamplingParams(temperature=0.0, max_tokens=2, kv_retention=retention)
    run_all(engine, [SHARED + [99]], params)
    engine.flush_kv_tiers()
    files = store_files(tmp_path)
    assert files
    for f in files:
        ttl = f.stat().st_mtime - time.time()
        assert abs(ttl - days * 86400) < 600, (f, ttl / 86400)


def test_bad_retention_is_refused(tiny_checkpoint) -> None:
    engine = cpu_engine(tiny_checkpoint)
    with pytest.raises(ValueError, match="kv_retention"):
        engine.add_request([1, 2, 3], dc.SamplingParams(kv_retention="forever"))
