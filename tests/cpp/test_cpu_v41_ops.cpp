// CPU backend V4.1 ops (hc_pre_shifted, hc_collapse) against the torch reference
// tests/python/v41_reference.py (fixtures below) and hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu_test_util.h"
#include "deepinfer/backend.h"
#include "deepinfer/error.h"

namespace deepinfer {
namespace {

using testing::expect_close;
using testing::fetch_f32;
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

}  // namespace
}  // namespace deepinfer
