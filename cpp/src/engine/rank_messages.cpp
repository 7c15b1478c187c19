#include "engine/rank_messages.h"

#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "deepinfer/error.h"

namespace deepinfer::engine {
namespace {

// Every rank runs the same binary, so the stats travel as their bytes.
static_assert(std::is_trivially_copyable_v<EngineStats>);

class Writer {
 public:
  template <typename T>
  void pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  template <typename T>
  void vec(const std::vector<T>& v) {
    pod(static_cast<uint64_t>(v.size()));
    for (const T& x : v) pod(x);
  }
  // (token, value) pairs: logit biases, top log-probabilities.
  void pairs(const std::vector<std::pair<int32_t, float>>& v) {
    pod(static_cast<uint64_t>(v.size()));
    for (const auto& [token, value] : v) {
      pod(token);
      pod(value);
    }
  }
  void str(const std::string& s) {
    pod(static_cast<uint64_t>(s.size()));
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  std::vector<uint8_t> take() { return std::move(bytes_); }

 private:
  std::vector<uint8_t> bytes_;
};

class Reader {
 public:
  Reader(const std::vector<uint8_t>& bytes, const char* what) : bytes_(bytes), what_(what) {}

  template <typename T>
  T pod() {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    T v;
    std::memcpy(&v, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  template <typename T>
  std::vector<T> vec() {
    const auto n = pod<uint64_t>();
    need_items(n, sizeof(T));
    std::vector<T> v(static_cast<size_t>(n));
    for (T& x : v) x = pod<T>();
    return v;
  }
  std::vector<std::pair<int32_t, float>> pairs() {
    const auto n = pod<uint64_t>();
    need_items(n, sizeof(int32_t) + sizeof(float));
    std::vector<std::pair<int32_t, float>> v(static_cast<size_t>(n));
    for (auto& [token, value] : v) {
      token = pod<int32_t>();
      value = pod<float>();
    }
    return v;
  }
  std::string str() {
    const auto n = pod<uint64_t>();
    need_items(n, 1);
    std::string s(reinterpret_cast<const char*>(bytes_.data() + at_), static_cast<size_t>(n));
    at_ += static_cast<size_t>(n);
    return s;
  }
  uint64_t count(size_t min_item_bytes) {
    const auto n = pod<uint64_t>();
    need_items(n, min_item_bytes);
    return n;
  }
  void done() const {
    if (at_ != bytes_.size()) {
      throw Error(ErrorCode::kInternal, std::string(what_) + ": " +
                                            std::to_string(bytes_.size() - at_) +
                                            " bytes left over after the message");
    }
  }

 private:
  void need(size_t n) const {
    if (bytes_.size() - at_ < n) {
      throw Error(ErrorCode::kInternal, std::string(what_) + ": the message ends after " +
                                            std::to_string(at_) + " of " + std::to_string(at_ + n) +
                                            " bytes");
    }
  }
  void need_items(uint64_t n, size_t item) const {
    if (item > 0 && n > (bytes_.size() - at_) / item) need(bytes_.size() - at_ + 1);
  }

  const std::vector<uint8_t>& bytes_;
  const char* what_;
  size_t at_ = 0;
};

void write_params(Writer& w, const SamplingParams& p) {
  w.pod(p.temperature);
  w.pod(p.top_k);
  w.pod(p.top_p);
  w.pod(static_cast<uint8_t>(p.seed.has_value()));
  w.pod(p.seed.value_or(0));
  w.pod(p.max_tokens);
  w.pod(static_cast<uint8_t>(p.ignore_eos));
  w.vec(p.stop_token_ids);
  w.pod(p.logprobs);
  w.vec(p.forced_tokens);
  w.pairs(p.logit_bias);
  w.pod(p.presence_penalty);
  w.pod(p.frequency_penalty);
  w.str(p.kv_retention);
}

SamplingParams read_params(Reader& r) {
  SamplingParams p;
  p.temperature = r.pod<float>();
  p.top_k = r.pod<int>();
  p.top_p = r.pod<float>();
  const bool has_seed = r.pod<uint8_t>() != 0;
  const auto seed = r.pod<uint64_t>();
  if (has_seed) p.seed = seed;
  p.max_tokens = r.pod<int>();
  p.ignore_eos = r.pod<uint8_t>() != 0;
  p.stop_token_ids = r.vec<int32_t>();
  p.logprobs = r.pod<int>();
  p.forced_tokens = r.vec<int32_t>();
  p.logit_bias = r.pairs();
  p.presence_penalty = r.pod<float>();
  p.frequency_penalty = r.pod<float>();
  p.kv_retention = r.str();
  return p;
}

}  // namespace

std::vector<uint8_t> encode(const StepOrder& order) {
  Writer w;
  w.pod(static_cast<uint8_t>(order.shutdown));
  w.pod(static_cast<uint64_t>(order.adds.size()));
  for (const AddOrder& a : order.adds) {
    if (a.params.constraint != nullptr) {
      throw Error(ErrorCode::kInternal, "a request with a constraint cannot leave rank 0");
    }
    w.pod(a.rank);
    w.pod(a.id);
    w.vec(a.prompt);
    write_params(w, a.params);
  }
  w.vec(order.aborts);
  return w.take();
}

StepOrder decode_step_order(const std::vector<uint8_t>& bytes) {
  Reader r(bytes, "step order from rank 0");
  StepOrder order;
  order.shutdown = r.pod<uint8_t>() != 0;
  const uint64_t adds = r.count(sizeof(int) + sizeof(RequestId));
  for (uint64_t i = 0; i < adds; ++i) {
    AddOrder a;
    a.rank = r.pod<int>();
    a.id = r.pod<RequestId>();
    a.prompt = r.vec<int32_t>();
    a.params = read_params(r);
    order.adds.push_back(std::move(a));
  }
  order.aborts = r.vec<RequestId>();
  r.done();
  return order;
}

std::vector<uint8_t> encode(const RankReport& report) {
  Writer w;
  w.pod(static_cast<uint64_t>(report.outputs.size()));
  for (const RequestOutput& o : report.outputs) {
    w.pod(o.id);
    w.pod(static_cast<uint8_t>(o.ready));
    w.pod(o.num_prompt_tokens);
    w.pod(o.prompt_cache_hit_tokens);
    w.vec(o.tokens);
    w.pod(static_cast<uint64_t>(o.logprobs.size()));
    for (const TokenLogprobs& l : o.logprobs) {
      w.pod(l.logprob);
      w.pairs(l.top);
    }
    w.pod(static_cast<int32_t>(o.finish));
    w.str(o.finish_detail);
  }
  w.pod(report.stats);
  return w.take();
}

RankReport decode_rank_report(const std::vector<uint8_t>& bytes) {
  Reader r(bytes, "rank report");
  RankReport report;
  const uint64_t n = r.count(sizeof(RequestId));
  for (uint64_t i = 0; i < n; ++i) {
    RequestOutput o;
    o.id = r.pod<RequestId>();
    o.ready = r.pod<uint8_t>() != 0;
    o.num_prompt_tokens = r.pod<int>();
    o.prompt_cache_hit_tokens = r.pod<int>();
    o.tokens = r.vec<int32_t>();
    const uint64_t lps = r.count(sizeof(float));
    for (uint64_t j = 0; j < lps; ++j) {
      TokenLogprobs l;
      l.logprob = r.pod<float>();
      l.top = r.pairs();
      o.logprobs.push_back(std::move(l));
    }
    const auto finish = r.pod<int32_t>();
    if (finish < 0 || finish > static_cast<int32_t>(FinishReason::kGrammarError)) {
      throw Error(ErrorCode::kInternal, "rank report: finish reason " + std::to_string(finish) +
                                            " is not one this engine has");
    }
    o.finish = static_cast<FinishReason>(finish);
    o.finish_detail = r.str();
    report.outputs.push_back(std::move(o));
  }
  report.stats = r.pod<EngineStats>();
  r.done();
  return report;
}

}  // namespace deepinfer::engine
