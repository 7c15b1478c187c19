// ModelExecutor's drafting with the checkpoint's own drafter (speculative_method "mtp"): V4's
// MTP block drafts on the device right after a step samples; V4.1's DSpark block once the step's
// tokens are on the host (engine/README.md#mtp-drafts).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/model_executor.h"
#include "engine/model_executor_internal.h"
#include "kv/cache_geometry.h"
#include "model/dspark.h"

namespace deepinfer::engine {

std::vector<size_t> ModelExecutor::plan_draft_rows(const ModelStep& step, const StepResult& result,
                                                   int reach) {
  std::vector<size_t> drafting;
  draft_tokens_.clear();
  mtp_rows_.clear();
  size_t token = 0;
  for (size_t i = 0; i < step.draft_rows.size(); ++i) {
    const ModelStep::DraftRow& d = step.draft_rows[i];
    const int count = result.counts.empty() ? 1 : result.counts[i];
    token += static_cast<size_t>(count);
    ForwardRow r;
    r.slot = d.slot;
    r.start_pos = d.first_logit_pos + count;
    r.num_tokens = 1;
    if (r.start_pos + reach > max_position()) continue;  // no room for the drafts' positions
    drafting.push_back(i);
    draft_tokens_.push_back(result.tokens[token - 1]);
    mtp_rows_.push_back(r);
  }
  // Positions past the sequence's blocks name block 0, which is never handed out: DSpark layers
  // keep only ring state there.
  draft_tables_.resize(drafting.size());
  for (size_t i = 0; i < drafting.size(); ++i) {
    ForwardRow& r = mtp_rows_[i];
    std::vector<int32_t>& table = draft_tables_[i];
    table = step.draft_rows[drafting[i]].block_table;
    table.resize(
        std::max(table.size(), static_cast<size_t>(kv::blocks_for_tokens(r.start_pos + reach))), 0);
    r.tokens = std::span<const int32_t>(draft_tokens_).subspan(i, 1);
    r.block_table = table;
  }
  return drafting;
}

void ModelExecutor::drafts_on_device(ModelStep& step) {
  ModelInstance& m = *model_;
  Backend& be = *m.backend;
  const int k = options_.num_mtp_drafts;
  if (!step.at_logits.trunk.defined()) return;
  // Each sampling row drafts from its last accepted position p (its first logits row's position
  // plus the drafts it accepts), which the device knows and the host does not yet: the rows are
  // planned at the furthest p and need room for k positions past it.
  std::vector<ModelInstance::MtpDraftRow> rows;
  std::vector<int32_t> row_start = {0};  // every sampling row's logits rows
  int32_t logit_row = 0, first = 0;
  for (size_t i = 0; i < step.draft_rows.size(); ++i) {
    const ModelStep::DraftRow& d = step.draft_rows[i];
    const int32_t last = d.first_logit_pos + d.num_logits - 1;
    if (last + k <= max_position()) {
      rows.push_back({.slot = d.slot,
                      .first_logit_pos = d.first_logit_pos,
                      .num_logits = d.num_logits,
                      .first_logit_row = logit_row,
                      .block_table = d.block_table,
                      .shift_from = d.shift_from,
                      .max_shift = d.max_shift});
      step.drafting.push_back(i);
      step.drafting_first.push_back(first);
      first += d.num_logits;
    }
    logit_row += d.num_logits;
    row_start.push_back(logit_row);
  }
  auto to_host = [&](const Tensor& t) {
    Tensor host = Tensor::zeros(t.shape(), t.dtype());
    be.copy_to_host(t, host);
    return host;
  };
  // With rows carried on the device (zero-overhead scheduling): the drafts each sampling row
  // accepted (0 for a plain row), the moves of the next step's carried rows and this step's
  // carried verify rows' counts for the host, and what the next step's carried rows read.
  if (options_.device_carried_rows) {
    step.accepted = be.accept_drafts(
        step.sampled, step.at_logits.tokens,
        be.upload(Tensor::from_vector(row_start, {static_cast<int64_t>(row_start.size())}),
                  DType::kI32));
    step.host_accepted = to_host(step.accepted);
    step.trunk = step.at_logits.trunk;
  }
  const ModelInstance::MtpDrafts drafts =
      m.mtp_draft_on_device(rows, step.at_logits, step.sampled, k, step.previous_accepted);
  if (options_.device_carried_rows) step.carried = m.carried_outputs(step.sampled, drafts, rows, k);
  step.at_logits = {};
  if (rows.empty()) return;
  step.host_first_draft = to_host(drafts.first);
  step.host_first_logprob = to_host(drafts.first_logprob);
  for (size_t j = 0; j < drafts.later.size(); ++j) {
    step.host_later_drafts.push_back(to_host(drafts.later[j]));
    step.host_later_logprobs.push_back(to_host(drafts.later_logprob[j]));
  }
}

void ModelExecutor::take_device_drafts(const ModelStep& step, StepResult& result) const {
  result.drafts.assign(step.draft_rows.size(), {});
  result.draft_probs.assign(step.draft_rows.size(), {});
  for (size_t q = 0; q < step.drafting.size(); ++q) {
    const size_t i = step.drafting[q];
    // The drafts past the ones this row accepted: draft 1 from the block's pass at that logits
    // row, the further ones from the rows the device moved there.
    const int accepted = result.counts.empty() ? 0 : result.counts[i] - 1;
    const int32_t at = step.drafting_first[q] + accepted;
    std::vector<int32_t>& drafts = result.drafts[i];
    std::vector<float>& probs = result.draft_probs[i];
    drafts.push_back(step.host_first_draft.data<int32_t>()[at]);
    probs.push_back(std::exp(step.host_first_logprob.data<float>()[at]));
    for (size_t j = 0; j < step.host_later_drafts.size(); ++j) {
      drafts.push_back(step.host_later_drafts[j].data<int32_t>()[q]);
      probs.push_back(std::exp(step.host_later_logprobs[j].data<float>()[q]));
    }
  }
}

void ModelExecutor::draft_dspark(ModelStep& step, StepResult& result) {
  ModelInstance& m = *model_;
  Backend& be = *m.backend;
  result.drafts.assign(step.draft_rows.size(), {});
  result.draft_probs.assign(step.draft_rows.size(), {});
  const int b = m.config.v41->dspark_block_size;
  const int k = std::min(options_.num_mtp_drafts, b);
  // The token each sampling row just sampled is the golden token at ap + 1, ap being the row's
  // last accepted position (its first logits row's position plus the accepted drafts).
  const std::vector<size_t> drafting = plan_draft_rows(step, result, b);
  if (drafting.empty()) return;
  const auto n = static_cast<int64_t>(drafting.size());
  std::vector<Tensor> host_tokens, host_conf;  // per draft i: [rows] i32, [rows, 1] f32
  {
    HostSyncForbidden no_sync(be);
    const DSparkOutput out = m.dspark_draft(mtp_rows_, Tensor());
    for (int j = 0; j < k; ++j) {
      host_tokens.push_back(Tensor::zeros({n}, DType::kI32));
      be.copy_to_host(out.tokens[static_cast<size_t>(j)], host_tokens.back());
      host_conf.push_back(Tensor::zeros({n, 1}, DType::kF32));
      be.copy_to_host(out.confidence[static_cast<size_t>(j)], host_conf.back());
    }
  }
  be.record_event()->wait();
  // The confidence head's c_j is the budget's per-draft estimate (sched/draft_budget.h).
  for (int j = 0; j < k; ++j) {
    for (size_t i = 0; i < drafting.size(); ++i) {
      result.drafts[drafting[i]].push_back(host_tokens[static_cast<size_t>(j)].data<int32_t>()[i]);
      result.draft_probs[drafting[i]].push_back(
          dspark_confidence(host_conf[static_cast<size_t>(j)].data<float>()[i]));
    }
  }
}

}  // namespace deepinfer::engine
