// cpp_generate: load a DeepSeek-V4 checkpoint with libdeepinfer and generate, with no Python.
//
//   cpp_generate <checkpoint_dir> [--max-tokens N] [--temperature T] [--seed S] [token ids...]
//
// Prompts are token ids (there is no tokenizer in the C++ core); without any, a fixed demo
// prompt is used. Two requests run together to show continuous batching.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "deepinfer/engine.h"
#include "deepinfer/error.h"

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0) {
    std::fprintf(
        stderr,
        "usage: %s <checkpoint_dir> [--max-tokens N] [--temperature T] [--seed S] [token ids...]\n",
        argv[0]);
    return argc < 2 ? 2 : 0;
  }
  deepinfer::EngineConfig config;
  config.model_path = argv[1];
  deepinfer::SamplingParams params;
  params.temperature = 0.0f;
  params.max_tokens = 16;
  std::vector<int32_t> prompt;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--max-tokens" && i + 1 < argc) {
      params.max_tokens = std::atoi(argv[++i]);
    } else if (a == "--temperature" && i + 1 < argc) {
      params.temperature = static_cast<float>(std::atof(argv[++i]));
    } else if (a == "--seed" && i + 1 < argc) {
      params.seed = std::strtoull(argv[++i], nullptr, 10);
    } else {
      prompt.push_back(std::atoi(a.c_str()));
    }
  }
  if (prompt.empty()) prompt = {0, 671, 6102, 294, 8760, 344};  // BOS + "The capital of France is"
  try {
    auto engine = deepinfer::Engine::create(config);
    std::vector<int32_t> second = prompt;
    second.push_back(13);
    std::map<deepinfer::RequestId, std::vector<int32_t>> tokens;
    std::map<deepinfer::RequestId, std::string> finish;
    const auto start = std::chrono::steady_clock::now();
    const deepinfer::RequestId a = engine->add_request(prompt, params);
    const deepinfer::RequestId b = engine->add_request(second, params);
    while (engine->has_unfinished()) {
      for (const deepinfer::RequestOutput& out : engine->step()) {
        auto& t = tokens[out.id];
        t.insert(t.end(), out.tokens.begin(), out.tokens.end());
        if (out.finish != deepinfer::FinishReason::kNone) {
          finish[out.id] = deepinfer::finish_reason_name(out.finish);
          if (!out.finish_detail.empty()) finish[out.id] += " (" + out.finish_detail + ")";
        }
      }
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (deepinfer::RequestId id : {a, b}) {
      std::printf("request %llu (%s):", static_cast<unsigned long long>(id), finish[id].c_str());
      for (int32_t t : tokens[id]) std::printf(" %d", t);
      std::printf("\n");
    }
    const deepinfer::EngineStats s = engine->stats();
    std::printf("%llu tokens generated in %.3f s over %llu steps\n",
                static_cast<unsigned long long>(s.generated_tokens), secs,
                static_cast<unsigned long long>(s.num_steps));
  } catch (const deepinfer::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
