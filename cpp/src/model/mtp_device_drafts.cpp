// ModelInstance::mtp_draft_on_device: the MTP block's greedy drafts past a step's sampling rows,
// enqueued right after the step sampled, so no host sync stands between a step and its drafts
// (engine/README.md#mtp-drafts).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "deepinfer/error.h"
#include "kv/cache_geometry.h"
#include "model/model_instance.h"

namespace deepinfer {

SamplingBatch greedy_sampling_batch(Backend& backend, int64_t rows) {
  auto zeros = [&](DType dtype) { return backend.upload(Tensor::zeros({rows}, dtype), dtype); };
  SamplingBatch greedy;
  greedy.num_rows = static_cast<int>(rows);
  greedy.temperature = zeros(DType::kF32);
  greedy.top_k = zeros(DType::kI32);
  greedy.top_p = backend.upload(
      Tensor::from_vector(std::vector<float>(static_cast<size_t>(rows), 1.0f), {rows}),
      DType::kF32);
  greedy.seed = zeros(DType::kI64);
  greedy.position = zeros(DType::kI32);
  greedy.num_logprobs = zeros(DType::kI32);
  return greedy;
}

ModelInstance::MtpDrafts ModelInstance::mtp_draft_on_device(std::span<const MtpDraftRow> rows,
                                                            const LogitsRowInputs& at_logits,
                                                            const Tensor& samples, int num_drafts,
                                                            const Tensor& previous_accepted) {
  if (mtp == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                "MTP drafts on the device: the checkpoint has no mtp.* block (or it was not "
                "loaded)");
  }
  if (num_drafts < 1) {
    throw Error(
        ErrorCode::kInvalidArgument,
        "MTP drafts on the device: num_drafts must be >= 1, got " + std::to_string(num_drafts));
  }
  MtpDrafts drafts;
  if (rows.empty()) return drafts;
  Backend& be = *backend;
  // Rows the step itself moved (carried verify rows) move here too, by the same counts, besides
  // the moves of this step's own acceptance.
  std::vector<int32_t> moved_from, moved_max;
  bool moved = false;
  for (const MtpDraftRow& r : rows) {
    moved_from.push_back(r.shift_from);
    moved_max.push_back(r.max_shift);
    moved = moved || r.shift_from >= 0;
  }
  if (moved && !previous_accepted.defined()) {
    throw Error(ErrorCode::kInvalidArgument,
                "MTP drafts on the device: a row moved by the previous step's accepted drafts, but "
                "no counts were given");
  }
  auto upload_i32 = [&](const std::vector<int32_t>& v) {
    return be.upload(Tensor::from_vector(v, {static_cast<int64_t>(v.size())}), DType::kI32);
  };
  // The previous step's moves of the moved rows, on a plan of the rows in order; carried token
  // indices stay (they index this step's outputs), and the compressed entries are left as packed:
  // the block's layer is a sliding one, which reads none (check_mtp_layer_kinds), and the plan
  // reserved no room for these moves.
  auto move_back = [&](const BatchPlan& plan) {
    if (!moved) return;
    RowShift shift = row_shift_of(plan, static_cast<int>(rows.size()), previous_accepted);
    shift.carry_remap = Tensor();
    shift.entries.clear();
    shift.shift_from = upload_i32(moved_from);
    shift.max_shift = upload_i32(moved_max);
    be.shift_rows(shift);
  };
  auto greedy = [&](const Tensor& logits, Tensor* logprob) {
    SampleResult r = be.sample(logits, greedy_sampling_batch(be, logits.size(0)));
    *logprob = r.logprobs;
    return r.tokens;
  };
  caches->wait_all_imports(be);  // the block's caches may have come with a KV tier hit

  // Draft 1: the block at every logits position p of each row with the token sampled there (the
  // token at p + 1 if the row accepted its drafts up to p), on the main trunk at p. Positions the
  // row accepted are rewritten with the values the lagging pass gave them (their sampled token
  // is the draft that was accepted); the others lie past the committed length, as any draft's.
  int32_t widest = 0;
  for (const MtpDraftRow& r : rows) widest = std::max(widest, r.num_logits);
  const std::vector<int32_t> placeholder(static_cast<size_t>(widest), 0);
  std::vector<ForwardRow> pass(rows.size());
  std::vector<int32_t> logit_index;  // pass token row -> the step's logits row
  std::vector<int32_t> row_start = {0};
  for (size_t i = 0; i < rows.size(); ++i) {
    const MtpDraftRow& r = rows[i];
    ForwardRow& f = pass[i];
    f.slot = r.slot;
    f.start_pos = r.first_logit_pos;
    f.num_tokens = r.num_logits;
    f.tokens = std::span<const int32_t>(placeholder).first(static_cast<size_t>(r.num_logits));
    f.num_logits = r.num_logits;
    f.block_table = r.block_table;
    for (int32_t j = 0; j < r.num_logits; ++j) logit_index.push_back(r.first_logit_row + j);
    row_start.push_back(row_start.back() + r.num_logits);
  }
  size_t max_blocks = validate_rows(pass, config, caches->shape(), /*check_tokens=*/false);
  const BatchPlan first_plan =
      build_batch_plan(pass, config, caches->shape(), be, LogitsMode::kLast, max_blocks);
  move_back(first_plan);
  const Tensor index = upload_i32(logit_index);
  be.select_tokens(first_plan.layout.token_ids, index, samples);
  const MtpOutput first = mtp->forward(first_plan, be.gather_rows(at_logits.trunk, index), *caches,
                                       /*step=*/0);
  drafts.first = greedy(first.logits, &drafts.first_logprob);
  if (num_drafts == 1) return drafts;

  // The drafts each row accepted: its pass tokens are its samples, its inputs the step's tokens.
  const Tensor accepted = be.accept_drafts(
      first_plan.layout.token_ids, be.gather_rows(at_logits.tokens, index), upload_i32(row_start));
  // Drafts 2..: one row per sequence at the position it has with every draft accepted, moved
  // back on the device by the drafts it rejected. Draft 2 takes draft 1 from the first pass's
  // output at the row's last logits row (moved back with the row: shift_rows moves a carried
  // token's index with its row) and the block's trunk at the same row; later drafts take the
  // previous draft and trunk of their own row.
  std::vector<std::vector<int32_t>> tables(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const MtpDraftRow& r = rows[i];
    tables[i].assign(r.block_table.begin(), r.block_table.end());
    const int32_t last = r.first_logit_pos + r.num_logits - 1;
    tables[i].resize(
        std::max(tables[i].size(), static_cast<size_t>(kv::blocks_for_tokens(last + num_drafts))),
        0);
  }
  Tensor previous = drafts.first;
  Tensor hidden = first.hidden;
  std::vector<ForwardRow> next(rows.size());
  for (int j = 1; j < num_drafts; ++j) {
    bool moves = false;
    for (size_t i = 0; i < rows.size(); ++i) {
      const MtpDraftRow& r = rows[i];
      ForwardRow& n = next[i];
      n.slot = r.slot;
      n.start_pos = r.first_logit_pos + r.num_logits - 1 + j;
      n.num_tokens = 1;
      n.tokens = std::span<const int32_t>(placeholder).first(1);
      n.num_logits = 1;
      n.block_table = tables[i];
      n.token_from_previous = j == 1 ? row_start[i] + r.num_logits - 1 : static_cast<int32_t>(i);
      n.shift_from = r.num_logits > 1 ? static_cast<int32_t>(i) : -1;
      n.max_shift = r.num_logits - 1;
      moves = moves || n.shift_from >= 0;
    }
    max_blocks = validate_rows(next, config, caches->shape(), /*check_tokens=*/false);
    const BatchPlan plan =
        build_batch_plan(next, config, caches->shape(), be, LogitsMode::kLast, max_blocks);
    if (moves) {
      RowShift shift = row_shift_of(plan, static_cast<int>(next.size()), accepted);
      // Draft 2's token index moves with its row (into the first pass's per-logits-row output);
      // later drafts read their own row's.
      if (j > 1) shift.carry_remap = Tensor();
      be.shift_rows(shift);
    }
    move_back(plan);
    take_carried_tokens(be, next, plan, previous);
    if (j == 1) hidden = be.gather_rows(hidden, plan.carry_remap);
    const MtpOutput out = mtp->forward(plan, hidden, *caches, j);
    drafts.later_logprob.emplace_back();
    previous = greedy(out.logits, &drafts.later_logprob.back());
    drafts.later.push_back(previous);
    hidden = out.hidden;
  }
  return drafts;
}

Tensor ModelInstance::carried_outputs(const Tensor& samples, const MtpDrafts& drafts,
                                      std::span<const MtpDraftRow> rows, int num_drafts) {
  Backend& be = *backend;
  const int64_t L = samples.numel();
  const int64_t regions = 1 + int64_t{num_drafts};
  if (static_cast<int64_t>(drafts.later.size()) + 1 != (drafts.first.defined() ? num_drafts : 1)) {
    throw Error(ErrorCode::kInvalidArgument,
                "carried outputs: " + std::to_string(drafts.later.size()) +
                    " further drafts for num_drafts " + std::to_string(num_drafts));
  }
  Tensor out = be.upload(Tensor::zeros({regions * L}, DType::kI32), DType::kI32);
  std::vector<int32_t> remap;
  auto fill = [&](int64_t region, const Tensor& source, auto&& index_of) {
    remap.assign(static_cast<size_t>(regions * L), -1);
    index_of(remap.data() + region * L);
    be.select_tokens(out, be.upload(Tensor::from_vector(remap, {regions * L}), DType::kI32),
                     source);
  };
  fill(0, samples, [&](int32_t* r) {
    for (int64_t l = 0; l < L; ++l) r[l] = static_cast<int32_t>(l);
  });
  if (!drafts.first.defined()) return out;
  fill(1, drafts.first, [&](int32_t* r) {
    int32_t at = 0;  // the row's first entry in MtpDrafts::first
    for (const MtpDraftRow& row : rows) {
      for (int32_t j = 0; j < row.num_logits; ++j) r[row.first_logit_row + j] = at + j;
      at += row.num_logits;
    }
  });
  for (int j = 2; j <= num_drafts; ++j) {
    fill(j, drafts.later[static_cast<size_t>(j - 2)], [&](int32_t* r) {
      for (size_t q = 0; q < rows.size(); ++q) {
        for (int32_t i = 0; i < rows[q].num_logits; ++i)
          r[rows[q].first_logit_row + i] = static_cast<int32_t>(q);
      }
    });
  }
  return out;
}

}  // namespace deepinfer
