#include "model/model_instance.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <string>
#include <utility>

#include "deepinfer/error.h"
#include "model/checkpoint.h"
#include "model/v41_weights.h"
#include "model/weights.h"

namespace deepinfer {

int resolve_decode_graph_max_batch(int requested, const Backend& backend, int num_state_slots) {
  if (requested < -1) {
    throw Error(ErrorCode::kInvalidArgument,
                "decode_graph_max_batch must be -1 (auto), 0 (off) or a batch size, got " +
                    std::to_string(requested));
  }
  const int wanted =
      requested >= 0 ? requested : (backend.device_kind() == DeviceKind::kCuda ? 256 : 0);
  return std::min(wanted, num_state_slots);
}

int64_t activation_reserve_bytes(const ModelConfig& c, int max_batch_tokens, int max_seqs,
                                 bool speculative) {
  const int64_t h = c.hidden_size;
  const int64_t heads_dim = static_cast<int64_t>(c.num_attention_heads) * c.head_dim;
  const int64_t per_token =
      4 * (2 * int64_t{c.hc_mult} * h + 5 * heads_dim + int64_t{c.o_groups} * c.o_lora_rank +
           int64_t{c.num_experts_per_tok} * (2 * h + 2 * int64_t{c.moe_intermediate_size}));
  int64_t logits = 2 * int64_t{max_seqs} * c.vocab_size * 4;  // logits and sampling
  if (speculative) {
    const int64_t rows = int64_t{std::min(max_seqs, DecodeGraphs::kMaxVerifyBatch)} *
                             BatchGeometry::kMaxPaddedRowTokens +
                         1;
    logits += rows * c.vocab_size * 4;
  }
  return 2 * per_token * max_batch_tokens + logits + (int64_t{1} << 30);
}

int64_t kv_blocks_from_memory(const DeviceMemory& memory, double utilization, int64_t reserve_bytes,
                              int64_t state_bytes, int64_t bytes_per_block) {
  const int64_t used = memory.total_bytes - memory.free_bytes;  // weights, contexts, others
  const int64_t budget =
      static_cast<int64_t>(utilization * static_cast<double>(memory.total_bytes)) - used -
      reserve_bytes - state_bytes;
  if (budget <= 0 || bytes_per_block <= 0) return 0;
  return budget / bytes_per_block;
}

ModelInstance::Output ModelInstance::forward(RowSpan rows, size_t max_blocks, LogitsMode mode,
                                             const Tensor& previous_tokens, Tensor* hidden) {
  if (hidden == nullptr && graphs != nullptr && graphs->accepts(rows, mode)) {
    // A replay cannot wait layer by layer: KV tier imports still pending are waited for whole.
    caches->wait_all_imports(*backend);
    DecodeGraphs::Output out = graphs->forward(rows, max_blocks, previous_tokens, mode);
    return {out.logits, out.next_positions};
  }
  const BatchPlan plan =
      build_batch_plan(rows, config, caches->shape(), *backend, mode, max_blocks);
  take_carried_tokens(*backend, rows, plan, previous_tokens);
  if (v41_model != nullptr) {
    if (hidden != nullptr) {
      throw Error(ErrorCode::kInvalidArgument,
                  "DeepSeek-V4.1 forward: the hidden trunk is for the V4 MTP drafter; V4.1 "
                  "drafts with DSpark (dspark_draft), whose main keys every forward writes");
    }
    caches->wait_all_imports(*backend);
    const Tensor ngram = engram_ngrams(*backend, rows, *config.v41, previous_tokens);
    const YocoRows yoco = plan_yoco_rows(rows, plan, *config.v41, mode, *backend);
    return {v41_model->forward(plan, ngram, *caches, yoco),
            yoco.drops ? yoco.next_positions : plan.next_positions};
  }
  return {model->forward(plan, *caches, hidden), plan.next_positions};
}

ModelInstance::MtpStep ModelInstance::mtp_forward(RowSpan rows, size_t max_blocks, LogitsMode mode,
                                                  const Tensor& previous_tokens,
                                                  const Tensor& hidden, int step) {
  if (mtp == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                "MTP forward: the checkpoint has no mtp.* block (or it was not loaded)");
  }
  const BatchPlan plan =
      build_batch_plan(rows, config, caches->shape(), *backend, mode, max_blocks);
  take_carried_tokens(*backend, rows, plan, previous_tokens);
  caches->wait_all_imports(*backend);  // the MTP block's caches
  MtpOutput out = mtp->forward(plan, hidden, *caches, step);
  return {out.logits, out.hidden, plan.next_positions};
}

ModelInstance::Output ModelInstance::forward_with_mtp(RowSpan rows, size_t max_blocks,
                                                      LogitsMode mode,
                                                      const Tensor& previous_tokens,
                                                      LogitsRowInputs* at_logits,
                                                      const PreviousStep* previous) {
  if (mtp == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                "forward with MTP: the checkpoint has no mtp.* block (or it was not loaded)");
  }
  const Tensor& ring = caches->layer(config.num_hidden_layers).trunk_ring;
  const int64_t backtrack = ring.size(1);
  const int64_t width = ring.size(2);
  // The block's rows, and where each of its token rows takes its trunk: this call's trunk row, or
  // (a row's first position, when it is start - 1) the ring's.
  std::vector<ForwardRow> follow;
  std::vector<int32_t> trunk_rows, ring_rows, ring_dest;
  // Rows moved by the previous step's accepted drafts (ForwardRow::shift_from): the trunk at
  // start - 1 is that step's at the logits row the row's first token was sampled at, which only
  // the device knows (its carried index, after the move); the ring's slot is not known either.
  std::vector<int32_t> moved_first_rows, moved_dest;
  bool moves = false;
  int32_t t = 0;
  for (const ForwardRow& r : rows) {
    ForwardRow f = r;
    f.num_logits = 0;
    moves = moves || r.shift_from >= 0;
    // A replayed hit's first row (start_pos == swa_valid_start) has no trunk before it either:
    // the slot was zeroed, and its window starts there.
    if (r.shift_from >= 0) {
      if (r.token_from_previous < 0 || r.start_pos == 0) {
        throw Error(ErrorCode::kInvalidArgument,
                    "forward with MTP: a row that moves by the previous step's accepted drafts "
                    "must carry its first token from that step (token_from_previous) and start "
                    "past position 0");
      }
      f.start_pos -= 1;
      moved_first_rows.push_back(t);
      moved_dest.push_back(static_cast<int32_t>(trunk_rows.size()));
      trunk_rows.push_back(0);  // replaced by the previous step's row
    } else if (r.start_pos > 0 && r.start_pos > r.swa_valid_start) {
      f.start_pos -= 1;
      ring_rows.push_back(static_cast<int32_t>(r.slot * backtrack + f.start_pos % backtrack));
      ring_dest.push_back(static_cast<int32_t>(trunk_rows.size()));
      trunk_rows.push_back(0);  // replaced by the ring's row
    } else {
      // Position 0 (or a replay's start) has no predecessor: the block starts at the row's
      // second token.
      f.num_tokens -= 1;
      f.tokens = r.tokens.subspan(1);
    }
    for (int32_t i = 0; i + 1 < r.num_tokens; ++i) trunk_rows.push_back(t + i);
    t += r.num_tokens;
    if (f.num_tokens > 0) follow.push_back(f);
  }
  Backend& be = *backend;
  auto upload_i32 = [&](const std::vector<int32_t>& v) {
    return be.upload(Tensor::from_vector(v, {static_cast<int64_t>(v.size())}), DType::kI32);
  };
  // The MTP blocks' caches (this ring among them) once their KV tier imports are in; the main
  // layers' are waited for layer by layer in the forward.
  for (int li = config.num_hidden_layers; li < caches->num_layers(); ++li)
    caches->wait_layer(be, li);
  // Read before the forward overwrites the ring (a chunk of more than `backtrack` tokens would).
  Tensor before;
  if (!ring_rows.empty()) before = be.gather_rows(ring.reshape({-1, width}), upload_i32(ring_rows));

  if (moves &&
      (previous == nullptr || !previous->accepted.defined() || !previous->trunk.defined())) {
    throw Error(ErrorCode::kInvalidArgument,
                "forward with MTP: a row moves by the previous step's accepted drafts, but no "
                "previous step's accepted counts and trunk were given");
  }
  const BatchPlan plan = build_batch_plan(rows, config, caches->shape(), be, mode, max_blocks);
  if (moves) shift_carried_rows(be, rows, plan, previous->accepted);
  take_carried_tokens(be, rows, plan, previous_tokens);
  Tensor hidden;
  const Tensor logits = model->forward(plan, *caches, &hidden);
  be.ring_write(ring, hidden.reshape({t, width}), plan.layout);
  if (at_logits != nullptr && logits.defined()) {
    const bool every_row = !plan.logit_rows.defined();
    at_logits->trunk = every_row ? hidden : be.gather_rows(hidden, plan.logit_rows);
    at_logits->tokens =
        every_row ? plan.layout.token_ids : be.gather_rows(plan.layout.token_ids, plan.logit_rows);
  }
  if (!follow.empty()) {
    const Tensor x = be.gather_rows(hidden, upload_i32(trunk_rows));
    if (before.defined()) be.scatter_rows(x.reshape({-1, width}), before, upload_i32(ring_dest));
    if (!moved_dest.empty()) {
      // The moved carried index of each such row's first token is the previous step's logits row
      // it was sampled at (region 0 of the carried outputs, ForwardRow::carried_tokens).
      const Tensor at = be.gather_rows(plan.carry_remap, upload_i32(moved_first_rows));
      const Tensor trunk = be.gather_rows(previous->trunk, at);
      be.scatter_rows(x.reshape({-1, width}), trunk.reshape({-1, width}), upload_i32(moved_dest));
    }
    const BatchPlan next =
        build_batch_plan(follow, config, caches->shape(), be, LogitsMode::kLast, max_blocks);
    if (moves) shift_carried_rows(be, follow, next, previous->accepted);
    take_carried_tokens(be, follow, next, previous_tokens);
    mtp->forward(next, x, *caches, 0);
  }
  return {logits, plan.next_positions};
}

Tensor ModelInstance::mtp_ring_trunk(RowSpan rows) {
  caches->wait_all_imports(*backend);  // the ring may have come with a KV tier hit
  const Tensor& ring = caches->layer(config.num_hidden_layers).trunk_ring;
  const int64_t backtrack = ring.size(1);
  std::vector<int32_t> at;
  for (const ForwardRow& r : rows)
    at.push_back(static_cast<int32_t>(r.slot * backtrack + r.start_pos % backtrack));
  const Tensor index =
      backend->upload(Tensor::from_vector(at, {static_cast<int64_t>(at.size())}), DType::kI32);
  return backend->gather_rows(ring.reshape({-1, config.hc_mult, config.hidden_size}), index);
}

std::vector<Tensor> ModelInstance::mtp_draft(RowSpan rows, size_t max_blocks, const Tensor& hidden,
                                             int num_drafts, std::vector<Tensor>* logits,
                                             std::vector<Tensor>* logprobs) {
  // With log-probabilities asked for, a greedy sample gives the argmax (lowest id on ties, as
  // argmax) and its log-probability in one pass over each row.
  SamplingBatch greedy;
  if (logprobs != nullptr)
    greedy = greedy_sampling_batch(*backend, static_cast<int64_t>(rows.size()));
  auto draft = [&](const Tensor& step_logits) {
    if (logits != nullptr) logits->push_back(step_logits);
    if (logprobs == nullptr) return backend->argmax(step_logits);
    SampleResult r = backend->sample(step_logits, greedy);
    logprobs->push_back(r.logprobs);
    return r.tokens;
  };
  std::vector<Tensor> tokens;
  MtpStep step = mtp_forward(rows, max_blocks, LogitsMode::kLast, Tensor(), hidden, 0);
  tokens.push_back(draft(step.logits));
  // Later steps: one row per sequence at the next position, its token the previous draft (taken
  // on the device), its hidden the previous step's trunk.
  static constexpr int32_t kPlaceholder[1] = {0};
  std::vector<ForwardRow> next(rows.size());
  for (int j = 1; j < num_drafts; ++j) {
    for (size_t s = 0; s < rows.size(); ++s) {
      const ForwardRow& r = rows[s];
      ForwardRow& n = next[s];
      n.slot = r.slot;
      n.start_pos = r.start_pos + r.num_tokens - 1 + j;
      n.num_tokens = 1;
      n.tokens = std::span<const int32_t>(kPlaceholder, 1);
      n.block_table = r.block_table;
      n.token_from_previous = static_cast<int32_t>(s);
    }
    max_blocks = validate_rows(next, config, caches->shape(), /*check_tokens=*/false);
    step = mtp_forward(next, max_blocks, LogitsMode::kLast, tokens.back(), step.hidden, j);
    tokens.push_back(draft(step.logits));
  }
  return tokens;
}

DSparkOutput ModelInstance::dspark_draft(RowSpan rows, const Tensor& previous_tokens) {
  if (dspark == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                "DSpark draft: the checkpoint has no DSpark drafter (mtp.* tensors), or it was "
                "not loaded");
  }
  const V41TextConfig& c = *config.v41;
  const int32_t b = c.dspark_block_size;
  // Each sequence's block [golden, noise...] at ap + 1, and one attention row per query at
  // ap + B in the same slot (DSparkDrafter).
  std::vector<int32_t> block_tokens;
  block_tokens.reserve(rows.size() * static_cast<size_t>(b));
  for (const ForwardRow& r : rows) {
    if (r.num_tokens != 1) {
      throw Error(ErrorCode::kInvalidArgument,
                  "DSpark draft: each row holds the golden token only, got a row of " +
                      std::to_string(r.num_tokens) + " tokens");
    }
    block_tokens.push_back(r.tokens[0]);
    block_tokens.insert(block_tokens.end(), static_cast<size_t>(b - 1), c.dspark_noise_token_id);
  }
  std::vector<ForwardRow> block(rows.size()), attend;
  attend.reserve(rows.size() * static_cast<size_t>(b));
  for (size_t i = 0; i < rows.size(); ++i) {
    ForwardRow& f = block[i];
    f = rows[i];
    f.num_tokens = b;
    f.tokens = std::span<const int32_t>(block_tokens)
                   .subspan(i * static_cast<size_t>(b), static_cast<size_t>(b));
    f.num_logits = 0;
    for (int32_t j = 0; j < b; ++j) {
      ForwardRow a;
      a.slot = f.slot;
      a.start_pos = f.start_pos + b - 1;
      a.num_tokens = 1;
      a.tokens = f.tokens.subspan(static_cast<size_t>(b - 1), 1);
      a.block_table = f.block_table;
      a.num_logits = 0;
      attend.push_back(a);
    }
  }
  const size_t max_blocks = validate_rows(block, config, caches->shape(), /*check_tokens=*/false);
  Backend& be = *backend;
  caches->wait_all_imports(be);
  const BatchPlan plan =
      build_batch_plan(block, config, caches->shape(), be, LogitsMode::kLast, max_blocks);
  take_carried_tokens(be, block, plan, previous_tokens);
  const BatchPlan attend_plan =
      build_batch_plan(attend, config, caches->shape(), be, LogitsMode::kLast, max_blocks);
  return dspark->draft(plan, attend_plan, *caches);
}

namespace {

std::string gib(int64_t bytes) {
  const double g = static_cast<double>(bytes) / static_cast<double>(int64_t{1} << 30);
  std::string s = std::to_string(g);
  return s.substr(0, s.find('.') + 3) + " GiB";
}

// The number of paged blocks that fit in device memory next to the loaded weights (KvSizing);
// fills m.kv_sizing. Throws Error(kIo) naming the numbers when fewer than 2 blocks fit.
int blocks_from_memory(ModelInstance& m, const CacheShape& shape, const KvSizing& sizing,
                       int num_mtp_layers) {
  // A one-block probe gives this config's bytes per block and per state slot.
  CacheShape probe = shape;
  probe.num_blocks = 1;
  probe.num_scratch_slots = 1;
  int64_t per_block = 0;
  int64_t per_slot = 0;
  {
    const ModelCaches caches(m.config, probe, *m.backend, num_mtp_layers);
    per_block = caches.bytes_per_block();
    per_slot = caches.bytes_per_state_slot();
  }
  const DeviceMemory memory = m.backend->memory_info();
  if (memory.total_bytes == 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "num_kv_blocks 0 sizes the KV cache from device memory, which the " +
                    m.backend->name() + " backend does not report; set num_kv_blocks");
  }
  KvSizingReport& r = m.kv_sizing;
  r.memory_after_weights = memory;
  r.activation_reserve_bytes = activation_reserve_bytes(m.config, sizing.max_batch_tokens,
                                                        sizing.max_seqs, sizing.speculative);
  r.state_bytes = per_slot * (shape.num_state_slots + 1);
  const int64_t blocks = kv_blocks_from_memory(
      memory, sizing.gpu_memory_utilization, r.activation_reserve_bytes, r.state_bytes, per_block);
  if (blocks < 2) {
    throw Error(ErrorCode::kIo,
                "not enough device memory for the KV cache: " + gib(memory.total_bytes) +
                    " in all, " + gib(memory.total_bytes - memory.free_bytes) +
                    " in use with the weights loaded; gpu_memory_utilization " +
                    std::to_string(sizing.gpu_memory_utilization).substr(0, 4) + " leaves " +
                    gib(static_cast<int64_t>(sizing.gpu_memory_utilization *
                                             static_cast<double>(memory.total_bytes)) -
                        (memory.total_bytes - memory.free_bytes)) +
                    ", and the activation reserve (" + gib(r.activation_reserve_bytes) +
                    ", max_num_batched_tokens " + std::to_string(sizing.max_batch_tokens) +
                    ") and state slots (" + gib(r.state_bytes) + ") need more than that plus " +
                    "two blocks of " + std::to_string(per_block) +
                    " bytes: raise gpu_memory_utilization or lower max_num_batched_tokens / "
                    "max_num_seqs");
  }
  return static_cast<int>(std::min<int64_t>(blocks, std::numeric_limits<int32_t>::max() / 2));
}

// Creates the caches (with the graphs' scratch slot when graphs are on) and the graphs.
void finish_instance(ModelInstance& m, CacheShape shape, int decode_graph_max_batch,
                     ModelWeights weights) {
  const int max_batch =
      resolve_decode_graph_max_batch(decode_graph_max_batch, *m.backend, shape.num_state_slots);
  shape.num_scratch_slots = max_batch > 0 ? 1 : 0;
  const int num_mtp = static_cast<int>(weights.mtp.size());
  m.caches = std::make_unique<ModelCaches>(m.config, shape, *m.backend, num_mtp);
  m.model = std::make_unique<DeepseekV4Model>(m.config, std::move(weights), *m.backend);
  if (num_mtp > 0) m.mtp = std::make_unique<MtpDrafter>(*m.model);
  if (max_batch > 0) {
    m.graphs = std::make_unique<DecodeGraphs>(m.config, *m.model, *m.caches, *m.backend, max_batch,
                                              /*scratch_slot=*/shape.num_state_slots);
  }
}

// The DeepSeek-V4.1 instance (docs/model.md#deepseek-v41-text-model) of `checkpoint`, or of random
// weights when it is null: decode graphs as V4's (finish_instance), without expert parallelism;
// KV in f32, bf16 or V4.1's FP8/FP4 formats ("fp8"). With `load_mtp` the DSpark drafter loads too
// (the checkpoint's mtp.*, or random weights).
void make_v41(ModelInstance& m, const Checkpoint* checkpoint, const CacheShape& shape,
              int decode_graph_max_batch, const std::string& activation_quant,
              const std::string& kv_cache_dtype, const std::function<void(int, int)>& progress,
              const KvSizing& sizing, const ModelInstance::RankTarget& rank, uint64_t seed,
              DType stored, bool load_mtp) {
  if (!rank.expert_slots.empty()) {
    throw Error(ErrorCode::kUnsupported,
                m.config.source + ": expert parallelism is not available for DeepSeek-V4.1 yet");
  }
  WeightLoadOptions options;
  options.quantize_activations = resolve_activation_quant(activation_quant, *m.backend);
  options.progress = progress;
  options.load_mtp = load_mtp;
  CacheShape sized = shape;
  // "auto" is f32 on the CPU (the oracle) and, on a device, V4.1's shipped FP8 / FP4 formats
  // ("fp8", v41_kv_dtypes) whatever the weights' dtype, as DeepInfer stores V4.1's caches.
  sized.kv_dtype =
      resolve_kv_cache_dtype(kv_cache_dtype, m.backend->device_kind(), auto_kv_is_fp8(m.config));
  V41Weights weights =
      checkpoint != nullptr
          ? load_v41_weights(*checkpoint, *m.config.v41, m.config, *m.backend, options)
          : random_v41_weights(*m.config.v41, m.config, *m.backend, seed, stored, options);
  m.notes = weights.notes;
  if (checkpoint == nullptr) {
    m.notes.push_back("random weights (load_format dummy): outputs are meaningless");
  }
  const auto num_dspark = static_cast<int>(weights.dspark.blocks.size());
  if (sized.num_blocks == 0) sized.num_blocks = blocks_from_memory(m, sized, sizing, num_dspark);
  const int max_batch =
      resolve_decode_graph_max_batch(decode_graph_max_batch, *m.backend, sized.num_state_slots);
  sized.num_scratch_slots = max_batch > 0 ? 1 : 0;  // the graphs' padding rows
  m.caches = std::make_unique<ModelCaches>(m.config, sized, *m.backend, num_dspark);
  m.v41_model = std::make_unique<DeepseekV41Model>(*m.config.v41, std::move(weights), *m.backend);
  if (num_dspark > 0) m.dspark = std::make_unique<DSparkDrafter>(*m.v41_model, sized);
  if (max_batch > 0) {
    m.graphs = std::make_unique<DecodeGraphs>(m.config, *m.v41_model, *m.caches, *m.backend,
                                              max_batch, /*scratch_slot=*/sized.num_state_slots);
  }
}

}  // namespace

bool resolve_activation_quant(const std::string& mode, const Backend& backend) {
  if (mode == "fp8") return true;
  if (mode == "none") return false;
  if (mode == "auto") return backend.device_kind() != DeviceKind::kCpu;
  throw Error(ErrorCode::kInvalidArgument,
              "activation_quant must be \"auto\", \"fp8\" or \"none\", got \"" + mode + "\"");
}

std::unique_ptr<ModelInstance> ModelInstance::load(
    const std::string& checkpoint_dir, const ModelConfig& config, const CacheShape& shape,
    const std::string& device, int num_threads, int decode_graph_max_batch,
    const std::string& activation_quant, const std::string& kv_cache_dtype,
    const std::function<void(int, int)>& progress, const KvSizing& sizing, bool load_mtp,
    RankTarget rank) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(checkpoint_dir)) {
    throw Error(ErrorCode::kNotFound, checkpoint_dir + ": checkpoint directory does not exist");
  }
  auto m = std::make_unique<ModelInstance>();
  m->config = config;
  Checkpoint checkpoint = Checkpoint::open(checkpoint_dir);
  m->backend = rank.backend ? std::move(rank.backend) : make_backend(device, num_threads);
  if (config.v41 != nullptr) {
    make_v41(*m, &checkpoint, shape, decode_graph_max_batch, activation_quant, kv_cache_dtype,
             progress, sizing, rank, /*seed=*/0, DType::kBF16, load_mtp);
    return m;
  }
  WeightLoadOptions options;
  options.quantize_activations = resolve_activation_quant(activation_quant, *m->backend);
  options.progress = progress;
  options.load_mtp = load_mtp;
  options.expert_slots = std::move(rank.expert_slots);
  CacheShape sized = shape;
  sized.kv_dtype =
      resolve_kv_cache_dtype(kv_cache_dtype, m->backend->device_kind(), auto_kv_is_fp8(config));
  ModelWeights weights = load_model_weights(checkpoint, m->config, *m->backend, options);
  m->notes = weights.notes;
  // The weights are on the device now: with 0 blocks asked for, what is left sizes the paged KV.
  if (sized.num_blocks == 0) {
    sized.num_blocks = blocks_from_memory(*m, sized, sizing, static_cast<int>(weights.mtp.size()));
  }
  finish_instance(*m, sized, decode_graph_max_batch, std::move(weights));
  return m;
}

std::unique_ptr<ModelInstance> ModelInstance::random(
    const ModelConfig& config, const CacheShape& shape, const std::string& device, int num_threads,
    uint64_t seed, DType stored, int decode_graph_max_batch, const std::string& activation_quant,
    const std::string& kv_cache_dtype, const KvSizing& sizing, RankTarget rank, bool load_mtp) {
  auto m = std::make_unique<ModelInstance>();
  m->config = config;
  m->backend = rank.backend ? std::move(rank.backend) : make_backend(device, num_threads);
  if (config.v41 != nullptr) {
    make_v41(*m, nullptr, shape, decode_graph_max_batch, activation_quant, kv_cache_dtype, {},
             sizing, rank, seed, stored, load_mtp);
    m->backend->synchronize();
    return m;
  }
  WeightLoadOptions options;
  options.quantize_activations = resolve_activation_quant(activation_quant, *m->backend);
  options.expert_slots = std::move(rank.expert_slots);
  options.load_mtp = load_mtp;
  CacheShape cache_shape = shape;
  cache_shape.kv_dtype =
      resolve_kv_cache_dtype(kv_cache_dtype, m->backend->device_kind(), auto_kv_is_fp8(config));
  ModelWeights weights = random_model_weights(m->config, *m->backend, seed, stored, options);
  m->notes.push_back("random weights (load_format dummy): outputs are meaningless");
  // As in load: with 0 blocks asked for, the memory the weights leave sizes the paged KV.
  if (cache_shape.num_blocks == 0) {
    cache_shape.num_blocks =
        blocks_from_memory(*m, cache_shape, sizing, static_cast<int>(weights.mtp.size()));
  }
  finish_instance(*m, cache_shape, decode_graph_max_batch, std::move(weights));
  m->backend->synchronize();
  return m;
}

}  // namespace deepinfer
