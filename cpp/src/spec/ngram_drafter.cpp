#include "spec/ngram_drafter.h"

#include <algorithm>

namespace deepinfer::spec {

void NgramDrafter::propose(RequestId, std::span<const int32_t> tokens, int max_drafts,
                           std::vector<int32_t>& drafts) {
  const auto len = static_cast<int64_t>(tokens.size());
  for (int n = max_ngram_; n >= min_ngram_; --n) {
    if (len <= n) continue;
    const auto tail = tokens.subspan(static_cast<size_t>(len - n));
    // Latest earlier occurrence first: recent context predicts best. The match must leave at
    // least one token after it.
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(tail.begin(), tail.end(), tokens.begin() + start)) continue;
      const int64_t from = start + n;
      const int64_t count = std::min<int64_t>(max_drafts, len - from);
      drafts.insert(drafts.end(), tokens.begin() + from, tokens.begin() + from + count);
      return;
    }
  }
}

}  // namespace deepinfer::spec
