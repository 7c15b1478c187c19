// The KV tiers wired into admission and commit (sched/kv_tiers.h) over a fake KvTransfer
// (kv_tiers_fakes.h): host tier hits, the fetch pool, bounded_replay's write-through, and the
// caches' block and state export/import they rely on (ModelCaches). The fetching state of a store
// hit (held, finished, failed, cancelled) is test_kv_tiers_store.cpp's.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "kv_tiers_fakes.h"
#include "model/cache_tensors.h"
#include "sched/kv_allocator.h"
#include "sched/kv_tiers.h"
#include "sched_test_util.h"
#include "temp_dir.h"

namespace deepinfer::sched {
namespace {

using namespace kv_tiers_test;  // NOLINT(google-build-using-namespace): the shared fakes

TEST(KvTiers, HostTierServesAPrefixTheGpuNoLongerHolds) {
  FakeTransfer t;
  KvTiersConfig config;
  config.host_bytes = 1 << 20;
  KvTiers tiers(config, t);
  std::vector<int32_t> prompt = distinct_tokens(400);
  {
    KvAllocator gpu(layout());
    gpu.set_tiers(&tiers);
    Sequence a = compute_prompt(gpu, t, prompt);
    EXPECT_EQ(t.exports, 3);
    tiers.poll();
    gpu.release(a);
  }
  // A new allocator: an empty GPU index (as after eviction), the same host tier.
  t.blocks.clear();
  KvAllocator gpu(layout());
  gpu.set_tiers(&tiers);
  Sequence b = make_seq(2, prompt);
  Admission hit = gpu.admit(b);
  ASSERT_EQ(hit.status, AdmitStatus::kAdmitted);
  EXPECT_EQ(hit.hit_tokens, 384);
  EXPECT_EQ(hit.restore_snapshot, -1);  // the state went straight into b's slot
  EXPECT_EQ(b.num_computed, 384);
  expect_prompt_imported(t, b);
  EXPECT_EQ(tiers.counters().host_hit_tokens, 384u);
  EXPECT_EQ(gpu.prefix_cache().index().size(), 3u);  // the fetched blocks are indexed
  gpu.check_invariants({&b});
  release_all(gpu, b);
}

TEST(KvTiers, TheHostTierLivesInOneArenaThatExportsAndImportsUseDirectly) {
  FakeTransfer t;
  KvTiersConfig config;
  config.host_bytes = 1 << 20;
  KvTiers tiers(config, t);
  ASSERT_EQ(t.arenas.size(), 1u);  // allocated once, at the configured size
  EXPECT_EQ(t.arenas[0].second - t.arenas[0].first, 1 << 20);
  EXPECT_EQ(tiers.counters().host_pinned_bytes, 0u);  // ordinary memory: not pinned
  std::vector<int32_t> prompt = distinct_tokens(400, 9);
  {
    KvAllocator gpu(layout());
    gpu.set_tiers(&tiers);
    Sequence a = compute_prompt(gpu, t, prompt);
    // The exports' destinations are host tier blocks, carved from the arena.
    ASSERT_EQ(t.export_dsts.size(), 3u);
    for (const uint8_t* p : t.export_dsts) EXPECT_TRUE(t.in_arena(p));
    tiers.poll();
    gpu.release(a);
  }
  t.blocks.clear();
  KvAllocator gpu(layout());
  gpu.set_tiers(&tiers);
  Sequence b = make_seq(2, prompt);
  ASSERT_EQ(gpu.admit(b).status, AdmitStatus::kAdmitted);
  expect_prompt_imported(t, b);
  // The import reads the very blocks the exports filled (no copy in between), and its owner
  // holds them.
  ASSERT_EQ(t.import_srcs.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(t.import_srcs[i], t.export_dsts[i]) << i;
  ASSERT_NE(t.import_keep_alive, nullptr);
  t.import_keep_alive.reset();
  release_all(gpu, b);
}

// Stores three distinct 400-token prompts; the pool of `threads` then fetches them together.
// Returns the most reads that were under way at once: each read waits (up to 10 s) until
// `threads` reads have begun, so a pool of that size reaches it and a smaller one cannot.
int peak_concurrent_reads(int threads) {
  deepinfer::test::TempDir dir;
  FakeTransfer t;
  KvTiersConfig config = store_config(dir.path());
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < 3; ++p) prompts.push_back(distinct_tokens(400, 100 + 1000 * p));
  {
    KvTiers tiers(config, t);
    KvAllocator gpu(layout());
    gpu.set_tiers(&tiers);
    for (const auto& prompt : prompts) {
      Sequence a = compute_prompt(gpu, t, prompt);
      tiers.flush();
      gpu.release(a);
    }
  }
  config.fetch_threads = threads;
  KvTiers tiers(config, t);
  EXPECT_EQ(tiers.fetch_pool_size(), threads);
  std::mutex mu;
  std::condition_variable cv;
  int begun = 0, inside = 0, peak = 0;
  tiers.set_fetch_test_hooks({nullptr, [&](kv::BlockHash) {
                                std::unique_lock<std::mutex> lock(mu);
                                ++begun;
                                peak = std::max(peak, ++inside);
                                cv.notify_all();
                                cv.wait_for(lock, std::chrono::seconds(10),
                                            [&] { return begun >= threads; });
                                --inside;
                              }});
  KvAllocator gpu(layout());
  gpu.set_tiers(&tiers);
  std::vector<Sequence> seqs;
  for (int p = 0; p < 3; ++p) seqs.push_back(make_seq(2 + p, prompts[static_cast<size_t>(p)]));
  tiers.hold_fetches(true);  // the three fetches are queued before any read starts
  for (Sequence& s : seqs) EXPECT_EQ(gpu.admit(s).status, AdmitStatus::kFetching);
  tiers.hold_fetches(false);
  // Polled together (poll_until_done's wait returns at once while another fetch is finishable).
  std::vector<bool> done(seqs.size(), false);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::count(done.begin(), done.end(), false) > 0 &&
         std::chrono::steady_clock::now() < deadline) {
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (done[i]) continue;
      const Admission a = gpu.poll_fetch(seqs[i]);
      if (a.status == AdmitStatus::kFetching) continue;
      done[i] = true;
      EXPECT_EQ(a.status, AdmitStatus::kAdmitted) << i;
      EXPECT_EQ(seqs[i].num_computed, 384) << i;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(std::count(done.begin(), done.end(), false), 0) << "a fetch never finished";
  for (Sequence& s : seqs) gpu.release(s);
  gpu.check_invariants({});
  return peak;
}

TEST(KvTiers, TheFetchPoolHasFetchThreadsReadingInParallel) {
  EXPECT_EQ(peak_concurrent_reads(1), 1);
  EXPECT_EQ(peak_concurrent_reads(3), 3);
  FakeTransfer t;
  KvTiers no_store(KvTiersConfig{}, t);
  EXPECT_EQ(no_store.fetch_pool_size(), 0);
}

// kv_window_state bounded_replay: the tiers store no snapshot, so a sequence's full prompt blocks
// (up to its hit limit) go through once the prompt is committed, checkpoint or not; a replayed
// sequence, which takes none, writes its new blocks too. Exact mode writes only at a snapshot.
TEST(KvTiers, BoundedReplayWritesThePromptThroughWithoutACheckpoint) {
  for (const bool exact : {true, false}) {
    SCOPED_TRACE(exact ? "exact" : "bounded_replay");
    FakeTransfer t;
    KvTiersConfig config;
    config.host_bytes = 1 << 20;
    config.window_state_exact = exact;
    KvTiers tiers(config, t);
    const std::vector<int32_t> prompt = distinct_tokens(400, 11);
    {
      KvAllocator gpu(layout());
      gpu.set_tiers(&tiers);
      Sequence a = make_seq(1, prompt);
      ASSERT_EQ(gpu.admit(a).status, AdmitStatus::kAdmitted);
      a.num_computed = 256;  // a chunk short of the hit limit (3 blocks)
      gpu.on_committed(a, -1, 0);
      EXPECT_EQ(t.exports, 0);
      a.num_computed = 400;  // the rest, without a snapshot
      gpu.on_committed(a, -1, 0);
      // Blocks [0, 3); block 3 holds the last prompt token, which a hit never covers.
      EXPECT_EQ(t.exports, exact ? 0 : 3);
      a.tokens.push_back(7);  // a decode commit: nothing more (only prompt blocks go through)
      a.num_computed = 401;
      gpu.on_committed(a, -1, 0);
      EXPECT_EQ(t.exports, exact ? 0 : 3);
      EXPECT_EQ(gpu.prefix_cache().snapshot_slots().num_used(), 0);
      if (exact) {
        // An exact-mode block without its snapshot would store a state nobody computed.
        EXPECT_THROW(tiers.write_through(a, 3, -1), Error);
      }
      tiers.poll();
      gpu.release(a);
    }
    if (exact) continue;
    // A later turn: the prompt, then 300 new tokens. A fresh GPU (as after eviction): the host
    // tier's 3 blocks are a replay hit, and the commit writes only the 2 new full blocks.
    t.blocks.clear();
    KvAllocator gpu(layout());
    gpu.set_tiers(&tiers);
    std::vector<int32_t> turn2 = prompt;
    const std::vector<int32_t> more = distinct_tokens(300, 12);
    turn2.insert(turn2.end(), more.begin(), more.end());
    Sequence b = make_seq(2, turn2);
    const Admission hit = gpu.admit(b);
    ASSERT_EQ(hit.status, AdmitStatus::kAdmitted);
    EXPECT_EQ(hit.hit_tokens, 384);
    EXPECT_EQ(b.replay_end, 384);
    EXPECT_EQ(b.num_computed, 256);
    b.num_computed = 700;
    gpu.on_committed(b, -1, 0);
    EXPECT_EQ(t.exports, 5);  // blocks 3 and 4 (384 and 512 on); [0, 3) are held already
    EXPECT_EQ(gpu.prefix_cache().snapshot_slots().num_used(), 0);
    tiers.poll();
    gpu.check_invariants({&b});
    release_all(gpu, b);
  }
}

TEST(KvTiers, ExactCacheBytesRoundTripThroughExportAndImport) {
  ModelConfig c;
  c.num_hidden_layers = 3;
  c.layer_types = {AttentionKind::kSliding, AttentionKind::kCompressedSparse,
                   AttentionKind::kHeavilyCompressed};
  auto be = make_cpu_backend(1);
  CacheShape shape;
  shape.num_blocks = 3;
  shape.num_state_slots = 3;
  for (KvCacheDType dtype : {KvCacheDType::kF32, KvCacheDType::kBF16}) {
    shape.kv_dtype = dtype;
    ModelCaches caches(c, shape, *be);
    for (int li = 0; li < 3; ++li) {
      LayerCaches& l = caches.layer(li);
      uint64_t seed = 7 + static_cast<uint64_t>(li);
      for (Tensor* t :
           {&l.swa_ring, &l.comp_ring, &l.comp_entries, &l.index_ring, &l.index_entries})
        if (t->defined()) be->fill_random_normal(*t, seed++, 0.0f, 1.0f);
    }
    auto block = std::make_shared<std::vector<uint8_t>>(caches.bytes_per_block());
    auto state = std::make_shared<std::vector<uint8_t>>(caches.bytes_per_state_slot());
    caches.export_block(*be, 1, *block, block);
    caches.export_state_slot(*be, 2, *state, state);
    be->synchronize();
    caches.import_block(*be, 2, *block);
    caches.import_state_slot(*be, 1, *state);
    int64_t layer_sum = 0;
    for (int64_t n : caches.block_bytes_per_layer()) layer_sum += n;
    EXPECT_EQ(layer_sum, caches.bytes_per_block());
    for (int li = 1; li < 3; ++li) {
      LayerCaches& l = caches.layer(li);
      const int64_t epb = l.comp_entries.size(0) / 3;
      Tensor from = be->to_host(l.comp_entries.narrow(0, epb, epb));
      Tensor to = be->to_host(l.comp_entries.narrow(0, 2 * epb, epb));
      EXPECT_EQ(std::memcmp(from.raw_data(), to.raw_data(), from.nbytes()), 0) << li;
      Tensor ring_from = be->to_host(l.comp_ring.narrow(0, 2, 1));
      Tensor ring_to = be->to_host(l.comp_ring.narrow(0, 1, 1));
      EXPECT_EQ(std::memcmp(ring_from.raw_data(), ring_to.raw_data(), ring_from.nbytes()), 0);
    }
    std::vector<uint8_t> wrong(3);
    EXPECT_THROW(caches.import_block(*be, 1, wrong), Error);
  }
}

// The layered import issues the copies layer by layer, layer 0 first, with one copy-stream event
// per layer after that layer's copies of every block and of the slot; the forward then waits for
// them one layer at a time (wait_layer), and an import with a bad payload enqueues nothing.
TEST(KvTiers, ALayeredImportIsIssuedLayerByLayerInOrder) {
  ModelConfig c;
  c.num_hidden_layers = 3;
  c.layer_types = {AttentionKind::kSliding, AttentionKind::kCompressedSparse,
                   AttentionKind::kHeavilyCompressed};
  auto be = make_cpu_backend(1);
  CacheShape shape;
  shape.num_blocks = 4;
  shape.num_state_slots = 3;
  ModelCaches caches(c, shape, *be);
  // Payloads of blocks 1 and 3 and of slot 2: every byte says which payload it is in.
  auto payload = [](size_t n, uint8_t tag) {
    std::vector<uint8_t> p(n);
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(tag + (i % 7) * 16);
    return p;
  };
  const auto nb = static_cast<size_t>(caches.bytes_per_block());
  const auto ns = static_cast<size_t>(caches.bytes_per_state_slot());
  const std::vector<std::vector<uint8_t>> blocks = {payload(nb, 1), payload(nb, 2)};
  const std::vector<uint8_t> state = payload(ns, 3);
  const std::vector<int32_t> ids = {1, 3};
  const std::vector<std::span<const uint8_t>> spans = {blocks[0], blocks[1]};
  // The bytes of layer `li` of a payload: its views' bytes, read back from the device.
  auto layer_bytes = [&](int li, int32_t block, int32_t slot) {
    std::vector<uint8_t> out;
    LayerCaches& l = caches.layer(li);
    for (Tensor* t : {&l.comp_entries, &l.index_entries}) {
      if (!t->defined()) continue;
      const int64_t epb = t->size(0) / shape.num_blocks;
      Tensor h = be->to_host(t->narrow(0, block * epb, epb));
      const auto* bytes = static_cast<const uint8_t*>(h.raw_data());
      out.insert(out.end(), bytes, bytes + h.nbytes());
    }
    for (Tensor* t : {&l.swa_ring, &l.comp_ring, &l.index_ring}) {
      if (!t->defined()) continue;
      Tensor h = be->to_host(t->narrow(0, slot, 1));
      const auto* bytes = static_cast<const uint8_t*>(h.raw_data());
      out.insert(out.end(), bytes, bytes + h.nbytes());
    }
    return out;
  };
  // What layer `li` holds once imported: its slices of the payloads.
  std::vector<std::vector<uint8_t>> want(3);
  {
    size_t block_off = 0, state_off = 0;
    for (int li = 0; li < 3; ++li) {
      const auto bl = static_cast<size_t>(caches.block_bytes_per_layer()[static_cast<size_t>(li)]);
      want[static_cast<size_t>(li)].assign(
          blocks[0].begin() + static_cast<ptrdiff_t>(block_off),
          blocks[0].begin() + static_cast<ptrdiff_t>(block_off + bl));
      block_off += bl;
      size_t sl = 0;
      LayerCaches& l = caches.layer(li);
      for (Tensor* t : {&l.swa_ring, &l.comp_ring, &l.index_ring})
        if (t->defined()) sl += t->narrow(0, 0, 1).nbytes();
      want[static_cast<size_t>(li)].insert(want[static_cast<size_t>(li)].end(),
                                           state.begin() + static_cast<ptrdiff_t>(state_off),
                                           state.begin() + static_cast<ptrdiff_t>(state_off + sl));
      state_off += sl;
    }
  }
  std::vector<std::vector<uint8_t>> before(3);
  for (int li = 0; li < 3; ++li) before[static_cast<size_t>(li)] = layer_bytes(li, 1, 2);
  std::vector<int> done;
  caches.import_layered(*be, ids, spans, 2, state, [&](int li) {
    // At layer li's event: layers <= li are in (block 1 and slot 2), later ones untouched.
    EXPECT_EQ(static_cast<int>(done.size()), li);
    EXPECT_EQ(caches.num_pending_imports(), li + 1);
    for (int k = 0; k < 3; ++k) {
      const std::vector<uint8_t> now = layer_bytes(k, 1, 2);
      if (k <= li)
        EXPECT_EQ(now, want[static_cast<size_t>(k)]) << "layer " << k << " at " << li;
      else
        EXPECT_EQ(now, before[static_cast<size_t>(k)]) << "layer " << k << " at " << li;
    }
    done.push_back(li);
  });
  EXPECT_EQ(done, (std::vector<int>{0, 1, 2}));
  // Block 3 got the second payload, whole.
  std::vector<uint8_t> b3;
  for (int li = 0; li < 3; ++li) {
    std::vector<uint8_t> l = layer_bytes(li, 3, 2);
    const auto bl = static_cast<size_t>(caches.block_bytes_per_layer()[static_cast<size_t>(li)]);
    b3.insert(b3.end(), l.begin(), l.begin() + static_cast<ptrdiff_t>(bl));
  }
  EXPECT_EQ(b3, blocks[1]);
  // The forward takes them layer by layer; anything else takes what is left at once.
  caches.wait_layer(*be, 0);
  EXPECT_EQ(caches.num_pending_imports(), 2);
  caches.wait_all_imports(*be);
  EXPECT_EQ(caches.num_pending_imports(), 0);
  // A payload of the wrong size is refused before anything is enqueued.
  const std::vector<uint8_t> short_block(nb - 1);
  const std::vector<std::span<const uint8_t>> bad = {blocks[0], short_block};
  EXPECT_THROW(caches.import_layered(*be, ids, bad, 2, state), Error);
  EXPECT_EQ(caches.num_pending_imports(), 0);
  EXPECT_EQ(layer_bytes(1, 3, 2).size(), want[1].size());
}

}  // namespace
}  // namespace deepinfer::sched
