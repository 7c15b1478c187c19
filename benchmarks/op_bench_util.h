// Timing, input and output helpers the CUDA op benchmarks share (cuda_op_bench.cpp and the
// cuda_*_bench.cpp files it links).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "deepinfer/backend.h"
#include "tensor/kv_record.h"

namespace deepinfer::bench {

using Clock = std::chrono::steady_clock;

inline double time_us(Backend& be, int iters, const std::function<void()>& fn) {
  fn();  // warm up (allocations, cuBLAS heuristics)
  be.synchronize();
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) fn();
  be.synchronize();
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
}

// As time_us, for calls shorter than their launch cost: the `iters` calls are captured into one
// graph (as the model's decode step runs them), and the time is that of a replay over `iters`.
inline double time_graph_us(Backend& be, int iters, const std::function<void()>& fn) {
  fn();  // warm up outside the capture
  std::unique_ptr<Graph> graph = be.capture([&] {
    for (int i = 0; i < iters; ++i) fn();
  });
  graph->replay();
  be.synchronize();
  auto t0 = Clock::now();
  graph->replay();
  be.synchronize();
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
}

inline Tensor rnd(Backend& be, const Shape& shape, DType dtype, uint64_t seed, float std = 1.0f) {
  Tensor t = be.empty(shape, dtype);
  be.fill_random_normal(t, seed, 0.0f, std);
  return t;
}

// A host e4m3 tensor of random bytes with magnitudes up to 1.875 (exponent field <= 7, no NaN).
inline Tensor random_e4m3(const Shape& shape, uint32_t seed) {
  Tensor t = Tensor::zeros(shape, DType::kF8E4M3);
  std::mt19937 rng(seed);
  auto* p = static_cast<uint8_t*>(t.raw_data());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng() & 0xbfu);
  return t;
}

inline Tensor i32(Backend& be, const std::vector<int32_t>& v) {
  return be.upload(Tensor::from_vector(v, {static_cast<int64_t>(v.size())}), DType::kI32);
}

// Layout for B sequences each with one query row at position ctx-1 (decode) or s_q rows.
inline BatchLayout decode_layout(Backend& be, int batch, int s_q, int ctx, int blocks_per_seq) {
  std::vector<int32_t> ids, pos, seq, qs, ctxv, slot, table;
  for (int b = 0; b < batch; ++b) {
    qs.push_back(static_cast<int32_t>(ids.size()));
    ctxv.push_back(ctx - s_q);
    slot.push_back(b + 1);
    for (int j = 0; j < s_q; ++j) {
      ids.push_back(2);
      pos.push_back(ctx - s_q + j);
      seq.push_back(b);
    }
    for (int k = 0; k < blocks_per_seq; ++k) table.push_back(1 + b * blocks_per_seq + k);
  }
  qs.push_back(static_cast<int32_t>(ids.size()));
  BatchLayout L;
  L.num_tokens = static_cast<int>(ids.size());
  L.num_seqs = batch;
  L.block_size = 128;
  L.max_blocks_per_seq = blocks_per_seq;
  L.token_ids = i32(be, ids);
  L.positions = i32(be, pos);
  L.token_seq = i32(be, seq);
  L.seq_q_start = i32(be, qs);
  L.seq_ctx_len = i32(be, ctxv);
  L.seq_slot = i32(be, slot);
  L.block_table = be.upload(Tensor::from_vector(table, {batch, blocks_per_seq}), DType::kI32);
  return L;
}

inline void emit(const std::string& name, const std::string& shape, double us, double bytes,
                 double flops) {
  std::printf(
      "{\"op\": \"%s\", \"shape\": \"%s\", \"us\": %.3f, \"GBps\": %.1f, \"TFLOPs\": %.2f}\n",
      name.c_str(), shape.c_str(), us, bytes / us / 1e3, flops / us / 1e6);
  std::fflush(stdout);
}

// Device-to-device copy bandwidth (bytes read + written per second, GB/s) of a `bytes` buffer by
// copy_into: the roofline that bandwidth-bound rows are graded against. (A `scale` by 1.0 is no
// substitute: on the H200 it reads 3.1-3.6 TB/s where the copy reaches 4.2.)
inline double copy_roofline_gbps(Backend& be, int64_t bytes) {
  Tensor a = rnd(be, {bytes / 4}, DType::kF32, 41);
  Tensor b = be.empty({bytes / 4}, DType::kF32);
  const double us = time_us(be, 10, [&] { be.copy_into(b, a); });
  return 2.0 * static_cast<double>(bytes) / us / 1e3;
}

// The buffer the copy roofline rows copy: 2 GiB of f32.
constexpr int64_t kCopyRooflineBytes = int64_t{1} << 31;

// The copy roofline as a row of its own, printed next to the rows it grades; returns its GB/s.
inline double emit_copy_roofline(Backend& be) {
  const double gbps = copy_roofline_gbps(be, kCopyRooflineBytes);
  emit("roofline_copy(copy_into)", "2GiB f32",
       2.0 * static_cast<double>(kCopyRooflineBytes) / gbps / 1e3,
       2.0 * static_cast<double>(kCopyRooflineBytes), 0);
  return gbps;
}

inline void emit_ratio(const std::string& name, const std::string& shape, double us, double bytes,
                       double flops, double ratio) {
  const double gbps = us > 0 ? bytes / us / 1e3 : 0.0;
  const double tflops = us > 0 ? flops / us / 1e6 : 0.0;
  std::printf(
      "{\"op\": \"%s\", \"shape\": \"%s\", \"us\": %.3f, \"GBps\": %.1f, \"TFLOPs\": %.2f, "
      "\"of_roofline\": %.3f}\n",
      name.c_str(), shape.c_str(), us, gbps, tflops, ratio);
  std::fflush(stdout);
}

inline const char* kv_name(DType kv) {
  switch (kv) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kE2M1x2:
      return "v41-fp4";  // V4.1's FP4 records (e2m1, UE8M0 per 32 for index keys)
    default:
      return "fp8";
  }
}

// `rows` random key rows of `dim` channels in a cache of `kv`: drawn in f32 and written through
// scatter_rows, which encodes them as the model's writes do.
inline Tensor random_cache(Backend& be, int64_t rows, int64_t dim, int rope, DType kv,
                           uint64_t seed) {
  Tensor f32 = rnd(be, {rows, dim}, DType::kF32, seed);
  if (kv == DType::kF32) return f32;
  const int64_t width = kv_record::row_width(kv, dim, rope);
  Tensor cache = be.empty({rows, width}, kv);
  std::vector<int32_t> dest(static_cast<size_t>(rows));
  std::iota(dest.begin(), dest.end(), 0);
  be.scatter_rows(cache, f32, i32(be, dest), rope);
  return cache;
}

}  // namespace deepinfer::bench
