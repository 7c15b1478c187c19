// Engine::create_rank: the ranks of a data-parallel, expert-parallel group made one by one over a
// communicator the caller owns (an embedding server's one process per GPU, here threads over the
// in-process communicator), stepped in lock-step by the caller. Each test names what it protects:
//   RanksOverCallerCommunicatorEqualOneEngine  greedy tokens equal one engine's; each rank runs its
//                                             own requests; ids name the rank; nothing leaks
//   SizeMismatchNamesTheOption                 data_parallel_size != the group's size
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/communicator.h"
#include "deepinfer/engine.h"
#include "deepinfer/error.h"
#include "dist/inprocess_communicator.h"
#include "small_v4_model.h"
#include "temp_dir.h"

namespace deepinfer {
namespace {

TEST(EngineRank, RanksOverCallerCommunicatorEqualOneEngine) {
  test::TempDir dir;
  test::write_small_v4(dir.path());

  std::unique_ptr<Engine> single = Engine::create(test::small_v4_group(dir.path(), 1));
  std::map<RequestId, size_t> single_ids;
  for (const auto& p : test::small_v4_prompts())
    single_ids[single->add_request(p, test::greedy12())] = single_ids.size();
  std::vector<std::vector<int32_t>> want(test::small_v4_prompts().size());
  for (const RequestOutput& o : single->run_until_idle()) {
    auto& t = want[single_ids.at(o.id)];
    t.insert(t.end(), o.tokens.begin(), o.tokens.end());
  }

  const int n = 2;
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<Backend*> raw;
  for (int r = 0; r < n; ++r) {
    backends.push_back(make_cpu_backend(1));
    raw.push_back(backends.back().get());
  }
  std::vector<std::unique_ptr<dist::Communicator>> comms = dist::make_inprocess_group(raw);
  std::vector<std::unique_ptr<Engine>> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.push_back(Engine::create_rank(test::small_v4_group(dir.path(), n),
                                        std::move(backends[static_cast<size_t>(r)]),
                                        *comms[static_cast<size_t>(r)]));
  }
  // The caller routes: request i to rank i % 2. An id names its rank.
  std::map<RequestId, size_t> ids;
  for (size_t i = 0; i < test::small_v4_prompts().size(); ++i) {
    const RequestId id = ranks[i % n]->add_request(test::small_v4_prompts()[i], test::greedy12());
    EXPECT_EQ(static_cast<size_t>((id - 1) % n), i % n);
    ids[id] = i;
  }
  std::vector<std::vector<int32_t>> got(test::small_v4_prompts().size());
  int steps = 0;
  while (ranks[0]->has_unfinished() || ranks[1]->has_unfinished()) {
    ASSERT_LT(++steps, 1000) << "the ranks did not finish";
    std::vector<std::vector<RequestOutput>> out(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back(
          [&, r] { out[static_cast<size_t>(r)] = ranks[static_cast<size_t>(r)]->step(); });
    }
    for (auto& t : threads) t.join();
    for (const auto& rank_out : out) {
      for (const RequestOutput& o : rank_out) {
        auto& t = got[ids.at(o.id)];
        t.insert(t.end(), o.tokens.begin(), o.tokens.end());
      }
    }
  }
  EXPECT_EQ(got, want);
  for (const auto& rank : ranks) {
    const EngineStats s = rank->stats();
    EXPECT_GT(s.dp_group_steps, 0u);
    EXPECT_EQ(s.num_running + s.num_waiting, 0);
    rank->check_invariants();
  }
  ranks.clear();  // before the communicators they use
}

TEST(EngineRank, SizeMismatchNamesTheOption) {
  test::TempDir dir;
  test::write_small_v4(dir.path());
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(make_cpu_backend(1));
  std::vector<std::unique_ptr<dist::Communicator>> comms =
      dist::make_inprocess_group(std::vector<Backend*>{backends[0].get()});
  try {
    Engine::create_rank(test::small_v4_group(dir.path(), 2), std::move(backends[0]), *comms[0]);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'data_parallel_size' is 2 but the communicator's group "
                                         "has 1 ranks"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace deepinfer
