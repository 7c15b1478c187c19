#include "cuda_attention_bench.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "cuda/attention/sm80/attention_mma_trace.h"
#include "cuda/attention/sm90/attention_wgmma_config.h"
#include "cuda/attention/sm90/attention_wgmma_trace.h"
#include "cuda/backend/cuda_backend.h"
#include "op_bench_util.h"

namespace deepinfer::bench {

namespace {

struct AttentionShape {
  int batch;
  int s_q;
  bool bf16_math;
  DType kv;  // kF32, kBF16, kU8 (fp8 records)
  int topk;
  int heads;
  // The sequences' context (positions ctx - s_q .. ctx - 1). A prefill shape (one sequence, s_q in
  // the thousands) takes a long one, so that every query sees more than top-k compressed entries.
  int ctx = 4096;
  bool prefill = false;
};

std::string shape_label(const AttentionShape& s) {
  return "B=" + std::to_string(s.batch) + " s_q=" + std::to_string(s.s_q) +
         " h=" + std::to_string(s.heads) + " topk=" + std::to_string(s.topk) +
         (s.prefill ? " ctx=" + std::to_string(s.ctx) : std::string()) + " " + kv_name(s.kv) +
         " KV" + (s.bf16_math ? ", bf16 mma" : ", f32");
}

// A shape's inputs (V4-Flash CSA widths: D = 512 with 64 RoPE channels, window 128, ratio 4,
// sparse top-k) and the op's call on them.
struct AttentionCase {
  static constexpr int kDim = 512, kRope = 64, kWindow = 128, kRatio = 4;
  BatchLayout layout;
  Tensor q, kv, ring_rows, ring, entries, topk, sinks;
  AttentionSpec spec;

  AttentionCase(Backend& be, const AttentionShape& s) {
    const int ctx = s.ctx;
    const int blocks = ctx / 128;
    const int t = s.batch * s.s_q;
    layout = decode_layout(be, s.batch, s.s_q, ctx, blocks);
    q = rnd(be, {t, s.heads, kDim}, DType::kF32, 12);
    kv = rnd(be, {t, kDim}, DType::kF32, 13);
    const int64_t ring_len = kWindow + 6;
    ring_rows = random_cache(be, (s.batch + 1) * ring_len, kDim, kRope, s.kv, 14);
    ring = ring_rows.reshape({s.batch + 1, ring_len, ring_rows.size(1)});
    entries =
        random_cache(be, (int64_t{s.batch} * blocks + 1) * (128 / kRatio), kDim, kRope, s.kv, 15);
    // The selected entries spread over the visible ones (decode at 4K: every other one of 1024
    // for top-512); a prefill query at position p sees (p + 1) / ratio of them, at least 7,168
    // here.
    std::vector<int32_t> picks(static_cast<size_t>(t) * s.topk);
    const int visible = (ctx - s.s_q + 1) / kRatio;
    for (int i = 0; i < t; ++i)
      for (int j = 0; j < s.topk; ++j)
        picks[static_cast<size_t>(i) * s.topk + j] = (j * (visible / s.topk)) % visible;
    topk = be.upload(Tensor::from_vector(picks, {t, s.topk}), DType::kI32);
    sinks = rnd(be, {s.heads}, DType::kF32, 16);
    spec.window = kWindow;
    spec.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
    spec.ratio = kRatio;
    spec.sparse = true;
    spec.bf16_math = s.bf16_math;
    spec.rope_dim = s.kv == DType::kF32 ? 0 : kRope;
  }
  void call(Backend& be) const {
    (void)be.attention(q, kv, ring, entries, topk, sinks, layout, spec);
  }
};

void run_shape(Backend& be, int iters, const AttentionShape& s, const std::string& match) {
  const std::string shape = shape_label(s);
  if (shape.find(match) == std::string::npos) return;
  const AttentionCase c(be, s);
  auto call = [&] { c.call(be); };
  const int t = s.batch * s.s_q;
  const double keys = static_cast<double>(AttentionCase::kWindow + s.topk);
  const double row_bytes = static_cast<double>(c.ring_rows.size(1)) * dtype_size(s.kv);
  // Decode: each sequence's attended rows once. A prefill chunk's queries share their rows through
  // L2, so no byte count says much there: compare its TFLOP/s.
  const double bytes = s.prefill ? 0.0 : s.batch * keys * row_bytes;
  const double flops = t * keys * s.heads * AttentionCase::kDim * 4.0;  // q.k, p.v: 2 per MAC
  const char* name = s.prefill ? "attention_prefill" : "attention_decode";
  if (!s.bf16_math) {
    emit(name, shape, time_us(be, iters, call), bytes, flops);
    emit(name, shape + " (graph)", time_graph_us(be, iters, call), bytes, flops);
    return;
  }
  // The tensor-core kernel's two combine paths (attention_plan.h), each with the plan it ran:
  // the backend's choice (DEEPINFER_ATTENTION_*: by default the fused combine and the cost
  // model's rows and splits; DEEPINFER_ATTENTION_KERNEL picks mma.sync or wgmma for these two
  // rows), then the separate combine kernel of the pre-fusion plan. Then, where the wgmma kernel
  // takes the shape (bf16 / fp8 KV on an sm_90 device with sm_90a code), each kernel forced:
  // mma_sync, wgmma, the wgmma_prefetch variants, wgmma_overlap (plain, _pdl and _fused: the
  // splits merged by their cluster), at 128 heads or a multiple wgmma_overlap_pair and
  // wgmma_overlap_pair_blocks (a cluster per unit), and wgmma_overlap_ilp (graph), the A/B rows,
  // and the engine's call (engine_rows) under the backend's choice, wgmma_overlap_ilp and both
  // pairs (the pairs over fp8 persistent there). Every row names the kernel that ran and its
  // merge.
  auto& cuda_be = dynamic_cast<cuda::CudaBackend&>(be);
  const cuda::AttentionMmaChoice backend_choice = cuda_be.attention_mma_choice();
  const cuda::AttentionKernelChoice backend_kernel = cuda_be.attention_kernel();
  auto plan_label = [&] {
    const cuda::AttentionMmaPlan p = cuda_be.last_attention_plan();
    const char* path = p.splits == 1     ? ", no split"
                       : p.fused         ? ", fused combine"
                       : p.cluster_merge ? ", cluster merge"
                                         : ", separate combine";
    std::string kernel = !cuda_be.last_attention_wgmma() ? ", mma_sync"
                         : p.overlap                     ? ", wgmma_overlap"
                         : p.prefetch                    ? ", wgmma_prefetch"
                                                         : ", wgmma";
    if (p.swizzle) kernel += "_sw128";
    if (p.pdl) kernel += "_pdl";
    if (p.ilp) kernel = ", wgmma_overlap_ilp";
    if (p.pair) kernel = p.persistent ? ", wgmma_overlap_pair" : ", wgmma_overlap_pair_blocks";
    if (p.keysplit) kernel = ", wgmma_keysplit";
    return kernel + path + " (rows=" + std::to_string(p.rows) +
           " splits=" + std::to_string(p.splits) + ")";
  };
  // The engine's call under the kernel and plan in force (DeepseekV4Model sets bf16_output with
  // bf16_math): the output in bf16, as FlashMLA's interface writes it; then also q in bf16, as the
  // engine's rms_norm_rope returns it (FlashMLA's q dtype); then also this call's keys in the
  // ring's format (the engine's kv from rms_norm_rope_kv): no encoding launch before the kernel,
  // as FlashMLA's call, whose cache holds them already.
  auto engine_rows = [&] {
    AttentionCase bf16_out = c;
    bf16_out.spec.bf16_output = true;
    const double out_us = time_graph_us(be, iters, [&] { bf16_out.call(be); });
    emit(name, shape + plan_label() + " bf16 out (graph)", out_us, bytes, flops);
    AttentionCase engine = bf16_out;
    engine.q = rnd(be, c.q.shape(), DType::kBF16, 12);
    const double engine_us = time_graph_us(be, iters, [&] { engine.call(be); });
    emit(name, shape + plan_label() + " bf16 q, bf16 out (graph)", engine_us, bytes, flops);
    AttentionCase encoded = engine;
    encoded.kv = random_cache(be, t, AttentionCase::kDim, AttentionCase::kRope, s.kv, 13);
    const double encoded_us = time_graph_us(be, iters, [&] { encoded.call(be); });
    emit(name, shape + plan_label() + " bf16 q, encoded kv, bf16 out (graph)", encoded_us, bytes,
         flops);
  };
  const double us = time_us(be, iters, call);
  emit(name, shape + plan_label(), us, bytes, flops);
  const double graph_us = time_graph_us(be, iters, call);
  emit(name, shape + plan_label() + " (graph)", graph_us, bytes, flops);
  engine_rows();
  cuda_be.set_attention_mma_choice({.fused_combine = false});
  const double separate_us = time_graph_us(be, iters, call);
  emit(name, shape + plan_label() + " (graph)", separate_us, bytes, flops);
  if (cuda_be.wgmma_device() && s.kv != DType::kF32 && s.heads % 64 == 0) {
    for (const cuda::AttentionKernelChoice k :
         {cuda::AttentionKernelChoice::kMmaSync, cuda::AttentionKernelChoice::kWgmma,
          cuda::AttentionKernelChoice::kWgmmaPrefetch,
          cuda::AttentionKernelChoice::kWgmmaPrefetchPdl,
          cuda::AttentionKernelChoice::kWgmmaPrefetchSw128,
          cuda::AttentionKernelChoice::kWgmmaPrefetchSw128Pdl,
          cuda::AttentionKernelChoice::kWgmmaOverlap, cuda::AttentionKernelChoice::kWgmmaOverlapPdl,
          cuda::AttentionKernelChoice::kWgmmaOverlapFused,
          cuda::AttentionKernelChoice::kWgmmaOverlapPair,
          cuda::AttentionKernelChoice::kWgmmaOverlapPairBlocks,
          cuda::AttentionKernelChoice::kWgmmaOverlapIlp,
          cuda::AttentionKernelChoice::kWgmmaKeySplit}) {
      const bool pair = k == cuda::AttentionKernelChoice::kWgmmaOverlapPair ||
                        k == cuda::AttentionKernelChoice::kWgmmaOverlapPairBlocks;
      if (pair && !cuda::wgmma_pair_takes(s.heads)) continue;
      const bool keysplit = k == cuda::AttentionKernelChoice::kWgmmaKeySplit;
      if (keysplit && s.kv != DType::kBF16) continue;  // bf16 rows only (else it runs auto)
      cuda_be.set_attention_kernel(k);
      const double k_us = time_graph_us(be, iters, call);
      emit(name, shape + plan_label() + " (graph)", k_us, bytes, flops);
      if (k == cuda::AttentionKernelChoice::kWgmmaOverlapIlp || pair || keysplit) {
        engine_rows();
      }
    }
    cuda_be.set_attention_kernel(backend_kernel);
  }
  cuda_be.set_attention_mma_choice(backend_choice);
}

// One traced launch of the overlap kernel (`kernel`: wgmma_overlap or its ilp variant) on the
// shape, every block traced (attention_wgmma_trace.h), summarised as one JSON line: the blocks'
// clock, their prologue / tile loop / epilogue, the prologue's parts (cycles from entry to the key
// list known, q stored, tile 0's row resolved, landed, published and full) and the epilogue's
// (from the last values issued to the scorer's and both warpgroups' values done), and per role
// the mean cycles per steady-state tile spent waiting (wait_*) and working, and the period of
// its loop. The last of 6 traced calls is the one summarised; us_untraced / us_traced (eager, 5
// calls each after a warm-up) show how much the stamps slow the kernel (the traced instantiation
// keeps its record pointer on the stack: a local load per stamp).
void trace_shape(cuda::CudaBackend& be, const AttentionShape& s, cuda::AttentionKernelChoice kernel,
                 const char* kernel_name, int ablate = 0) {
  const AttentionCase c(be, s);
  const cuda::AttentionKernelChoice kernel0 = be.attention_kernel();
  be.set_attention_kernel(kernel);
  auto call = [&] { c.call(be); };
  const double untraced_us = time_us(be, 5, call);  // also the plan, allocations
  const cuda::AttentionMmaPlan p = be.last_attention_plan();
  if (!be.last_attention_wgmma() || !p.overlap) {
    be.set_attention_kernel(kernel0);
    std::printf(
        "{\"trace\": \"attention_overlap\", \"shape\": \"%s\", \"kernel\": \"%s\", "
        "\"skipped\": \"the overlap kernel does not run here\"}\n",
        shape_label(s).c_str(), kernel_name);
    return;
  }
  const int ctas = static_cast<int>(int64_t{s.batch} * s.s_q * p.head_groups * p.splits);
  const Tensor stamps = be.zeros({cuda::overlap_trace_words(ctas)}, DType::kI64);
  be.set_attention_trace({static_cast<int64_t*>(stamps.raw_data()), ctas, ablate});
  const double traced_us = time_us(be, 5, call);
  be.set_attention_trace({});
  be.set_attention_kernel(kernel0);
  const Tensor host = be.to_host(stamps);
  const int64_t* w = host.data<int64_t>();
  const cuda::OverlapTraceSummary t = cuda::summarize_overlap_trace(
      std::vector<int64_t>(w, w + cuda::overlap_trace_words(ctas)), ctas);
  const double us_per_tile = t.clock_ghz > 0 ? t.scorer_period / t.clock_ghz / 1e3 : 0.0;
  std::printf(
      "{\"trace\": \"attention_overlap\", \"ablate\": %d, \"shape\": \"%s\", \"kernel\": \"%s\", "
      "\"us_untraced\": %.2f, \"us_traced\": %.2f, "
      "\"splits\": %lld, \"ctas\": %d, \"tiles\": %.1f, \"steady_tiles\": %.0f, "
      "\"clock_ghz\": %.3f, \"us_per_tile\": %.3f, \"cycles\": {\"block\": %.0f, "
      "\"prologue\": %.0f, \"loop\": %.0f, \"epilogue\": %.0f}, "
      "\"prologue_from_entry\": {\"keys\": %.0f, \"q_stored\": %.0f, \"tile0_addresses\": %.0f, "
      "\"tile0_landed\": %.0f, \"tile0_published\": %.0f, \"tile0_full\": %.0f}, "
      "\"epilogue_from_loop_end\": {\"scorer_values_done\": %.0f, \"both_values_done\": %.0f}, "
      "\"producer\": {\"wait_free\": %.0f, \"wait_landed\": %.0f, \"decode\": %.0f, "
      "\"issue_next\": %.0f, \"period\": %.0f}, "
      "\"scorer\": {\"wait_full\": %.0f, \"wait_prev_values\": %.0f, \"wait_scores\": %.0f, "
      "\"wait_probs_free\": %.0f, \"softmax\": %.0f, \"issue_values\": %.0f, "
      "\"period\": %.0f}, "
      "\"value\": {\"wait_probs\": %.0f, \"products\": %.0f, \"release\": %.0f, "
      "\"period\": %.0f}}\n",
      ablate, shape_label(s).c_str(), kernel_name, untraced_us, traced_us,
      static_cast<long long>(p.splits), t.ctas, t.tiles, t.steady, t.clock_ghz, us_per_tile,
      t.block_cycles, t.prologue_cycles, t.loop_cycles, t.epilogue_cycles, t.prologue_keys,
      t.prologue_query, t.first_addresses, t.first_landed, t.first_published, t.first_full,
      t.epilogue_values, t.epilogue_ready, t.producer_wait_free, t.producer_wait_landed,
      t.producer_decode, t.producer_issue, t.producer_period, t.scorer_wait_full,
      t.scorer_wait_prev_values, t.scorer_wait_scores, t.scorer_wait_probs_free, t.scorer_softmax,
      t.scorer_issue_values, t.scorer_period, t.value_wait_probs, t.value_products, t.value_release,
      t.value_period);
  std::fflush(stdout);
}

}  // namespace

void bench_attention_trace(Backend& be, const std::string& match, int ablate) {
  auto& cuda_be = dynamic_cast<cuda::CudaBackend&>(be);
  // fp8 KV, top-k 512: 64 heads at B = 1 (10 splits of about one tile), 64 and 256, 128 heads at
  // B = 64 and 256, and a prefill chunk of 4,096 queries at 64 heads (bench_attention_decode's).
  const std::vector<AttentionShape> shapes = {
      {1, 1, true, DType::kU8, 512, 64},    {256, 1, true, DType::kU8, 512, 64},
      {64, 1, true, DType::kU8, 512, 128},  {64, 1, true, DType::kU8, 512, 64},
      {256, 1, true, DType::kU8, 512, 128}, {1, 4096, true, DType::kU8, 512, 64, 32768, true}};
  for (const AttentionShape& s : shapes) {
    if (shape_label(s).find(match) == std::string::npos) continue;
    if (ablate != 0) {  // the default kernel with and without the ablation
      for (const int bits : {0, ablate}) {
        trace_shape(cuda_be, s, cuda::AttentionKernelChoice::kWgmmaOverlapIlp, "wgmma_overlap_ilp",
                    bits);
      }
      continue;
    }
    trace_shape(cuda_be, s, cuda::AttentionKernelChoice::kWgmmaOverlap, "wgmma_overlap");
    trace_shape(cuda_be, s, cuda::AttentionKernelChoice::kWgmmaOverlapIlp, "wgmma_overlap_ilp");
    if (cuda::wgmma_pair_takes(s.heads)) {  // the cluster pairs, where they run (traced: a
      // cluster per unit, as the persistent launch is not traced)
      trace_shape(cuda_be, s, cuda::AttentionKernelChoice::kWgmmaOverlapPairBlocks,
                  "wgmma_overlap_pair_blocks");
    }
  }
}

namespace {

// `t`'s phases as JSON members ("name": {mean, max, max_block}), cycles.
template <size_t N>
std::string trace_phases_json(const std::array<cuda::TracePhaseStats, N>& phases,
                              const char* (*name)(int)) {
  std::string out;
  for (size_t ph = 0; ph < N; ++ph) {
    const cuda::TracePhaseStats& p = phases[ph];
    if (p.blocks == 0) continue;
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%s\"%s\": {\"mean\": %.0f, \"max\": %lld, \"max_block\": %d}",
                  out.empty() ? "" : ", ", name(static_cast<int>(ph)), p.mean,
                  static_cast<long long>(p.max), p.max_block);
    out += buf;
  }
  return out;
}

std::string span_json(const char* name, const cuda::TraceSpan& s) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "\"%s\": [%lld, %lld]", name, static_cast<long long>(s.first),
                static_cast<long long>(s.last));
  return buf;
}

}  // namespace

void bench_attention_mma_trace(Backend& be, int iters, const std::string& match) {
  auto& cuda_be = dynamic_cast<cuda::CudaBackend&>(be);
  // The small-batch route's shapes (mma.sync, 16-head blocks, the separate combine), top-k 512,
  // 64 heads: the engine's call (bf16 q, this call's keys encoded, bf16 out).
  const std::vector<AttentionShape> shapes = {{1, 1, true, DType::kU8, 512, 64},
                                              {1, 1, true, DType::kBF16, 512, 64},
                                              {2, 1, true, DType::kU8, 512, 64},
                                              {1, 2, true, DType::kU8, 512, 64}};
  for (const AttentionShape& s : shapes) {
    const std::string shape = shape_label(s);
    if (shape.find(match) == std::string::npos) continue;
    AttentionCase engine(be, s);
    engine.spec.bf16_output = true;
    engine.q = rnd(be, engine.q.shape(), DType::kBF16, 12);
    engine.kv = random_cache(be, int64_t{s.batch} * s.s_q, AttentionCase::kDim,
                             AttentionCase::kRope, s.kv, 13);
    auto call = [&] { engine.call(be); };
    const double untraced_us = time_graph_us(be, iters, call);
    const cuda::AttentionMmaPlan plan = cuda_be.last_attention_plan();
    if (cuda_be.last_attention_wgmma() || plan.splits == 1 || plan.fused || plan.rows != 16) {
      std::printf(
          "{\"trace\": \"attention_mma\", \"shape\": \"%s\", \"skipped\": \"the call does "
          "not take the small-batch route (mma.sync 16-head blocks, separate combine)\"}\n",
          shape.c_str());
      continue;
    }
    const int tokens = s.batch * s.s_q;
    const int blocks = static_cast<int>(tokens * plan.head_groups * plan.splits);
    const int combines = tokens * s.heads;
    const Tensor stamps = be.zeros({cuda::mma_trace_words(blocks, combines)}, DType::kI64);
    cuda_be.set_attention_mma_trace({static_cast<int64_t*>(stamps.raw_data()), blocks, combines});
    const double traced_us = time_graph_us(be, iters, call);
    cuda_be.set_attention_mma_trace({});
    const Tensor host = be.to_host(stamps);
    const int64_t* w = host.data<int64_t>();
    const cuda::MmaTraceSummary t = cuda::summarize_mma_trace(
        std::vector<int64_t>(w, w + cuda::mma_trace_words(blocks, combines)), blocks, combines);
    std::printf(
        "{\"trace\": \"attention_mma\", \"shape\": \"%s\", \"splits\": %lld, \"us_untraced\": "
        "%.3f, \"us_traced\": %.3f, \"blocks\": %d, \"combines\": %d, \"clock_ghz\": %.3f, "
        "\"cycles\": {%s}, \"probe_after_wait\": {\"mean\": %.0f, \"max\": %lld}, "
        "\"combine_cycles\": {%s}, \"timeline_ns\": {%s, %s, %s, %s, %s, "
        "%s}, \"placement\": {\"split_sms\": %d, \"combine_sms\": %d, "
        "\"combine_max_per_sm\": %d, \"combines_on_split_sms\": %d, \"combines_alone\": %d, "
        "\"load_alone_mean\": %.0f, \"load_shared_mean\": %.0f}}\n",
        shape.c_str(), static_cast<long long>(plan.splits), untraced_us, traced_us, t.blocks,
        t.combines, t.clock_ghz, trace_phases_json(t.phases, cuda::mma_trace_phase_name).c_str(),
        t.probe.mean, static_cast<long long>(t.probe.max),
        trace_phases_json(t.combine_phases, cuda::combine_trace_phase_name).c_str(),
        span_json("entry", t.entry).c_str(), span_json("waited", t.waited).c_str(),
        span_json("end", t.end).c_str(), span_json("combine_entry", t.combine_entry).c_str(),
        span_json("combine_waited", t.combine_waited).c_str(),
        span_json("combine_end", t.combine_end).c_str(), t.placement.split_sms,
        t.placement.combine_sms, t.placement.combine_max_per_sm, t.placement.combines_on_split_sms,
        t.placement.combines_alone, t.placement.load_alone_mean, t.placement.load_shared_mean);
    std::fflush(stdout);
  }
}

void bench_attention_decode(Backend& be, int iters, const std::string& match) {
  std::vector<AttentionShape> shapes;
  for (const auto& [b, sq] :
       std::vector<std::pair<int, int>>{{1, 1}, {2, 1}, {1, 2}, {64, 1}, {256, 1}, {256, 2}}) {
    shapes.push_back({b, sq, false, DType::kF32, 512, 64});
    for (const DType kv : {DType::kF32, DType::kBF16, DType::kU8})
      shapes.push_back({b, sq, true, kv, 512, 64});
  }
  // Small batches between (the launches and a block's chain of dependent loads dominate there):
  // V4's fp8 records only.
  for (const int b : {4, 8}) shapes.push_back({b, 1, true, DType::kU8, 512, 64});
  for (const int b : {1, 64, 256}) {
    shapes.push_back({b, 1, true, DType::kU8, 1024, 64});  // top-k 1024
    shapes.push_back({b, 1, true, DType::kU8, 512, 128});  // V4-Pro: 128 heads
    shapes.push_back({b, 1, true, DType::kBF16, 512, 128});
  }
  // Sparse prefill (the peer: FlashMLA's flash_mla_sparse_fwd at the same shape): one sequence's
  // chunk of 4,096 or 16,384 queries at the end of a long context, each with its 128 sliding keys
  // and 512 selected entries.
  for (const DType kv : {DType::kBF16, DType::kU8})
    shapes.push_back({1, 4096, true, kv, 512, 64, 32768, true});
  shapes.push_back({1, 16384, true, DType::kBF16, 512, 64, 65536, true});
  for (const DType kv : {DType::kBF16, DType::kU8})
    shapes.push_back({1, 4096, true, kv, 512, 128, 32768, true});
  for (const AttentionShape& s : shapes) run_shape(be, iters, s, match);
}

}  // namespace deepinfer::bench
