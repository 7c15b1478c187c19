// The V4.1 ops at V4.1-Flash widths (cuda_v41_bench.h), run by cuda_op_bench --only v41.
#include "cuda_v41_bench.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "op_bench_util.h"
#include "tensor/kv_record.h"

namespace deepinfer::bench {

namespace {

constexpr int64_t kHidden = 5120;  // V4.1-Flash
constexpr int kHcMult = 4;

// Decode sizes are replayed from a graph (their device time is below the launch cost).
double time_tokens_us(Backend& be, int iters, int64_t tokens, const std::function<void()>& fn) {
  return tokens <= 256 ? time_graph_us(be, iters, fn) : time_us(be, iters, fn);
}

std::string tokens_shape(int64_t tokens, const std::string& rest) {
  return "T=" + std::to_string(tokens) + " " + rest + (tokens <= 256 ? " (graph)" : "");
}

void bench_hc(Backend& be, int iters, int64_t tokens) {
  const int64_t width = kHcMult * kHidden;
  const int64_t fn_rows = (2 + kHcMult) * kHcMult;
  Tensor X = rnd(be, {tokens, kHcMult, kHidden}, DType::kF32, 40);
  Tensor fn = rnd(be, {fn_rows, width}, DType::kF32, 41, 0.01f);
  Tensor base = rnd(be, {fn_rows}, DType::kF32, 42);
  Tensor scale = rnd(be, {3}, DType::kF32, 43);
  Tensor prev = rnd(be, {tokens, kHcMult}, DType::kF32, 44);
  HcParams p;
  p.norm_eps = 1e-20f;
  // X is read by the norm, the mix GEMM and the collapse; fn once.
  const double x_bytes = tokens * width * 4.0;
  emit("hc_pre_shifted", tokens_shape(tokens, "N=4 H=5120"),
       time_tokens_us(be, iters, tokens,
                      [&] { (void)be.hc_pre_shifted(X, fn, base, scale, prev, p); }),
       3 * x_bytes + fn_rows * width * 4.0 + tokens * kHidden * 4.0,
       2.0 * tokens * fn_rows * width);
  emit("hc_collapse", tokens_shape(tokens, "N=4 H=5120"),
       time_tokens_us(be, iters, tokens, [&] { (void)be.hc_collapse(X, prev); }),
       x_bytes + tokens * kHidden * 4.0, 2.0 * tokens * width);
}

void bench_engram(Backend& be, int iters, int64_t tokens) {
  // Layer 14's hash constants at V4.1-Flash sizes (n = 4, 8 heads, primes above 16M).
  EngramHashParams params;
  params.multipliers = {67716810739261, 51510806800915, 30921347202721, 82619226485591};
  for (int64_t i = 0; i < 24; ++i) params.primes.push_back(16000477 + 2 * i);
  params.heads = 8;
  params.pad_id = 2;
  const int32_t vocab = 129280;
  std::vector<int32_t> ngram, map;
  for (int64_t i = 0; i < tokens * 4; ++i) ngram.push_back(static_cast<int32_t>(i * 7919 % vocab));
  for (int32_t v = 0; v < vocab; ++v) map.push_back(v % 99092);
  Tensor ng = be.upload(Tensor::from_vector(ngram, {tokens, 4}), DType::kI32);
  Tensor token_map = i32(be, map);
  emit("engram_hash", tokens_shape(tokens, "n=4 heads=8"),
       time_tokens_us(be, iters, tokens, [&] { (void)be.engram_hash(ng, token_map, params); }),
       tokens * (4 * 4.0 + 4 * 4.0 + 24 * 4.0), 0);

  Tensor X = rnd(be, {tokens, kHcMult, kHidden}, DType::kF32, 45);
  Tensor kv = rnd(be, {tokens, (kHcMult + 1) * kHidden}, DType::kF32, 46);
  Tensor wq = rnd(be, {kHcMult, kHidden}, DType::kF32, 47);
  Tensor wk = rnd(be, {kHcMult, kHidden}, DType::kF32, 48);
  // X, the keys and the value read (the value once per stream), X written.
  const double bytes = tokens * kHcMult * kHidden * 4.0 * 4 + 2.0 * kHcMult * kHidden * 4;
  emit("engram_gate", tokens_shape(tokens, "N=4 H=5120"),
       time_tokens_us(be, iters, tokens, [&] { (void)be.engram_gate(X, kv, wq, wk, 1e-20f); }),
       bytes, tokens * kHcMult * kHidden * 8.0);
}

// Decode rows of `batch` sequences at `ctx` index entries (ratio 1: one entry per token), over
// f32, bf16 or V4.1 FP4 index keys (kE2M1x2: what kv_cache_dtype "fp8" stores, written through
// scatter_rows as the model writes them).
void bench_candidates(Backend& be, int iters, int batch, int ctx, DType keys) {
  const int heads = 32, dim = 128, ratio = 1, block_entries = 8, top_blocks = 2048, top_k = 512;
  const int blocks = ctx / 128;
  BatchLayout L = decode_layout(be, batch, 1, ctx, blocks);
  Tensor q = rnd(be, {batch, heads, dim}, DType::kF32, 50);
  Tensor w = rnd(be, {batch, heads}, DType::kF32, 51);
  const int64_t rows = (int64_t{batch} * blocks + 1) * 128;
  Tensor cache;
  if (keys == DType::kE2M1x2) {
    cache = be.empty({rows, kv_record::row_width(keys, dim, 0)}, keys);
    std::vector<int32_t> dest(static_cast<size_t>(rows));
    std::iota(dest.begin(), dest.end(), 0);
    be.scatter_rows(cache, rnd(be, {rows, dim}, DType::kF32, 52), i32(be, dest), 0);
  } else {
    cache = rnd(be, {rows, dim}, keys, 52);
  }
  const char* key_name = keys == DType::kF32 ? "f32" : keys == DType::kBF16 ? "bf16" : "v41-fp4";
  const std::string shape = "B=" + std::to_string(batch) + " ctx=" + std::to_string(ctx) +
                            " h=32 d=128 be=8 " + key_name + " keys";
  const double key_bytes = static_cast<double>(kv_record::RowCodec{keys, dim, 0}.row_bytes());
  Tensor cand;
  auto candidates = [&] {
    cand = be.indexer_candidates(q, w, cache, L, ratio, block_entries, top_blocks, 0.0884f, 1.0f);
  };
  const double all_bytes = static_cast<double>(batch) * ctx * key_bytes;
  const double all_flops = static_cast<double>(batch) * ctx * heads * dim * 2.0;
  emit("indexer_candidates", shape + " top2048", time_us(be, iters, candidates), all_bytes,
       all_flops);
  emit("indexer_candidates", shape + " top2048 (graph)", time_graph_us(be, iters, candidates),
       all_bytes, all_flops);
  auto in_candidates = [&] {
    (void)be.indexer_topk_in_candidates(q, w, cache, L, ratio, cand, block_entries, top_k, 0.0884f,
                                        1.0f);
  };
  const double scored = static_cast<double>(batch) * std::min(ctx, top_blocks * block_entries);
  emit("indexer_topk_in_candidates", shape + " kb2048 top512", time_us(be, iters, in_candidates),
       scored * key_bytes, scored * heads * dim * 2.0);
  emit("indexer_topk_in_candidates", shape + " kb2048 top512 (graph)",
       time_graph_us(be, iters, in_candidates), scored * key_bytes, scored * heads * dim * 2.0);
}

}  // namespace

void bench_v41(Backend& be, int iters) {
  for (const int64_t tokens : {1, 64, 256, 4096}) {
    bench_hc(be, tokens > 256 ? std::min(iters, 10) : iters, tokens);
    bench_engram(be, tokens > 256 ? std::min(iters, 10) : iters, tokens);
  }
  for (const int ctx : {32768, 131072})
    for (const int batch : {1, 64})
      for (const DType keys : {DType::kF32, DType::kBF16, DType::kE2M1x2})
        bench_candidates(be, iters, batch, ctx, keys);
}

}  // namespace deepinfer::bench
