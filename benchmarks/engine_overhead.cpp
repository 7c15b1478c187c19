// Engine-core overhead, measured on the host:
//
//  1. Scheduler + step-plan + commit CPU time per engine step with 256 running sequences in
//     decode, on a no-op executor (launch and wait do nothing but hand back fixed tokens), so the
//     time is the engine's own. Goal: <= 30 us per step.
//  2. Device idle gap between steps with zero-overhead scheduling on vs off, on the CPU backend's
//     stream with an artificial per-step latency (the scripted executor sleeps on the stream
//     worker). The gap is the time the stream sits idle between the end of one step and the start
//     of the next. Goal with ZOS: < 5% of the step.
//
// Usage: engine_overhead [--seqs 256] [--steps 2000] [--latency-us 2000] [--short-latency-us 200]
//                        [--gap-steps 300]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "engine/engine_config.h"
#include "engine/engine_impl.h"
#include "testing/scripted_executor.h"

namespace {

using namespace deepinfer;
using Clock = std::chrono::steady_clock;

// Hands back token 7 for every sampling row; does no work.
class NoopExecutor final : public engine::StepExecutor {
 public:
  struct Step final : engine::InflightStep {
    size_t num_samples = 0;
  };
  std::unique_ptr<engine::InflightStep> launch(const sched::StepPlan& plan,
                                               engine::InflightStep*) override {
    auto s = std::make_unique<Step>();
    s->num_samples = static_cast<size_t>(plan.num_sampling_rows());
    return s;
  }
  sched::StepResult wait(engine::InflightStep& step) override {
    sched::StepResult r;
    r.tokens.assign(static_cast<Step&>(step).num_samples, 7);
    return r;
  }
  int vocab_size() const override { return 1000; }
  int max_position() const override { return 1 << 20; }
  int num_kv_blocks() const override { return 8192; }
  int num_state_slots() const override { return 512; }
  int num_snapshot_slots() const override { return 0; }
  const std::vector<int>& eos_token_ids() const override { return eos_; }

 private:
  std::vector<int> eos_ = {1};
};

int arg(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  }
  return fallback;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

void scheduler_overhead(int num_seqs, int steps) {
  EngineConfig c;
  c.scheduler.max_num_seqs = num_seqs;
  c.scheduler.max_num_batched_tokens = 16 * num_seqs;
  c.scheduler.max_model_len = 1 << 16;
  c.cache.enable_prefix_cache = false;
  engine::EngineImpl engine(c, std::make_unique<NoopExecutor>());
  SamplingParams p;
  p.max_tokens = 1 << 20;
  p.ignore_eos = true;
  for (int i = 0; i < num_seqs; ++i) engine.add_request(std::vector<int32_t>(16, 3 + i % 100), p);
  for (int i = 0; i < 8; ++i) engine.step();  // admit everyone and reach steady decode
  std::vector<double> us;
  us.reserve(static_cast<size_t>(steps));
  size_t tokens = 0;
  for (int i = 0; i < steps; ++i) {
    auto t0 = Clock::now();
    std::vector<RequestOutput> out = engine.step();
    auto t1 = Clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    tokens += out.size();
  }
  const double mean = std::accumulate(us.begin(), us.end(), 0.0) / static_cast<double>(us.size());
  std::printf(
      "scheduler+plan+commit per decode step, %d running sequences, no-op executor, %d steps:\n",
      num_seqs, steps);
  std::printf(
      "  mean %.2f us   p50 %.2f us   p99 %.2f us   (%.1f outputs/step; %.3f us per sequence)\n",
      mean, percentile(us, 0.5), percentile(us, 0.99), static_cast<double>(tokens) / steps,
      mean / num_seqs);
}

void idle_gap(bool zero_overhead, int latency_us, int steps, int num_seqs) {
  testing::ScriptedExecutorOptions o;
  o.model.vocab_size = 1000;
  o.model.step_latency = std::chrono::microseconds(latency_us);
  o.num_kv_blocks = 4096;
  o.num_snapshot_slots = 0;
  EngineConfig c;
  c.scheduler.max_num_seqs = num_seqs;
  c.scheduler.zero_overhead = zero_overhead;
  c.cache.enable_prefix_cache = false;
  c.scheduler.max_model_len = 1 << 16;
  o.num_state_slots =
      engine::live_state_slots(engine::resolve_engine_config(c, o.model.max_position));
  auto executor = std::make_unique<testing::ScriptedExecutor>(o);
  testing::ScriptedExecutor* ex = executor.get();
  engine::EngineImpl engine(c, std::move(executor));
  SamplingParams p;
  p.max_tokens = 1 << 20;
  p.ignore_eos = true;
  for (int i = 0; i < num_seqs; ++i) engine.add_request(std::vector<int32_t>(32, 3 + i), p);
  for (int i = 0; i < steps; ++i) engine.step();
  std::vector<testing::StepTiming> t = ex->timings();
  std::vector<double> gaps, busy;
  for (size_t i = 2; i < t.size(); ++i) {  // skip the prefill and the first decode
    gaps.push_back(std::chrono::duration<double, std::micro>(t[i].start - t[i - 1].end).count());
    busy.push_back(std::chrono::duration<double, std::micro>(t[i].end - t[i].start).count());
  }
  const double gap =
      std::accumulate(gaps.begin(), gaps.end(), 0.0) / static_cast<double>(gaps.size());
  const double step =
      std::accumulate(busy.begin(), busy.end(), 0.0) / static_cast<double>(busy.size());
  std::printf(
      "  ZOS %-3s: step %.1f us, idle gap mean %.2f us (p50 %.2f, p99 %.2f) = %.2f%% of the step\n",
      zero_overhead ? "on" : "off", step, gap, percentile(gaps, 0.5), percentile(gaps, 0.99),
      100.0 * gap / step);
}

}  // namespace

int main(int argc, char** argv) {
  const int seqs = arg(argc, argv, "--seqs", 256);
  const int steps = arg(argc, argv, "--steps", 2000);
  const int latency = arg(argc, argv, "--latency-us", 2000);
  const int short_latency = arg(argc, argv, "--short-latency-us", 200);
  const int gap_steps = arg(argc, argv, "--gap-steps", 300);
  scheduler_overhead(seqs, steps);
  for (int l : {latency, short_latency}) {
    std::printf(
        "device idle gap between decode steps, 64 sequences, %d us artificial step latency on "
        "the CPU stream, %d steps:\n",
        l, gap_steps);
    idle_gap(false, l, gap_steps, 64);
    idle_gap(true, l, gap_steps, 64);
  }
  return 0;
}
