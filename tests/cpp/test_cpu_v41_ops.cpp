// CPU backend V4.1 ops (hc_pre_shifted, hc_collapse, engram_hash, embedding_fp8, engram_gate,
// indexer_candidates, indexer_topk_in_candidates, and the C2 / C1 compressors as existing ops)
// against the torch reference tests/python/v41_reference.py (fixtures below) and hand-computed
// values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cpu_test_util.h"
#include "deepinfer/backend.h"
#include "deepinfer/error.h"

namespace deepinfer {
namespace {

using testing::expect_close;
using testing::fetch_f32;
using testing::fetch_i32;
using testing::HostLayout;
using testing::sz;

// ((i*a + b) mod 97 - 48) / 64 for i < n: exact in fp32, so the C++ inputs equal those of
// tests/python/v41_op_fixtures.py's `pat`, which made the fixtures.
std::vector<float> pats(int64_t n, int64_t a, int64_t b, float mul = 1.0f, float add = 0.0f) {
  std::vector<float> v(sz(n));
  for (int64_t i = 0; i < n; ++i) {
    v[sz(i)] = static_cast<float>((i * a + b) % 97 - 48) / 64.0f * mul + add;
  }
  return v;
}

std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// The fixtures' tolerance: fp32 against the reference's fp32 with another summation order.
void expect_fixture(const std::vector<float>& got, const std::vector<float>& want,
                    const std::string& what) {
  expect_close(got, to_double(want), 1e-5, 1e-5, what);
}

class CpuV41OpsTest : public testing::BackendTest {};

// ---- shifted mHC --------------------------------------------------------------------------------

// Printed by `python3 tests/python/v41_op_fixtures.py` (shifted_hc): V41Model.hc_mix and
// forward_chunk's collapse and trunk update over two sub-layers, then the final collapse.
// T 2, N 4, H 2; the sub-block outputs are fixed inputs.
namespace shifted_hc_fixture {
const std::vector<float> kWantPre0 = {0.288251847f, 0.25628534f,  0.594046533f, 0.554592013f,
                                      0.503785849f, 0.374431193f, 0.329697162f, 0.403894216f};
const std::vector<float> kWantPost0 = {1.00125909f,  0.801651061f, 1.73354077f,  0.459007084f,
                                       0.896019697f, 1.66519916f,  0.864389837f, 1.83380175f};
const std::vector<float> kWantComb0 = {
    0.142880708f,  0.294048458f, 0.11914172f,   0.443928212f, 0.310454249f, 0.21878013f,
    0.258873671f,  0.211890951f, 0.0753213987f, 0.15501073f,  0.535645366f, 0.234021515f,
    0.471342683f,  0.332159758f, 0.0863382518f, 0.110158354f, 0.203988478f, 0.158746973f,
    0.285758615f,  0.351505011f, 0.202290565f,  0.222148523f, 0.498986304f, 0.0765736178f,
    0.354599476f,  0.156717926f, 0.141669422f,  0.347012281f, 0.239120528f, 0.462385684f,
    0.0735846534f, 0.224908143f};
const std::vector<float> kWantY0 = {-0.578125f, 0.0f, 0.578125f, -0.359375f};
const std::vector<float> kWantPre1 = {0.639902711f, 0.925085187f,  0.519728482f, 0.834116697f,
                                      0.391979814f, 0.0452360697f, 0.27045998f,  0.423260421f};
const std::vector<float> kWantPost1 = {1.02241063f,  0.853907824f, 1.31542301f, 0.781114221f,
                                       0.922368765f, 1.5367763f,   1.2743144f,  1.52076149f};
const std::vector<float> kWantComb1 = {
    0.186293259f, 0.300528109f, 0.172844931f, 0.340332747f,  0.0695362762f, 0.251381218f,
    0.54267782f,  0.136403695f, 0.572471619f, 0.0330599807f, 0.138472185f,  0.255995184f,
    0.171697855f, 0.415029734f, 0.146004021f, 0.267267436f,  0.333077103f,  0.0653446838f,
    0.453854024f, 0.147723183f, 0.081618771f, 0.494014442f,  0.0478397571f, 0.376526028f,
    0.491787136f, 0.161910996f, 0.292104721f, 0.0541961491f, 0.0935159698f, 0.278728873f,
    0.206200495f, 0.421553671f};
const std::vector<float> kWantY1 = {-1.17338228f, 0.444607913f, 2.21185064f, -1.72798324f};
const std::vector<float> kWantH = {-3.99773526f, -0.458025455f, 1.35629988f, -0.952127457f};
}  // namespace shifted_hc_fixture

TEST_F(CpuV41OpsTest, ShiftedHcMatchesReference) {
  using namespace shifted_hc_fixture;
  const int64_t T = 2, N = 4, H = 2, rows = (2 + N) * N;
  const HcParams p{static_cast<int>(N), 20, 1e-6f, 1e-20f};
  const Tensor fn[2] = {up(pats(rows * N * H, 31, 7), {rows, N * H}),
                        up(pats(rows * N * H, 29, 3), {rows, N * H})};
  const Tensor base[2] = {up(pats(rows, 13, 5), {rows}), up(pats(rows, 11, 17), {rows})};
  const Tensor scale[2] = {up({0.75f, 1.25f, 0.5f}, {3}), up({1.5f, 0.625f, 1.0f}, {3})};
  const Tensor out[2] = {up(pats(T * H, 23, 41), {T, H}), up(pats(T * H, 19, 2), {T, H})};
  const std::vector<float>* want[2][4] = {{&kWantPre0, &kWantPost0, &kWantComb0, &kWantY0},
                                          {&kWantPre1, &kWantPost1, &kWantComb1, &kWantY1}};

  Tensor X = be->hc_expand(up(pats(T * H, 37, 11), {T, H}), static_cast<int>(N));
  Tensor prev_pre;  // undefined: the first sub-layer reads stream 0
  for (int k = 0; k < 2; ++k) {
    const HcShiftedMix m = be->hc_pre_shifted(X, fn[k], base[k], scale[k], prev_pre, p);
    const std::string sub = "sub-layer " + std::to_string(k) + " ";
    expect_fixture(fetch_f32(*be, m.pre), *want[k][0], sub + "pre");
    expect_fixture(fetch_f32(*be, m.post), *want[k][1], sub + "post");
    expect_fixture(fetch_f32(*be, m.comb), *want[k][2], sub + "comb");
    expect_fixture(fetch_f32(*be, m.y), *want[k][3], sub + "y");
    X = be->hc_post(X, out[k], m.post, m.comb);  // the trunk update is V4's
    prev_pre = m.pre;
  }
  expect_fixture(fetch_f32(*be, be->hc_collapse(X, prev_pre)), kWantH, "final collapse");
}

// hc_pre_shifted's coefficients are hc_pre's; with prev_pre = its own pre the collapse is hc_pre's
// y too, and an undefined prev_pre is a one-hot pre on stream 0.
TEST_F(CpuV41OpsTest, ShiftedHcAgreesWithHcPre) {
  const int64_t T = 3, N = 4, H = 5, rows = (2 + N) * N;
  const HcParams p{static_cast<int>(N), 20, 1e-6f, 1e-6f};
  const Tensor X = up(rng.uniform(sz(T * N * H)), {T, N, H});
  const Tensor fn = up(rng.uniform(sz(rows * N * H), -0.3f, 0.3f), {rows, N * H});
  const Tensor base = up(rng.uniform(sz(rows)), {rows});
  const Tensor scale = up({0.9f, 1.1f, 0.8f}, {3});
  const HcMix v4 = be->hc_pre(X, fn, base, scale, p);
  const HcShiftedMix first = be->hc_pre_shifted(X, fn, base, scale, Tensor(), p);
  const HcShiftedMix own = be->hc_pre_shifted(X, fn, base, scale, first.pre, p);
  EXPECT_EQ(fetch_f32(*be, first.post), fetch_f32(*be, v4.post));
  EXPECT_EQ(fetch_f32(*be, first.comb), fetch_f32(*be, v4.comb));
  expect_close(fetch_f32(*be, own.y), to_double(fetch_f32(*be, v4.y)), 1e-6, 1e-6, "own pre");

  std::vector<float> one_hot(sz(T * N), 0.0f);
  for (int64_t t = 0; t < T; ++t) one_hot[sz(t * N)] = 1.0f;
  const Tensor stream0 = be->hc_collapse(X, up(one_hot, {T, N}));
  EXPECT_EQ(fetch_f32(*be, first.y), fetch_f32(*be, stream0));
}

TEST_F(CpuV41OpsTest, ShiftedHcArgumentErrors) {
  const HcParams p{2, 3, 1e-6f, 1e-6f};
  const Tensor X = up(std::vector<float>(2 * 2 * 3), {2, 2, 3});
  const Tensor fn = up(std::vector<float>(8 * 6), {8, 6});
  const Tensor base = up(std::vector<float>(8), {8});
  const Tensor scale = up({1, 1, 1}, {3});
  expect_error(
      [&] {
        be->hc_pre_shifted(X, fn, base, scale, up({1, 0, 1}, {3}), p);
      },
      ErrorCode::kInvalidArgument, "hc_pre_shifted: argument prev_pre");
  expect_error(
      [&] {
        be->hc_collapse(X, up({1, 0, 1}, {1, 3}));
      },
      ErrorCode::kInvalidArgument, "hc_collapse: argument pre");
}

// ---- Engram -------------------------------------------------------------------------------------

// [T, n] n-gram windows of `tokens` at `positions`: column r holds the token at position t - r, -1
// before the sequence start (what the graph assembles from a sequence's token history).
std::vector<int32_t> ngram_windows(const std::vector<int32_t>& tokens,
                                   const std::vector<int>& positions, int n) {
  std::vector<int32_t> out;
  for (const int t : positions) {
    for (int r = 0; r < n; ++r) out.push_back(t - r >= 0 ? tokens[sz(t - r)] : -1);
  }
  return out;
}

// Printed by `python3 tests/python/v41_op_fixtures.py` (flash_hash, tiny_engram):
// V4.1-Flash's layer-14 multipliers (engram_multipliers: NumPy default_rng(10007*14)) and primes
// (engram_primes' nextprime chain), and V41Model.engram_rows of two sequences near their start;
// a tiny trigram layer's rows and V41Model.engram's gated trunk.
namespace engram_fixture {
const std::vector<int64_t> kFlashMult14 = {67716810739261, 51510806800915, 30921347202721,
                                           82619226485591};
const std::vector<int64_t> kFlashPrimes14 = {
    16000477, 16000487, 16000499, 16000507, 16000511, 16000573, 16000609, 16000627,
    16000667, 16000669, 16000693, 16000697, 16000711, 16000729, 16000759, 16000769,
    16000781, 16000799, 16000813, 16000819, 16000841, 16000877, 16000879, 16000889};
const std::vector<int32_t> kFlashRows14 = {
    15724883,  21161350,  42150044,  51817823,  64954610,  94368667,  105819943, 117674023,
    128036378, 145368376, 166100140, 186409735, 203411496, 213660140, 236382477, 241671563,
    256170745, 283000176, 303940327, 312553203, 332677653, 337998015, 366180469, 381010057,
    1236925,   26394376,  34473986,  52643416,  78363450,  83126617,  104678233, 112308096,
    135292808, 155552676, 164905665, 191586364, 199486839, 208551357, 238069417, 246578104,
    271303834, 274578651, 296729779, 308521682, 325155968, 348233315, 362857516, 371987735,
    1112188,   29601211,  44396326,  59962248,  69455961,  82440372,  106295722, 120864475,
    129253515, 148667394, 163863195, 178387839, 206203937, 223637118, 229343381, 250834875,
    264602203, 278003186, 291302020, 309296228, 332782405, 346043922, 353221223, 376258209,
    12337753,  23734284,  32948913,  58207098,  79770828,  93651174,  98642417,  112058632,
    136754359, 146210108, 161788789, 185586063, 194573067, 210013121, 230982930, 241686880,
    260503024, 284940683, 294524475, 315061059, 324290944, 341528973, 353983975, 370970588,
    10769968,  17892028,  42665499,  48651427,  67686082,  86225104,  102597315, 119617665,
    130130260, 146611561, 175675022, 179161542, 194310480, 220521684, 233039757, 241888798,
    260915987, 276278007, 297464409, 309399778, 329418962, 351724764, 367547753, 383228832,
    13792263,  25442096,  34361146,  50331367,  67723939,  89260728,  98868364,  116167121,
    129027833, 152178422, 160266488, 180898556, 196495568, 219719792, 236638326, 248670451,
    271807787, 273505137, 300138912, 315000321, 323183060, 341273580, 353351025, 369182513,
    8531091,   22764571,  42241855,  56679503,  64334163,  92132107,  102627744, 124701429,
    142865794, 156984974, 168301396, 181194355, 203083136, 223829941, 225441215, 253859658,
    263602904, 274511779, 298576706, 313825477, 334268697, 339136269, 366305074, 374505637};
const std::vector<int64_t> kTinyMult = {158200576279471525, 9991520871637985, 74235746863936745};
const std::vector<int64_t> kTinyPrimes = {41, 43, 47, 53};
const std::vector<int32_t> kTinyRows = {25, 49, 104, 153, 33, 81, 112, 161,
                                        4,  69, 95,  151, 11, 72, 94,  142};
const std::vector<float> kTinyGated = {
    -0.0626347661f, -0.34511295f,  1.51032615f,    -1.19953585f,  0.886330009f,  -0.725127697f,
    0.884683907f,   -1.45418096f,  0.410911977f,   0.451194108f,  0.224231303f,  0.0809281468f,
    -0.22623454f,   0.0803256333f, -0.434069693f,  -0.229666814f, 0.331778497f,  -0.107500404f,
    -0.0196087062f, -0.254379809f, -0.0906185657f, -0.60265398f,  -0.422467113f, 0.751481652f,
    -1.20895541f,   0.729425013f,  -1.33350623f,   -0.144777358f, 0.215573132f,  0.0819195956f,
    0.0439355075f,  -0.517958581f};
}  // namespace engram_fixture

TEST_F(CpuV41OpsTest, EngramHashMatchesReferenceFlash) {
  using namespace engram_fixture;
  // A stand-in compressed-id map with V4.1-Flash's large ids (the compressed vocabulary is 99092).
  const std::vector<int32_t> token_map = {99091, 17, 31337, 50000, 12345, 0, 77777, 4242};
  const EngramHashParams params{kFlashMult14, kFlashPrimes14, 8, token_map[2]};  // cpad: pad id 2
  // Sequence a's first five positions (1..4 real tokens), sequence b's positions 5 and 6.
  std::vector<int32_t> ngram = ngram_windows({5, 3, 0, 7, 1}, {0, 1, 2, 3, 4}, 4);
  const std::vector<int32_t> tail = ngram_windows({6, 2, 4, 1, 0, 3, 7}, {5, 6}, 4);
  ngram.insert(ngram.end(), tail.begin(), tail.end());
  const Tensor rows = be->engram_hash(up_i(ngram, {7, 4}), up_i(token_map, {8}), params);
  EXPECT_EQ(rows.shape(), (Shape{7, 24}));
  EXPECT_EQ(fetch_i32(*be, rows), kFlashRows14);
}

// The whole Engram path on a tiny layer: hash -> embedding of the flattened rows (the lookup is
// the existing op) -> linear (wkv) -> gate, against V41Model.engram.
TEST_F(CpuV41OpsTest, EngramMatchesReferenceTiny) {
  using namespace engram_fixture;
  const int64_t T = 4, N = 2, H = 4, heads = 2, dim = 2, tables = 2 * heads;
  const std::vector<int32_t> token_map = {7, 45, 3, 0, 30, 12, 47, 21, 3, 9};
  const EngramHashParams params{kTinyMult, kTinyPrimes, static_cast<int>(heads), token_map[2]};
  const Tensor rows = be->engram_hash(up_i(ngram_windows({4, 9, 1, 6}, {0, 1, 2, 3}, 3), {T, 3}),
                                      up_i(token_map, {10}), params);
  EXPECT_EQ(fetch_i32(*be, rows), kTinyRows);

  int64_t table_rows = 0;
  for (const int64_t p : kTinyPrimes) table_rows += p;
  const Tensor table = up(pats(table_rows * dim, 17, 3, 2.0f), {table_rows, dim});
  const Tensor e = be->embedding(table, rows.reshape({T * tables})).reshape({T, tables * dim});
  const Tensor wkv = up(pats((N + 1) * H * tables * dim, 43, 6), {(N + 1) * H, tables * dim});
  const Tensor kv = be->linear(e, wkv);
  const Tensor X = up(pats(T * N * H, 41, 13), {T, N, H});
  const Tensor q_weight = up(pats(N * H, 7, 1, 0.5f, 1.0f), {N, H});
  const Tensor k_weight = up(pats(N * H, 5, 9, 0.5f, 1.0f), {N, H});
  expect_fixture(fetch_f32(*be, be->engram_gate(X, kv, q_weight, k_weight, 1e-20f)), kTinyGated,
                 "gated trunk");
}

// Hand-computed gate: zero keys give d = 0 and sign(0) = 0, so g = sigmoid(0) = 1/2 on every
// stream; keys equal to x with unit weights give d = sum(x^2) / mean(x^2) / sqrt(H) = sqrt(H) = 2.
TEST_F(CpuV41OpsTest, EngramGateHandComputed) {
  const std::vector<float> x = {1, -1, 2, 0, 3, 3, 3, 3};  // T 1, N 2, H 4
  const std::vector<float> v = {1, 2, 3, 4};
  const Tensor X = up(x, {1, 2, 4});
  const Tensor ones = up(std::vector<float>(8, 1.0f), {2, 4});
  std::vector<float> kv_zero(8, 0.0f);
  kv_zero.insert(kv_zero.end(), v.begin(), v.end());
  std::vector<double> half;
  for (int s = 0; s < 2; ++s) {
    for (int c = 0; c < 4; ++c) half.push_back(x[sz(s * 4 + c)] + 0.5 * v[sz(c)]);
  }
  expect_close(fetch_f32(*be, be->engram_gate(X, up(kv_zero, {1, 12}), ones, ones, 1e-20f)), half,
               1e-6, 1e-6, "zero keys");

  std::vector<float> kv_self = x;
  kv_self.insert(kv_self.end(), v.begin(), v.end());
  // d = 2 for any nonzero x_s, so g = sigmoid(sqrt(2)).
  const double g = 1.0 / (1.0 + std::exp(-std::sqrt(2.0)));
  std::vector<double> want;
  for (int s = 0; s < 2; ++s) {
    for (int c = 0; c < 4; ++c) want.push_back(x[sz(s * 4 + c)] + g * v[sz(c)]);
  }
  expect_close(fetch_f32(*be, be->engram_gate(X, up(kv_self, {1, 12}), ones, ones, 1e-20f)), want,
               1e-6, 1e-6, "keys = x");
}

TEST_F(CpuV41OpsTest, EngramArgumentAndContentErrors) {
  const Tensor map = up_i({0, 1, 2}, {3});
  const EngramHashParams ok{{3, 5}, {7, 11}, 2, 0};
  const Tensor ngram = up_i({0, -1, 1, 0}, {2, 2});
  EngramHashParams bad = ok;
  bad.primes = {7};
  expect_error([&] { be->engram_hash(ngram, map, bad); }, ErrorCode::kInvalidArgument,
               "engram_hash: params.primes must hold (n - 1) * heads = 2 primes, got 1");
  bad = ok;
  bad.primes = {2000000000, 2000000000};
  expect_error([&] { be->engram_hash(ngram, map, bad); }, ErrorCode::kInvalidArgument,
               "i32 row range");
  expect_error(
      [&] {
        be->engram_hash(up_i({0, 1, 2}, {1, 3}), map, ok);
      },
      ErrorCode::kInvalidArgument, "engram_hash: argument ngram");
  expect_error(
      [&] {
        be->engram_hash(up_i({0, 3}, {1, 2}), map, ok);
      },
      ErrorCode::kInvalidArgument, "ngram[0][1] = 3 is outside [-1, 3)");
  const Tensor X = up(std::vector<float>(2 * 3), {1, 2, 3});
  const Tensor w = up(std::vector<float>(6), {2, 3});
  expect_error(
      [&] {
        be->engram_gate(X, up(std::vector<float>(6), {1, 6}), w, w, 1e-20f);
      },
      ErrorCode::kInvalidArgument, "engram_gate: argument kv");
}

// Rows of a 3 x 40 FP8 table (two scale groups, the second partial): e4m3 0x38 = 1, 0xc0 = -2,
// 0x01 = 2^-9 (subnormal); scales 2^(r) on columns 0..31 and 2^-7 on 32..39 of row r.
TEST_F(CpuV41OpsTest, EmbeddingFp8HandComputed) {
  Tensor values = Tensor::zeros({3, 40}, DType::kF8E4M3);
  auto* code = values.data<uint8_t>();
  for (int64_t i = 0; i < 3 * 40; ++i) code[i] = 0x38;
  code[0] = 0x01;            // row 0, column 0
  code[2 * 40 + 33] = 0xc0;  // row 2, column 33
  Tensor scales = Tensor::zeros({3, 2}, DType::kE8M0);
  for (int r = 0; r < 3; ++r) {
    scales.data<uint8_t>()[2 * r] = static_cast<uint8_t>(127 + r);
    scales.data<uint8_t>()[2 * r + 1] = 120;
  }
  const Tensor v = be->upload_weight(values, DType::kF8E4M3);
  const Tensor sc = be->upload_weight(scales, DType::kE8M0);
  std::vector<double> want;
  for (const int row : {2, 0, 2}) {
    for (int c = 0; c < 40; ++c) {
      double x = 1.0;
      if (row == 0 && c == 0) x = std::ldexp(1.0, -9);
      if (row == 2 && c == 33) x = -2.0;
      want.push_back(x * (c < 32 ? std::ldexp(1.0, row) : std::ldexp(1.0, -7)));
    }
  }
  expect_close(fetch_f32(*be, be->embedding_fp8(v, sc, up_i({2, 0, 2}, {3}))), want, 0.0, 0.0,
               "fp8 rows");
  EXPECT_EQ(be->embedding_fp8(v, sc, up_i({}, {0})).shape(), (Shape{0, 40}));
  // Host memory is the CPU backend's memory: a mapped table is the host tensor itself.
  ASSERT_TRUE(be->supports_mapped_host_weights());
  const Tensor mapped = be->upload_weight_mapped(values);
  EXPECT_EQ(mapped.raw_data(), values.raw_data());
  expect_close(fetch_f32(*be, be->embedding_fp8(mapped, be->upload_weight_mapped(scales),
                                                up_i({2, 0, 2}, {3}))),
               want, 0.0, 0.0, "fp8 rows, mapped");

  expect_error(
      [&] {
        fetch_f32(*be, be->embedding_fp8(v, sc, up_i({0, 3}, {2})));
      },
      ErrorCode::kInvalidArgument, "embedding_fp8: ids[1] = 3 is outside the table's rows [0, 3)");
  expect_error(
      [&] {
        be->embedding_fp8(v, be->upload_weight(Tensor::zeros({3, 1}, DType::kE8M0), DType::kE8M0),
                          up_i({0}, {1}));
      },
      ErrorCode::kInvalidArgument, "embedding_fp8: argument scales must be e8m0[3, 2]");
  expect_error(
      [&] {
        be->embedding_fp8(up(std::vector<float>(120), {3, 40}), sc, up_i({0}, {1}));
      },
      ErrorCode::kInvalidArgument, "embedding_fp8: argument values must be f8_e4m3");
}

// ---- candidate blocks ---------------------------------------------------------------------------

// One index head of width 1 with q = weight = 1: score(j) = relu(key_j), so the scores are the
// cache's values. Sequence 0 reads cache rows 0..15 through block table [0, 1], sequence 1 rows
// 8..15 first (table [1, 0]); paged blocks hold 8 entries (ratio 1).
struct CandidateCase {
  // Entries 0..10 of sequence 0 (with ties) and an invisible 11 that would win were it visible.
  std::vector<float> keys = {1, 5, 2, 4, 0, 5, 3, 3, 1, 2, 5, 9, 0, 0, 0, 0};
  HostLayout layout{{{9, 2, 0}, {0, 2, 1}}, 8, 2, {0, 1, 1, 0}};
};

TEST_F(CpuV41OpsTest, CandidateBlocksHandComputed) {
  const CandidateCase c;
  const BatchLayout l = c.layout.upload(*be);
  const Tensor q = up({1, 1, 1, 1}, {4, 1, 1});
  const Tensor w = up({1, 1, 1, 1}, {4, 1});
  const Tensor cache = up(c.keys, {16, 1});
  // Blocks of 3 entries. Position 9 sees 10 entries: block maxima 5 5 3 2 -> 0 1 2. Position 10
  // sees 11: maxima 5 5 3 5 (entry 11's 9 is invisible) -> ties at 5 go to the lower blocks: 0 1
  // 3. Sequence 1 (rows 8.. of the cache: 1, 2) has one visible block.
  const Tensor cand = be->indexer_candidates(q, w, cache, l, 1, 3, 3, 1.0f, 1.0f);
  EXPECT_EQ(fetch_i32(*be, cand), (std::vector<int32_t>{0, 1, 2, 0, 1, 3, 0, -1, -1, 0, -1, -1}));
  EXPECT_EQ(
      fetch_i32(*be, be->indexer_candidates(q, w, cache, l, 1, 3, 5, 1.0f, 1.0f)),
      (std::vector<int32_t>{0, 1, 2, 3, -1, 0, 1, 3, 2, -1, 0, -1, -1, -1, -1, 0, -1, -1, -1, -1}));

  // Top 4 inside them. Position 9 (entries 0..8): 5@1 5@5 4@3 3@6 (3@7 loses the tie). Position
  // 10 (entries 0..5, 9, 10): 5@1 5@5 5@10 4@3. Sequence 1: what there is, then -1.
  EXPECT_EQ(
      fetch_i32(*be, be->indexer_topk_in_candidates(q, w, cache, l, 1, cand, 3, 4, 1.0f, 1.0f)),
      (std::vector<int32_t>{1, 5, 3, 6, 1, 5, 10, 3, 0, -1, -1, -1, 1, 0, -1, -1}));

  // A repeated block counts once and -1 is no block: block 2 alone is entries 6 7 8 (3 3 1).
  const Tensor repeated = up_i({2, 2, -1, 2, -1, 2, -1, -1, -1, 0, 0, 0}, {4, 3});
  EXPECT_EQ(
      fetch_i32(*be, be->indexer_topk_in_candidates(q, w, cache, l, 1, repeated, 3, 4, 1.0f, 1.0f)),
      (std::vector<int32_t>{6, 7, 8, -1, 6, 7, 8, -1, -1, -1, -1, -1, 1, 0, -1, -1}));
}

// Printed by `python3 tests/python/v41_op_fixtures.py` (candidates): V41Model.select on TINY_A's
// candidate source (layer 6: full top-k and candidate entries) and its restricted index source
// (layer 8), with 2 index heads of 4, small-integer weights (scores exact, about 5 distinct values
// among up to 20 entries: many ties) and rows at positions 12..19. Sets, ascending, -1 padded.
namespace candidate_fixture {
const std::vector<int32_t> kWantTopk6 = {0, 3, 5, 8,  0, 3, 5, 10, 2, 4, 7,  12, 1, 3, 6,  11,
                                         0, 3, 8, 13, 0, 3, 8, 13, 0, 5, 10, 15, 2, 7, 12, 17};
const std::vector<int32_t> kWantCandEntries6 = {
    0,  1,  2,  3,  4,  5,  6,  7,  8,  -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0,  1,  2,
    3,  4,  5,  9,  10, 11, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0,  1,  2,  6,  7,  8,
    12, 13, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0,  1,  2,  6,  7,  8,  9,  10, 11,
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 3,  4,  5,  6,  7,  8,  12, 13, 14, -1, -1, -1,
    -1, -1, -1, -1, -1, -1, -1, -1, 3,  4,  5,  6,  7,  8,  12, 13, 14, -1, -1, -1, -1, -1, -1,
    -1, -1, -1, -1, -1, 0,  1,  2,  3,  4,  5,  9,  10, 11, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    -1, -1, 0,  1,  2,  6,  7,  8,  12, 13, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
const std::vector<int32_t> kWantTopk8 = {0, 2, 5, 7,  0, 2, 3, 5,  0, 8, 13, 14, 1, 2, 6,  7,
                                         3, 5, 8, 13, 3, 5, 7, 12, 0, 2, 3,  5,  0, 8, 13, 14};
}  // namespace candidate_fixture

// (i*a + b) mod 5 - 2: the fixture script's `coarse`.
std::vector<float> coarse(int64_t n, int64_t a, int64_t b, float mul = 1.0f) {
  std::vector<float> v(sz(n));
  for (int64_t i = 0; i < n; ++i) v[sz(i)] = static_cast<float>((i * a + b) % 5 - 2) * mul;
  return v;
}

// Each row's non-negative values, ascending, padded with -1 to `width` (set comparison).
std::vector<int32_t> as_sets(std::vector<int32_t> v, int64_t cols, int64_t width) {
  std::vector<int32_t> out;
  for (size_t r = 0; r * sz(cols) < v.size(); ++r) {
    std::vector<int32_t> row;
    for (int64_t i = 0; i < cols; ++i) {
      if (v[r * sz(cols) + sz(i)] >= 0) row.push_back(v[r * sz(cols) + sz(i)]);
    }
    std::sort(row.begin(), row.end());
    row.resize(sz(width), -1);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

TEST_F(CpuV41OpsTest, CandidateSelectionMatchesReference) {
  using namespace candidate_fixture;
  const int64_t S = 8, hi = 2, di = 4, entries = 20, q_lora = 32, hidden = 64, top_k = 4, bs = 3;
  const HostLayout layout({{12, static_cast<int>(S), 0}}, 8, 3, {0, 1, 2});
  const BatchLayout l = layout.upload(*be);
  std::vector<float> keys = coarse(entries * di, 3, 2);
  keys.resize(sz(24 * di), 0.0f);  // three paged blocks of 8
  const Tensor cache = up(keys, {24, di});
  const Tensor xn = up(coarse(S * hidden, 2, 0), {S, hidden});
  const Tensor qa = up(coarse(S * q_lora, 4, 3, 0.25f), {S, q_lora});
  // The indexer's q (unroped: the fixture's RoPE angle is 0) and weights of a layer.
  auto indexer = [&](int64_t a, int64_t b) {
    const Tensor q = be->linear(qa, up(coarse(hi * di * q_lora, a, b), {hi * di, q_lora}));
    const Tensor w = be->linear(xn, up(coarse(hi * hidden, b, a), {hi, hidden}));
    return std::pair{q.reshape({S, hi, di}), w};
  };
  const auto [q6, w6] = indexer(7, 1);
  const auto [q8, w8] = indexer(3, 4);
  EXPECT_EQ(as_sets(fetch_i32(*be, be->indexer_topk(q6, w6, cache, l, 1, top_k, 1.0f, 1.0f)), top_k,
                    top_k),
            kWantTopk6);
  const Tensor cand = be->indexer_candidates(q6, w6, cache, l, 1, bs, 3, 1.0f, 1.0f);
  // The candidate entries: the visible entries of the chosen blocks.
  const std::vector<int32_t> blocks = fetch_i32(*be, cand);
  std::vector<int32_t> cand_entries;
  for (int64_t t = 0; t < S; ++t) {
    const int64_t visible = 12 + t + 1;
    for (int64_t i = 0; i < 3; ++i) {
      const int32_t c = blocks[sz(t * 3 + i)];
      for (int64_t j = c * bs; c >= 0 && j < std::min(visible, (c + 1) * bs); ++j) {
        cand_entries.push_back(static_cast<int32_t>(j));
      }
    }
    cand_entries.resize(sz((t + 1) * entries), -1);
  }
  EXPECT_EQ(as_sets(cand_entries, entries, entries), kWantCandEntries6);
  EXPECT_EQ(as_sets(fetch_i32(*be, be->indexer_topk_in_candidates(q8, w8, cache, l, 1, cand, bs,
                                                                  top_k, 1.0f, 1.0f)),
                    top_k, top_k),
            kWantTopk8);
}

// With every visible block a candidate the restriction is a no-op: indexer_topk's result, on
// integer scores full of ties, a paged fp32 cache and ratio 2.
TEST_F(CpuV41OpsTest, CandidatesCoveringEverythingEqualIndexerTopk) {
  const int heads = 3, dim = 4, ratio = 2, block = 8, epb = block / ratio, top_k = 5;
  const HostLayout layout({{13, 6, 0}, {0, 3, 1}, {30, 1, 2}}, block, 4,
                          {3, 0, 5, 1, 2, 4, 0, 0, 6, 7, 1, 3});
  const BatchLayout l = layout.upload(*be);
  const int64_t T = layout.num_tokens();
  const Tensor q = up(rng.integers(sz(T * heads * dim), -1, 2), {T, heads, dim});
  const Tensor w = up(rng.integers(sz(T * heads), 0, 2), {T, heads});
  const Tensor cache = up(rng.integers(sz(8 * epb * dim), -1, 2), {8 * epb, dim});
  for (const int bs : {1, 3, 4}) {
    const Tensor all = be->indexer_candidates(q, w, cache, l, ratio, bs, 64, 0.5f, 2.0f);
    EXPECT_EQ(fetch_i32(*be, be->indexer_topk_in_candidates(q, w, cache, l, ratio, all, bs, top_k,
                                                            0.5f, 2.0f)),
              fetch_i32(*be, be->indexer_topk(q, w, cache, l, ratio, top_k, 0.5f, 2.0f)))
        << "block_entries " << bs;
  }
}

TEST_F(CpuV41OpsTest, CandidateArgumentAndContentErrors) {
  const CandidateCase c;
  const BatchLayout l = c.layout.upload(*be);
  const Tensor q = up({1, 1, 1, 1}, {4, 1, 1});
  const Tensor w = up({1, 1, 1, 1}, {4, 1});
  const Tensor cache = up(c.keys, {16, 1});
  expect_error([&] { be->indexer_candidates(q, w, cache, l, 1, 0, 3, 1.0f, 1.0f); },
               ErrorCode::kInvalidArgument, "indexer_candidates: block_entries must be >= 1");
  expect_error(
      [&] {
        be->indexer_topk_in_candidates(q, w, cache, l, 1, up_i({0, 1}, {2, 1}), 3, 4, 1.0f, 1.0f);
      },
      ErrorCode::kInvalidArgument, "indexer_topk_in_candidates: argument candidates");
  expect_error(
      [&] {
        be->indexer_topk_in_candidates(q, w, cache, l, 1, up_i({0, -2, 0, 0}, {4, 1}), 3, 4, 1.0f,
                                       1.0f);
      },
      ErrorCode::kInvalidArgument, "candidates[1][0] = -2 is negative and not -1");
}

// ---- C2 / C1 compressors ------------------------------------------------------------------------

// Printed by `python3 tests/python/v41_op_fixtures.py` (compressor): V41Model.compress's normed
// pre-RoPE entries (comp_pre) and roped entries (comp_kv) of a C2 and a C1 kv source over 4
// tokens; H 6, D 4, RoPE on the last 2 channels (inv_freq of compress theta, dim 2).
namespace compressor_fixture {
const std::vector<float> kInvFreq = {1.0f};
const std::vector<float> kWantPreC2 = {-0.194859609f, -1.44492543f, 0.276824743f,  -0.875334501f,
                                       -1.3703506f,   0.265410572f, 0.0984087437f, 0.983866036f};
const std::vector<float> kWantKvC2 = {-0.194859609f, -1.44492543f, 0.276824743f, -0.875334501f,
                                      -1.3703506f,   0.265410572f, -0.93557936f, -0.319949925f};
const std::vector<float> kWantPreC1 = {1.04511201f,   1.32965815f,   -0.141799331f, 0.133713365f,
                                       -0.899509311f, -1.40172541f,  0.17368941f,   -0.327103376f,
                                       -1.31808829f,  -0.822442472f, 0.153056696f,  0.683158457f,
                                       1.27297604f,   1.0521208f,    -0.13364169f,  -0.380518287f};
const std::vector<float> kWantKvC1 = {1.04511201f,   1.32965815f,   -0.141799331f, 0.133713365f,
                                      -0.899509311f, -1.40172541f,  0.369092792f,  -0.0305801183f,
                                      -1.31808829f,  -0.822442472f, -0.684888244f, -0.145120189f,
                                      1.27297604f,   1.0521208f,    0.186003f,     0.35785073f};
}  // namespace compressor_fixture

// C2 needs no new op: compress_pool with ratio 2, no overlap and a zero ape is the per-channel
// softmax over each pair of tokens. Fed in two calls (entry 1 pools a ring token and a new one),
// then rms_norm and rope at j * 2, against the reference's one-shot compress.
TEST_F(CpuV41OpsTest, C2IsCompressPoolWithoutApe) {
  using namespace compressor_fixture;
  const int64_t H = 6, D = 4;
  const std::vector<float> xn = pats(4 * H, 53, 21);
  std::vector<float> w = pats(D * H, 61, 4);  // [wkv; wgate]: proj rows are [kv | gate]
  const std::vector<float> wgate = pats(D * H, 59, 30, 2.0f);
  w.insert(w.end(), wgate.begin(), wgate.end());
  const Tensor weight = up(w, {2 * D, H});
  const Tensor norm_w = up(pats(D, 3, 8, 0.25f, 1.0f), {D});
  const Tensor inv_freq = up(kInvFreq, {1});
  const Tensor ape = up(std::vector<float>(2 * D, 0.0f), {2, D});
  const Tensor ring = up(std::vector<float>(2 * 2 * D, 0.0f), {1, 2, 2 * D});
  const CompressSpec spec{2, false, static_cast<int>(D)};
  std::vector<float> pre, kv;
  // Call 0: tokens 0..2 close entry 0; call 1: token 3 closes entry 1 with token 2 from the ring.
  for (const auto& [ctx, q, window] : {std::tuple{0, 3, 0}, std::tuple{3, 1, 1}}) {
    const BatchLayout l = HostLayout({{ctx, q, 0}}, 8, 1).upload(*be);
    const std::vector<float> x(xn.begin() + ctx * H, xn.begin() + (ctx + q) * H);
    const Tensor proj = be->linear(up(x, {q, H}), weight);
    EntryBatch entries;
    entries.num_entries = 1;
    entries.seq = up_i({0}, {1});
    entries.window = up_i({window}, {1});
    entries.rope_pos = up_i({2 * window}, {1});
    entries.dest = up_i({window}, {1});
    const Tensor u = be->compress_pool(proj, ring, ape, l, entries, spec);
    be->ring_write(ring, proj, l);
    const Tensor normed = be->rms_norm(u, norm_w, 1e-20f);
    const std::vector<float> p = fetch_f32(*be, normed);
    const std::vector<float> k =
        fetch_f32(*be, be->rope(normed, entries.rope_pos, inv_freq, false));
    pre.insert(pre.end(), p.begin(), p.end());
    kv.insert(kv.end(), k.begin(), k.end());
  }
  expect_fixture(pre, kWantPreC2, "C2 pre-RoPE entries");
  expect_fixture(kv, kWantKvC2, "C2 entries");
}

// C1 is a per-token projection: linear, rms_norm, rope at the token's position.
TEST_F(CpuV41OpsTest, C1IsAProjectionPerToken) {
  using namespace compressor_fixture;
  const int64_t T = 4, H = 6, D = 4;
  const Tensor u = be->linear(up(pats(T * H, 53, 21), {T, H}), up(pats(D * H, 61, 4), {D, H}));
  const Tensor normed = be->rms_norm(u, up(pats(D, 3, 8, 0.25f, 1.0f), {D}), 1e-20f);
  expect_fixture(fetch_f32(*be, normed), kWantPreC1, "C1 pre-RoPE entries");
  const Tensor pos = up_i({0, 1, 2, 3}, {T});
  expect_fixture(fetch_f32(*be, be->rope(normed, pos, up(kInvFreq, {1}), false)), kWantKvC1,
                 "C1 entries");
}

}  // namespace
}  // namespace deepinfer
