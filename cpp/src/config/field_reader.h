// FieldReader: typed, validated reads of one JSON object of a config.json; every error names the
// file and the field path. Shared by ModelConfig (V4) and V41TextConfig (V4.1).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>

#include "common/json.h"
#include "deepinfer/config.h"
#include "deepinfer/error.h"

namespace deepinfer::config_detail {

// Reads typed fields of one JSON object; every error names the file and the field path.
class FieldReader {
 public:
  FieldReader(const json::Value& object, std::string source, std::string prefix = "")
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  const json::Value* find(std::string_view key) const { return object_.find(key); }
  bool has(std::string_view key) const {
    const json::Value* v = find(key);
    return v != nullptr && !v->is_null();
  }
  std::string path(std::string_view key) const { return prefix_ + std::string(key); }

  [[noreturn]] void fail(std::string_view key, const std::string& what) const {
    throw Error(ErrorCode::kInvalidConfig, source_ + ": field '" + path(key) + "' " + what);
  }
  [[noreturn]] void fail_value(std::string_view key, const std::string& expected) const {
    fail(key, "must be " + expected + ", got " + find(key)->dump());
  }

  int64_t get_int(std::string_view key, int64_t fallback, int64_t min_value,
                  int64_t max_value = std::numeric_limits<int32_t>::max()) const {
    if (!has(key)) return fallback;
    const json::Value& v = *find(key);
    std::string range = min_value == 1   ? "a positive integer"
                        : min_value == 0 ? "a non-negative integer"
                                         : "an integer >= " + std::to_string(min_value);
    if (!v.is_integer()) fail_value(key, range);
    int64_t i = v.as_int();
    if (i < min_value || i > max_value)
      fail_value(key, range + " no larger than " + std::to_string(max_value));
    return i;
  }

  double get_double(std::string_view key, double fallback, double min_exclusive) const {
    if (!has(key)) return fallback;
    const json::Value& v = *find(key);
    if (!v.is_number() || !std::isfinite(v.as_double()) || !(v.as_double() > min_exclusive)) {
      fail_value(key, "a number greater than " + format_number(min_exclusive));
    }
    return v.as_double();
  }

  bool get_bool(std::string_view key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!find(key)->is_bool()) fail_value(key, "true or false");
    return find(key)->as_bool();
  }

  std::string get_string(std::string_view key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!find(key)->is_string()) fail_value(key, "a string");
    return find(key)->as_string();
  }

  const std::string& source() const { return source_; }

  static std::string format_number(double d) {
    std::ostringstream os;
    os << d;
    return os.str();
  }

 private:
  const json::Value& object_;
  std::string source_;
  std::string prefix_;
};

// Reads one rope sub-dict ("main" or "compress" of rope_parameters, or a flat yarn dict).
RopeConfig parse_rope(const FieldReader& r, double theta, bool allow_yarn);
// quantization_config (and the top-level expert_dtype) of `root`.
QuantConfig parse_quantization(const FieldReader& root);

}  // namespace deepinfer::config_detail
