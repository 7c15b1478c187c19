// A small JSON reader for config.json, safetensors headers and index files. Parse errors name the
// source (usually a file path), the line and column, and what was expected.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deepinfer::json {

class Value {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  using Array = std::vector<Value>;
  using Object = std::vector<std::pair<std::string, Value>>;  // keys in document order

  Value() = default;  // null
  static Value make_bool(bool b);
  static Value make_number(double d, bool is_integer_literal);
  static Value make_int(int64_t i);  // exact, even beyond 2^53
  static Value make_string(std::string s);
  static Value make_array(Array a);
  static Value make_object(Object o);

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  // A number whose value is integral (1, 2.0 and 1e3 are; 1.5 is not) and fits in int64.
  bool is_integer() const;
  // The literal had neither a fraction nor an exponent ("2", not "2.0" or "2e0").
  bool is_integer_literal() const { return type_ == Type::kNumber && integer_literal_; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  // Accessors throw deepinfer::Error(kInvalidArgument) naming the actual type on mismatch.
  bool as_bool() const;
  double as_double() const;
  int64_t as_int() const;  // requires is_integer()
  const std::string& as_string() const;
  const Array& as_array() const;
  const Object& as_object() const;

  // Member lookup; nullptr when this is not an object or the key is absent.
  const Value* find(std::string_view key) const;

  const char* type_name() const;  // "null", "bool", "number", "string", "array", "object"
  // Compact JSON text (numbers printed with up to 17 significant digits); for error messages.
  std::string dump() const;

 private:
  Type type_ = Type::kNull;
  bool bool_ = false;
  double number_ = 0.0;
  bool integer_literal_ = false;
  bool exact_int_ = false;  // int_ holds the value exactly (integer literals that fit int64)
  int64_t int_ = 0;
  std::string string_;
  std::shared_ptr<Array> array_;
  std::shared_ptr<Object> object_;
};

// Parses a whole document (trailing non-space text is an error). Throws
// deepinfer::Error(kCorruptFile) "<source>: invalid JSON at line L, column C: <reason>".
// Nesting deeper than 256 levels is rejected rather than overflowing the stack.
Value parse(std::string_view text, std::string_view source);

}  // namespace deepinfer::json
