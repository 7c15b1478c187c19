// KV cache dtypes (docs/model.md#kv-cache-dtypes): the fp8 / bf16 row records of
// tensor/kv_record.h, and the CPU cache ops on bf16 / fp8 caches. The ops are checked against
// the f32 ops run on the dequantized cache contents, so the quantization is the only difference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "cpu_test_util.h"
#include "deepinfer/backend.h"
#include "deepinfer/config.h"
#include "deepinfer/dtype.h"
#include "deepinfer/error.h"
#include "model/cache_tensors.h"
#include "tensor/kv_record.h"

namespace deepinfer {
namespace {

using kv_record::RowCodec;
using testing::fetch_f32;
using testing::fetch_i32;
using testing::HostLayout;
using testing::SeqSpec;
using testing::sz;

// ---- records ---------------------------------------------------------------------------------

TEST(KvRecord, ByteCounts) {
  EXPECT_EQ(kv_record::main_record_bytes(512, 64), 584);  // 448 + 128 + 7 -> 584
  EXPECT_EQ(kv_record::index_record_bytes(128), 132);
  EXPECT_EQ(kv_record::main_record_bytes(6, 2), 16);      // 4 + 4 + 1 -> 16
  EXPECT_EQ(kv_record::main_record_bytes(100, 20), 128);  // 80 + 40 + 2 = 122 -> 128
}

TEST(KvRecord, ScaleIsThePowerOfTwoAboveAmaxOver448) {
  EXPECT_EQ(kv_record::fp8_scale(448.0f), 1.0f);
  EXPECT_EQ(kv_record::fp8_scale(449.0f), 2.0f);
  EXPECT_EQ(kv_record::fp8_scale(3.0f), std::ldexp(1.0f, -7));
  EXPECT_EQ(kv_record::fp8_scale(0.0f), std::ldexp(1.0f, -22));  // amax clamped to 1e-4
}

// A hand-made record, byte by byte: non-RoPE {1, -2, 0.5, 3} (amax 3: scale 2^-7, so 128, -256,
// 64, 384 in e4m3), RoPE {1, -0.5} in bf16, the scale byte 127 - 7, zero padding to 16.
TEST(KvRecord, MainRecordPinnedByteByByte) {
  const float x[6] = {1.0f, -2.0f, 0.5f, 3.0f, 1.0f, -0.5f};
  std::vector<uint8_t> rec(16, 0xAA);
  kv_record::encode_main(x, 6, 2, rec.data());
  const std::vector<uint8_t> want = {0x70, 0xF8, 0x68, 0x7C, 0x80, 0x3F, 0x00, 0xBF,
                                     0x78, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(rec, want);
  float back[6];
  kv_record::decode_main(rec.data(), 6, 2, back);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(back[i], x[i]) << i;
}

TEST(KvRecord, IndexRecordPinnedByteByByte) {
  const float x[4] = {1.0f, -2.0f, 0.5f, 3.0f};
  std::vector<uint8_t> rec(8, 0xAA);
  kv_record::encode_index(x, 4, rec.data());
  // e4m3 values, then the f32 scale 2^-7 (0x3C000000) little endian.
  const std::vector<uint8_t> want = {0x70, 0xF8, 0x68, 0x7C, 0x00, 0x00, 0x00, 0x3C};
  EXPECT_EQ(rec, want);
  float back[4];
  kv_record::decode_index(rec.data(), 4, back);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back[i], x[i]) << i;
}

// Values already on the grid (e4m3 times the group's scale, the group's amax setting exactly
// that scale; bf16 RoPE channels) come back exactly.
TEST(KvRecord, GridValuesRoundTripExactly) {
  testing::Rng rng(7);
  const int64_t dim = 512, rope = 64;
  std::vector<float> x(dim);
  for (int64_t g = 0; g < (dim - rope) / 64; ++g) {
    const float scale = std::ldexp(1.0f, static_cast<int>(g) * 3 - 10);
    for (int64_t c = 0; c < 64; ++c) {
      const float v = round_to_f8e4m3(rng.uniform(1, -448, 448)[0]);
      x[sz(g * 64 + c)] = v * scale;
    }
    x[sz(g * 64 + 5)] = -448.0f * scale;  // amax sets the scale
  }
  for (int64_t c = dim - rope; c < dim; ++c) {
    x[sz(c)] = bf16_to_f32(f32_to_bf16(rng.uniform(1, -100, 100)[0]));
  }
  for (DType dtype : {DType::kU8, DType::kBF16}) {
    const RowCodec codec{dtype, dim, dtype == DType::kU8 ? rope : 0};
    if (dtype == DType::kBF16) {
      for (float& v : x) v = bf16_to_f32(f32_to_bf16(v));
    }
    std::vector<uint8_t> rec(sz(codec.row_bytes()));
    std::vector<float> back(sz(dim));
    codec.encode(x.data(), rec.data());
    codec.decode(rec.data(), back.data());
    EXPECT_EQ(back, x) << dtype_name(dtype);
  }
  // Index keys: one scale for the key.
  std::vector<float> key(128);
  for (float& v : key) v = round_to_f8e4m3(rng.uniform(1, -448, 448)[0]) * 0.25f;
  key[3] = 448.0f * 0.25f;
  std::vector<uint8_t> rec(132);
  std::vector<float> back(128);
  kv_record::encode_index(key.data(), 128, rec.data());
  kv_record::decode_index(rec.data(), 128, back.data());
  EXPECT_EQ(back, key);
}

// Off the grid: e4m3 keeps 3 mantissa bits (relative error <= 2^-4, subnormals below 2^-6 of
// the scale have an absolute error <= 2^-10 scale); bf16 keeps 7 (relative error <= 2^-8).
TEST(KvRecord, RandomValuesStayWithinTheFormatsError) {
  testing::Rng rng(11);
  const int64_t dim = 100, rope = 20;  // a partial last group: 80 = 64 + 16 non-RoPE channels
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> x = rng.uniform(sz(dim), -3, 3);
    x[sz(trial % dim)] *= 1000.0f;  // one outlier per record
    std::vector<uint8_t> rec(128);
    std::vector<float> back(sz(dim));
    kv_record::encode_main(x.data(), dim, rope, rec.data());
    kv_record::decode_main(rec.data(), dim, rope, back.data());
    for (int64_t g = 0; g < 2; ++g) {
      const int64_t c0 = g * 64, c1 = std::min<int64_t>(dim - rope, c0 + 64);
      float amax = 0;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(x[sz(c)]));
      const float scale = kv_record::fp8_scale(amax);
      for (int64_t c = c0; c < c1; ++c) {
        const float err = std::fabs(back[sz(c)] - x[sz(c)]);
        EXPECT_LE(err, std::fabs(x[sz(c)]) * 0.0625f + scale * std::ldexp(1.0f, -10)) << c;
      }
    }
    for (int64_t c = dim - rope; c < dim; ++c) {
      EXPECT_LE(std::fabs(back[sz(c)] - x[sz(c)]), std::fabs(x[sz(c)]) * std::ldexp(1.0f, -8));
    }
  }
}

// ---- ops on quantized caches -------------------------------------------------------------------

class KvCacheOpsTest : public testing::BackendTest {
 protected:
  // The rows of a cache tensor decoded to f32 [rows, dim] (through the host).
  std::vector<float> decode_cache(const Tensor& cache, int64_t dim, int64_t rope) {
    Tensor h = be->to_host(cache);
    const RowCodec codec{h.dtype(), dim, rope};
    const int64_t rows = h.numel() / codec.row_width();
    std::vector<float> out(sz(rows * dim));
    const auto* p = static_cast<const uint8_t*>(h.raw_data());
    for (int64_t r = 0; r < rows; ++r) codec.decode(p + r * codec.row_bytes(), &out[sz(r * dim)]);
    return out;
  }
  std::vector<float> round_trip(const std::vector<float>& rows, DType dtype, int64_t dim,
                                int64_t rope) {
    const RowCodec codec{dtype, dim, rope};
    std::vector<uint8_t> rec(sz(codec.row_bytes()));
    std::vector<float> out(rows.size());
    for (size_t r = 0; r < rows.size() / sz(dim); ++r) {
      codec.encode(&rows[r * sz(dim)], rec.data());
      codec.decode(rec.data(), &out[r * sz(dim)]);
    }
    return out;
  }
  // The attention tests' batch: a 5-token chunk from 0, a decode row, a 9-token chunk, over
  // rows of 100 channels (20 RoPE), 3 heads, window 8 in rings of 10, ratio 4 in blocks of 8.
  struct AttnGeometry {
    int64_t dim = 100, rope = 20, heads = 3, window = 8, ring_len = 10, slots = 3;
    int ratio = 4, block = 8, max_blocks = 5;
    std::vector<SeqSpec> seqs = {{0, 5, 2}, {37, 1, 0}, {20, 9, 1}};
    // Blocks 1, 2, ... in order, max_blocks per sequence.
    std::vector<int32_t> table() const {
      std::vector<int32_t> t(sz(seqs.size()) * sz(max_blocks));
      std::iota(t.begin(), t.end(), 1);
      return t;
    }
  };
  // Each token's sparse top-3: its last visible entry and the ones 2 and 4 before (-1: none).
  static std::vector<int32_t> three_entries(const HostLayout& hl, int ratio) {
    std::vector<int32_t> topk;
    for (int64_t t = 0; t < hl.num_tokens(); ++t) {
      const int n = (hl.positions[sz(t)] + 1) / ratio;
      for (int k = 0; k < 3; ++k) topk.push_back(n - 1 - 2 * k >= 0 ? n - 1 - 2 * k : -1);
    }
    return topk;
  }
  // A cache of `rows` rows in `dtype` holding `values` [n, dim] at `dest` (others zero),
  // written by scatter_rows.
  Tensor cache_of(DType dtype, int64_t rows, int64_t dim, int64_t rope,
                  const std::vector<float>& values, const std::vector<int32_t>& dest) {
    Tensor cache = be->zeros({rows, kv_record::row_width(dtype, dim, rope)}, dtype);
    const auto n = static_cast<int64_t>(dest.size());
    be->scatter_rows(cache, up(values, {n, dim}), up_i(dest, {n}), static_cast<int>(rope));
    return cache;
  }
};

TEST_F(KvCacheOpsTest, ScatterAndRingWriteStoreEncodedRecords) {
  const int64_t dim = 100, rope = 20, slots = 2, len = 4;
  for (DType dtype : {DType::kBF16, DType::kU8}) {
    const RowCodec codec{dtype, dim, rope};
    auto rows = rng.uniform(sz(3 * dim), -5, 5);
    Tensor cache = cache_of(dtype, 6, dim, rope, rows, {4, -1, 1});
    Tensor host = be->to_host(cache);
    const auto* bytes = static_cast<const uint8_t*>(host.raw_data());
    std::vector<uint8_t> rec(sz(codec.row_bytes()));
    for (auto [i, row] : {std::pair{0, 4}, std::pair{2, 1}}) {
      codec.encode(&rows[sz(i * dim)], rec.data());
      EXPECT_EQ(0, std::memcmp(bytes + row * codec.row_bytes(), rec.data(), rec.size()))
          << dtype_name(dtype) << " row " << row;
    }
    // ring_write: sequence 0 (slot 1) writes positions 0..5 of which the last 4 survive.
    HostLayout hl({{0, 6, 1}}, 8, 1);
    auto kv = rng.uniform(sz(6 * dim), -5, 5);
    Tensor ring = be->zeros({slots, len, codec.row_width()}, dtype);
    be->ring_write(ring, up(kv, {6, dim}), hl.upload(*be), static_cast<int>(rope));
    const std::vector<float> got = decode_cache(ring, dim, rope);
    const std::vector<float> stored = round_trip(kv, dtype, dim, rope);
    for (int64_t p = 0; p < 6; ++p) {
      if (p < 2) continue;  // overwritten
      const int64_t r = 1 * len + p % len;
      EXPECT_TRUE(std::equal(stored.begin() + p * dim, stored.begin() + (p + 1) * dim,
                             got.begin() + r * dim))
          << dtype_name(dtype) << " position " << p;
    }
    for (int64_t i = 0; i < len * dim; ++i) EXPECT_EQ(got[sz(i)], 0.0f);  // slot 0 untouched
  }
}

// Attention over a quantized SWA ring and entry cache equals the f32 op run on the decoded
// caches and on this call's keys passed through the same format, bit for bit.
TEST_F(KvCacheOpsTest, AttentionReadsThroughTheFormat) {
  const AttnGeometry g;
  const int64_t dim = g.dim, rope = g.rope, heads = g.heads, W = g.window, len = g.ring_len,
                slots = g.slots;
  const int ratio = g.ratio, epb = g.block / g.ratio, max_blocks = g.max_blocks;
  const std::vector<SeqSpec> seqs = g.seqs;
  std::vector<int32_t> table = g.table();
  std::shuffle(table.begin(), table.end(), rng.engine());
  HostLayout hl(seqs, g.block, max_blocks, table);
  const int64_t T = hl.num_tokens(), entry_rows = (1 + 3 * max_blocks) * epb;
  // The ring: each sequence's past keys at their ring rows; entries: every visible entry.
  std::vector<float> ring_rows, entry_values;
  std::vector<int32_t> ring_dest, entry_dest;
  for (size_t b = 0; b < seqs.size(); ++b) {
    for (int64_t p = std::max<int64_t>(0, seqs[b].ctx - len); p < seqs[b].ctx; ++p) {
      auto r = rng.uniform(sz(dim), -2, 2);
      ring_rows.insert(ring_rows.end(), r.begin(), r.end());
      ring_dest.push_back(static_cast<int32_t>(seqs[b].slot * len + p % len));
    }
    for (int j = 0; j < (seqs[b].ctx + seqs[b].q) / ratio; ++j) {
      auto r = rng.uniform(sz(dim), -2, 2);
      entry_values.insert(entry_values.end(), r.begin(), r.end());
      entry_dest.push_back(table[b * max_blocks + sz(j / epb)] * epb + j % epb);
    }
  }
  auto q = rng.uniform(sz(T * heads * dim));
  auto kv = rng.uniform(sz(T * dim), -2, 2);
  auto sinks = rng.uniform(sz(heads), -1, 2);
  const std::vector<int32_t> topk = three_entries(hl, ratio);
  for (DType dtype : {DType::kBF16, DType::kU8}) {
    Tensor ring = cache_of(dtype, slots * len, dim, rope, ring_rows, ring_dest)
                      .reshape({slots, len, kv_record::row_width(dtype, dim, rope)});
    Tensor entries = cache_of(dtype, entry_rows, dim, rope, entry_values, entry_dest);
    const std::vector<float> ring_f32 = decode_cache(ring, dim, rope);
    const std::vector<float> entries_f32 = decode_cache(entries, dim, rope);
    const std::vector<float> kv_stored = round_trip(kv, dtype, dim, rope);
    ASSERT_NE(kv_stored, kv);  // the format does round
    for (bool sparse : {false, true}) {
      AttentionSpec spec{static_cast<int>(W), 0.3f, ratio, sparse};
      Tensor topk_t = sparse ? up_i(topk, {T, 3}) : Tensor();
      AttentionSpec quant = spec;
      quant.rope_dim = static_cast<int>(rope);
      auto got =
          fetch_f32(*be, be->attention(up(q, {T, heads, dim}), up(kv, {T, dim}), ring, entries,
                                       topk_t, up(sinks, {heads}), hl.upload(*be), quant));
      auto want = fetch_f32(
          *be, be->attention(up(q, {T, heads, dim}), up(kv_stored, {T, dim}),
                             up(ring_f32, {slots, len, dim}), up(entries_f32, {entry_rows, dim}),
                             topk_t, up(sinks, {heads}), hl.upload(*be), spec));
      EXPECT_EQ(got, want) << dtype_name(dtype) << (sparse ? " sparse" : " dense");
    }
  }
}

TEST_F(KvCacheOpsTest, IndexerReadsThroughTheFormat) {
  const int64_t di = 64, heads = 4;
  const int ratio = 4, block = 16, epb = block / ratio, max_blocks = 13;
  const std::vector<SeqSpec> seqs = {{200, 1, 0}, {95, 6, 0}};
  std::vector<int32_t> table(sz(2 * max_blocks));
  std::iota(table.begin(), table.end(), 1);
  std::shuffle(table.begin(), table.end(), rng.engine());
  HostLayout hl(seqs, block, max_blocks, table);
  const int64_t T = hl.num_tokens(), rows = (1 + 2 * max_blocks) * epb;
  std::vector<float> keys;
  std::vector<int32_t> dest;
  for (size_t b = 0; b < seqs.size(); ++b) {
    for (int j = 0; j < (seqs[b].ctx + seqs[b].q) / ratio; ++j) {
      auto r = rng.uniform(sz(di));
      keys.insert(keys.end(), r.begin(), r.end());
      dest.push_back(table[b * max_blocks + sz(j / epb)] * epb + j % epb);
    }
  }
  auto q = rng.uniform(sz(T * heads * di));
  auto w = rng.uniform(sz(T * heads));
  for (DType dtype : {DType::kBF16, DType::kU8}) {
    Tensor cache = cache_of(dtype, rows, di, 0, keys, dest);
    EXPECT_EQ(cache.size(1), dtype == DType::kU8 ? di + 4 : di);
    auto got = fetch_i32(*be, be->indexer_topk(up(q, {T, heads, di}), up(w, {T, heads}), cache,
                                               hl.upload(*be), ratio, 10, 0.17f, 0.5f));
    auto want = fetch_i32(*be, be->indexer_topk(up(q, {T, heads, di}), up(w, {T, heads}),
                                                up(decode_cache(cache, di, 0), {rows, di}),
                                                hl.upload(*be), ratio, 10, 0.17f, 0.5f));
    EXPECT_EQ(got, want) << dtype_name(dtype);
  }
}

TEST_F(KvCacheOpsTest, FrontNamesTheCacheArgument) {
  const int64_t dim = 100, rope = 20;
  auto rows = rng.uniform(sz(2 * dim));
  // An fp8 main cache is 128 bytes a row here; 132 (the index record) is wrong with rope_dim 20.
  Tensor wrong = be->zeros({4, 132}, DType::kU8);
  expect_error(
      [&] {
        be->scatter_rows(wrong, up(rows, {2, dim}), up_i({0, 1}, {2}), rope);
      },
      ErrorCode::kInvalidArgument, "scatter_rows: argument cache must be u8[*, 128]");
  Tensor f16 = be->zeros({4, dim}, DType::kF16);
  expect_error(
      [&] {
        be->scatter_rows(f16, up(rows, {2, dim}), up_i({0, 1}, {2}));
      },
      ErrorCode::kInvalidArgument,
      "argument cache must be (f32 or bf16 or f8_e4m3 or e2m1x2 or u8)");
  HostLayout hl({{0, 2, 0}}, 8, 1);
  Tensor ring = be->zeros({1, 4, dim}, DType::kBF16);
  be->ring_write(ring, up(rows, {2, dim}), hl.upload(*be), rope);  // bf16: rope_dim ignored
  expect_error(
      [&] {
        be->ring_write(be->zeros({1, 4, 99}, DType::kBF16), up(rows, {2, dim}), hl.upload(*be),
                       rope);
      },
      ErrorCode::kInvalidArgument, "ring_write: argument ring must be bf16[*, *, 100]");
  // copy_rows moves records as bytes (prefix-cache snapshots of the rings).
  Tensor bytes = cache_of(DType::kU8, 4, dim, rope, rows, {0, 1});
  be->copy_rows(bytes, up_i({0, 1}, {2}), up_i({2, 3}, {2}));
  const auto all = decode_cache(bytes, dim, rope);
  EXPECT_TRUE(std::equal(all.begin(), all.begin() + 2 * dim, all.begin() + 2 * dim));
}

// ---- this call's keys encoded where they are made (rms_norm_rope_kv) ---------------------------

// rms_norm_rope_kv's rows are rms_norm_rope's result encoded by the codec, byte for byte (f32:
// that result), weighted or not, at a tiny record (a partial scale group) and at V4's, in V4's
// formats and V4.1's FP8 record.
TEST_F(KvCacheOpsTest, RmsNormRopeKvIsTheEncodedNormRope) {
  struct Dims {
    int64_t dim, rope;
  };
  for (const Dims d : {Dims{100, 20}, Dims{512, 64}}) {
    const int64_t t = 5;
    Tensor x = up(rng.uniform(sz(t * d.dim), -3, 3), {t, d.dim});
    Tensor pos = up_i({0, 7, 4095, 100000, 3}, {t});
    std::vector<float> freq(sz(d.rope / 2));
    for (size_t i = 0; i < freq.size(); ++i) freq[i] = std::pow(10000.0f, -2.0f * i / d.rope);
    Tensor inv_freq = up(freq, {d.rope / 2});
    for (const bool weighted : {false, true}) {
      Tensor w = weighted ? up(rng.uniform(sz(d.dim), 0.5, 1.5), {d.dim}) : Tensor();
      const std::vector<float> f32 = fetch_f32(*be, be->rms_norm_rope(x, w, 1e-6f, pos, inv_freq));
      for (DType dtype : {DType::kF32, DType::kBF16, DType::kU8, DType::kF8E4M3}) {
        const RowCodec codec{dtype, d.dim, d.rope};
        Tensor rows = be->to_host(
            be->rms_norm_rope_kv(x, w, 1e-6f, pos, inv_freq, dtype, static_cast<int>(d.rope)));
        ASSERT_EQ(rows.dtype(), dtype);
        ASSERT_EQ(rows.shape(), (Shape{t, codec.row_width()}));
        std::vector<uint8_t> want(sz(t * codec.row_bytes()));
        for (int64_t r = 0; r < t; ++r) {
          codec.encode(&f32[sz(r * d.dim)], want.data() + r * codec.row_bytes());
        }
        EXPECT_EQ(0, std::memcmp(rows.raw_data(), want.data(), want.size()))
            << dtype_name(dtype) << " dim " << d.dim << (weighted ? " weighted" : "");
      }
    }
  }
}

// Keys passed in the ring's format read and store as the same keys passed in f32: ring_write
// stores the same bytes, attention returns the same bits (dense and sparse entries, a prefill
// chunk, decode rows).
TEST_F(KvCacheOpsTest, EncodedKeysAreTheF32Keys) {
  const AttnGeometry g;
  const int64_t dim = g.dim, rope = g.rope, heads = g.heads, W = g.window, len = g.ring_len,
                slots = g.slots;
  const int ratio = g.ratio, epb = g.block / g.ratio, max_blocks = g.max_blocks;
  HostLayout hl(g.seqs, g.block, max_blocks, g.table());
  const int64_t T = hl.num_tokens(), entry_rows = (1 + 3 * max_blocks) * epb;
  auto q = rng.uniform(sz(T * heads * dim));
  auto kv = rng.uniform(sz(T * dim), -2, 2);
  auto sinks = rng.uniform(sz(heads), -1, 2);
  const std::vector<int32_t> topk = three_entries(hl, ratio);
  for (DType dtype : {DType::kBF16, DType::kU8}) {
    const RowCodec codec{dtype, dim, rope};
    std::vector<uint8_t> records(sz(T * codec.row_bytes()));
    for (int64_t t = 0; t < T; ++t) {
      codec.encode(&kv[sz(t * dim)], records.data() + t * codec.row_bytes());
    }
    Tensor host = Tensor::zeros({T, codec.row_width()}, dtype);
    std::memcpy(host.raw_data(), records.data(), records.size());
    Tensor kv_rows = be->upload(host, dtype);
    // ring_write: the same bytes from f32 rows and from records.
    Tensor ring_f32 = be->zeros({slots, len, codec.row_width()}, dtype);
    Tensor ring_rec = be->zeros({slots, len, codec.row_width()}, dtype);
    be->ring_write(ring_f32, up(kv, {T, dim}), hl.upload(*be), static_cast<int>(rope));
    be->ring_write(ring_rec, kv_rows, hl.upload(*be), static_cast<int>(rope));
    Tensor a = be->to_host(ring_f32), b = be->to_host(ring_rec);
    EXPECT_EQ(0, std::memcmp(a.raw_data(), b.raw_data(), a.nbytes())) << dtype_name(dtype);
    // attention: the same bits, over the ring just written and random entries.
    Tensor entries =
        cache_of(dtype, entry_rows, dim, rope, rng.uniform(sz(entry_rows * dim), -2, 2), [&] {
          std::vector<int32_t> d(sz(entry_rows));
          std::iota(d.begin(), d.end(), 0);
          return d;
        }());
    for (bool sparse : {false, true}) {
      AttentionSpec spec{static_cast<int>(W), 0.3f, ratio, sparse};
      spec.rope_dim = static_cast<int>(rope);
      Tensor topk_t = sparse ? up_i(topk, {T, 3}) : Tensor();
      auto from_f32 =
          fetch_f32(*be, be->attention(up(q, {T, heads, dim}), up(kv, {T, dim}), ring_f32, entries,
                                       topk_t, up(sinks, {heads}), hl.upload(*be), spec));
      auto from_rows =
          fetch_f32(*be, be->attention(up(q, {T, heads, dim}), kv_rows, ring_f32, entries, topk_t,
                                       up(sinks, {heads}), hl.upload(*be), spec));
      EXPECT_EQ(from_f32, from_rows) << dtype_name(dtype) << (sparse ? " sparse" : " dense");
    }
  }
}

// The fronts name the argument: keys in another format than the ring's, records of the wrong
// width, an output format that is no KV cache dtype.
TEST_F(KvCacheOpsTest, EncodedKeysNameTheirArgument) {
  const int64_t dim = 100, rope = 20;
  HostLayout hl({{0, 2, 0}}, 8, 1);
  const RowCodec fp8{DType::kU8, dim, rope};
  Tensor ring = be->zeros({1, 4, fp8.row_width()}, DType::kU8);
  Tensor sinks = up(rng.uniform(2), {2});
  Tensor q = up(rng.uniform(sz(2 * 2 * dim)), {2, 2, dim});
  AttentionSpec spec{8, 0.3f, 0, false};
  spec.rope_dim = static_cast<int>(rope);
  expect_error(
      [&] {
        be->attention(q, be->zeros({2, dim}, DType::kBF16), ring, Tensor(), Tensor(), sinks,
                      hl.upload(*be), spec);
      },
      ErrorCode::kInvalidArgument, "attention: argument kv bf16[2, 100]");
  expect_error(
      [&] {
        be->attention(q, be->zeros({2, fp8.row_width() - 8}, DType::kU8), ring, Tensor(), Tensor(),
                      sinks, hl.upload(*be), spec);
      },
      ErrorCode::kInvalidArgument, "attention: argument kv must be u8[2, 128]");
  expect_error(
      [&] {
        be->ring_write(ring, be->zeros({2, fp8.row_width() + 8}, DType::kU8), hl.upload(*be),
                       static_cast<int>(rope));
      },
      ErrorCode::kInvalidArgument, "ring_write: argument rows must be u8[2, 128]");
  Tensor x = up(rng.uniform(sz(2 * dim)), {2, dim});
  Tensor freq = up(rng.uniform(sz(rope / 2)), {rope / 2});
  expect_error(
      [&] {
        be->rms_norm_rope_kv(x, Tensor(), 1e-6f, up_i({0, 1}, {2}), freq, DType::kI32,
                             static_cast<int>(rope));
      },
      ErrorCode::kInvalidArgument, "rms_norm_rope_kv: kv_dtype must be a KV cache dtype");
  expect_error(
      [&] {
        be->rms_norm_rope_kv(x, Tensor(), 1e-6f, up_i({0, 1}, {2}), freq, DType::kU8, 101);
      },
      ErrorCode::kInvalidArgument, "rms_norm_rope_kv: rope_dim 101 must be in [0, 100]");
}

// ---- capacity
// ------------------------------------------------------------------------------------

TEST(KvCacheCapacity, BytesFollowTheDtype) {
  ModelConfig c;  // V4 widths: D 512, R 64, Di 128, window 128
  c.num_hidden_layers = 3;
  c.layer_types = {AttentionKind::kSliding, AttentionKind::kCompressedSparse,
                   AttentionKind::kHeavilyCompressed};
  auto be = make_cpu_backend(1);
  CacheShape shape;
  shape.num_blocks = 2;
  shape.num_state_slots = 1;
  const int64_t swa = 134, csa_ring = 2 * 4 + 5, hca_ring = 128 + 5;
  // Compressor rings are f32 whatever the dtype: CSA [kv|gate] of 2D (and 2Di), HCA of D.
  const int64_t comp_ring_bytes = csa_ring * (4 * 512 + 4 * 128) * 4 + hca_ring * 2 * 512 * 4;
  const struct {
    KvCacheDType dtype;
    int64_t main, index;
  } cases[] = {{KvCacheDType::kF32, 2048, 512},
               {KvCacheDType::kBF16, 1024, 256},
               {KvCacheDType::kFp8, 584, 132}};
  for (const auto& k : cases) {
    shape.kv_dtype = k.dtype;
    ModelCaches caches(c, shape, *be);
    EXPECT_EQ(caches.bytes_per_block(), 32 * (k.main + k.index) + 1 * k.main)
        << kv_cache_dtype_name(k.dtype);
    EXPECT_EQ(caches.bytes_per_state_slot(), 3 * swa * k.main + comp_ring_bytes)
        << kv_cache_dtype_name(k.dtype);
  }
  EXPECT_EQ(resolve_kv_cache_dtype("auto", DeviceKind::kCpu), KvCacheDType::kF32);
  EXPECT_EQ(resolve_kv_cache_dtype("fp8", DeviceKind::kCpu), KvCacheDType::kFp8);
  EXPECT_EQ(resolve_kv_cache_dtype("auto", DeviceKind::kCpu, /*fp8_weights=*/true),
            KvCacheDType::kF32);
  // A device takes DeepSeek's fp8 records for FP8 checkpoints and bf16 otherwise.
  EXPECT_EQ(resolve_kv_cache_dtype("auto", DeviceKind::kCuda), KvCacheDType::kBF16);
  EXPECT_EQ(resolve_kv_cache_dtype("auto", DeviceKind::kCuda, /*fp8_weights=*/true),
            KvCacheDType::kFp8);
  EXPECT_EQ(resolve_kv_cache_dtype("f32", DeviceKind::kCuda, /*fp8_weights=*/true),
            KvCacheDType::kF32);
  EXPECT_EQ(resolve_kv_cache_dtype("bf16", DeviceKind::kCuda), KvCacheDType::kBF16);
  EXPECT_THROW(resolve_kv_cache_dtype("int4", DeviceKind::kCpu), Error);
}

}  // namespace
}  // namespace deepinfer
