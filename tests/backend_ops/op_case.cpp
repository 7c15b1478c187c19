#include "op_case.h"

#include <algorithm>
#include <cstdio>

#include "compare.h"

namespace deepinfer::backend_ops {

uint32_t OpCase::seed() const {
  uint32_t h = 2166136261u;  // FNV-1a
  for (const char ch : name()) h = (h ^ static_cast<unsigned char>(ch)) * 16777619u;
  return h;
}

std::string OpCase::skip_reason(const std::string& backend, const Backend& be) const {
  if (!only_backends.empty() &&
      std::find(only_backends.begin(), only_backends.end(), backend) == only_backends.end()) {
    std::string list;
    for (const std::string& b : only_backends) list += (list.empty() ? "" : ", ") + b;
    return "applies to " + list + " only: " + only_why;
  }
  if (own_reference && be.device_kind() == DeviceKind::kCpu) {
    return "the CPU op rejects the inputs whose device handling the row checks";
  }
  if (bf16_weights && be.weight_dtype(DType::kBF16) != DType::kBF16) {
    return "the backend keeps bf16 weights in " +
           std::string(dtype_name(be.weight_dtype(DType::kBF16))) + ": the f32 row covers it";
  }
  return {};
}

void check_outputs(const std::vector<Tolerance>& rules, const Outputs& ref, const Outputs& dev) {
  ASSERT_EQ(ref.size(), dev.size()) << "number of outputs";
  ASSERT_TRUE(rules.size() == 1 || rules.size() == ref.size())
      << rules.size() << " tolerances for " << ref.size() << " outputs";
  for (size_t i = 0; i < ref.size(); ++i) {
    const Tolerance& t = rules.size() == 1 ? rules[0] : rules[i];
    const std::string& what = ref[i].name;
    EXPECT_EQ(what, dev[i].name);
    switch (t.kind) {
      case Tolerance::Kind::kBytes:
        EXPECT_TRUE(same_bytes(ref[i].value, dev[i].value)) << what;
        break;
      case Tolerance::Kind::kClose:
        EXPECT_TRUE(max_abs_close(ref[i].value, dev[i].value, t.rtol, t.atol)) << what;
        break;
      case Tolerance::Kind::kBf16:
        EXPECT_TRUE(bf16_close(ref[i].value, dev[i].value)) << what;
        break;
    }
  }
}

std::string dims(const Shape& shape) {
  std::string s;
  for (const int64_t d : shape) s += (s.empty() ? "" : "x") + std::to_string(d);
  return s.empty() ? "scalar" : s;
}

std::string num(double value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", value);
  std::string s;
  for (const char* p = buf; *p != '\0'; ++p) {
    if (*p == '.') {
      s += 'p';
    } else if (*p == '-') {
      s += 'm';
    } else if (*p != '+') {
      s += *p;
    }
  }
  return s;
}

}  // namespace deepinfer::backend_ops
