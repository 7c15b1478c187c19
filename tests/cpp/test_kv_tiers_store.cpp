// A store hit through the KV tiers (sched/kv_tiers.h) over the fake KvTransfer of
// kv_tiers_fakes.h: the fetching state of the request (held, finished, failed, cancelled), a
// second hit on blocks being fetched, promotion into the host tier, and every failure falling
// back to recompute.
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "deepinfer/error.h"
#include "kv_tiers_fakes.h"

namespace deepinfer::sched {
namespace {

using namespace kv_tiers_test;  // NOLINT(google-build-using-namespace): the shared fakes

TEST_F(KvTiersStore, AHitWaitsFetchingThenImportsTheBytes) {
  KvTiers tiers(config, t);
  tiers.hold_fetches(true);
  KvAllocator gpu(layout());
  gpu.set_tiers(&tiers);
  Sequence b = make_seq(2, prompt);
  ASSERT_EQ(gpu.admit(b).status, AdmitStatus::kFetching);
  b.state = SeqState::kFetching;
  // The hit's blocks and the slot are reserved; nothing is imported or indexed yet.
  EXPECT_EQ(b.block_table.size(), 4u);
  EXPECT_GE(b.state_slot, 0);
  EXPECT_EQ(b.num_computed, 0);
  EXPECT_EQ(gpu.blocks().num_free(), 11);
  EXPECT_EQ(gpu.prefix_cache().index().size(), 0u);
  EXPECT_TRUE(t.blocks.empty());
  EXPECT_EQ(tiers.num_fetches(), 1);
  gpu.check_invariants({&b});
  b.check_invariants();
  // Held: it stays pending however often it is polled.
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(gpu.poll_fetch(b).status, AdmitStatus::kFetching);
    tiers.wait_for_fetch(std::chrono::microseconds(100));
  }
  tiers.hold_fetches(false);
  Admission hit = poll_until_done(gpu, tiers, b);
  ASSERT_EQ(hit.status, AdmitStatus::kAdmitted);
  EXPECT_EQ(hit.hit_tokens, 384);
  EXPECT_EQ(b.num_computed, 384);
  EXPECT_EQ(b.tier_fetch, 0u);
  expect_prompt_imported(t, b);
  const KvTierCounters c = tiers.counters();
  EXPECT_EQ(c.store_hit_tokens, 384u);
  EXPECT_EQ(c.fetches, 1u);
  EXPECT_GT(c.fetch_seconds_total, 0.0);
  EXPECT_EQ(c.fetch_seconds_max, c.fetch_seconds_total);
  EXPECT_EQ(tiers.num_fetches(), 0);
  EXPECT_EQ(gpu.prefix_cache().index().size(), 3u);
  release_all(gpu, b);
}

TEST_F(KvTiersStore, StoreBlocksArePromotedIntoTheArenaAndImportedFromThere) {
  KvTiersConfig with_host = config;
  with_host.host_bytes = 1 << 20;
  KvTiers tiers(with_host, t);
  ASSERT_EQ(t.arenas.size(), 1u);
  KvAllocator gpu(layout());
  gpu.set_tiers(&tiers);
  Sequence b = make_seq(2, prompt);
  // Held until admit has returned: otherwise the pool may finish the read first, and admit
  // (which polls once) returns the hit at once (a CI run saw kAdmitted here).
  tiers.hold_fetches(true);
  ASSERT_EQ(gpu.admit(b).status, AdmitStatus::kFetching);
  b.state = SeqState::kFetching;
  tiers.hold_fetches(false);
  ASSERT_EQ(poll_until_done(gpu, tiers, b).status, AdmitStatus::kAdmitted);
  expect_prompt_imported(t, b);
  EXPECT_EQ(tiers.counters().store_hit_tokens, 384u);
  // The store reads went into host tier blocks first, and the import read those blocks.
  ASSERT_EQ(t.import_srcs.size(), 3u);
  for (const uint8_t* p : t.import_srcs) EXPECT_TRUE(t.in_arena(p));
  t.import_keep_alive.reset();
  release_all(gpu, b);
}

TEST_F(KvTiersStore, ReleaseWhileFetchingFreesEverythingAndDropsTheRead) {
  {
    KvTiers tiers(config, t);
    tiers.hold_fetches(true);
    KvAllocator gpu(layout());
    gpu.set_tiers(&tiers);
    Sequence b = make_seq(2, prompt);
    ASSERT_EQ(gpu.admit(b).status, AdmitStatus::kFetching);
    gpu.release(b);  // the request was aborted
    EXPECT_EQ(b.tier_fetch, 0u);
    EXPECT_EQ(tiers.num_fetches(), 0);
    gpu.check_invariants({});
    EXPECT_EQ(gpu.blocks().num_free(), 15);
    EXPECT_EQ(gpu.live_slots().num_free(), 3);
    // The pool may now run the cancelled read; its result goes nowhere.
    tiers.hold_fetches(false);
    tiers.wait_for_fetch(std::chrono::milliseconds(20));
    EXPECT_TRUE(t.blocks.empty());
    // A second one still in flight when the tiers go: the destructor joins the pool.
    Sequence c = make_seq(3, prompt);
    tiers.hold_fetches(true);
    ASSERT_EQ(gpu.admit(c).status, AdmitStatus::kFetching);
    EXPECT_EQ(tiers.num_fetches(), 1);
    EXPECT_EQ(tiers.counters().fetches, 0u);  // cancelled fetches are not counted
  }
  EXPECT_TRUE(t.blocks.empty());
}

TEST_F(KvTiersStore, ASecondHitOnTheBlocksBeingFetchedWaitsHoldingNothing) {
  KvTiers tiers(config, t);
  tiers.hold_fetches(true);
  KvAllocator gpu(layout());
  gpu.set_tiers(&tiers);
  Sequence b = make_seq(2, prompt);
  ASSERT_EQ(gpu.admit(b).status, AdmitStatus::kFetching);
  b.state = SeqState::kFetching;
  // c's plan would read the blocks b's fetch reads: it waits, with no blocks, slot or fetch.
  Sequence c = make_seq(3, prompt);
  ASSERT_EQ(gpu.admit(c).status, AdmitStatus::kWaitFetch);
  c.state = SeqState::kFetching;
  EXPECT_EQ(c.fetch_wait, b.tier_fetch);
  EXPECT_FALSE(c.holds_resources());
  EXPECT_EQ(tiers.num_fetches(), 1);
  EXPECT_EQ(gpu.blocks().num_free(), 11);
  EXPECT_EQ(gpu.live_slots().num_free(), 2);
  c.check_invariants();
  gpu.check_invariants({&b});
  EXPECT_TRUE(gpu.fetch_waiting(c));
  // b is aborted: c's wait is over and its admission starts its own fetch.
  gpu.release(b);
  EXPECT_FALSE(gpu.fetch_waiting(c));
  EXPECT_EQ(c.fetch_wait, 0u);
  ASSERT_EQ(gpu.admit(c).status, AdmitStatus::kFetching);
  c.state = SeqState::kFetching;
  // d waits for c's fetch; once it is adopted, d's admission reuses c's blocks from the GPU
  // index and fetches only the snapshot (the GPU index keeps none for a fetched prefix).
  Sequence d = make_seq(4, prompt);
  ASSERT_EQ(gpu.admit(d).status, AdmitStatus::kWaitFetch);
  EXPECT_EQ(d.fetch_wait, c.tier_fetch);
  tiers.hold_fetches(false);
  ASSERT_EQ(poll_until_done(gpu, tiers, c).status, AdmitStatus::kAdmitted);
  EXPECT_FALSE(gpu.fetch_waiting(d));
  tiers.hold_fetches(true);  // so that admission surely leaves it fetching
  ASSERT_EQ(gpu.admit(d).status, AdmitStatus::kFetching);
  d.state = SeqState::kFetching;
  EXPECT_EQ(std::vector<kv::BlockId>(d.block_table.begin(), d.block_table.begin() + 3),
            std::vector<kv::BlockId>(c.block_table.begin(), c.block_table.begin() + 3));
  tiers.hold_fetches(false);
  const Admission hit = poll_until_done(gpu, tiers, d);
  ASSERT_EQ(hit.status, AdmitStatus::kAdmitted);
  EXPECT_EQ(hit.hit_tokens, 384);
  EXPECT_EQ(t.slots[d.state_slot], std::vector<uint8_t>(8, 0x55));
  // b's cancelled fetch is not counted; c read the prefix, d only the snapshot's file.
  const KvTierCounters counters = tiers.counters();
  EXPECT_EQ(counters.fetches, 2u);
  EXPECT_EQ(counters.store_hit_tokens, 768u);
  gpu.check_invariants({&c, &d});
  gpu.release(d);
  release_all(gpu, c);
}

TEST_F(KvTiersStore, ACorruptFileFoundByTheFetchFallsBackToRecompute) {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path()))
    if (e.path().extension() == ".kvb") files.push_back(e.path());
  ASSERT_EQ(files.size(), 3u);
  // Flip the last payload byte of every file (sizes and times unchanged): the plan, from sizes,
  // still takes them; the read finds the damage.
  for (const auto& f : files) {
    const auto mtime = std::filesystem::last_write_time(f);  // the expiry: keep it
    std::FILE* fp = std::fopen(f.c_str(), "r+b");
    ASSERT_NE(fp, nullptr);
    std::fseek(fp, -1, SEEK_END);
    const int c = std::fgetc(fp);
    std::fseek(fp, -1, SEEK_END);
    std::fputc(c ^ 0xFF, fp);
    std::fclose(fp);
    std::filesystem::last_write_time(f, mtime);
  }
  KvTiers tiers(config, t);
  KvAllocator gpu(layout());
  gpu.set_tiers(&tiers);
  tiers.hold_fetches(true);  // so that admission surely leaves it fetching
  Sequence b = make_seq(2, prompt);
  ASSERT_EQ(gpu.admit(b).status, AdmitStatus::kFetching);
  tiers.hold_fetches(false);
  Admission failed = poll_until_done(gpu, tiers, b);
  // Failed: everything released, to be admitted again from the GPU index alone.
  ASSERT_EQ(failed.status, AdmitStatus::kLater);
  EXPECT_FALSE(b.holds_resources());
  EXPECT_TRUE(b.skip_tiers);
  EXPECT_EQ(tiers.counters().fetch_failures, 1u);
  EXPECT_EQ(tiers.counters().fetches, 1u);
  EXPECT_EQ(tiers.counters().store_hit_tokens, 0u);
  gpu.check_invariants({});
  EXPECT_EQ(gpu.blocks().num_free(), 15);
  Admission miss = gpu.admit(b);
  ASSERT_EQ(miss.status, AdmitStatus::kAdmitted);
  EXPECT_EQ(miss.hit_tokens, 0);
  EXPECT_EQ(b.num_computed, 0);
  gpu.check_invariants({&b});
  gpu.release(b);
}

// The fallback every failed fetch takes: b holds nothing, is marked to skip the tiers, the
// failure is counted, and every block and slot is free again.
void expect_fell_back(KvAllocator& gpu, KvTiers& tiers, const Sequence& b) {
  EXPECT_FALSE(b.holds_resources());
  EXPECT_EQ(b.tier_fetch, 0u);
  EXPECT_TRUE(b.skip_tiers);
  EXPECT_EQ(tiers.counters().fetch_failures, 1u);
  EXPECT_EQ(tiers.counters().store_hit_tokens, 0u);
  EXPECT_EQ(tiers.num_fetches(), 0);
  gpu.check_invariants({});
  EXPECT_EQ(gpu.blocks().num_free(), 15);
  EXPECT_EQ(gpu.live_slots().num_free(), 3);
  EXPECT_EQ(gpu.prefix_cache().index().size(), 0u);
}

TEST_F(KvTiersStore, AFetchWhoseSetupThrowsFallsBackToRecompute) {
  KvTiers tiers(config, t);
  KvAllocator gpu(layout());
  gpu.set_tiers(&tiers);
  tiers.set_fetch_test_hooks(
      {[] { throw Error(ErrorCode::kInternal, "planted setup fault"); }, nullptr});
  // The admission that planned the store hit does not throw: it admits from the GPU index
  // (nothing there), to recompute the whole prompt.
  Sequence b = make_seq(2, prompt);
  Admission miss = gpu.admit(b);
  ASSERT_EQ(miss.status, AdmitStatus::kAdmitted);
  EXPECT_EQ(miss.hit_tokens, 0);
  EXPECT_EQ(b.num_computed, 0);
  EXPECT_EQ(b.tier_fetch, 0u);
  EXPECT_TRUE(b.skip_tiers);
  EXPECT_EQ(b.block_table.size(), 4u);
  EXPECT_EQ(tiers.counters().fetch_failures, 1u);
  EXPECT_EQ(tiers.num_fetches(), 0);
  EXPECT_TRUE(t.blocks.empty());
  gpu.check_invariants({&b});
  gpu.release(b);
  gpu.check_invariants({});
  EXPECT_EQ(gpu.blocks().num_free(), 15);
  EXPECT_EQ(gpu.live_slots().num_free(), 3);
  // The tiers keep working: the next request fetches the prefix.
  tiers.set_fetch_test_hooks({});
  Sequence c = make_seq(3, prompt);
  tiers.hold_fetches(true);  // so that admission surely leaves it fetching
  ASSERT_EQ(gpu.admit(c).status, AdmitStatus::kFetching);
  tiers.hold_fetches(false);
  const Admission hit = poll_until_done(gpu, tiers, c);
  ASSERT_EQ(hit.status, AdmitStatus::kAdmitted);
  EXPECT_EQ(hit.hit_tokens, 384);
  expect_prompt_imported(t, c);
  release_all(gpu, c);
}

TEST_F(KvTiersStore, AStoreReadThatThrowsFallsBackToRecompute) {
  KvTiers tiers(config, t);
  KvAllocator gpu(layout());
  gpu.set_tiers(&tiers);
  tiers.set_fetch_test_hooks(
      {nullptr, [](kv::BlockHash) { throw Error(ErrorCode::kIo, "planted read fault"); }});
  tiers.hold_fetches(true);  // so that admission surely leaves it fetching
  Sequence b = make_seq(2, prompt);
  ASSERT_EQ(gpu.admit(b).status, AdmitStatus::kFetching);
  tiers.hold_fetches(false);
  ASSERT_EQ(poll_until_done(gpu, tiers, b).status, AdmitStatus::kLater);
  expect_fell_back(gpu, tiers, b);
  EXPECT_TRUE(t.blocks.empty());
  ASSERT_EQ(gpu.admit(b).status, AdmitStatus::kAdmitted);
  EXPECT_EQ(b.num_computed, 0);
  gpu.release(b);
}

TEST_F(KvTiersStore, AnImportThatThrowsFallsBackToRecompute) {
  KvTiers tiers(config, t);
  KvAllocator gpu(layout());
  gpu.set_tiers(&tiers);
  t.fail_imports = true;
  tiers.hold_fetches(true);
  Sequence b = make_seq(2, prompt);
  ASSERT_EQ(gpu.admit(b).status, AdmitStatus::kFetching);
  tiers.hold_fetches(false);
  // The fetch read everything; the import of its second block threw.
  ASSERT_EQ(poll_until_done(gpu, tiers, b).status, AdmitStatus::kLater);
  EXPECT_EQ(t.imports, 2);
  // finish_fetch counted the hit before the import failed; the fallback undoes nothing else.
  EXPECT_FALSE(b.holds_resources());
  EXPECT_TRUE(b.skip_tiers);
  EXPECT_EQ(tiers.counters().fetch_failures, 1u);
  EXPECT_EQ(tiers.num_fetches(), 0);
  gpu.check_invariants({});
  EXPECT_EQ(gpu.blocks().num_free(), 15);
  EXPECT_EQ(gpu.live_slots().num_free(), 3);
  EXPECT_EQ(gpu.prefix_cache().index().size(), 0u);  // the half-imported blocks are not indexed
  t.fail_imports = false;
  ASSERT_EQ(gpu.admit(b).status, AdmitStatus::kAdmitted);
  EXPECT_EQ(b.num_computed, 0);
  gpu.release(b);
}

}  // namespace
}  // namespace deepinfer::sched
