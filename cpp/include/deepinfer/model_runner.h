// ModelRunner: a loaded DeepSeek-V4 checkpoint, its KV caches and one backend; runs forward calls
// over a varlen batch of sequence chunks (one-shot prefill, chunked prefill and decode mix freely).
//
// The caller owns cache placement: each sequence names its state slot and its block table (the
// engine's BlockPool/StatePool decide them; tests pick them by hand). Thread-safety: a ModelRunner
// is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/config.h"
#include "deepinfer/tensor.h"

namespace deepinfer {

struct RunnerOptions {
  int num_blocks = 64;      // paged KV blocks of kBlockSize tokens
  int num_state_slots = 8;  // sequences that can hold state at once
  int max_backtrack = 6;    // ring slack for speculative rollback
  int num_threads = 0;      // CPU backend worker threads (0 = hardware concurrency)
  // "auto" (the GPU when this build has the CUDA backend and one is present, else the CPU),
  // "cpu", "cuda" or "cuda:N".
  std::string device = "auto";
  // Largest decode batch (one token per sequence) replayed as a recorded graph: -1 picks the
  // backend's default (256 on CUDA, off on the CPU), 0 is off (every call runs eagerly).
  int decode_graph_max_batch = -1;
  // Activations in front of quantized weights: "auto", "fp8" or "none" (PlacementConfig).
  std::string activation_quant = "auto";
  // KV cache storage: "auto", "f32", "bf16" or "fp8" (CacheConfig::kv_cache_dtype).
  std::string kv_cache_dtype = "auto";
  // DeepSeek-V4.1's YOCO prefill truncation (docs/model.md#yoco-prefill-truncation): "off"
  // (exact), "mask" or "compact", keeping the consumer layers' work in the last
  // yoco_keep_tokens positions of a prefill (>= sliding_window + max_backtrack).
  std::string yoco_prefill_truncation = "off";
  int yoco_keep_tokens = 140;
  // Where DeepSeek-V4.1's Engram tables live: "auto", "device" or "host" (PlacementConfig).
  std::string engram_table_memory = "auto";
};

// The tokens of one sequence processed by a forward call: positions start_pos ..
// start_pos + tokens.size() - 1. Everything before start_pos must already be in the caches of
// `slot` / `block_table` (written by earlier calls for the same sequence).
struct SequenceChunk {
  int32_t slot = 0;
  int64_t start_pos = 0;
  std::vector<int32_t> tokens;
  std::vector<int32_t> block_table;  // physical block of each logical 128-token block
  // The end of the prefill this chunk belongs to (0: the chunk's end): the chunks of one prefill
  // under YOCO truncation name the same end. Logits of rows the truncation dropped are NaN.
  int64_t prompt_end = 0;
  // A replayed KV-tier hit (kv_window_state bounded_replay,
  // docs/kv_store.md#window-state-on-a-hit): every sliding window sees only keys at positions >=
  // swa_valid_start, and the compressed entries of windows closing at or before replay_end are kept
  // in the blocks, not rewritten.
  int64_t swa_valid_start = 0;
  int64_t replay_end = 0;
};

enum class LogitsMode { kAll, kLast };

// Decode graphs used so far (RunnerOptions::decode_graph_max_batch).
struct DecodeGraphStats {
  int num_recorded = 0;           // (bucket, tokens per row, block-table width) shapes recorded
  uint64_t num_calls = 0;         // forward calls served by a graph (the recording call included)
  uint64_t num_verify_calls = 0;  // those of them with a speculative verify row
};

// forward() with the hidden state the MTP drafter reads.
struct HiddenForward {
  Tensor logits;  // as forward()
  Tensor hidden;  // host f32 [total tokens, hc_mult, hidden_size]: the HC trunk after the last
                  // layer, before the head
};

// One pass of the checkpoint's MTP block (docs/model.md#mtp-block).
struct MtpForward {
  Tensor logits;  // host f32 [rows, vocab]: every token (kAll) or each sequence's last (kLast)
  Tensor hidden;  // host f32 [rows, hc_mult, hidden_size]: the block's HC trunk at those rows
};

// Greedy drafts of the MTP block.
struct MtpDraft {
  Tensor tokens;  // host i32 [num sequences, num_drafts]
  Tensor logits;  // host f32 [num sequences, num_drafts, vocab]: the logits each was taken from
};

// One draft step of DeepSeek-V4.1's DSpark drafter (docs/model.md#dspark-drafter).
struct DSparkDraft {
  Tensor tokens;       // host i32 [num sequences, dspark_block_size]: draft i for ap + 2 + i
  Tensor confidences;  // host f32 [num sequences, dspark_block_size]: sigmoid of the head's logit
  Tensor logits;       // host f32 [num sequences, dspark_block_size, vocab] (Markov term included)
};

class ModelRunner {
 public:
  // Reads <dir>/config.json and the safetensors weights, creates the backend and the caches. A
  // config.json of model_type "deepseek_v41" runs the DeepSeek-V4.1 text graph
  // (docs/model.md#deepseek-v41-text-model); its Engram layers need the tokens before each chunk,
  // which the runner keeps per state slot, so a chunk must start at or before the end of what its
  // slot was fed.
  static std::unique_ptr<ModelRunner> load(const std::string& checkpoint_dir,
                                           const RunnerOptions& options = {});
  // The model described by `config_json` (a config.json path) with random weights whose matrices
  // are bf16 (or f32 with `bf16 = false`): for benchmarks at real widths without a checkpoint.
  static std::unique_ptr<ModelRunner> random(const std::string& config_json,
                                             const RunnerOptions& options, uint64_t seed,
                                             bool bf16 = true);
  virtual ~ModelRunner() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const RunnerOptions& options() const = 0;  // device: the one in use ("auto" resolved)
  virtual Backend& backend() = 0;
  // Logits (host, f32): [total tokens, vocab] for kAll, [num sequences, vocab] for kLast.
  // Throws Error(kInvalidArgument) naming the sequence and field for a malformed batch.
  virtual Tensor forward(const std::vector<SequenceChunk>& batch, LogitsMode mode) = 0;
  // Greedy next tokens (host [num sequences] i32): the argmax of each sequence's last logits row,
  // taken on the device, so only the token ids travel to the host (forward copies [B, vocab]).
  // kAll: the argmax of every token row ([total tokens] i32), as a speculative verify step scores
  // every position of its rows.
  virtual Tensor greedy(const std::vector<SequenceChunk>& batch,
                        LogitsMode mode = LogitsMode::kLast) = 0;
  virtual DecodeGraphStats decode_graph_stats() const = 0;
  // DeepSeek-V4.1: makes `tokens` state slot `slot`'s history (what its Engram n-grams read
  // before a chunk) without running them, so the next chunk may start at any position up to
  // tokens.size(). The caches keep whatever earlier calls wrote: a benchmark decodes at a long
  // context this way without prefilling it (the cost of a step depends on the lengths, not the
  // cached values). Throws Error(kInvalidArgument) naming the slot or the token for a slot out of
  // range or a token id outside the vocabulary, and for a DeepSeek-V4 model (it keeps no history).
  virtual void set_history(int slot, const std::vector<int32_t>& tokens) = 0;
  // What loading left out on purpose ("skipped 31 mtp.* tensors ..."), for the user.
  virtual std::vector<std::string> load_notes() const = 0;

  // ---- speculative drafting with the checkpoint's MTP block (docs/model.md#mtp-block) ----------
  // MTP blocks loaded (0: the checkpoint has none; the calls below then throw kInvalidArgument).
  virtual int num_mtp_blocks() const = 0;
  // forward(), also returning the trunk the MTP block reads at every token (runs eagerly).
  virtual HiddenForward forward_hidden(const std::vector<SequenceChunk>& batch,
                                       LogitsMode mode) = 0;
  // One pass of MTP block `step % num_mtp_blocks()` over `batch`, whose chunks hold, for each
  // position p, the token at p + 1; `hidden` (host f32 [total tokens, hc_mult, hidden_size]) is
  // the trunk at the same positions: forward_hidden's (step 0), or the previous pass's
  // MtpForward::hidden when drafting further ahead. Row p's logits predict the token at p + 2.
  // The block's own caches in each chunk's slot and blocks are read and written like the main
  // layers' (a chunk's earlier positions must have been passed through the block before).
  virtual MtpForward mtp_forward(const std::vector<SequenceChunk>& batch, const Tensor& hidden,
                                 LogitsMode mode, int step = 0) = 0;
  // Greedy drafting on the device: mtp_forward over `batch` (step 0) drafts each sequence's
  // first token from its last row; each of the num_drafts - 1 further steps runs one token per
  // sequence, the previous draft at the next position, on the previous step's trunk.
  virtual MtpDraft mtp_draft(const std::vector<SequenceChunk>& batch, const Tensor& hidden,
                             int num_drafts) = 0;

  // ---- DeepSeek-V4.1's DSpark drafter (docs/model.md#dspark-drafter) ---------------------------
  // DSpark blocks loaded (0: none; dspark_draft then throws kInvalidArgument). Every forward of a
  // model with them writes their main keys.
  virtual int num_dspark_blocks() const = 0;
  // One draft step per chunk: its single token is the golden token (the target's sample) at
  // start_pos = ap + 1, ap being the last position its slot was fed. Writes the draft keys into
  // the blocks' rings at ap + 1 .. ap + dspark_block_size (the next forward overwrites them).
  virtual DSparkDraft dspark_draft(const std::vector<SequenceChunk>& batch) = 0;
};

}  // namespace deepinfer
