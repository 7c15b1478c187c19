// ModelExecutor's drafting with the checkpoint's own drafter (speculative_method "mtp"): once a
// step's tokens are on the host, the V4 MTP block or V4.1's DSpark block drafts past each sampling
// row (engine/README.md#mtp-drafts).
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
                                                   int position_offset, int reach) {
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
    r.start_pos = d.first_logit_pos + count + position_offset;
    r.num_tokens = 1;
    if (r.start_pos + reach > max_position()) continue;  // no room for the drafts' positions
    drafting.push_back(i);
    draft_tokens_.push_back(result.tokens[token - 1]);
    mtp_rows_.push_back(r);
  }
  // Positions past the sequence's blocks name block 0, which is never handed out: the MTP
  // block's throwaway compressed entries land there (positions inside the sequence are rewritten
  // when they are computed), and DSpark layers keep only ring state.
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

void ModelExecutor::draft_ahead(ModelStep& step, StepResult& result) {
  ModelInstance& m = *model_;
  Backend& be = *m.backend;
  const int k = options_.num_mtp_drafts;
  result.drafts.assign(step.draft_rows.size(), {});
  result.draft_probs.assign(step.draft_rows.size(), {});
  if (dspark_on()) {
    draft_dspark(step, result);
    return;
  }
  // Each sampling row's block pass stopped one position short of its last accepted one, whose
  // next token this step just sampled: the drafts start there (ModelInstance::forward_with_mtp),
  // with that token, on the trunk ring's row there.
  const std::vector<size_t> drafting = plan_draft_rows(step, result, /*position_offset=*/-1, k);
  if (drafting.empty()) return;
  const auto n = static_cast<int64_t>(drafting.size());
  std::vector<Tensor> host;     // [rows] i32 per draft step
  std::vector<Tensor> host_lp;  // [rows] f32 per draft step
  {
    HostSyncForbidden no_sync(be);
    std::vector<Tensor> logprobs;
    const std::vector<Tensor> drafts = m.mtp_draft(
        mtp_rows_, table_width(mtp_rows_, m), m.mtp_ring_trunk(mtp_rows_), k, nullptr, &logprobs);
    for (size_t j = 0; j < drafts.size(); ++j) {
      host.push_back(Tensor::zeros({n}, DType::kI32));
      be.copy_to_host(drafts[j], host.back());
      host_lp.push_back(Tensor::zeros({n}, DType::kF32));
      be.copy_to_host(logprobs[j], host_lp.back());
    }
  }
  be.record_event()->wait();
  for (size_t j = 0; j < host.size(); ++j) {
    for (size_t i = 0; i < drafting.size(); ++i) {
      result.drafts[drafting[i]].push_back(host[j].data<int32_t>()[i]);
      result.draft_probs[drafting[i]].push_back(std::exp(host_lp[j].data<float>()[i]));
    }
  }
}

void ModelExecutor::draft_dspark(ModelStep& step, StepResult& result) {
  ModelInstance& m = *model_;
  Backend& be = *m.backend;
  const int b = m.config.v41->dspark_block_size;
  const int k = std::min(options_.num_mtp_drafts, b);
  // The token each sampling row just sampled is the golden token at ap + 1, ap being the row's
  // last accepted position (its first logits row's position plus the accepted drafts).
  const std::vector<size_t> drafting = plan_draft_rows(step, result, /*position_offset=*/0, b);
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
