// A carried verify row (engine/README.md#drafting-under-zero-overhead-scheduling): planned before
// the previous step's verification is known, at the position it has if every draft was accepted,
// with all its tokens (the sample after the accepted drafts and the MTP drafts past it) still on
// the device. ModelInstance moves it by the accepted count (Backend::accept_drafts,
// Backend::shift_rows), takes its tokens from ModelInstance::carried_outputs and the MTP block's
// trunk at start - 1 from the previous step's trunk. Its logits must be bit for bit those of the
// same row planned on the host from the committed tokens, as the engine plans rows today (CPU, a
// small V4 model with an MTP block and random weights), and so must the MTP drafts made past it
// on the device (ModelInstance::mtp_draft_on_device with the row's move). (The scheduler and the
// executor planning such rows are not built yet.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/config.h"
#include "model/batch_plan.h"
#include "model/model_instance.h"
#include "small_v4_model.h"

namespace deepinfer {
namespace {

std::vector<int32_t> host_i32(Backend& be, const Tensor& t) {
  const Tensor h = be.to_host(t);
  return {h.data<int32_t>(), h.data<int32_t>() + h.numel()};
}

std::vector<float> host_f32(Backend& be, const Tensor& t) {
  const Tensor h = be.to_host(t);
  return {h.data<float>(), h.data<float>() + h.numel()};
}

class CarriedVerifyRow : public ::testing::Test {
 protected:
  static std::unique_ptr<ModelInstance> instance() {
    ModelConfig c = ModelConfig::from_json_text(test::kSmallV4Config, "small V4");
    c.num_nextn_predict_layers = 1;
    c.mtp_layer_types = {AttentionKind::kSliding};
    CacheShape shape;
    shape.num_blocks = 4;
    shape.num_state_slots = 2;
    return ModelInstance::random(c, shape, "cpu", 1, /*seed=*/11, DType::kF32, 0, "auto", "auto",
                                 {}, {},
                                 /*load_mtp=*/true);
  }

  ForwardRow row(int32_t start, std::span<const int32_t> tokens, int32_t logits) const {
    return ForwardRow{.slot = 1,
                      .start_pos = start,
                      .num_tokens = static_cast<int32_t>(tokens.size()),
                      .tokens = tokens,
                      .block_table = table_,
                      .num_logits = logits,
                      .history = {}};
  }

  // Prefills the prompt; returns its greedy next token.
  int32_t prefill(ModelInstance& m) {
    std::vector<ForwardRow> rows = {row(0, prompt_, 1)};
    const auto out = m.forward_with_mtp(rows, 1, LogitsMode::kLast, Tensor());
    return host_i32(*m.backend, m.backend->argmax(out.logits))[0];
  }

  const std::vector<int32_t> table_ = {1};
  std::vector<int32_t> prompt_ = {3, 17, 45, 9, 120, 77, 8, 200, 31, 64, 5, 90, 13, 250, 44, 2};
};

TEST_F(CarriedVerifyRow, EqualsTheRowPlannedFromCommittedTokens) {
  constexpr int kDrafts = 2;  // MTP drafts per row
  const auto n = static_cast<int32_t>(prompt_.size());
  // The greedy continuation, to draft two right tokens and a wrong one: the verify row accepts 2
  // of its 3 drafts, so the next row moves back by one.
  std::unique_ptr<ModelInstance> plain = instance();
  std::vector<int32_t> greedy = {prefill(*plain)};
  for (int i = 0; i < 3; ++i) {
    const std::vector<int32_t> one = {greedy.back()};
    std::vector<ForwardRow> rows = {row(n + i, one, 1)};
    const auto out = plain->forward_with_mtp(rows, 1, LogitsMode::kLast, Tensor());
    greedy.push_back(host_i32(*plain->backend, plain->backend->argmax(out.logits))[0]);
  }
  const std::vector<int32_t> verify = {greedy[0], greedy[1], greedy[2], (greedy[3] + 1) % 256};
  const int32_t accepted = 2;

  // The reference: the step's drafts on the host's cue from the committed tokens (what
  // ModelExecutor did before drafting on the device), then the next row at its true position.
  std::unique_ptr<ModelInstance> ref = instance();
  ASSERT_EQ(prefill(*ref), greedy[0]);
  std::vector<int32_t> ref_samples;
  {
    std::vector<ForwardRow> rows = {row(n, verify, 4)};
    const auto out = ref->forward_with_mtp(rows, 1, LogitsMode::kLast, Tensor());
    ref_samples = host_i32(*ref->backend, ref->backend->argmax(out.logits));
  }
  ASSERT_EQ(ref_samples[0], verify[1]);
  ASSERT_EQ(ref_samples[1], verify[2]);
  ASSERT_NE(ref_samples[2], verify[3]);
  const std::vector<int32_t> bonus = {ref_samples[accepted]};
  std::vector<int32_t> ref_drafts;
  {
    std::vector<ForwardRow> rows = {row(n + accepted, bonus, 1)};
    for (const Tensor& d : ref->mtp_draft(rows, 1, ref->mtp_ring_trunk(rows), kDrafts))
      ref_drafts.push_back(host_i32(*ref->backend, d)[0]);
  }
  std::vector<int32_t> next_tokens = {bonus[0]};
  next_tokens.insert(next_tokens.end(), ref_drafts.begin(), ref_drafts.end());
  std::vector<float> ref_logits;
  {
    std::vector<ForwardRow> rows = {row(n + accepted + 1, next_tokens, 1 + kDrafts)};
    ref_logits =
        host_f32(*ref->backend, ref->forward_with_mtp(rows, 1, LogitsMode::kLast, Tensor()).logits);
  }

  // On the device's cue: the verify step, its drafts and accepted count on the device, and the
  // next row planned at the all-accepted position with every token carried.
  std::unique_ptr<ModelInstance> dev = instance();
  Backend& be = *dev->backend;
  ASSERT_EQ(prefill(*dev), greedy[0]);
  ModelInstance::LogitsRowInputs at_logits;
  std::vector<ForwardRow> verify_rows = {row(n, verify, 4)};
  const auto out = dev->forward_with_mtp(verify_rows, 1, LogitsMode::kLast, Tensor(), &at_logits);
  const Tensor samples = be.argmax(out.logits);
  const ModelInstance::MtpDraftRow draft_row{.slot = 1,
                                             .first_logit_pos = n,
                                             .num_logits = 4,
                                             .first_logit_row = 0,
                                             .block_table = table_};
  const std::vector<ModelInstance::MtpDraftRow> draft_rows = {draft_row};
  const ModelInstance::MtpDrafts drafts =
      dev->mtp_draft_on_device(draft_rows, at_logits, samples, kDrafts);
  const Tensor counts = be.accept_drafts(
      samples, at_logits.tokens,
      be.upload(Tensor::from_vector(std::vector<int32_t>{0, 4}, {2}), DType::kI32));
  ASSERT_EQ(host_i32(be, counts), std::vector<int32_t>{accepted});
  const Tensor carried = dev->carried_outputs(samples, drafts, draft_rows, kDrafts);
  // The carried entries at the accepted logits row are the reference's tokens.
  const std::vector<int32_t> regions = host_i32(be, carried);
  ASSERT_EQ(regions.size(), size_t{4 * (1 + kDrafts)});
  for (int j = 0; j <= kDrafts; ++j) EXPECT_EQ(regions[4 * j + accepted], next_tokens[j]) << j;

  const std::vector<int32_t> placeholders(1 + kDrafts, 0);
  ForwardRow carried_row = row(n + 4, placeholders, 1 + kDrafts);
  carried_row.token_from_previous = 3;  // the last logits row: every draft accepted
  carried_row.carried_tokens = 1 + kDrafts;
  carried_row.carried_stride = 4;
  carried_row.shift_from = 0;
  carried_row.max_shift = 3;
  const ModelInstance::PreviousStep previous{.accepted = counts, .trunk = at_logits.trunk};
  std::vector<ForwardRow> next_rows = {carried_row};
  ModelInstance::LogitsRowInputs next_at_logits;
  const auto next =
      dev->forward_with_mtp(next_rows, 1, LogitsMode::kLast, carried, &next_at_logits, &previous);
  const std::vector<float> got = host_f32(be, next.logits);
  ASSERT_EQ(got.size(), ref_logits.size());
  EXPECT_EQ(std::memcmp(got.data(), ref_logits.data(), got.size() * sizeof(float)), 0);
  EXPECT_EQ(host_i32(be, next.next_positions),
            (std::vector<int32_t>{n + accepted + 2, n + accepted + 3, n + accepted + 4}));
  // The MTP block's state: its window ring (which the lagging pass over the moved row wrote from
  // the previous step's trunk at start - 1) and the trunk ring, slot 1, byte for byte (before
  // drafting, which writes throwaway positions past the committed ones differently).
  const int mtp_layer = dev->config.num_hidden_layers;
  for (const auto& [name, of] : {std::pair{"swa_ring", &LayerCaches::swa_ring},
                                 std::pair{"trunk_ring", &LayerCaches::trunk_ring}}) {
    const Tensor a = be.to_host(dev->caches->layer(mtp_layer).*of);
    const Tensor b = ref->backend->to_host(ref->caches->layer(mtp_layer).*of);
    ASSERT_EQ(a.numel(), b.numel()) << name;
    const int64_t per_slot = a.numel() / a.size(0);
    EXPECT_EQ(std::memcmp(a.data<float>() + per_slot, b.data<float>() + per_slot,
                          static_cast<size_t>(per_slot) * sizeof(float)),
              0)
        << name;
  }

  // The drafts past the moved row: on the device from where it was planned (moved by both
  // steps' accepted counts), and on the host's cue from its true position.
  const Tensor next_samples = be.argmax(next.logits);
  const ModelInstance::MtpDraftRow moved_row{.slot = 1,
                                             .first_logit_pos = n + 4,
                                             .num_logits = 1 + kDrafts,
                                             .first_logit_row = 0,
                                             .block_table = table_,
                                             .shift_from = 0,
                                             .max_shift = 3};
  const std::vector<ModelInstance::MtpDraftRow> moved_rows = {moved_row};
  const ModelInstance::MtpDrafts next_drafts =
      dev->mtp_draft_on_device(moved_rows, next_at_logits, next_samples, kDrafts, counts);
  const std::vector<int32_t> ref_next_samples = host_i32(be, next_samples);
  int32_t next_accepted = 0;
  while (next_accepted < kDrafts && ref_next_samples[static_cast<size_t>(next_accepted)] ==
                                        next_tokens[static_cast<size_t>(next_accepted) + 1])
    ++next_accepted;
  std::vector<int32_t> ref_next_drafts;
  std::vector<float> ref_logprobs;  // the drafts' log-probabilities: bits, not just the argmax
  {
    const std::vector<int32_t> token = {ref_next_samples[static_cast<size_t>(next_accepted)]};
    std::vector<ForwardRow> rows = {row(n + accepted + 1 + next_accepted, token, 1)};
    std::vector<Tensor> logprobs;
    for (const Tensor& d :
         ref->mtp_draft(rows, 1, ref->mtp_ring_trunk(rows), kDrafts, nullptr, &logprobs))
      ref_next_drafts.push_back(host_i32(*ref->backend, d)[0]);
    for (const Tensor& lp : logprobs) ref_logprobs.push_back(host_f32(*ref->backend, lp)[0]);
  }
  std::vector<int32_t> got_drafts = {
      host_i32(be, next_drafts.first)[static_cast<size_t>(next_accepted)]};
  for (const Tensor& d : next_drafts.later) got_drafts.push_back(host_i32(be, d)[0]);
  EXPECT_EQ(got_drafts, ref_next_drafts) << "accepted " << next_accepted;
  std::vector<float> got_logprobs = {
      host_f32(be, next_drafts.first_logprob)[static_cast<size_t>(next_accepted)]};
  for (const Tensor& lp : next_drafts.later_logprob) got_logprobs.push_back(host_f32(be, lp)[0]);
  ASSERT_EQ(got_logprobs.size(), ref_logprobs.size());
  EXPECT_EQ(std::memcmp(got_logprobs.data(), ref_logprobs.data(), ref_logprobs.size() * 4), 0);
}

}  // namespace
}  // namespace deepinfer
