// The Backend interface: every op the DeepSeek-V4 graph needs, on one device, in stream order.
//
// Execution model (the same for CPU, CUDA and Ascend):
//  - Every op call *enqueues* work on the backend's single compute stream and returns at once.
//    Output tensors are allocated at call time (their memory is valid immediately), their
//    contents are valid only for work enqueued later on the same stream, or on the host after an
//    Event recorded behind the op has completed.
//  - The model graph never reads device memory on the host between ops; everything a step needs
//    (positions, block tables, entry lists) is planned on the host and uploaded with `upload`.
//    `to_host` (and Event::wait / synchronize) are the only calls that wait for the stream.
//  - Tensors passed to an op stay alive until the op has run (the backend keeps references).
//
// Math: the CPU backend is the reference and computes in fp32; a device op is correct when it
// matches the CPU op on the same inputs.
//
// The ops' argument and result structs (HcParams, BatchLayout, SamplingBatch, AttentionSpec, ...)
// are in deepinfer/backend_args.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "deepinfer/backend_args.h"
#include "deepinfer/backend_handles.h"
#include "deepinfer/tensor.h"
#include "deepinfer/weight.h"

namespace deepinfer {

// The op interface every backend implements, as a non-virtual front: each public op checks its
// arguments' metadata (dtype, shape, contiguity, device; backend/op_checks.h, written once for
// every backend) on the calling thread and then calls the backend's protected `*_impl`. An
// argument error is Error(kInvalidArgument) "<op>: argument <arg> must be ...", the same on
// every backend. Contents (ids, positions, block tables) are the implementation's business: the
// CPU reference checks them on its stream, a device backend cannot without a host sync.
//
// Tensors an op takes live on this backend's device (`t.device().kind == device_kind()`) and are
// contiguous, except where an op says otherwise (the host side of transfers; to_host and
// upload_weight take any strides). A dense matrix weight (moe_route's gate, the embedding table,
// a dense MatrixWeight) is f32 or weight_dtype(DType::kBF16); every other float tensor is f32.
// A quantized MatrixWeight (linear, grouped_linear, the experts) is in a format
// upload_matrix_weight produced on this backend.
//
// KV caches (the SWA ring of ring_write/attention, the entry caches of scatter_rows/attention,
// the index cache of indexer_topk) may be stored as f32, bf16 or byte records; rows of C
// channels go in as f32 and come out decoded. Their byte layout is defined once in
// cpp/src/tensor/kv_record.h (docs/model.md#kv-cache-dtypes): bf16 [.., C]; a kU8 cache holds
// V4's fp8 main-KV record of kv_record::main_record_bytes(C, rope_dim) bytes when rope_dim > 0,
// V4's fp8 index-key record of C + 4 bytes when rope_dim == 0; a kF8E4M3 cache holds V4.1's FP8
// record (C e4m3 + a UE8M0 scale per 32 channels), a kE2M1x2 cache V4.1's FP4 records (the main
// record, e4m3 scales per 16, when rope_dim > 0; the index-key record, UE8M0 scales per 32, when
// rope_dim == 0); the last dimension of a record cache counts bytes. Attention reads this call's
// keys `kv` through the SWA ring's format too (quantized and decoded), so a key reads the same
// whether it comes from this call or from the ring. A backend without kernels for a cache dtype
// (supports_kv_cache_dtype) fails with Error(kUnsupported) before enqueuing anything.
class Backend {
 public:
  virtual ~Backend() = default;

  virtual DeviceKind device_kind() const = 0;
  virtual std::string name() const = 0;
  // The dtype a matrix weight (see above) is kept in when the checkpoint stores it as `stored`.
  // The CPU reference keeps everything in f32; a device backend keeps bf16 checkpoints in bf16
  // for its tensor cores. Vectors (norm weights, biases, sinks, mHC parameters, position biases)
  // are always f32.
  virtual DType weight_dtype(DType stored) const = 0;
  // Whether the KV cache ops take caches of `dtype` (kF32, kBF16, kU8 V4 fp8 records, kF8E4M3
  // V4.1 FP8 records or kE2M1x2 V4.1 FP4 records). The CPU reference takes them all; the default
  // is f32 only.
  virtual bool supports_kv_cache_dtype(DType dtype) const { return dtype == DType::kF32; }
  // Whether the indexer ops read index caches of `dtype`; the default: supports_kv_cache_dtype.
  virtual bool supports_index_cache_dtype(DType dtype) const {
    return supports_kv_cache_dtype(dtype);
  }
  // Whether attention under `spec` over caches of kv_dtype (the ring's and the entries') with
  // heads of head_dim channels reads q rounded to bf16 (a tensor-core kernel under
  // spec.bf16_math), so that q may come in bf16 (rms_norm_rope's bf16_output) at no cost in
  // precision. The default, and the CPU reference: no.
  virtual bool attention_rounds_query(int64_t /*head_dim*/, DType /*kv_dtype*/,
                                      const AttentionSpec& /*spec*/) const {
    return false;
  }
  // Whether upload_weight_mapped works (kernels read host memory in place). The CPU backend:
  // trivially; CUDA: through pinned, mapped host memory. The default: no.
  virtual bool supports_mapped_host_weights() const { return false; }
  // While forbidden, the backend's own host synchronisations (to_host, synchronize) throw
  // Error(kInternal): the model graph and sampling are launched with it forbidden, so a hidden
  // sync that would stall the pipeline fails loudly instead. See HostSyncForbidden. (Event::wait
  // is not guarded: events are waited for by the engine's commit, outside any launch.)
  // Returns the previous setting.
  bool set_host_sync_forbidden(bool forbidden);
  // The device's memory now, after the backend hands its cached free blocks back (waits for the
  // stream). The default, for host backends, is unknown (zeros).
  virtual DeviceMemory memory_info() { return {}; }
  // Makes this backend's device the calling thread's current one. A thread that did not make
  // the backend calls it before using it (the ranks of a group run on their own threads, several
  // GPUs in one process). Nothing to do for host backends.
  virtual void make_current() {}

  // ---- memory and synchronisation ------------------------------------------------------------
  // Uninitialised device tensor (zeroed on the CPU backend).
  virtual Tensor empty(const Shape& shape, DType dtype) = 0;
  virtual Tensor zeros(const Shape& shape, DType dtype) = 0;
  // A device tensor of `dtype` holding a copy of `host` (a host tensor, any strides) converted;
  // `host` may be reused as soon as this returns (per-step metadata goes through here). Converts
  // between float dtypes and between i32 and i64; other conversions are Error(kUnsupported).
  Tensor upload(const Tensor& host, DType dtype);
  // Like upload, for immutable data (weights): when the device is the host and no conversion is
  // needed the result aliases `host`, so weights mmap-ed from a checkpoint are not copied.
  Tensor upload_weight(const Tensor& host, DType dtype);
  // Like upload_weight without a conversion, for a weight that stays in host memory and that the
  // backend's kernels read in place, over the bus (a table too big for device memory that ops
  // touch sparsely: V4.1's Engram tables). The result has `host`'s dtype and shape and counts as
  // a tensor of this backend's device (ops take it), but its bytes are host memory, freed when its
  // last view dies. CPU: `host` itself; CUDA: a copy in pinned host memory mapped into the device
  // (cudaHostAllocMapped). Error(kUnsupported) without supports_mapped_host_weights(), Error(kIo)
  // naming the bytes when the memory cannot be pinned.
  Tensor upload_weight_mapped(const Tensor& host);
  // A matrix weight of a checkpoint (host tensors: values and scales as shipped, see weight.h)
  // in the format this backend computes with: the CPU reference dequantizes to f32 exactly; the
  // CUDA backend keeps the shipped bytes. act_group is kept. Checks the scales' shape against
  // the values and blocks (Error(kInvalidArgument) naming what differs).
  MatrixWeight upload_matrix_weight(const MatrixWeight& host);
  // A contiguous copy of `device` on the host; waits for all work enqueued so far.
  Tensor to_host(const Tensor& device);
  // Enqueues a copy of `device` into the contiguous host tensor `host` (same dtype and shape).
  // `host` holds the data once an event recorded after this call has completed; this is how a
  // step's results reach the host without waiting for steps enqueued behind it.
  void copy_to_host(const Tensor& device, const Tensor& host);
  virtual std::unique_ptr<Event> record_event() = 0;
  void synchronize();
  // Enqueues a copy of `host` (converted to dst's dtype, as upload does) into the existing device
  // tensor `dst` of the same shape; `host` may be reused as soon as this returns. Graph inputs
  // are refreshed this way, so their device addresses stay fixed.
  void upload_into(const Tensor& dst, const Tensor& host);
  // Enqueues dst = src for two device tensors of one dtype and shape.
  void copy_into(const Tensor& dst, const Tensor& src);

  // ---- the copy stream: host -> device copies that a later forward waits for, op by op -------
  // KV tier imports (docs/kv_store.md#the-engine-and-the-tiers) go on a second stream so that
  // they overlap the compute stream's work, and the forward of layer L waits only for the event
  // recorded after layer L's copies. On a backend with a single stream (the CPU) the copy stream
  // is the compute stream: these calls keep plain stream order and wait_event has nothing to do.
  // None may be called while a graph is captured.
  // Orders the copy stream behind everything enqueued on the compute stream so far (whatever a
  // launched step or a pending export still does with the memory the copies will write).
  void begin_copies();
  // upload_into, on the copy stream; `host` may be reused as soon as this returns.
  void upload_into_on_copy_stream(const Tensor& dst, const Tensor& host);
  // upload_into_on_copy_stream for `host` bytes in memory from allocate_pinned_host, without a
  // staging copy where the backend can: the copy reads `host` after this returns, so the caller
  // must not write those bytes until an event recorded after it has completed (the backend keeps
  // `host`'s storage alive until then). A backend that cannot copy directly (the CPU) stages it
  // as upload_into_on_copy_stream does.
  void upload_pinned_into_on_copy_stream(const Tensor& dst, const Tensor& host);
  // upload_pinned_into_on_copy_stream of dsts[i] from hosts[i] for every i, in one call: a KV
  // tier import moves a few small views per block and layer (hundreds per request). CUDA: one
  // cudaMemcpyBatchAsync and one event for the owners instead of a copy and an event per view
  // (each view's memory is still checked to be pinned); on the H200, 700 views took 1.45 ms of
  // host time against 2.04 ms one by one.
  void upload_pinned_batch_on_copy_stream(std::span<const Tensor> dsts,
                                          std::span<const Tensor> hosts);
  // An event behind everything enqueued on the copy stream so far.
  std::unique_ptr<Event> record_copy_event();
  // Work enqueued on the compute stream from now on runs after `event` (one of this backend's
  // events) has completed; the host does not wait.
  void wait_event(Event& event);
  // ---- concurrent branches of one step
  // ----------------------------------------------------------- The ops enqueued between
  // begin_branch() and end_branch() form a side branch: it runs after everything enqueued before
  // begin_branch(), and alongside the ops enqueued after end_branch() until join_branches();
  // everything enqueued after the join runs after both. So the side branch must not read what those
  // later ops write, nor they what it writes, before the join. At decode sizes most kernels fill a
  // few SMs, so two independent chains of them (a layer's compressors next to its query path, the
  // shared expert next to the routed ones) overlap. A tensor that dies while a branch is open or
  // not yet joined keeps its memory until the join. A backend with one queue (the CPU) runs the ops
  // in the order enqueued, which is one order the branches allow. One branch at a time:
  // begin_branch joins a previous one first, and synchronize, to_host and a capture's end join an
  // open one. end_branch never throws (SideBranch calls it from a destructor): an error there
  // surfaces at the join.
  void begin_branch();
  void end_branch() noexcept;
  void join_branches();

  // `bytes` of host memory for a tier that the device copies from and to (the KV host tier's
  // arena), allocated once: CUDA pins it (cudaHostAlloc, portable across devices), so copies
  // run at bus speed without staging, and copy_to_host into it lands directly; the CPU backend
  // returns ordinary page-aligned memory. Error(kIo) naming the bytes when it cannot be had.
  HostBuffer allocate_pinned_host(size_t bytes);
  // Records the ops `body` enqueues as a Graph, without running them. `body` must not upload,
  // synchronise or copy to the host, and every tensor it allocates must die before it returns
  // (results go into tensors allocated before the capture); the tensors it reads or writes must
  // outlive the graph. The default re-issues `body` at each replay (a backend without native
  // graphs still gets the same semantics); the CUDA backend captures a CUDA graph.
  virtual std::unique_ptr<Graph> capture(std::function<void()> body);

  // ---- dense ops --------------------------------------------------------------------------------
  // table [V, H] (matrix weight), ids [T] i32 -> [T, H] f32.
  Tensor embedding(const Tensor& table, const Tensor& ids);
  // RMSNorm over the last dim: y = x * rsqrt(mean(x^2) + eps) * weight. `weight` may be undefined
  // (unweighted norm).
  Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps);
  // x [M, K], w [N, K] -> x w^T [M, N], after w's activation quantization (weight.h) of x. With
  // x_norm it reads rms_norm(x, x_norm.weight, x_norm.eps) (RowNorm; as linear_pair).
  Tensor linear(const Tensor& x, const MatrixWeight& w, const RowNorm& x_norm = {});
  // Block-diagonal linear: x [M, G*K], w [G*N, K] -> [M, G*N]; group g maps x[:, gK:(g+1)K]
  // with rows [gN, (g+1)N) of w. Activation groups restart at each group's first column.
  Tensor grouped_linear(const Tensor& x, const MatrixWeight& w, int groups);
  // linear(x, a) and linear(x, b) of one x [M, K] (a [Na, K], b [Nb, K]): [M, Na] and [M, Nb]. A
  // backend may run both in one pass over x (the CUDA backend's FP8 decode GEMV does: one launch
  // instead of two); each result is then linear's up to the order of its f32 sums over K. With
  // x_norm both read rms_norm(x, x_norm.weight, x_norm.eps) (RowNorm: a backend may norm x as it
  // quantizes it, without a launch or a tensor of its own).
  std::pair<Tensor, Tensor> linear_pair(const Tensor& x, const MatrixWeight& a,
                                        const MatrixWeight& b, const RowNorm& x_norm = {});
  // Dynamic activation quantization (weight.h) of x [M, K] f32 in groups of `group` columns,
  // returned dequantized: [M, K] f32 whose values are e4m3 values times powers of two.
  Tensor quantize_activations(const Tensor& x, int group);
  Tensor scale(const Tensor& x, float factor);
  // a + b elementwise: f32, or i32 (index arithmetic on the device, e.g. a row's first index plus
  // the drafts it accepted); both of one dtype and shape.
  Tensor add(const Tensor& a, const Tensor& b);
  // Rows of x [T, ...] (any dtype) picked by rows [R] i32 -> [R, ...].
  Tensor gather_rows(const Tensor& x, const Tensor& rows);
  // Interleaved RoPE on the trailing 2*len(inv_freq) channels of x [T, heads, d] (or [T, d]) at
  // positions [T] i32; angle = pos * inv_freq[i] in fp32; `inverse` rotates by -angle. x is f32,
  // or bf16 (an attention output under AttentionSpec::bf16_output), widened exactly; the result
  // is f32 either way.
  Tensor rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, bool inverse);
  // rope(rms_norm(x, weight, eps), positions, inv_freq, /*inverse=*/false) as one op (the model's
  // q-norm + RoPE and kv-norm + RoPE): RMSNorm over the last dim of x [T, d] or [T, heads, d],
  // then the forward rotation of its trailing 2*len(inv_freq) channels. Same result as the two
  // ops; a backend may fuse them into one pass over x. bf16_output: the backend may return the
  // result in bf16 (the f32 result rounded to nearest even), for a consumer that takes either
  // (attention's q, where attention_rounds_query); the CPU reference ignores it and returns f32.
  Tensor rms_norm_rope(const Tensor& x, const Tensor& weight, float eps, const Tensor& positions,
                       const Tensor& inv_freq, bool bf16_output = false);
  // rms_norm_rope of the model's kv rows x [T, D] f32, returned in a KV cache format (kv_dtype and
  // rope_dim as a cache's, above): [T, row width], each row the f32 result encoded as ring_write
  // stores it. These are the rows that ring_write stores by copying and that attention reads as
  // this call's keys without quantizing them again, so a backend quantizes the keys where they
  // are made, in the norm's pass. An f32 kv_dtype gives rms_norm_rope's f32 result.
  Tensor rms_norm_rope_kv(const Tensor& x, const Tensor& weight, float eps, const Tensor& positions,
                          const Tensor& inv_freq, DType kv_dtype, int rope_dim);
  // Index of the largest value of each row of x [T, V] -> [T] i32 (lowest index on ties).
  Tensor argmax(const Tensor& x);
  // Samples one token per row of logits [B, V] f32 (see SamplingBatch).
  SampleResult sample(const Tensor& logits, const SamplingBatch& batch);
  // Applies `adjustments` to logits [B, V] f32 in place (see LogitAdjustments).
  void adjust_logits(const Tensor& logits, const LogitAdjustments& adjustments);
  // Patches this step's token ids in place: tokens[i] = previous[remap[i]] where remap[i] >= 0 (a
  // token the previous step sampled on the device and the host has not seen yet); the other
  // entries keep their value. tokens [T] i32, remap [T] i32, previous [P] i32 (not overlapping
  // tokens).
  void select_tokens(const Tensor& tokens, const Tensor& remap, const Tensor& previous);
  // Moves the rows RowShift names to the positions the previous step's accepted drafts give them
  // (backend_args.h), rewriting the call's metadata on the device. A row shifted to before
  // position 0, or entries past their batch's capacity, are the caller's error: the CPU op
  // throws, device ops leave such values unchanged.
  void shift_rows(const RowShift& shift);
  // The drafts each verify row of a step accepted, on the device: row r holds token rows
  // [row_start[r], row_start[r + 1]) of `tokens` (its input token, then its drafts) and of
  // `samples` (one sample per token row: sample j is the token after input j), and accepts its
  // drafts while they equal the samples before them (sample/verify.h: greedy rows by match,
  // sampled rows by the point-mass rejection rule). samples, tokens [T] i32, row_start [R + 1]
  // i32 -> [R] i32 in [0, row length - 1]. A plain row (one token) accepts 0.
  Tensor accept_drafts(const Tensor& samples, const Tensor& tokens, const Tensor& row_start);
  // Copies t[src[i]] -> t[dst[i]] along dim 0 of t (any dtype, rank >= 1); src, dst [N] i32
  // (state slots: snapshots for the prefix cache).
  void copy_rows(const Tensor& t, const Tensor& src, const Tensor& dst);
  // Fills an f32 or bf16 tensor with normal(mean, std) values from a counter-based generator
  // keyed by (seed, element index): random weights for benchmarks, without a checkpoint.
  void fill_random_normal(const Tensor& t, uint64_t seed, float mean, float std);

  // ---- hyper-connections -----------------------------------------------------------------------
  // x [T, H] -> [T, N, H] with N = hc_mult identical copies.
  Tensor hc_expand(const Tensor& x, int hc_mult);
  // X [T, N, H]; fn [(2+N)N, N*H], base [(2+N)N], scale [3] (all f32). y_norm: the sub-layer's
  // RMSNorm of y (RowNorm), applied to the returned y.
  HcMix hc_pre(const Tensor& X, const Tensor& fn, const Tensor& base, const Tensor& scale,
               const HcParams& params, const RowNorm& y_norm = {});
  // X_new[t, j] = post[t, j] * out[t] + sum_i comb[t, i, j] * X[t, i].
  Tensor hc_post(const Tensor& X, const Tensor& out, const Tensor& post, const Tensor& comb);
  // hc_post(X, out, post, comb), then hc_pre of its result with the next sub-layer's fn, base
  // and scale: one op so a backend can mix the trunk as it writes it (the default runs the two).
  HcPostPre hc_post_pre(const Tensor& X, const Tensor& out, const Tensor& post, const Tensor& comb,
                        const Tensor& fn, const Tensor& base, const Tensor& scale,
                        const HcParams& params, const RowNorm& y_norm = {});
  // Final collapse: fn [N, N*H], base [N], scale [1] -> [T, H], then y_norm (the model's final
  // norm) applied to it.
  Tensor hc_head(const Tensor& X, const Tensor& fn, const Tensor& base, const Tensor& scale,
                 const HcParams& params, const RowNorm& y_norm = {});

  // V4.1 shifted mHC: each sub-layer's mix (pre, post, comb: hc_pre's formulas) is computed from
  // its own trunk X, but its block input is collapsed with the previous sub-layer's pre:
  // y[t] = sum_s prev_pre[t, s] * X[t, s]. prev_pre [T, N] f32, or undefined for the first
  // sub-layer, whose input is stream 0 (prev_pre one-hot on stream 0). The trunk update is hc_post.
  HcShiftedMix hc_pre_shifted(const Tensor& X, const Tensor& fn, const Tensor& base,
                              const Tensor& scale, const Tensor& prev_pre, const HcParams& params);
  // y[t] = sum_s pre[t, s] * X[t, s]: X [T, N, H], pre [T, N] -> [T, H]. The final collapse of a
  // shifted model (no HyperHead: pre is the last sub-layer's).
  Tensor hc_collapse(const Tensor& X, const Tensor& pre);

  // ---- Engram (V4.1 n-gram memory, docs/model.md#v41-ops) ---------------------------------------
  // Hash rows of each token's n-gram. ngram [T, n] i32: column r holds the token id at position
  // t - r, -1 before the sequence start; token_map [V] i32 maps token ids to compressed ids (-1
  // maps to params.pad_id). h = c[0]*M[0], then for r = 1..n-1: h ^= c[r]*M[r] and, per head,
  // row = h mod P[r-1][head] + offset[r-1][head] (offset: exclusive prefix sum of the primes in
  // (order, head) order), in unsigned 64-bit arithmetic. -> [T, (n-1)*heads] i32 rows of the
  // layer's table, in (order, head) order. The lookup is `embedding` on the flattened rows, or
  // `embedding_fp8` for a table kept as shipped.
  Tensor engram_hash(const Tensor& ngram, const Tensor& token_map, const EngramHashParams& params);
  // Rows of a row-scaled FP8 table (V4.1's Engram table as shipped, model.md C.7.4), dequantized:
  // values [V, C] f8_e4m3, scales [V, ceil(C / 32)] e8m0 (one per row and 32 columns), ids [T]
  // i32 -> [T, C] f32, out[t][c] = e4m3(values[id][c]) * 2^(scales[id][c / 32] - 127) with
  // id = ids[t] (exact in f32). The table stays in its stored format: only the looked-up rows are
  // decoded.
  Tensor embedding_fp8(const Tensor& values, const Tensor& scales, const Tensor& ids);
  // The Engram gate on the trunk X [T, N, H]: kv [T, (N+1)*H] is wkv of the looked-up rows, keys
  // k = kv[:, :N*H] as [T, N, H], value v = kv[:, N*H:]. Per stream s: d = sum_c x_s*wq_s*wk_s*k_s
  // * rsqrt(mean(x_s^2)+eps) * rsqrt(mean(k_s^2)+eps) / sqrt(H); g = sigmoid(sign(d) *
  // sqrt(max(|d|, 1e-6))); X_new[t, s] = x_s + g * v. q_weight, k_weight [N, H] f32.
  Tensor engram_gate(const Tensor& X, const Tensor& kv, const Tensor& q_weight,
                     const Tensor& k_weight, float eps);

  // ---- mixture of experts ----------------------------------------------------------------------
  // scores = sqrt(softplus(x gate_w^T)); experts = top-k of scores + bias (bias may be undefined),
  // or tid2eid[token_ids] when tid2eid [V, k] i32 is defined (hash routing). Weights are the
  // chosen scores renormalised to sum 1 (+1e-20) times routed_scale.
  Routing moe_route(const Tensor& x, const Tensor& gate_w, const Tensor& bias,
                    const Tensor& tid2eid, const Tensor& token_ids, int top_k, float routed_scale);
  // sum over chosen experts e of weight * w2_e (silu(min(x w1_e^T, L)) * clamp(x w3_e^T, -L, L)),
  // each GEMM after its weight's activation quantization. All expert matrices have one format.
  Tensor moe_experts(const Tensor& x, const Routing& routing, const ExpertWeights& experts,
                     float swiglu_limit);
  // silu(min(gate, L)) * clamp(up, -L, L), elementwise.
  Tensor swiglu(const Tensor& gate, const Tensor& up, float swiglu_limit);

  // ---- caches and attention --------------------------------------------------------------------
  // ring [slots, R, C] (R >= 1): for each sequence, rows [T, C] of its last min(q_len, R) tokens
  // are stored at ring[slot][pos % R]. Earlier rows of a longer chunk would be overwritten anyway.
  // rows are f32; the ring f32, or a KV cache format (above: [slots, R, row width], rope_dim
  // selecting the fp8 record). rows may also come in the ring's format already (its dtype, [T, row
  // width]: rms_norm_rope_kv's), which are stored as they are.
  void ring_write(const Tensor& ring, const Tensor& rows, const BatchLayout& layout,
                  int rope_dim = 0);
  // Pools the windows that close in this call. proj [T, 2C] holds each token's [kv | gate]
  // (C = D, or 2D with overlap); `ring` [slots, R, 2C] (R >= 1) holds the same rows of earlier
  // tokens (read before this call's ring_write). gate + ape[i] is softmax-ed over the window's
  // slots per channel. Returns the pooled, not yet normalised entries [E, D].
  Tensor compress_pool(const Tensor& proj, const Tensor& ring, const Tensor& ape,
                       const BatchLayout& layout, const EntryBatch& entries,
                       const CompressSpec& spec);
  // cache [rows, C]: cache[dest[i]] = rows[i]; dest[i] == -1 (a padding entry) is skipped.
  // rows [N, C] f32; the cache f32 or a KV cache format (above: [rows, row width]).
  void scatter_rows(const Tensor& cache, const Tensor& rows, const Tensor& dest, int rope_dim = 0);
  // Lightning indexer. q [T, h, Di] (roped) f32, or e4m3 codes (kF8E4M3: q's values are the
  // codes', see quantize_indexer_q), weights [T, h] f32, index_cache [blocks*epb, Di]
  // (f32 or bf16), [blocks*epb, Di + 4] V4 fp8 index-key records (kU8) or V4.1 FP4 index-key
  // records (kE2M1x2; supports_index_cache_dtype).
  // score(t, j) = sum_h weights[t,h] * weight_scale * relu(q[t,h] . k_j) * score_scale over the
  // visible entries j < (pos_t + 1) / ratio. Returns [T, top_k] i32: the indices of the top
  // min(top_k, visible) scores (ties: lower index first), then -1.
  Tensor indexer_topk(const Tensor& q, const Tensor& weights, const Tensor& index_cache,
                      const BatchLayout& layout, int ratio, int top_k, float score_scale,
                      float weight_scale);
  // The indexer's fp8 q, as DeepSeek's engine feeds it with fp8 index keys (tensor/indexer_q.h):
  // q [T, h, Di] f32, weights [T, h] f32 -> q as e4m3 codes [T, h, Di] kF8E4M3 of q / s and
  // weights * s, s = 2^ceil(log2(max(amax, 1e-4) / 448)) per (token, head) row. The indexer ops
  // score the pair as they score q and weights, with q rounded to e4m3 relative to its row.
  IndexerQFp8 quantize_indexer_q(const Tensor& q, const Tensor& weights);
  // V4.1 candidate blocks (long-context indexer): the indexer_topk scores of the visible entries
  // j < (pos_t + 1) / ratio, grouped into blocks [c*block_entries, (c+1)*block_entries); a block's
  // score is the max over its visible entries. Returns [T, top_blocks] i32: the top
  // min(top_blocks, visible blocks) blocks (a set; by score, ties: lower block first), then -1.
  Tensor indexer_candidates(const Tensor& q, const Tensor& weights, const Tensor& index_cache,
                            const BatchLayout& layout, int ratio, int block_entries, int top_blocks,
                            float score_scale, float weight_scale);
  // indexer_topk restricted to candidate blocks: only the visible entries of the blocks in
  // candidates [T, Kb] i32 (block ids of indexer_candidates, -1 = none) are scored. Returns
  // [T, top_k] i32 absolute entry indices: the top min(top_k, candidate entries) (ties: lower
  // index first), then -1.
  Tensor indexer_topk_in_candidates(const Tensor& q, const Tensor& weights,
                                    const Tensor& index_cache, const BatchLayout& layout, int ratio,
                                    const Tensor& candidates, int block_entries, int top_k,
                                    float score_scale, float weight_scale);
  // Attention with the shared K=V vector and a per-head sink. q [T, nh, D] is f32, or bf16 (a
  // backend's rms_norm_rope under bf16_output; the CPU reference widens it exactly); kv [T, D] f32
  // are this call's keys (quantized through the ring's format here), or those keys already in the
  // ring's format (its dtype, [T, row width]: rms_norm_rope_kv's rows); swa_ring [slots, R, D]
  // holds earlier keys; entries [blocks*epb, D] the paged compressed entries (undefined for sliding
  // layers), the caches in one KV format or V4.1's pair (a kF8E4M3 ring and kE2M1x2 entries;
  // spec.rope_dim selecting the record; see above); topk [T, K] i32 the chosen entries of a sparse
  // layer (-1 = none). For query t at position p of sequence b the keys are the positions (p - W,
  // p] (from spec.swa_start[b] on, when given) plus the compressed entries j < (p + 1) / ratio
  // (dense) or in topk[t] (sparse); softmax(q.k * scale ++ sinks[h]) without the sink column,
  // times the keys; under spec.output_rope_inv_freq the RoPE channels rotated back. -> [T, nh, D].
  Tensor attention(const Tensor& q, const Tensor& kv, const Tensor& swa_ring, const Tensor& entries,
                   const Tensor& topk, const Tensor& sinks, const BatchLayout& layout,
                   const AttentionSpec& spec);

 protected:
  // The implementations behind the front: called with arguments whose metadata the front has
  // checked, on the calling thread. Each may add a check of a limit of its own backend.
  virtual Tensor upload_impl(const Tensor& host, DType dtype) = 0;
  virtual Tensor upload_weight_impl(const Tensor& host, DType dtype) = 0;
  virtual MatrixWeight upload_matrix_weight_impl(const MatrixWeight& host) = 0;
  virtual Tensor upload_weight_mapped_impl(const Tensor& host);
  virtual Tensor to_host_impl(const Tensor& device) = 0;
  virtual void copy_to_host_impl(const Tensor& device, const Tensor& host) = 0;
  virtual void synchronize_impl() = 0;
  virtual void upload_into_impl(const Tensor& dst, const Tensor& host) = 0;
  virtual void copy_into_impl(const Tensor& dst, const Tensor& src) = 0;
  // The copy stream; the defaults are those of a single-stream backend (see begin_copies).
  virtual void begin_copies_impl() {}
  virtual void upload_into_on_copy_stream_impl(const Tensor& dst, const Tensor& host) {
    upload_into_impl(dst, host);
  }
  virtual std::unique_ptr<Event> record_copy_event_impl() { return record_event(); }
  virtual void upload_pinned_into_on_copy_stream_impl(const Tensor& dst, const Tensor& host) {
    upload_into_on_copy_stream_impl(dst, host);
  }
  // Default: one upload_pinned_into_on_copy_stream_impl per pair, in order.
  virtual void upload_pinned_batch_on_copy_stream_impl(std::span<const Tensor> dsts,
                                                       std::span<const Tensor> hosts);
  // Default: ordinary page-aligned memory (not pinned).
  virtual HostBuffer allocate_pinned_host_impl(size_t bytes);
  virtual void wait_event_impl(Event& event) { (void)event; }
  // The side branch; the defaults are those of a backend with one queue (see begin_branch).
  virtual void begin_branch_impl() {}
  virtual void end_branch_impl() noexcept {}
  virtual void join_branches_impl() {}

  virtual Tensor embedding_impl(const Tensor& table, const Tensor& ids) = 0;
  virtual Tensor rms_norm_impl(const Tensor& x, const Tensor& weight, float eps) = 0;
  virtual Tensor linear_impl(const Tensor& x, const MatrixWeight& w, const RowNorm& x_norm) = 0;
  virtual Tensor grouped_linear_impl(const Tensor& x, const MatrixWeight& w, int groups) = 0;
  // Default: rms_norm_impl of x where x_norm is defined, then linear_impl of each weight.
  virtual std::pair<Tensor, Tensor> linear_pair_impl(const Tensor& x, const MatrixWeight& a,
                                                     const MatrixWeight& b, const RowNorm& x_norm);
  virtual Tensor quantize_activations_impl(const Tensor& x, int group) = 0;
  virtual Tensor scale_impl(const Tensor& x, float factor) = 0;
  virtual Tensor add_impl(const Tensor& a, const Tensor& b) = 0;
  virtual Tensor gather_rows_impl(const Tensor& x, const Tensor& rows) = 0;
  virtual Tensor rope_impl(const Tensor& x, const Tensor& positions, const Tensor& inv_freq,
                           bool inverse) = 0;
  // Default: rms_norm_impl then rope_impl (f32, whatever bf16_output says).
  virtual Tensor rms_norm_rope_impl(const Tensor& x, const Tensor& weight, float eps,
                                    const Tensor& positions, const Tensor& inv_freq,
                                    bool bf16_output);
  virtual Tensor rms_norm_rope_kv_impl(const Tensor& x, const Tensor& weight, float eps,
                                       const Tensor& positions, const Tensor& inv_freq,
                                       DType kv_dtype, int rope_dim) = 0;
  virtual Tensor argmax_impl(const Tensor& x) = 0;
  virtual SampleResult sample_impl(const Tensor& logits, const SamplingBatch& batch) = 0;
  virtual void adjust_logits_impl(const Tensor& logits, const LogitAdjustments& adjustments) = 0;
  virtual void select_tokens_impl(const Tensor& tokens, const Tensor& remap,
                                  const Tensor& previous) = 0;
  virtual void shift_rows_impl(const RowShift& shift) = 0;
  virtual Tensor accept_drafts_impl(const Tensor& samples, const Tensor& tokens,
                                    const Tensor& row_start) = 0;
  virtual void copy_rows_impl(const Tensor& t, const Tensor& src, const Tensor& dst) = 0;
  virtual void fill_random_normal_impl(const Tensor& t, uint64_t seed, float mean, float std) = 0;

  virtual Tensor hc_expand_impl(const Tensor& x, int hc_mult) = 0;
  // y_norm, where defined, is applied to the collapsed output (RowNorm).
  virtual HcMix hc_pre_impl(const Tensor& X, const Tensor& fn, const Tensor& base,
                            const Tensor& scale, const HcParams& params, const RowNorm& y_norm) = 0;
  virtual Tensor hc_post_impl(const Tensor& X, const Tensor& out, const Tensor& post,
                              const Tensor& comb) = 0;
  virtual Tensor hc_head_impl(const Tensor& X, const Tensor& fn, const Tensor& base,
                              const Tensor& scale, const HcParams& params,
                              const RowNorm& y_norm) = 0;
  // The default is literally hc_post_impl, then hc_pre_impl of its result (the CPU reference).
  virtual HcPostPre hc_post_pre_impl(const Tensor& X, const Tensor& out, const Tensor& post,
                                     const Tensor& comb, const Tensor& fn, const Tensor& base,
                                     const Tensor& scale, const HcParams& params,
                                     const RowNorm& y_norm);

  // V4.1 ops: the defaults throw Error(kUnsupported) naming the op and the backend, so a backend
  // without them yet still builds and fails loudly when a V4.1 graph reaches it.
  virtual HcShiftedMix hc_pre_shifted_impl(const Tensor& X, const Tensor& fn, const Tensor& base,
                                           const Tensor& scale, const Tensor& prev_pre,
                                           const HcParams& params);
  virtual Tensor hc_collapse_impl(const Tensor& X, const Tensor& pre);
  virtual Tensor engram_hash_impl(const Tensor& ngram, const Tensor& token_map,
                                  const EngramHashParams& params);
  virtual Tensor embedding_fp8_impl(const Tensor& values, const Tensor& scales, const Tensor& ids);
  virtual Tensor engram_gate_impl(const Tensor& X, const Tensor& kv, const Tensor& q_weight,
                                  const Tensor& k_weight, float eps);
  virtual Tensor indexer_candidates_impl(const Tensor& q, const Tensor& weights,
                                         const Tensor& index_cache, const BatchLayout& layout,
                                         int ratio, int block_entries, int top_blocks,
                                         float score_scale, float weight_scale);
  virtual IndexerQFp8 quantize_indexer_q_impl(const Tensor& q, const Tensor& weights);
  virtual Tensor indexer_topk_in_candidates_impl(const Tensor& q, const Tensor& weights,
                                                 const Tensor& index_cache,
                                                 const BatchLayout& layout, int ratio,
                                                 const Tensor& candidates, int block_entries,
                                                 int top_k, float score_scale, float weight_scale);

  virtual Routing moe_route_impl(const Tensor& x, const Tensor& gate_w, const Tensor& bias,
                                 const Tensor& tid2eid, const Tensor& token_ids, int top_k,
                                 float routed_scale) = 0;
  virtual Tensor moe_experts_impl(const Tensor& x, const Routing& routing,
                                  const ExpertWeights& experts, float swiglu_limit) = 0;
  virtual Tensor swiglu_impl(const Tensor& gate, const Tensor& up, float swiglu_limit) = 0;

  virtual void ring_write_impl(const Tensor& ring, const Tensor& rows, const BatchLayout& layout,
                               int rope_dim) = 0;
  virtual Tensor compress_pool_impl(const Tensor& proj, const Tensor& ring, const Tensor& ape,
                                    const BatchLayout& layout, const EntryBatch& entries,
                                    const CompressSpec& spec) = 0;
  virtual void scatter_rows_impl(const Tensor& cache, const Tensor& rows, const Tensor& dest,
                                 int rope_dim) = 0;
  virtual Tensor indexer_topk_impl(const Tensor& q, const Tensor& weights,
                                   const Tensor& index_cache, const BatchLayout& layout, int ratio,
                                   int top_k, float score_scale, float weight_scale) = 0;
  virtual Tensor attention_impl(const Tensor& q, const Tensor& kv, const Tensor& swa_ring,
                                const Tensor& entries, const Tensor& topk, const Tensor& sinks,
                                const BatchLayout& layout, const AttentionSpec& spec) = 0;

 private:
  // Throws Error(kInternal) naming `what` while host syncs are forbidden.
  void check_host_sync_allowed(const char* what) const;
  // Throws Error(kUnsupported): `op` is not implemented on this backend (the default impls).
  [[noreturn]] void unsupported(const char* op) const;

  bool host_sync_forbidden_ = false;
  enum class BranchState { kNone, kOpen, kEnded };
  BranchState branch_ = BranchState::kNone;
};

// A side branch (Backend::begin_branch) for the ops enqueued in its scope.
class SideBranch {
 public:
  explicit SideBranch(Backend& backend) : backend_(backend) { backend_.begin_branch(); }
  ~SideBranch() { backend_.end_branch(); }
  SideBranch(const SideBranch&) = delete;
  SideBranch& operator=(const SideBranch&) = delete;

 private:
  Backend& backend_;
};

// Forbids host syncs on `backend` for its lifetime (restores the previous state after).
class HostSyncForbidden {
 public:
  explicit HostSyncForbidden(Backend& backend)
      : backend_(backend), previous_(backend.set_host_sync_forbidden(true)) {}
  ~HostSyncForbidden() { backend_.set_host_sync_forbidden(previous_); }
  HostSyncForbidden(const HostSyncForbidden&) = delete;
  HostSyncForbidden& operator=(const HostSyncForbidden&) = delete;

 private:
  Backend& backend_;
  bool previous_;  // nested guards: the outer one stays in force
};

// The CPU reference backend. `num_threads` = 0 picks the hardware concurrency.
std::unique_ptr<Backend> make_cpu_backend(int num_threads = 0);
// The device "auto" stands for: "cuda" when this build has the CUDA backend and a GPU is present,
// else "cpu". Any other name is returned as it is.
std::string resolve_device(const std::string& device);
// A backend by name: "auto" (see resolve_device), "cpu", or "cuda" / "cuda:N" when this build has
// the CUDA backend. Throws Error(kInvalidArgument) for an unknown name, Error(kUnsupported) for a
// backend not compiled in.
std::unique_ptr<Backend> make_backend(const std::string& device, int num_threads = 0);
// True when `device` names a backend this build has ("auto" always: it falls back to the CPU).
bool backend_available(const std::string& device);

}  // namespace deepinfer
