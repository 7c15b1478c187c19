// Draft verification on the host (contract in verify.h).
#include "sample/verify.h"

#include <string>

#include "deepinfer/error.h"

namespace deepinfer::sample {

namespace {

[[noreturn]] void invalid(const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "verify_row: " + what);
}

double probability_of(const std::vector<std::pair<int32_t, double>>& dist, int32_t token) {
  for (const auto& [id, p] : dist)
    if (id == token) return p;
  return 0.0;
}

// Draws from max(q - p, 0) renormalised, walking q in its rank order; q itself when the
// residual has no mass (p covers q up to rounding).
int32_t draw_residual(const std::vector<std::pair<int32_t, double>>& q, const DraftDistribution& p,
                      double u) {
  auto p_of = [&](int32_t id) { return probability_of(p, id); };
  std::vector<double> residual(q.size());
  double mass = 0.0;
  for (size_t i = 0; i < q.size(); ++i) {
    residual[i] = std::max(q[i].second - p_of(q[i].first), 0.0);
    mass += residual[i];
  }
  const bool empty = !(mass > 0.0);
  const double target = u * (empty ? 1.0 : mass);
  double cum = 0.0;
  int32_t pick = q.front().first;
  for (size_t i = 0; i < q.size(); ++i) {
    const double w = empty ? q[i].second : residual[i];
    if (w <= 0.0) continue;
    cum += w;
    pick = q[i].first;
    if (cum > target) break;
  }
  return pick;
}

}  // namespace

VerifyResult verify_row(std::span<const std::span<const float>> rows,
                        std::span<const int32_t> drafts,
                        std::span<const DraftDistribution> draft_dists, const RowParams& params) {
  const size_t d = drafts.size();
  if (rows.size() != d + 1) {
    invalid(std::to_string(d) + " drafts need " + std::to_string(d + 1) + " logits rows, got " +
            std::to_string(rows.size()));
  }
  if (!draft_dists.empty() && draft_dists.size() != d) {
    invalid(std::to_string(d) + " drafts but " + std::to_string(draft_dists.size()) +
            " draft distributions");
  }
  const int64_t vocab = static_cast<int64_t>(rows[0].size());
  for (size_t j = 0; j < d; ++j) {
    if (rows[j + 1].size() != rows[0].size()) invalid("logits rows differ in width");
    if (drafts[j] < 0 || drafts[j] >= vocab) {
      invalid("draft " + std::to_string(j) + " = " + std::to_string(drafts[j]) +
              " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  VerifyResult result;
  RowParams row = params;
  for (size_t j = 0; j < d; ++j) {
    row.position = params.position + static_cast<int64_t>(j);
    const int32_t x = drafts[j];
    const bool point_mass = draft_dists.empty() || draft_dists[j].empty();
    if (point_mass) {
      RowParams plain = row;
      plain.num_logprobs = 0;
      const int32_t y = sample_row(rows[j], plain).token;
      result.tokens.push_back(y);
      if (y != x) return result;
      ++result.num_accepted;
      continue;
    }
    const auto q = sampling_distribution(rows[j], row);
    bool accepted = false;
    if (params.temperature == 0.0f) {
      accepted = q.front().first == x;
    } else {
      const double q_x = probability_of(q, x);
      const double p_x = probability_of(draft_dists[j], x);
      // A draft its own distribution gives no mass cannot have been drawn from it: reject.
      accepted = p_x > 0.0 && uniform(params.seed, row.position, kAcceptStream) * p_x < q_x;
    }
    if (accepted) {
      result.tokens.push_back(x);
      ++result.num_accepted;
      continue;
    }
    if (params.temperature == 0.0f) {
      result.tokens.push_back(q.front().first);
    } else {
      result.tokens.push_back(
          draw_residual(q, draft_dists[j], uniform(params.seed, row.position, kResidualStream)));
    }
    return result;
  }
  row.position = params.position + static_cast<int64_t>(d);
  RowParams last = row;
  last.num_logprobs = 0;
  result.tokens.push_back(sample_row(rows[d], last).token);
  return result;
}

}  // namespace deepinfer::sample
