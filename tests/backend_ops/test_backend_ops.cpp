// The harness of the backend op table (op_case.h): every row against every device backend this
// build has, as GoogleTest value-parameterised tests named <backend>__<op>__<label>.
#include <gtest/gtest.h>

#include <cctype>
#include <functional>
#include <iterator>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "cases.h"
#include "compare.h"
#include "device_backends.h"
#include "op_case.h"

namespace deepinfer::backend_ops {
namespace {

const std::vector<OpCase>& table() {
  static const std::vector<OpCase> rows = [] {
    std::vector<OpCase> all;
    for (auto family :
         {dense_cases, select_tokens_cases, shift_rows_cases, adjust_logits_cases, hc_cases,
          gemm_cases, moe_cases, moe_quant_cases, cache_cases, indexer_cases, attention_cases,
          kv_dtype_cases, sample_cases, v41_cases, v41_indexer_cases}) {
      std::vector<OpCase> part = family();
      all.insert(all.end(), std::make_move_iterator(part.begin()),
                 std::make_move_iterator(part.end()));
    }
    return all;
  }();
  return rows;
}

struct Param {
  std::string backend;
  size_t row;
};

void PrintTo(const Param& p, std::ostream* os) {
  *os << p.backend << " row " << p.row;
}

std::vector<Param> params() {
  std::vector<Param> out;
  for (const std::string& backend : device_backend_names()) {
    for (size_t i = 0; i < table().size(); ++i) out.push_back({backend, i});
  }
  return out;
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  std::string backend = info.param.backend;  // "cuda:1" -> "cuda_1"
  for (char& ch : backend) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return backend + "__" + table()[info.param.row].name();
}

// Runs a row on `be` with host syncs forbidden, as the model graph and sampling run (an op only
// enqueues work), then copies its outputs to the host.
Outputs run_on(Backend& be, const std::function<Outputs()>& run) {
  Outputs outs;
  {
    HostSyncForbidden guard(be);
    outs = run();
  }
  for (Output& o : outs) o.value = be.to_host(o.value);
  return outs;
}

class BackendOps : public ::testing::TestWithParam<Param> {};

TEST_P(BackendOps, MatchesCpu) {
  const Param& p = GetParam();
  const OpCase& row = table()[p.row];
  std::string why;
  Backend* device = shared_backend(p.backend, &why);
  if (device == nullptr) {
    if (device_required()) FAIL() << why;
    GTEST_SKIP() << why;
  }
  why = row.skip_reason(p.backend, *device);
  if (!why.empty()) GTEST_SKIP() << why;

  Rng rng(row.seed());
  const std::unique_ptr<DrawnCase> drawn = row.draw(rng);
  Backend& cpu = cpu_reference();
  const Outputs ref = run_on(cpu, [&] { return drawn->run_reference(cpu); });
  const Outputs dev = run_on(*device, [&] { return drawn->run(*device); });
  drawn->check(ref, dev);
  if (row.deterministic) {
    const Outputs again = run_on(*device, [&] { return drawn->run(*device); });
    ASSERT_EQ(again.size(), dev.size());
    for (size_t i = 0; i < dev.size(); ++i) {
      EXPECT_TRUE(same_bytes(dev[i].value, again[i].value))
          << dev[i].name << ": a second run on the device differs";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Table, BackendOps, ::testing::ValuesIn(params()), param_name);
// A build with the CPU backend only has no rows to instantiate; the test below reports that.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BackendOps);

// Checked on every build: each row has a name GoogleTest accepts, unique in the table. Then skips
// when no device backend is compiled in, which is how a CPU-only build reports the table.
TEST(BackendOpsTable, WellFormed) {
  std::set<std::string> names;
  for (const OpCase& row : table()) {
    const std::string name = row.name();
    EXPECT_FALSE(row.op.empty() || row.label.empty()) << name;
    for (const char ch : name) {
      const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                      (ch >= '0' && ch <= '9') || ch == '_';
      EXPECT_TRUE(ok) << "row " << name << ": labels are [A-Za-z0-9_]";
      if (!ok) break;
    }
    EXPECT_TRUE(names.insert(name).second) << "row " << name << " twice";
  }
  if (device_backend_names().empty()) {
    if (device_required()) FAIL() << "no device backend compiled in, and one is required";
    GTEST_SKIP() << "no backend other than the CPU reference is compiled in: the " << table().size()
                 << " op cases have nothing to compare";
  }
}

}  // namespace
}  // namespace deepinfer::backend_ops
