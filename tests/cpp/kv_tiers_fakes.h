// The fakes the KV tier tests share (test_kv_tiers.cpp, test_kv_tiers_store.cpp): device caches
// as host byte arrays behind KvTransfer, a 400-token prompt computed and written through, and a
// store that holds it as after a restart.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "sched/kv_allocator.h"
#include "sched/kv_tiers.h"
#include "sched_test_util.h"
#include "temp_dir.h"

namespace deepinfer::sched::kv_tiers_test {

using test::distinct_tokens;
using test::make_seq;

// Device caches as host byte arrays: a block's bytes are its id and a generation, so an import
// shows where the bytes came from. Events are complete at once.
class FakeTransfer final : public KvTransfer {
 public:
  static constexpr int64_t kBlock = 16, kState = 8;

  class DoneEvent final : public Event {
   public:
    bool query() override { return true; }
    void wait() override {}
  };

  int64_t block_bytes() const override { return kBlock; }
  int64_t state_bytes() const override { return kState; }
  std::vector<uint64_t> block_bytes_per_layer() const override { return {kBlock}; }
  void export_block(kv::BlockId block, int32_t slot, std::span<uint8_t> dst,
                    const std::shared_ptr<const void>&) override {
    ++exports;
    export_dsts.push_back(dst.data());
    std::vector<uint8_t>& b = blocks[block];
    b.resize(kBlock);
    std::copy(b.begin(), b.end(), dst.begin());
    if (slot >= 0) {
      std::vector<uint8_t>& s = slots[slot];
      s.resize(kState);
      std::copy(s.begin(), s.end(), dst.begin() + kBlock);
    }
  }
  std::unique_ptr<Event> record_event() override { return std::make_unique<DoneEvent>(); }
  void import_block(kv::BlockId block, std::span<const uint8_t> src) override {
    // A planted fault: the device copy fails part-way, after the first block went in.
    if (fail_imports && ++imports > 1) throw Error(ErrorCode::kInternal, "planted import fault");
    blocks[block].assign(src.begin(), src.end());
  }
  void import_state(int32_t slot, std::span<const uint8_t> src) override {
    slots[slot].assign(src.begin(), src.end());
  }
  void fill_block(kv::BlockId block, uint8_t value) { blocks[block].assign(kBlock, value); }
  HostBuffer allocate_host_arena(size_t bytes) override {
    HostBuffer arena = HostBuffer::ordinary(bytes);
    arenas.emplace_back(arena.data(), arena.data() + bytes);
    return arena;
  }
  void import_fetched(std::span<const kv::BlockId> ids,
                      std::span<const std::span<const uint8_t>> payloads, int32_t slot,
                      std::span<const uint8_t> state,
                      const std::shared_ptr<const void>& keep_alive) override {
    for (const auto& p : payloads) import_srcs.push_back(p.data());
    import_keep_alive = keep_alive;
    KvTransfer::import_fetched(ids, payloads, slot, state, keep_alive);
  }
  bool in_arena(const uint8_t* p) const {
    for (const auto& [begin, end] : arenas)
      if (p >= begin && p < end) return true;
    return false;
  }

  std::map<kv::BlockId, std::vector<uint8_t>> blocks;
  std::map<int32_t, std::vector<uint8_t>> slots;
  int exports = 0;
  std::vector<const uint8_t*> export_dsts, import_srcs;
  std::vector<std::pair<const uint8_t*, const uint8_t*>> arenas;  // host tier arenas handed out
  std::shared_ptr<const void> import_keep_alive;
  bool fail_imports = false;
  int imports = 0;
};

inline KvLayout layout() {
  return {/*num_blocks=*/16, /*num_live_slots=*/4, /*num_snapshot_slots=*/2, 128, true};
}

// Runs a 400-token prompt through `kv` as the scheduler would up to its checkpoint at 384: its
// blocks get distinct bytes and the snapshot slot gets 0x5s; the commit writes it through.
inline Sequence compute_prompt(KvAllocator& kv, FakeTransfer& t,
                               const std::vector<int32_t>& prompt) {
  Sequence a = make_seq(1, prompt);
  EXPECT_EQ(kv.admit(a).status, AdmitStatus::kAdmitted);
  for (size_t i = 0; i < a.block_table.size(); ++i)
    t.fill_block(a.block_table[i], static_cast<uint8_t>(0x10 + i));
  a.num_computed = 384;
  const int32_t snap = kv.prefix_cache().take_snapshot_slot();
  t.slots[snap].assign(FakeTransfer::kState, 0x55);
  kv.on_committed(a, snap, 384);
  return a;
}

// compute_prompt's bytes, imported into `b`'s first 3 blocks and its slot.
inline void expect_prompt_imported(FakeTransfer& t, const Sequence& b) {
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(t.blocks[b.block_table[i]], std::vector<uint8_t>(16, 0x10 + i)) << i;
  EXPECT_EQ(t.slots[b.state_slot], std::vector<uint8_t>(8, 0x55));
}

// Releases the last holder: every usable block is free again.
inline void release_all(KvAllocator& gpu, Sequence& b) {
  gpu.release(b);
  gpu.check_invariants({});
  EXPECT_EQ(gpu.blocks().num_free(), 15);
}

// Polls a fetching sequence until its fetch has finished (the pool reads in the background).
inline Admission poll_until_done(KvAllocator& kv, KvTiers& tiers, Sequence& seq) {
  for (int i = 0; i < 10000; ++i) {
    Admission a = kv.poll_fetch(seq);
    if (a.status != AdmitStatus::kFetching) return a;
    tiers.wait_for_fetch(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "the fetch never finished";
  return Admission{AdmitStatus::kFetching};
}

inline KvTiersConfig store_config(const std::string& path) {
  KvTiersConfig config;
  config.store_path = path;
  config.model_identity = "fake";
  return config;
}

// A store holding a 400-token prompt's 3 blocks (the last with its snapshot), written by tiers
// that are gone again (as before a restart); the fake device caches are empty.
class KvTiersStore : public ::testing::Test {
 protected:
  void SetUp() override {
    {
      KvTiers tiers(config, t);
      KvAllocator gpu(layout());
      gpu.set_tiers(&tiers);
      Sequence a = compute_prompt(gpu, t, prompt);
      tiers.flush();
      gpu.release(a);
    }
    t.blocks.clear();
    t.slots.clear();
  }

  deepinfer::test::TempDir dir;
  FakeTransfer t;
  const KvTiersConfig config = store_config(dir.path());
  const std::vector<int32_t> prompt = distinct_tokens(400, 5);
};

}  // namespace deepinfer::sched::kv_tiers_test
