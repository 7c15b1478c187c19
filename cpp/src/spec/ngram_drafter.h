// Prompt-lookup drafting: the tokens that followed the latest earlier occurrence of the context's
// last n tokens, for n from `max_ngram` down to `min_ngram` (the first n that matches wins).
// Cheap and model-free: it pays where the output copies its context (code edits, quoting,
// retrieval), and costs only the verify rows elsewhere.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "deepinfer/engine.h"

namespace deepinfer::spec {

class NgramDrafter final : public Drafter {
 public:
  NgramDrafter(int min_ngram, int max_ngram) : min_ngram_(min_ngram), max_ngram_(max_ngram) {}

  void propose(RequestId id, std::span<const int32_t> tokens, int max_drafts,
               std::vector<int32_t>& drafts) override;

 private:
  int min_ngram_;
  int max_ngram_;
};

}  // namespace deepinfer::spec
