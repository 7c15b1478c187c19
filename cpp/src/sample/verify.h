// Verification of drafted tokens (speculative decoding) on the host: the reference a backend's
// verify op runs and device backends must match.
//
// A request's verify rows are the target model's logits at its last committed token and at each
// of its d drafts: row j scores the token that follows draft j - 1, so it verifies draft j
// (j < d), and row d gives the token after the last draft. Drafts are accepted as a prefix:
//  - a point-mass draft (a drafter that proposes tokens without a distribution: prompt lookup,
//    an oracle, greedy drafting) is accepted iff it equals y_j = sample_row(row j) at position
//    + j, the token the row would give without drafts; the first mismatch commits y_j. Given the
//    context, P(accept x) = q_j(x) and a rejection leaves y_j distributed as q_j without x,
//    renormalised: exactly rejection sampling against a point mass. Greedy rows accept by match.
//  - a draft with a distribution p_j (sampled drafting): accepted iff
//    u < q_j(x) / p_j(x), u = uniform(seed, position + j, kAcceptStream); the first rejected row
//    draws from the residual max(q_j - p_j, 0) (renormalised) with u = uniform(seed, position +
//    j, kResidualStream), or from q_j should the residual be empty.
// With every draft accepted, row d is sampled as any row (sample_row at position + d). So the
// committed tokens have exactly the target's distribution, whatever the drafts. The engine runs
// the point-mass rule on any backend: it samples every logits row and compares on the host
// (engine/model_executor.cpp).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "sample/sampler.h"

namespace deepinfer::sample {

inline constexpr uint32_t kAcceptStream = 1;
inline constexpr uint32_t kResidualStream = 2;

// A draft distribution: (token, probability) pairs; empty for a point mass at the draft token.
using DraftDistribution = std::vector<std::pair<int32_t, double>>;

struct VerifyResult {
  int num_accepted = 0;         // a: drafts 0..a-1 were accepted
  std::vector<int32_t> tokens;  // the a + 1 committed tokens: accepted drafts, then the final
};

// rows: d + 1 logits rows of one request (each of the same vocabulary); drafts: d tokens;
// draft_dists: d distributions or empty (every draft a point mass). params.position is the
// position of the token row 0 generates. Throws Error(kInvalidArgument) on a size mismatch or a
// draft outside the vocabulary, and for what sample_row rejects.
VerifyResult verify_row(std::span<const std::span<const float>> rows,
                        std::span<const int32_t> drafts,
                        std::span<const DraftDistribution> draft_dists, const RowParams& params);

}  // namespace deepinfer::sample
