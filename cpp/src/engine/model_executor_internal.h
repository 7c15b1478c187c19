// What model_executor.cpp and model_executor_drafts.cpp share: the in-flight step's state and
// the width of a call's block tables.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/model_executor.h"
#include "model/batch_plan.h"

namespace deepinfer::engine {

class ModelExecutor::ModelStep final : public InflightStep {
 public:
  Tensor sampled;       // device [S] i32: read by the next step's carried rows
  Tensor host_tokens;   // host [S] i32, filled by the stream
  Tensor host_logprob;  // host [S] f32
  Tensor host_top_ids;  // host [S, N] i32 (N = max logprobs asked), undefined if none
  Tensor host_top_lp;   // host [S, N] f32
  std::unique_ptr<Event> done;
  // Kept from the forward while the sample is deferred (finish_launch).
  Tensor logits;
  Tensor next_positions;
  std::vector<std::pair<int, std::string>> constraint_errors;
  // A step with verify rows: each sampling row's drafts (host_tokens etc. then hold one sample
  // per logits row), and the forced tokens of plain rows, applied on the host.
  std::vector<std::vector<int32_t>> verify_drafts;
  std::vector<int32_t> forced;
  // speculative_method "mtp": per sampling row, what drafting past it needs.
  struct DraftRow {
    int32_t slot = 0;
    int32_t first_logit_pos = 0;  // position of the row's first logits row (as planned)
    int32_t num_logits = 1;       // 1 + the drafts it verifies
    std::vector<int32_t> block_table;
    int32_t shift_from = -1;  // a carried verify row: how the forward moved it (ForwardRow)
    int32_t max_shift = 0;
  };
  std::vector<DraftRow> draft_rows;
  // The V4 MTP block drafts on the device right after sampling (drafts_on_device): forward_with_
  // mtp's inputs at the logits rows (kept while the sample is deferred), the sampling rows that
  // drafted (indices into draft_rows) with the first of their logits rows among the drafts'
  // MtpDrafts::first, and the host copies of the drafts.
  ModelInstance::LogitsRowInputs at_logits;
  std::vector<size_t> drafting;
  std::vector<int32_t> drafting_first;
  Tensor host_first_draft;                  // [sum num_logits of drafting rows] i32
  Tensor host_first_logprob;                // same, f32
  std::vector<Tensor> host_later_drafts;    // per further draft: [drafting rows] i32
  std::vector<Tensor> host_later_logprobs;  // f32
  // What the next step's carried verify rows read (ForwardRow::carried_tokens,
  // ModelInstance::PreviousStep): the samples and drafts per logits row
  // (ModelInstance::carried_outputs), the drafts each sampling row accepted, and the main trunk
  // at the logits rows; the accepted counts also on the host, where a carried verify row's commit
  // takes them (its drafts were never on the host). `previous_accepted`: the previous step's,
  // which this step's carried verify rows moved by.
  Tensor carried;
  Tensor accepted;
  Tensor trunk;
  Tensor host_accepted;
  Tensor previous_accepted;
  std::vector<char> verify_on_device;  // per sampling row of a verify step: counted on the device
};

// The widest block table of the rows. The scheduler's rows are checked where they are made
// (prompts at admission, blocks by the allocator); debug builds check them again here.
inline size_t table_width(RowSpan rows, const ModelInstance& m) {
#ifdef DEEPINFER_DEBUG_INVARIANTS
  return validate_rows(rows, m.config, m.caches->shape(), /*check_tokens=*/true);
#else
  (void)m;
  size_t width = 1;
  for (const ForwardRow& r : rows) width = std::max(width, r.block_table.size());
  return width;
#endif
}

}  // namespace deepinfer::engine
