// Engine::create_front and Engine::serve_rank: a group of "processes" (here threads, over the
// in-process communicator; the protocol does not depend on the communicator) where rank 0 is the
// front the caller drives and the other ranks serve its steps. Each test names what it protects:
//   FrontEqualsOneEngine        greedy tokens equal one engine's; requests spread over the ranks;
//                               stats add up; destroying the front ends the other ranks' loops
//   AbortsReachTheirRank        an abort of a request on another rank finishes it there
//   FailedRankFailsTheFront     a rank whose group is aborted makes the front's step throw, naming
//                               it, and every later step too
//   OverTcp                     the same group launched as deepinfer/rank_group.h does it (a
//                               listener on a free port, ranks connecting over loopback)
#include <gtest/gtest.h>

#include <chrono>
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
#include "deepinfer/rank_group.h"
#include "dist/inprocess_communicator.h"
#include "small_v4_model.h"
#include "temp_dir.h"

namespace deepinfer {
namespace {

// A front over n ranks; the others serve from their own threads until the front goes away.
struct Group {
  std::unique_ptr<Engine> front;
  std::vector<std::unique_ptr<dist::Communicator>> comms;
  std::vector<std::thread> servers;
  std::vector<std::string> server_errors;

  Group(const std::string& dir, int n) : server_errors(static_cast<size_t>(n)) {
    std::vector<std::unique_ptr<Backend>> backends;
    std::vector<Backend*> raw;
    for (int r = 0; r < n; ++r) {
      backends.push_back(make_cpu_backend(1));
      raw.push_back(backends.back().get());
    }
    comms = dist::make_inprocess_group(raw);
    for (int r = 1; r < n; ++r) {
      servers.emplace_back(
          [this, dir, n, r, b = std::move(backends[static_cast<size_t>(r)])]() mutable {
            try {
              Engine::serve_rank(test::small_v4_group(dir, n), std::move(b),
                                 *comms[static_cast<size_t>(r)]);
            } catch (const Error& e) {
              server_errors[static_cast<size_t>(r)] = e.what();
            }
          });
    }
    front = Engine::create_front(test::small_v4_group(dir, n), std::move(backends[0]),
                                 std::move(comms[0]));
  }
  ~Group() {
    front.reset();  // sends the shutdown
    for (auto& t : servers) t.join();
  }
};

std::vector<std::vector<int32_t>> run(Engine& e) {
  std::map<RequestId, size_t> ids;
  for (const auto& p : test::small_v4_prompts())
    ids[e.add_request(p, test::greedy12())] = ids.size();
  std::vector<std::vector<int32_t>> tokens(ids.size());
  for (const RequestOutput& o : e.run_until_idle()) {
    auto& t = tokens[ids.at(o.id)];
    t.insert(t.end(), o.tokens.begin(), o.tokens.end());
  }
  return tokens;
}

TEST(ProcessGroup, FrontEqualsOneEngine) {
  test::TempDir dir;
  test::write_small_v4(dir.path());
  const std::vector<std::vector<int32_t>> want =
      run(*Engine::create(test::small_v4_group(dir.path(), 1)));
  for (int n : {2, 4}) {
    SCOPED_TRACE("ranks " + std::to_string(n));
    std::string errors;
    {
      Group g(dir.path(), n);
      EXPECT_EQ(run(*g.front), want);
      const EngineStats s = g.front->stats();
      EXPECT_GT(s.dp_group_steps, 0u);
      EXPECT_EQ(s.generated_tokens, test::small_v4_prompts().size() * 12);
      EXPECT_EQ(s.num_blocks_free, s.num_blocks_total);
      EXPECT_EQ(g.front->num_unfinished(), 0);
      g.front.reset();
      for (auto& t : g.servers) t.join();
      g.servers.clear();
      for (const auto& e : g.server_errors) errors += e;
    }
    EXPECT_EQ(errors, "") << "a rank's loop failed";
  }
}

TEST(ProcessGroup, AbortsReachTheirRank) {
  test::TempDir dir;
  test::write_small_v4(dir.path());
  Group g(dir.path(), 2);
  std::vector<RequestId> ids;
  SamplingParams long_run = test::greedy12();
  long_run.max_tokens = 200;
  for (const auto& p : test::small_v4_prompts()) ids.push_back(g.front->add_request(p, long_run));
  g.front->step();
  g.front->step();
  for (RequestId id : ids) g.front->abort(id);
  std::map<RequestId, FinishReason> finish;
  for (const RequestOutput& o : g.front->run_until_idle())
    if (o.finish != FinishReason::kNone) finish[o.id] = o.finish;
  ASSERT_EQ(finish.size(), ids.size());
  for (RequestId id : ids) EXPECT_EQ(finish[id], FinishReason::kAbort) << id;
  const EngineStats s = g.front->stats();
  EXPECT_EQ(s.num_blocks_free, s.num_blocks_total);
  EXPECT_EQ(s.num_running + s.num_waiting, 0);
}

TEST(ProcessGroup, FailedRankFailsTheFront) {
  test::TempDir dir;
  test::write_small_v4(dir.path());
  Group g(dir.path(), 2);
  g.front->add_request(test::small_v4_prompts()[0], test::greedy12());
  g.front->step();
  g.comms[1]->abort("rank 1 lost its device");
  try {
    g.front->step();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 lost its device"), std::string::npos) << e.what();
  }
  try {
    g.front->step();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("failed earlier"), std::string::npos) << e.what();
  }
}

TEST(ProcessGroup, OverTcp) {
  test::TempDir dir;
  test::write_small_v4(dir.path());
  const std::vector<std::vector<int32_t>> want =
      run(*Engine::create(test::small_v4_group(dir.path(), 1)));
  const int n = 2;
  RankListener listener("127.0.0.1", 0);
  const int port = listener.port();
  ASSERT_GT(port, 0);
  std::string server_error;
  std::thread server([&] {
    try {
      serve_tcp_rank(test::small_v4_group(dir.path(), n), 1, 0, "127.0.0.1", port,
                     std::chrono::seconds(30));
    } catch (const Error& e) {
      server_error = e.what();
    }
  });
  {
    std::unique_ptr<Engine> front = create_tcp_front(test::small_v4_group(dir.path(), n),
                                                     std::move(listener), std::chrono::seconds(30));
    EXPECT_EQ(run(*front), want);
    EXPECT_GT(front->stats().dp_group_steps, 0u);
  }  // the front's destruction closes the group
  server.join();
  EXPECT_EQ(server_error, "");
}

}  // namespace
}  // namespace deepinfer
