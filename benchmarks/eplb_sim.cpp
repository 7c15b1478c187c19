// EPLB simulation: max/mean rank load of one MoE layer before and after each rebalance, on a
// skewed traffic (Zipf popularity over 256 experts, top-6, a hot set that moves), for 8, 32 and
// 64 expert-parallel ranks with one redundant slot per rank. CPU only; prints a markdown table.
//
//   eplb_sim [--steps N] [--tokens T] [--zipf S] [--shift N]
#include "testing/eplb_sim.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  using deepinfer::testing::EplbSimOptions;
  EplbSimOptions base;
  base.num_steps = 40000;
  base.traffic.tokens_per_step = 256;
  base.traffic.shift_every_steps = 15000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--steps")
      base.num_steps = std::atoll(argv[i + 1]);
    else if (a == "--tokens")
      base.traffic.tokens_per_step = std::atoi(argv[i + 1]);
    else if (a == "--zipf")
      base.traffic.zipf_s = std::atof(argv[i + 1]);
    else if (a == "--shift")
      base.traffic.shift_every_steps = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  std::printf(
      "experts %d, top-%d, Zipf s=%.2f, %d tokens/step, hot set %d moved every %lld steps; "
      "window %d steps (buckets of %d), rebalance every %lld steps (first at %lld)\n\n",
      base.traffic.num_experts, base.traffic.top_k, base.traffic.zipf_s,
      base.traffic.tokens_per_step, base.traffic.hot_set,
      static_cast<long long>(base.traffic.shift_every_steps), base.eplb.window_steps,
      base.eplb.bucket_steps, static_cast<long long>(base.eplb.rebalance_interval),
      static_cast<long long>(base.eplb.rebalance_interval / 4));
  std::printf(
      "| ranks | slots/rank | step | before (measured) | planned (same window) | after (next "
      "window, measured) |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|\n");
  for (int ranks : {8, 32, 64}) {
    EplbSimOptions o = base;
    o.num_ranks = ranks;
    for (const auto& r : deepinfer::testing::simulate_eplb(o)) {
      const int spr = o.traffic.num_experts / ranks + o.eplb.redundant_slots_per_rank;
      if (r.after >= 0) {
        std::printf("| %d | %d | %lld | %.3f | %.3f | %.3f |\n", ranks, spr,
                    static_cast<long long>(r.step), r.before, r.planned, r.after);
      } else {
        std::printf("| %d | %d | %lld | %.3f | %.3f | — |\n", ranks, spr,
                    static_cast<long long>(r.step), r.before, r.planned);
      }
    }
  }
  return 0;
}
