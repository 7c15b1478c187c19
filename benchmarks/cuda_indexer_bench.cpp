// The lightning indexer's benchmark of the CUDA backend (scores and top-k at V4-Flash widths over
// every index-key format), run by cuda_op_bench (`--only indexer`).
#include "cuda_indexer_bench.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "cuda/backend/cuda_backend.h"
#include "cuda/indexer/indexer_options.h"
#include "op_bench_util.h"

namespace deepinfer::bench {

namespace {

// The lightning indexer at V4-Flash widths (64 heads x 128, ratio 4, top 512) for `batch`
// sequences of `s_q` rows (1: decode; more: the last prefill chunk) at context `ctx`: scores over
// the about ctx/4 index keys in a cache of `kv`, then the top-k. The bytes are those of the index
// keys each row scores (a prefill chunk's rows share theirs through L2); the indexer_topk and
// indexer_scores rows give their GB/s as a fraction of `copy_gbps` (the run's copy roofline) in
// "of_roofline". Rows:
//  - indexer_topk: the op as the backend runs it (its scoring kernel named), plain and in a
//    graph; for bf16 / fp8 / V4.1 FP4 keys also with the f32 CUDA-core scores (graph), the A/B
//    pair; and with each selection kernel forced (graph): binned, one block, split;
//  - indexer_scores: the scoring kernels alone (graph), each kernel that takes the keys: the
//    tensor-core one as the op picks it (fp8 keys at 64 heads: pipelined wgmma on sm_90), the
//    mma.sync one with q in one part (what the op's second MMA costs) and, for fp8 keys, the
//    mma.sync one with the records copied in runs of a block and as it stands (the previous fp8
//    kernel: the A/B); on sm_90 the wgmma kernel forced, its pipelined variant
//    (indexer_score_wgmma_pipelined.cu, the same scores, the default; the A/B for
//    DEEPINFER_INDEXER_FP8_SCORES=wgmma) and q's lo part in e4m3;
//  - fp8 keys with q in fp8 (the engine's path: quantize_indexer_q): the scores alone, by the
//    op's choice and by each fp8 kernel forced on sm_90 (pipelined, persistent with 3 of 8 and
//    with all k-steps through cvt), the op on the persistent scores, the op with the
//    quantization, and the quantization alone;
//  - indexer_select: the top-k alone (graph) over the scores of the op's own kernel, as the
//    heuristic picks it and with each selection kernel forced (the A/B); its bytes are the
//    scores read.
void run_indexer(Backend& be, int iters, int batch, int s_q, int ctx, DType kv,
                 const std::string& match, double copy_gbps) {
  const int heads = 64, dim = 128, ratio = 4, top_k = 512;
  const std::string shape =
      "B=" + std::to_string(batch) + (s_q > 1 ? " s_q=" + std::to_string(s_q) : std::string()) +
      " ctx=" + std::to_string(ctx) + " h=64 d=128 top512 " + kv_name(kv) + " keys";
  if (!match.empty() && shape.find(match) == std::string::npos) return;
  const int blocks = ctx / 128;
  const int t = batch * s_q;
  BatchLayout L = decode_layout(be, batch, s_q, ctx, blocks);
  Tensor q = rnd(be, {t, heads, dim}, DType::kF32, 30);
  Tensor w = rnd(be, {t, heads}, DType::kF32, 31);
  Tensor cache = random_cache(be, (int64_t{batch} * blocks + 1) * (128 / ratio), dim, 0, kv, 32);
  auto& cuda_be = dynamic_cast<cuda::CudaBackend&>(be);
  using cuda::IndexerScoreKernel;
  using cuda::IndexerSelectKernel;
  auto run = [&](const cuda::IndexerRunOptions& opt) {
    (void)cuda::indexer_topk_run(cuda_be, q, w, cache, L, ratio, top_k, 0.0884f, 0.125f, opt);
  };
  const bool tensor_cores = kv != DType::kF32;  // what indexer_heuristics.h picks here
  // Keys each row scores: row j of a sequence sits at position ctx - s_q + j.
  double keys = 0;
  for (int j = 0; j < s_q; ++j) keys += static_cast<double>((ctx - s_q + j + 1) / ratio);
  const double bytes = batch * keys * cache.size(1) * dtype_size(kv);
  const double flops = batch * keys * heads * dim * 2.0;
  // A row over the index keys, graded against the run's copy roofline ("of_roofline": issue 11's
  // indexer goal is 0.75 of it at 32K and more).
  auto emit_keys = [&](const char* name, const std::string& label, double us) {
    emit_ratio(name, label, us, bytes, flops, bytes / us / 1e3 / copy_gbps);
  };
  const std::string tc = ", tensor-core scores", cc = ", cuda-core scores";
  auto op = [&] { run({}); };
  emit_keys("indexer_topk", shape + (tensor_cores ? tc : cc), time_us(be, iters, op));
  emit_keys("indexer_topk", shape + (tensor_cores ? tc : cc) + " (graph)",
            time_graph_us(be, iters, op));
  if (tensor_cores) {
    auto op_cc = [&] { run({.score_kernel = IndexerScoreKernel::kCudaCore}); };
    emit_keys("indexer_topk", shape + cc + " (graph)", time_graph_us(be, iters, op_cc));
  }
  const std::pair<IndexerSelectKernel, std::string> selections[] = {
      {IndexerSelectKernel::kAuto, ""},
      {IndexerSelectKernel::kBinned, ", binned: one wide block per row"},
      {IndexerSelectKernel::kRowSort,
       ", binned, rows of at most 1024 slots sorted whole (the default where binned runs)"},
      {IndexerSelectKernel::kOneBlock, ", one block per row"},
      {IndexerSelectKernel::kSplit, ", split over blocks"}};
  // The whole op with each selection kernel forced; the binned one only where a row fits its
  // shared memory (forced elsewhere, the op would run the heuristic's other choice).
  const bool binned_fits =
      cuda::indexer_binned_selection_fits(cuda_be, top_k, int64_t{blocks} * (128 / ratio));
  auto skipped = [&](IndexerSelectKernel k) {
    return (k == IndexerSelectKernel::kBinned || k == IndexerSelectKernel::kRowSort) &&
           !binned_fits;
  };
  for (const auto& [k, label] : selections) {
    if (k == IndexerSelectKernel::kAuto || skipped(k)) continue;
    auto op_forced = [&] { run({.select_kernel = k}); };
    emit_keys("indexer_topk", shape + (tensor_cores ? tc : cc) + ", selection" + label + " (graph)",
              time_graph_us(be, iters, op_forced));
  }
  // The stages apart, on a scores buffer of the caller's: [batch, blocks * entries per block].
  Tensor scores = be.empty({t, int64_t{blocks} * (128 / ratio)}, DType::kF32);
  float* sp = scores.data<float>();
  const std::pair<IndexerScoreKernel, std::string> kernels[] = {
      {IndexerScoreKernel::kTensorCore, tc},
      {IndexerScoreKernel::kTensorCoreOnePass, tc + ", q in one part (below the op's precision)"},
      {IndexerScoreKernel::kTensorCoreKeyRuns, tc + ", fp8 records copied in runs of a block"},
      {IndexerScoreKernel::kTensorCoreMmaSync, tc + ", mma.sync"},
      {IndexerScoreKernel::kTensorCoreWgmma, tc + ", wgmma: each key converted once for 64 heads"},
      {IndexerScoreKernel::kTensorCoreWgmmaPipelined,
       tc + ", wgmma pipelined: a producer warp's bulk copies, 3 scoring warpgroups per SM"},
      {IndexerScoreKernel::kTensorCoreWgmmaLoE4m3,
       tc + ", wgmma, q's lo part in e4m3 (below the op's precision)"},
      {IndexerScoreKernel::kCudaCore, cc}};
  for (const auto& [k, label] : kernels) {
    if (k != IndexerScoreKernel::kCudaCore && !tensor_cores) continue;
    const bool fp8_only =
        k == IndexerScoreKernel::kTensorCoreKeyRuns || k == IndexerScoreKernel::kTensorCoreMmaSync;
    if (fp8_only && kv != DType::kU8) continue;
    const bool wgmma = k == IndexerScoreKernel::kTensorCoreWgmma ||
                       k == IndexerScoreKernel::kTensorCoreWgmmaLoE4m3 ||
                       k == IndexerScoreKernel::kTensorCoreWgmmaPipelined;
    if (wgmma && (kv != DType::kU8 || !cuda::indexer_wgmma_runs(cuda_be))) continue;
    auto score_only = [&] { run({.score_kernel = k, .run_select = false, .scores = sp}); };
    emit_keys("indexer_scores", shape + label + " (graph)", time_graph_us(be, iters, score_only));
  }
  if (kv == DType::kU8) {
    // q in fp8, as the engine runs fp8 index keys (quantize_indexer_q, then the op's default
    // scores over the codes: on sm_90 the persistent kernel's e4m3 MMAs), and the quantization
    // alone (its bytes: q read, codes and weights written).
    const IndexerQFp8 q8 = be.quantize_indexer_q(q, w);
    auto fp8_q_scores = [&] {
      (void)cuda::indexer_topk_run(cuda_be, q8.q, q8.weights, cache, L, ratio, top_k, 0.0884f,
                                   0.125f, {.run_select = false, .scores = sp});
    };
    emit_keys("indexer_scores",
              shape + tc + ", q in fp8 (quantize_indexer_q; the default scores) (graph)",
              time_graph_us(be, iters, fp8_q_scores));
    // The same scores by each fp8 kernel forced (sm_90): the pipelined one and the persistent one
    // (indexer_score_wgmma_persistent.cu, the same bytes) with both conversion splits, the A/B,
    // and without conversion (e4m3 MMAs, not the same bytes: the default); then the whole op on
    // the persistent kernel with the 3-of-8 split.
    const std::pair<IndexerScoreKernel, std::string> fp8_q_kernels[] = {
        {IndexerScoreKernel::kTensorCoreWgmmaPipelined, ", wgmma pipelined"},
        {IndexerScoreKernel::kTensorCoreWgmmaPersistent,
         ", wgmma persistent: blocks over the flattened tiles, q from its codes, 3 of 8 k-steps "
         "converted by cvt"},
        {IndexerScoreKernel::kTensorCoreWgmmaPersistentCvt,
         ", wgmma persistent, every k-step converted by cvt"},
        {IndexerScoreKernel::kTensorCoreWgmmaPersistentFp8,
         ", wgmma persistent, codes on e4m3 MMAs (fp8 MMA sums, the default)"}};
    for (const auto& [k, label] : fp8_q_kernels) {
      if (!cuda::indexer_wgmma_runs(cuda_be)) break;
      auto forced_scores = [&] {
        (void)cuda::indexer_topk_run(cuda_be, q8.q, q8.weights, cache, L, ratio, top_k, 0.0884f,
                                     0.125f,
                                     {.score_kernel = k, .run_select = false, .scores = sp});
      };
      emit_keys("indexer_scores", shape + tc + ", q in fp8" + label + " (graph)",
                time_graph_us(be, iters, forced_scores));
    }
    if (cuda::indexer_wgmma_runs(cuda_be)) {
      auto persistent_op = [&] {
        (void)cuda::indexer_topk_run(
            cuda_be, q8.q, q8.weights, cache, L, ratio, top_k, 0.0884f, 0.125f,
            {.score_kernel = IndexerScoreKernel::kTensorCoreWgmmaPersistent});
      };
      emit_keys("indexer_topk", shape + tc + ", q in fp8, wgmma persistent scores (graph)",
                time_graph_us(be, iters, persistent_op));
    }
    auto fp8_q_op = [&] {
      const IndexerQFp8 r = be.quantize_indexer_q(q, w);
      (void)be.indexer_topk(r.q, r.weights, cache, L, ratio, top_k, 0.0884f, 0.125f);
    };
    emit_keys("indexer_topk", shape + tc + ", q in fp8: quantize_indexer_q + the op (graph)",
              time_graph_us(be, iters, fp8_q_op));
    auto quantize = [&] { (void)be.quantize_indexer_q(q, w); };
    emit("quantize_indexer_q", "T=" + std::to_string(t) + " h=64 d=128",
         time_graph_us(be, iters, quantize), t * heads * (dim * 5.0 + 8), 0);
  }
  run({.run_select = false, .scores = sp});  // the op's own scores, for the selection alone
  for (const auto& [k, label] : selections) {
    if (skipped(k)) continue;
    auto select_only = [&] { run({.select_kernel = k, .run_scores = false, .scores = sp}); };
    emit("indexer_select", shape + label + " (graph)", time_graph_us(be, iters, select_only),
         batch * keys * sizeof(float), 0);
  }
}

}  // namespace

void bench_indexer(Backend& be, int iters, const std::string& match) {
  // The copy roofline of the same run (bytes read + written), which the indexer's rows are graded
  // against (their "of_roofline"); `--match roofline` prints it alone.
  const double copy_gbps = match.empty() || match == "roofline"
                               ? emit_copy_roofline(be)
                               : copy_roofline_gbps(be, kCopyRooflineBytes);
  if (match == "roofline") return;
  for (const int ctx : {32768, 131072}) {
    for (const int batch : {1, 64})
      for (const DType kv : {DType::kF32, DType::kBF16, DType::kU8, DType::kE2M1x2})
        run_indexer(be, iters, batch, 1, ctx, kv, match, copy_gbps);
    // A batch four times larger over V4's fp8 index keys (the engine's format for FP8
    // checkpoints): the call's fixed part (launch, each block's first reads) weighs a quarter.
    run_indexer(be, iters, 256, 1, ctx, DType::kU8, match, copy_gbps);
  }
  // A short context over fp8 index keys: mostly the call's fixed part (launch, each block's
  // prologue and first copies, its tail). At B = 1 it is the model benchmark's decode row (1,024
  // entries at ratio 4), where the selection sorts the whole row.
  run_indexer(be, iters, 64, 1, 4096, DType::kU8, match, copy_gbps);
  run_indexer(be, iters, 1, 1, 4096, DType::kU8, match, copy_gbps);
  // Prefill: the last 1024-row chunk of a 32K prompt.
  for (const DType kv : {DType::kF32, DType::kBF16, DType::kU8, DType::kE2M1x2})
    run_indexer(be, iters, 1, 1024, 32768, kv, match, copy_gbps);
}

}  // namespace deepinfer::bench
