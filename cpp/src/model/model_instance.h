// ModelInstance: a loaded checkpoint on a backend with its caches; what ModelRunner and the
// engine's ModelExecutor both drive.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/config.h"
#include "model/cache_tensors.h"
#include "model/decode_graphs.h"
#include "model/deepseek_v4.h"
#include "model/deepseek_v41.h"
#include "model/dspark.h"
#include "model/mtp.h"

namespace deepinfer {

// How load() sizes the paged KV cache when the shape asks for 0 blocks (a GPU engine with
// num_kv_blocks 0): every block that fits in `gpu_memory_utilization` of the device's memory next
// to the weights, the state slots and activation_reserve_bytes(config, max_batch_tokens, max_seqs).
struct KvSizing {
  double gpu_memory_utilization = 0.9;
  int max_batch_tokens = 2048;
  int max_seqs = 1;
  bool speculative = false;  // verify steps may come: their decode graphs' logits buffer too
};

// What load() measured when it sized the KV cache from memory (all zero otherwise).
struct KvSizingReport {
  DeviceMemory memory_after_weights;  // total, and free with the weights loaded
  int64_t activation_reserve_bytes = 0;
  int64_t state_bytes = 0;
};

// Greedy sampling parameters for `rows` rows (temperature 0, no top-k/top-p, no logprobs
// columns): Backend::sample then gives each row's argmax (lowest id on ties) and its
// log-probability in one pass, as the drafters want.
SamplingBatch greedy_sampling_batch(Backend& backend, int64_t rows);

struct ModelInstance {
  ModelConfig config;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<ModelCaches> caches;
  std::unique_ptr<DeepseekV4Model> model;  // DeepSeek-V4; null for V4.1
  // DeepSeek-V4.1 (config.v41 set; docs/model.md#deepseek-v41-text-model): decode graphs as V4,
  // the DSpark drafter, no expert parallelism; KV f32, bf16 or V4.1's FP8/FP4 records. Null for V4.
  std::unique_ptr<DeepseekV41Model> v41_model;
  // V4.1's DSpark drafter (docs/model.md#dspark-drafter); null when the checkpoint ships no mtp.*
  // tensors or they were not loaded. Refers to `v41_model`.
  std::unique_ptr<DSparkDrafter> dspark;
  // The checkpoint's MTP drafter; null when it ships no mtp.* block. Refers to `model`.
  std::unique_ptr<MtpDrafter> mtp;
  // Decode steps replayed as graphs; null when off. Declared last: it refers to the above.
  std::unique_ptr<DecodeGraphs> graphs;
  // What loading left out on purpose (ModelWeights::notes), for the user.
  std::vector<std::string> notes;
  KvSizingReport kv_sizing;  // set when the paged KV was sized from device memory

  struct Output {
    Tensor logits;          // [logit rows, vocab] f32 on the device; undefined when none wanted
    Tensor next_positions;  // [logit rows] i32: the position each logits row predicts
  };
  // Enqueues the forward of `rows` (checked by validate_rows, whose result is `max_blocks`):
  // replaying a recorded decode graph when one fits, else eagerly. Rows with token_from_previous
  // take their first token from `previous_tokens` on the device. The outputs stay valid until the
  // next forward is enqueued (stream order). Under V4.1's YOCO compact truncation the logits rows
  // the truncation dropped (yoco_dropped_logit_rows) are left out.
  // With `hidden`, the call runs eagerly and *hidden receives the HC trunk after the last layer
  // ([T, hc_mult, H] on the device, every token row): what the MTP drafter reads.
  Output forward(RowSpan rows, size_t max_blocks, LogitsMode mode, const Tensor& previous_tokens,
                 Tensor* hidden = nullptr);

  struct MtpStep {
    Tensor logits;  // [logit rows, vocab] f32 on the device; undefined when none wanted
    Tensor hidden;  // [logit rows, hc_mult, H]: the block's trunk at those rows
    // [logit rows] i32: each logits row's position + 1 (its logits predict the token at + 2)
    Tensor next_positions;
  };
  // forward() for an engine that drafts with the MTP block (runs eagerly). The block follows the
  // main layers one position behind: position p reads the token at p + 1, so each row's block
  // pass covers positions start - 1 .. end - 2 (its tokens are the row's), reading the trunk at
  // start - 1 from the slot's trunk ring, which then receives the row's trunk. So the block's
  // caches and the trunk ring of a slot depend only on the tokens its main caches hold, and are
  // copied, snapshotted and exported with them. Needs an MTP block.
  // With `at_logits`, it also receives the main trunk and the input token at each logits row:
  // what drafting on the device (mtp_draft_on_device) starts from.
  struct LogitsRowInputs {
    Tensor trunk;   // [logit rows, hc_mult, H] f32
    Tensor tokens;  // [logit rows] i32: each logits row's input token (carried ones resolved)
  };
  // Rows with shift_from >= 0 (a carried verify row, planned before the previous step's accepted
  // drafts were known) move on the device by `previous`'s accepted counts, and read the trunk at
  // start - 1 from `previous`'s trunk at the logits row their first token was sampled at.
  struct PreviousStep {
    Tensor accepted;  // [sampling rows] i32: drafts each of that step's sampling rows accepted
    Tensor trunk;     // [logit rows, hc_mult, H]: its main trunk at its logits rows
  };
  Output forward_with_mtp(RowSpan rows, size_t max_blocks, LogitsMode mode,
                          const Tensor& previous_tokens, LogitsRowInputs* at_logits = nullptr,
                          const PreviousStep* previous = nullptr);
  // The trunk ring's row at each row's start_pos (written by forward_with_mtp within the last
  // max_backtrack positions): [rows, hc_mult, H] on the device.
  Tensor mtp_ring_trunk(RowSpan rows);
  // Greedy drafts: MTP step 0 over `rows` (their tokens are each position's next token, `hidden`
  // [T, hc_mult, H] the trunk there) drafts each row's first token from its last position; each
  // of the num_drafts - 1 further steps runs one token per row, the previous draft at the next
  // position, on the previous step's trunk. Returns the drafts per step ([rows] i32 on the
  // device); `logits` (when given) receives each step's [rows, vocab] f32, and `logprobs` each
  // draft's log_softmax(logits)[draft] ([rows] f32, from a greedy `sample` on the device, so no
  // vocabulary row leaves it; that op also rejects NaN or all -inf rows, which argmax passes).
  std::vector<Tensor> mtp_draft(RowSpan rows, size_t max_blocks, const Tensor& hidden,
                                int num_drafts, std::vector<Tensor>* logits = nullptr,
                                std::vector<Tensor>* logprobs = nullptr);

  // One sampling row of a step that drafts on the device (mtp_draft_on_device).
  struct MtpDraftRow {
    int32_t slot = 0;
    int32_t first_logit_pos = 0;  // position of its first logits row
    int32_t num_logits = 1;       // 1 + the drafts it verified
    int32_t first_logit_row = 0;  // index of its first logits row among the step's
    // Covers first_logit_pos + num_logits - 1 + num_drafts (entries past the sequence's blocks
    // name block 0, where the throwaway draft positions land).
    std::span<const int32_t> block_table;
    // A row the step moved (a carried verify row, ForwardRow::shift_from): first_logit_pos is
    // where it was planned, and it moved by previous_accepted[shift_from] - max_shift.
    int32_t shift_from = -1;
    int32_t max_shift = 0;
  };
  struct MtpDrafts {
    // Per logits row of the rows, in order: the first draft past it, i.e. the row's first draft
    // if the step accepted exactly that row's index of its drafts, and its log-probability.
    Tensor first;          // [sum num_logits] i32
    Tensor first_logprob;  // [sum num_logits] f32
    // Drafts 2 .. num_drafts past each row's accepted drafts: [rows] i32 / f32 per draft.
    std::vector<Tensor> later;
    std::vector<Tensor> later_logprob;
  };
  // Greedy MTP drafts past a step's sampling rows, enqueued right after the step sampled, with
  // no host sync (engine/README.md#mtp-drafts). `samples`: the step's sampled token per logits
  // row; `at_logits`: forward_with_mtp's. The block runs at every logits position p of a row with
  // the token sampled there, so whichever number of its drafts the row accepted, the first draft
  // past it was computed (MtpDrafts::first); the further drafts run one row per sequence at the
  // position the row would have with all its drafts accepted, moved back on the device by the
  // drafts it rejected (Backend::accept_drafts, Backend::shift_rows), so they equal mtp_draft's
  // from the accepted position. Needs an MTP block; rows must have room for num_drafts positions
  // past their last logits row.
  // `previous_accepted`: the accepted counts the step's moved rows moved by (MtpDraftRow::
  // shift_from), needed when a row moved.
  MtpDrafts mtp_draft_on_device(std::span<const MtpDraftRow> rows, const LogitsRowInputs& at_logits,
                                const Tensor& samples, int num_drafts,
                                const Tensor& previous_accepted = Tensor());
  // What a carried verify row of the next step reads (ForwardRow::carried_tokens, stride L): one
  // region of L entries per token, L = the step's logits rows (`samples` [L] i32): region 0 the
  // sample at each logits row, region 1 the first draft past it (MtpDrafts::first), region j >= 2
  // the row's draft j, repeated at each of its logits rows. So the row's tokens sit at one logits
  // row index in every region, which moves with the accepted count. [(1 + num_drafts) * L] i32;
  // entries of rows that did not draft are 0.
  Tensor carried_outputs(const Tensor& samples, const MtpDrafts& drafts,
                         std::span<const MtpDraftRow> rows, int num_drafts);

  // Enqueues MTP draft step `step` (MtpDrafter::forward) over `rows` (validate_rows' result is
  // `max_blocks`), whose tokens are each position's next token; carried tokens as in forward.
  // `hidden`: [T, hc_mult, H] on the device. Error(kInvalidArgument) when there is no drafter.
  MtpStep mtp_forward(RowSpan rows, size_t max_blocks, LogitsMode mode,
                      const Tensor& previous_tokens, const Tensor& hidden, int step);

  // One DSpark draft step (DSparkDrafter::draft): `rows` has one row per sequence, its one token
  // the golden token (the target's sample) at start_pos = ap + 1, where ap is the last position
  // the main caches hold; a carried token (token_from_previous) comes from `previous_tokens`. Its
  // block table must cover ap + dspark_block_size. Error(kInvalidArgument) without a drafter.
  DSparkOutput dspark_draft(RowSpan rows, const Tensor& previous_tokens);

  // Loads the safetensors weights of <dir> (whose config.json is `config`) onto `device` ("cpu",
  // "cuda", "cuda:N"; `num_threads` is for the CPU backend). `decode_graph_max_batch`: the
  // largest decode batch replayed as a graph; 0 turns graphs off, -1 picks the backend's default
  // (see resolve_decode_graph_max_batch).
  // `activation_quant`: "auto", "fp8" or "none" (resolve_activation_quant). `kv_cache_dtype`:
  // "auto", "f32", "bf16" or "fp8" (resolve_kv_cache_dtype; it replaces shape.kv_dtype and is
  // checked before the weights load). `load_mtp` off skips the checkpoint's mtp.* blocks (and so
  // their caches) with a note: an engine that does not draft with them keeps neither.
  // `rank`: for one rank of a parallel group, the backend made for it (instead of one made for
  // `device`) and the routed experts it holds (WeightLoadOptions::expert_slots).
  struct RankTarget {
    std::unique_ptr<Backend> backend;   // null: make_backend(device, num_threads)
    std::vector<int32_t> expert_slots;  // empty: every expert
  };
  static std::unique_ptr<ModelInstance> load(
      const std::string& checkpoint_dir, const ModelConfig& config, const CacheShape& shape,
      const std::string& device, int num_threads, int decode_graph_max_batch = 0,
      const std::string& activation_quant = "auto", const std::string& kv_cache_dtype = "auto",
      const std::function<void(int, int)>& progress = {}, const KvSizing& sizing = {},
      bool load_mtp = true, RankTarget rank = {});
  // The model of `config` with random weights (matrices stored as `stored`, or in the real
  // formats when config.quantization says so), for benchmarks. `load_mtp`: the config's V4 MTP
  // blocks (num_nextn_predict_layers) or DeepSeek-V4.1's DSpark drafter get random weights too.
  static std::unique_ptr<ModelInstance> random(
      const ModelConfig& config, const CacheShape& shape, const std::string& device,
      int num_threads, uint64_t seed, DType stored, int decode_graph_max_batch = 0,
      const std::string& activation_quant = "auto", const std::string& kv_cache_dtype = "auto",
      const KvSizing& sizing = {}, RankTarget rank = {}, bool load_mtp = false);
};

// Bytes kept free for one forward's activations at max_batch_tokens tokens (and the logits of
// max_seqs rows): twice the f32 bytes per token of the largest tensors alive at once in a layer
// (the trunk before and after, queries with their norm and RoPE copies, the attention output and
// its projections, the routed pairs' rows), plus 1 GiB for library workspaces and graphs; with
// `speculative`, also the logits buffer the verify steps' decode graphs share (decode_graphs.h).
int64_t activation_reserve_bytes(const ModelConfig& config, int max_batch_tokens, int max_seqs,
                                 bool speculative = false);
// Paged KV blocks of `bytes_per_block` that fit in `utilization` of `memory` (measured with the
// weights loaded) next to `reserve_bytes` and `state_bytes`; 0 when none do.
int64_t kv_blocks_from_memory(const DeviceMemory& memory, double utilization, int64_t reserve_bytes,
                              int64_t state_bytes, int64_t bytes_per_block);

// Whether quantized weights get dynamic FP8 activation quantization: "fp8" yes, "none" no,
// "auto" on every backend but the CPU reference. Throws Error(kInvalidArgument) for another name.
bool resolve_activation_quant(const std::string& mode, const Backend& backend);

// -1 (auto): 256 on a CUDA backend, where launch overhead dominates small decode steps, and 0 on
// the CPU, where a graph only re-issues the calls. Never more than the state slots (the most
// sequences a batch can hold). Throws Error(kInvalidArgument) below -1.
int resolve_decode_graph_max_batch(int requested, const Backend& backend, int num_state_slots);

}  // namespace deepinfer
