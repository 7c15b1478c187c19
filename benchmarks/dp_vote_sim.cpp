// Simulation of DP-group voting (sched/dp_vote.h) on a mixed trace: what voting costs in steps.
//
// Each rank gets a deterministic stream of requests (prompt 128..16K tokens, decode 16..1024
// tokens, mean inter-arrival 150..600 steps by rank, in
// bursts: arrivals only in the first half of every 20000 steps, so the group goes idle). A prefill
// step admits from the head of the waiting queue up to 8192 tokens (chunked; a cut chunk ends the
// batch) while running < 64; a decode step gives every running request one token. Time is in group
// steps. Reported: the share of rank-steps that were dummy decodes or empty prefills (steps lost to
// voting), idle rank-steps, and time to first prefill (arrival → first chunk scheduled) in steps.
// Pure CPU, no model.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <vector>

#include "sched/dp_vote.h"

using namespace deepinfer::sched;

namespace {

struct Req {
  int arrival;
  int prompt_left;
  int decode_left;
  bool started = false;
};

struct Rank {
  std::deque<Req> waiting;
  std::vector<int> running;  // decode tokens left
  uint64_t rng;
  int next_arrival = 0;
  int mean_gap;
};

uint64_t next(uint64_t& s) {
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return s >> 33;
}

constexpr int kBudget = 8192;
constexpr int kMaxRunning = 64;

struct Result {
  long rank_steps = 0, dummy = 0, empty = 0, idle = 0, prefill_steps = 0, group_steps = 0;
  std::vector<int> ttfp;
};

Result simulate(int n, bool idle_rule, int horizon) {
  std::vector<Rank> ranks(n);
  for (int r = 0; r < n; ++r) {
    ranks[r].rng = 12345 + 977 * r;
    ranks[r].mean_gap = 150 + 150 * (r % 4);  // ranks differ in load
  }
  std::vector<DpVote> votes(n, DpVote(DpVoteConfig{.prefill_when_group_idle = idle_rule}));
  Result res;
  for (int t = 0; t < horizon; ++t) {
    for (Rank& k : ranks) {
      while (k.next_arrival <= t) {
        const int prompt = 128 << (next(k.rng) % 8);  // 128 .. 16384
        const int decode = 16 + static_cast<int>(next(k.rng) % 1009);
        k.waiting.push_back({k.next_arrival, prompt, decode});
        k.next_arrival += 1 + static_cast<int>(next(k.rng) % (2 * k.mean_gap));
        // Bursts: arrivals only in the first half of every 20000 steps, so the group drains.
        if (k.next_arrival % 20000 >= 10000) k.next_arrival += 20000 - k.next_arrival % 20000;
      }
    }
    std::vector<Ballot> b(n);
    for (int r = 0; r < n; ++r) {
      const LocalWish w{
          !ranks[r].waiting.empty() && static_cast<int>(ranks[r].running.size()) < kMaxRunning,
          !ranks[r].running.empty()};
      b[r] = votes[r].first_ballot(w);
    }
    const Tally t1 = Tally::of(b);
    DpVote::Proposal p = DpVote::Proposal::kDecided;
    for (int r = 0; r < n; ++r) p = votes[r].after_first(t1);
    if (p == DpVote::Proposal::kConfirm) {
      for (int r = 0; r < n; ++r) b[r] = votes[r].second_ballot(votes[r].runs_prefill_selection());
      const Tally t2 = Tally::of(b);
      for (int r = 0; r < n; ++r) votes[r].after_second(t2);
    }
    if (votes[0].group_step() != GroupStep::kIdle) ++res.group_steps;
    if (votes[0].group_step() == GroupStep::kPrefill) ++res.prefill_steps;
    for (int r = 0; r < n; ++r) {
      Rank& k = ranks[r];
      ++res.rank_steps;
      switch (votes[r].action()) {
        case RankAction::kIdle:
          ++res.idle;
          break;
        case RankAction::kDummyDecode:
          ++res.dummy;
          break;
        case RankAction::kEmptyPrefill:
          ++res.empty;
          break;
        case RankAction::kDecode:
          for (int& left : k.running) --left;
          std::erase_if(k.running, [](int left) { return left <= 0; });
          break;
        case RankAction::kPrefill: {
          int budget = kBudget;
          while (budget > 0 && !k.waiting.empty() &&
                 static_cast<int>(k.running.size()) < kMaxRunning) {
            Req& q = k.waiting.front();
            if (!q.started) res.ttfp.push_back(t - q.arrival), q.started = true;
            const int chunk = std::min(budget, q.prompt_left);
            q.prompt_left -= chunk;
            budget -= chunk;
            if (q.prompt_left > 0) break;
            k.running.push_back(q.decode_left);
            k.waiting.pop_front();
          }
          break;
        }
      }
    }
  }
  return res;
}

}  // namespace

int main() {
  constexpr int kHorizon = 200000;
  std::printf("%5s %-11s %12s %9s %9s %9s %9s %10s %9s %9s\n", "ranks", "idle_rule", "rank_steps",
              "dummy%", "empty%", "lost%", "idle%", "prefill%", "ttfp_p50", "ttfp_max");
  for (int n : {4, 8}) {
    for (bool idle_rule : {true, false}) {
      Result r = simulate(n, idle_rule, kHorizon);
      std::sort(r.ttfp.begin(), r.ttfp.end());
      const double rs = static_cast<double>(r.rank_steps);
      std::printf("%5d %-11s %12ld %8.2f%% %8.2f%% %8.2f%% %8.2f%% %9.2f%% %9d %9d\n", n,
                  idle_rule ? "prefill" : "deepseek", r.rank_steps, 100.0 * r.dummy / rs,
                  100.0 * r.empty / rs, 100.0 * (r.dummy + r.empty) / rs, 100.0 * r.idle / rs,
                  100.0 * r.prefill_steps / std::max(1L, r.group_steps),
                  r.ttfp.empty() ? 0 : r.ttfp[r.ttfp.size() / 2],
                  r.ttfp.empty() ? 0 : r.ttfp.back());
    }
  }
  return 0;
}
