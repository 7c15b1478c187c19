// Helpers of the scheduler-room tests: sequences built by hand.
#pragma once

#include <cstdint>
#include <vector>

#include "sched/sequence.h"

namespace deepinfer::sched::test {

inline Sequence make_seq(RequestId id, std::vector<int32_t> tokens) {
  Sequence s;
  s.id = id;
  s.tokens = std::move(tokens);
  s.num_prompt_tokens = static_cast<int>(s.tokens.size());
  return s;
}

// `n` tokens that differ from block to block (so their block hashes differ), offset by `salt`.
inline std::vector<int32_t> distinct_tokens(int n, int salt = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = 2 + (i * 7 + salt * 131) % 997;
  return t;
}

}  // namespace deepinfer::sched::test
