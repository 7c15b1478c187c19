#include "common/json.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <system_error>
#include <unordered_set>

#include "deepinfer/error.h"

namespace deepinfer::json {

// ---- Value -----------------------------------------------------------------------------------

Value Value::make_bool(bool b) {
  Value v;
  v.type_ = Type::kBool;
  v.bool_ = b;
  return v;
}

Value Value::make_number(double d, bool is_integer_literal) {
  Value v;
  v.type_ = Type::kNumber;
  v.number_ = d;
  v.integer_literal_ = is_integer_literal;
  return v;
}

Value Value::make_int(int64_t i) {
  Value v = make_number(static_cast<double>(i), true);
  v.exact_int_ = true;
  v.int_ = i;
  return v;
}

Value Value::make_string(std::string s) {
  Value v;
  v.type_ = Type::kString;
  v.string_ = std::move(s);
  return v;
}

Value Value::make_array(Array a) {
  Value v;
  v.type_ = Type::kArray;
  v.array_ = std::make_shared<Array>(std::move(a));
  return v;
}

Value Value::make_object(Object o) {
  Value v;
  v.type_ = Type::kObject;
  v.object_ = std::make_shared<Object>(std::move(o));
  return v;
}

bool Value::is_integer() const {
  if (type_ != Type::kNumber) return false;
  if (exact_int_) return true;
  // 2^63 is exactly representable; int64 holds [-2^63, 2^63).
  constexpr double kTwo63 = 9223372036854775808.0;
  return std::isfinite(number_) && std::trunc(number_) == number_ && number_ >= -kTwo63 &&
         number_ < kTwo63;
}

namespace {

[[noreturn]] void throw_type_mismatch(const Value& v, const char* expected) {
  // Enough of the value to recognise it; a whole config would drown the message.
  constexpr size_t kMaxShown = 64;
  std::string shown = v.dump();
  if (shown.size() > kMaxShown) shown = shown.substr(0, kMaxShown - 3) + "...";
  throw Error(ErrorCode::kInvalidArgument,
              "JSON value " + shown + " has type " + v.type_name() + ", expected " + expected);
}

}  // namespace

bool Value::as_bool() const {
  if (type_ != Type::kBool) throw_type_mismatch(*this, "bool");
  return bool_;
}

double Value::as_double() const {
  if (type_ != Type::kNumber) throw_type_mismatch(*this, "number");
  return number_;
}

int64_t Value::as_int() const {
  if (!is_integer()) throw_type_mismatch(*this, "an integer that fits in int64");
  return exact_int_ ? int_ : static_cast<int64_t>(number_);
}

const std::string& Value::as_string() const {
  if (type_ != Type::kString) throw_type_mismatch(*this, "string");
  return string_;
}

const Value::Array& Value::as_array() const {
  if (type_ != Type::kArray) throw_type_mismatch(*this, "array");
  return *array_;
}

const Value::Object& Value::as_object() const {
  if (type_ != Type::kObject) throw_type_mismatch(*this, "object");
  return *object_;
}

const Value* Value::find(std::string_view key) const {
  if (type_ != Type::kObject) return nullptr;
  for (const auto& [k, v] : *object_) {
    if (k == key) return &v;
  }
  return nullptr;
}

const char* Value::type_name() const {
  switch (type_) {
    case Type::kNull:
      return "null";
    case Type::kBool:
      return "bool";
    case Type::kNumber:
      return "number";
    case Type::kString:
      return "string";
    case Type::kArray:
      return "array";
    case Type::kObject:
      return "object";
  }
  return "?";
}

namespace {

void dump_string(std::string_view s, std::string& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 0xf];
        } else {
          out += ch;  // UTF-8 passes through unchanged
        }
    }
  }
  out += '"';
}

void dump_value(const Value& v, std::string& out);

void dump_number(const Value& v, std::string& out) {
  double d = v.as_double();
  if (!std::isfinite(d)) {
    out += "null";  // JSON has no spelling for NaN or infinity
    return;
  }
  if (v.is_integer_literal() && v.is_integer()) {
    out += std::to_string(v.as_int());
    return;
  }
  // Shortest text that reads back as the same double: at most 17 significant digits.
  char buf[32];
  auto result = std::to_chars(buf, buf + sizeof buf, d);
  out.append(buf, result.ptr);
}

void dump_value(const Value& v, std::string& out) {
  switch (v.type()) {
    case Value::Type::kNull:
      out += "null";
      return;
    case Value::Type::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Type::kNumber:
      dump_number(v, out);
      return;
    case Value::Type::kString:
      dump_string(v.as_string(), out);
      return;
    case Value::Type::kArray: {
      out += '[';
      bool first = true;
      for (const Value& e : v.as_array()) {
        if (!first) out += ',';
        first = false;
        dump_value(e, out);
      }
      out += ']';
      return;
    }
    case Value::Type::kObject: {
      out += '{';
      bool first = true;
      for (const auto& [k, e] : v.as_object()) {
        if (!first) out += ',';
        first = false;
        dump_string(k, out);
        out += ':';
        dump_value(e, out);
      }
      out += '}';
      return;
    }
  }
}

}  // namespace

std::string Value::dump() const {
  std::string out;
  dump_value(*this, out);
  return out;
}

// ---- Parser ----------------------------------------------------------------------------------

namespace {

constexpr int kMaxDepth = 256;

class Parser {
 public:
  Parser(std::string_view text, std::string_view source) : text_(text), source_(source) {}

  Value parse_document() {
    // RFC 8259 lets a parser ignore a leading byte order mark; editors on some systems add one.
    if (text_.substr(0, 3) == "\xEF\xBB\xBF") pos_ = 3;
    skip_whitespace();
    Value v = parse_value(0);
    skip_whitespace();
    if (pos_ != text_.size()) fail(pos_, "unexpected " + describe_at(pos_) + " after the document");
    return v;
  }

 private:
  [[noreturn]] void fail(size_t pos, const std::string& reason) const {
    size_t line = 1;
    size_t line_start = 0;
    for (size_t i = 0; i < pos && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    }
    throw Error(ErrorCode::kCorruptFile, std::string(source_) + ": invalid JSON at line " +
                                             std::to_string(line) + ", column " +
                                             std::to_string(pos - line_start + 1) + ": " + reason);
  }

  // "character 'x'", "byte 0x1f" or "end of input", for error messages.
  std::string describe_at(size_t pos) const {
    if (pos >= text_.size()) return "end of input";
    auto c = static_cast<unsigned char>(text_[pos]);
    if (c >= 0x20 && c < 0x7f) return std::string("character '") + text_[pos] + "'";
    static constexpr char kHex[] = "0123456789abcdef";
    return std::string("byte 0x") + kHex[c >> 4] + kHex[c & 0xf];
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  void skip_whitespace() {
    while (!at_end()) {
      char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  Value parse_value(int depth) {
    if (at_end()) fail(pos_, "unexpected end of input, expected a JSON value");
    char c = text_[pos_];
    switch (c) {
      case '{':
        return parse_object(depth + 1);
      case '[':
        return parse_array(depth + 1);
      case '"':
        return Value::make_string(parse_string());
      case 't':
        expect_literal("true");
        return Value::make_bool(true);
      case 'f':
        expect_literal("false");
        return Value::make_bool(false);
      case 'n':
        expect_literal("null");
        return Value();
      default:
        break;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
    if (c == 'N' || c == 'I') fail(pos_, "NaN and Infinity are not valid JSON numbers");
    fail(pos_, "unexpected " + describe_at(pos_) + ", expected a JSON value");
  }

  void expect_literal(std::string_view literal) {
    if (text_.substr(pos_, literal.size()) != literal) {
      fail(pos_, "invalid literal, expected '" + std::string(literal) + "'");
    }
    pos_ += literal.size();
  }

  void enter(int depth) const {
    if (depth > kMaxDepth) {
      fail(pos_, "nesting deeper than " + std::to_string(kMaxDepth) + " levels");
    }
  }

  Value parse_object(int depth) {
    enter(depth);
    ++pos_;  // '{'
    Value::Object members;
    std::unordered_set<std::string> keys;
    skip_whitespace();
    if (peek() == '}') {
      ++pos_;
      return Value::make_object(std::move(members));
    }
    while (true) {
      skip_whitespace();
      if (peek() != '"') fail(pos_, "unexpected " + describe_at(pos_) + ", expected a string key");
      size_t key_pos = pos_;
      std::string key = parse_string();
      if (!keys.insert(key).second) fail(key_pos, "duplicate key \"" + key + "\"");
      skip_whitespace();
      if (peek() != ':') fail(pos_, "unexpected " + describe_at(pos_) + ", expected ':'");
      ++pos_;
      skip_whitespace();
      Value v = parse_value(depth);
      members.emplace_back(std::move(key), std::move(v));
      skip_whitespace();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        return Value::make_object(std::move(members));
      }
      fail(pos_, "unexpected " + describe_at(pos_) + ", expected ',' or '}'");
    }
  }

  Value parse_array(int depth) {
    enter(depth);
    ++pos_;  // '['
    Value::Array elements;
    skip_whitespace();
    if (peek() == ']') {
      ++pos_;
      return Value::make_array(std::move(elements));
    }
    while (true) {
      skip_whitespace();
      elements.push_back(parse_value(depth));
      skip_whitespace();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        return Value::make_array(std::move(elements));
      }
      fail(pos_, "unexpected " + describe_at(pos_) + ", expected ',' or ']'");
    }
  }

  uint32_t parse_hex4() {
    if (text_.size() - pos_ < 4) fail(pos_, "unexpected end of input in \\u escape");
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_];
      uint32_t digit;
      if (c >= '0' && c <= '9') {
        digit = static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        digit = static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        digit = static_cast<uint32_t>(c - 'A' + 10);
      } else {
        fail(pos_, "unexpected " + describe_at(pos_) + " in \\u escape, expected a hex digit");
      }
      value = value * 16 + digit;
      ++pos_;
    }
    return value;
  }

  static void append_utf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // Reads a \uXXXX escape (pos_ at the 'u'), joining a surrogate pair into one code point.
  uint32_t parse_unicode_escape() {
    size_t escape_pos = pos_ - 1;
    ++pos_;  // 'u'
    uint32_t cp = parse_hex4();
    if (cp >= 0xDC00 && cp <= 0xDFFF) fail(escape_pos, "lone low surrogate in \\u escape");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (text_.substr(pos_, 2) != "\\u") {
        fail(escape_pos, "high surrogate in \\u escape is not followed by a low surrogate");
      }
      pos_ += 2;
      uint32_t low = parse_hex4();
      if (low < 0xDC00 || low > 0xDFFF) {
        fail(escape_pos, "high surrogate in \\u escape is not followed by a low surrogate");
      }
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    return cp;
  }

  // Copies one UTF-8 encoded character starting at pos_ (a byte >= 0x80), rejecting overlong
  // forms, encoded surrogates and code points above U+10FFFF (RFC 3629).
  void copy_utf8_char(std::string& out) {
    auto lead = static_cast<unsigned char>(text_[pos_]);
    size_t length;
    unsigned char lo = 0x80;
    unsigned char hi = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) lo = 0xA0;
      if (lead == 0xED) hi = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) lo = 0x90;
      if (lead == 0xF4) hi = 0x8F;
    } else {
      fail(pos_, "invalid UTF-8 lead " + describe_at(pos_) + " in string");
    }
    for (size_t i = 1; i < length; ++i) {
      size_t p = pos_ + i;
      if (p >= text_.size()) fail(p, "unexpected end of input inside a UTF-8 sequence");
      auto c = static_cast<unsigned char>(text_[p]);
      unsigned char min = i == 1 ? lo : 0x80;
      unsigned char max = i == 1 ? hi : 0xBF;
      if (c < min || c > max)
        fail(p, "invalid UTF-8 continuation " + describe_at(p) + " in string");
    }
    out.append(text_.substr(pos_, length));
    pos_ += length;
  }

  std::string parse_string() {
    size_t start = pos_;
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (at_end()) fail(start, "unterminated string");
      auto c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) fail(pos_, "unescaped control " + describe_at(pos_) + " in string");
      if (c >= 0x80) {
        copy_utf8_char(out);
        continue;
      }
      if (c != '\\') {
        out += static_cast<char>(c);
        ++pos_;
        continue;
      }
      ++pos_;  // backslash
      if (at_end()) fail(start, "unterminated string");
      char e = text_[pos_];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u':
          append_utf8(parse_unicode_escape(), out);
          continue;
        default:
          fail(pos_ - 1, "invalid escape \\" + describe_at(pos_));
      }
      ++pos_;
    }
  }

  size_t skip_digits() {
    size_t n = 0;
    while (!at_end() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      ++pos_;
      ++n;
    }
    return n;
  }

  Value parse_number() {
    size_t start = pos_;
    if (peek() == '-') ++pos_;
    if (peek() == 'I') fail(start, "NaN and Infinity are not valid JSON numbers");
    if (peek() == '0') {
      ++pos_;
      if (peek() >= '0' && peek() <= '9') fail(start, "leading zeros are not allowed in numbers");
    } else if (skip_digits() == 0) {
      fail(pos_, "unexpected " + describe_at(pos_) + ", expected a digit");
    }
    bool integer_literal = true;
    if (peek() == '.') {
      integer_literal = false;
      ++pos_;
      if (skip_digits() == 0) {
        fail(pos_, "unexpected " + describe_at(pos_) + ", expected a digit after '.'");
      }
    }
    if (peek() == 'e' || peek() == 'E') {
      integer_literal = false;
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (skip_digits() == 0) {
        fail(pos_, "unexpected " + describe_at(pos_) + ", expected a digit in the exponent");
      }
    }
    std::string_view literal = text_.substr(start, pos_ - start);
    const char* first = literal.data();
    const char* last = literal.data() + literal.size();
    if (integer_literal) {
      int64_t i = 0;
      auto r = std::from_chars(first, last, i);
      if (r.ec == std::errc() && r.ptr == last) return Value::make_int(i);
    }
    double d = 0.0;
    auto r = std::from_chars(first, last, d);
    if (r.ec == std::errc::result_out_of_range) {
      if (overflows(literal)) fail(start, "number " + std::string(literal) + " is out of range");
      d = literal[0] == '-' ? -0.0 : 0.0;  // underflow: closer to zero than any double
    } else if (r.ec != std::errc() || r.ptr != last) {
      fail(start, "invalid number " + std::string(literal));
    }
    return Value::make_number(d, integer_literal);
  }

  // Whether an out-of-range literal is too large (rather than too small) for a double: its
  // decimal magnitude (digits before the point, or minus the zeros after it, plus the exponent)
  // is positive.
  static bool overflows(std::string_view literal) {
    size_t i = literal[0] == '-' ? 1 : 0;
    int64_t magnitude = 0;
    bool seen_nonzero = false;
    bool after_point = false;
    for (; i < literal.size() && literal[i] != 'e' && literal[i] != 'E'; ++i) {
      char c = literal[i];
      if (c == '.') {
        after_point = true;
      } else if (!seen_nonzero && c == '0') {
        if (after_point) --magnitude;
      } else {
        if (!after_point) ++magnitude;
        seen_nonzero = true;
      }
    }
    int64_t exponent = 0;
    bool negative = false;
    if (i < literal.size()) {
      ++i;
      if (literal[i] == '+' || literal[i] == '-') negative = literal[i++] == '-';
      for (; i < literal.size(); ++i) {
        // Saturate: any exponent past a billion is already decisive.
        if (exponent < 1'000'000'000) exponent = exponent * 10 + (literal[i] - '0');
      }
    }
    return magnitude + (negative ? -exponent : exponent) > 0;
  }

  std::string_view text_;
  std::string_view source_;
  size_t pos_ = 0;
};

}  // namespace

Value parse(std::string_view text, std::string_view source) {
  return Parser(text, source).parse_document();
}

}  // namespace deepinfer::json
