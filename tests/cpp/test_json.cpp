#include <gtest/gtest.h>

#include <string>

#include "common/json.h"
#include "deepinfer/error.h"

namespace deepinfer::json {
namespace {

Value parse_ok(std::string_view text) {
  return parse(text, "test.json");
}

// Parses `text`, expecting failure; returns the message.
std::string parse_error(std::string_view text) {
  try {
    parse(text, "test.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptFile) << text;
    return e.what();
  }
  ADD_FAILURE() << "parsed without error: " << text;
  return "";
}

TEST(Json, Scalars) {
  EXPECT_TRUE(parse_ok("null").is_null());
  EXPECT_TRUE(parse_ok("true").as_bool());
  EXPECT_FALSE(parse_ok(" false ").as_bool());
  EXPECT_EQ(parse_ok("\"abc\"").as_string(), "abc");
  EXPECT_DOUBLE_EQ(parse_ok("-1.5e2").as_double(), -150.0);
  EXPECT_DOUBLE_EQ(parse_ok("0.25").as_double(), 0.25);
  EXPECT_EQ(parse_ok("-0").as_int(), 0);
}

TEST(Json, ObjectKeepsDocumentOrder) {
  Value v = parse_ok(R"({"b": 1, "a": [true, null, "x"], "c": {}})");
  ASSERT_TRUE(v.is_object());
  const auto& o = v.as_object();
  ASSERT_EQ(o.size(), 3u);
  EXPECT_EQ(o[0].first, "b");
  EXPECT_EQ(o[1].first, "a");
  EXPECT_EQ(o[2].first, "c");
  ASSERT_NE(v.find("a"), nullptr);
  EXPECT_EQ(v.find("a")->as_array().size(), 3u);
  EXPECT_TRUE(v.find("c")->as_object().empty());
  EXPECT_EQ(v.find("missing"), nullptr);
  EXPECT_EQ(v.find("a")->find("x"), nullptr);  // not an object
}

TEST(Json, IntegerClassification) {
  EXPECT_TRUE(parse_ok("1").is_integer());
  EXPECT_TRUE(parse_ok("1").is_integer_literal());
  EXPECT_TRUE(parse_ok("2.0").is_integer());
  EXPECT_FALSE(parse_ok("2.0").is_integer_literal());
  EXPECT_TRUE(parse_ok("1e3").is_integer());
  EXPECT_EQ(parse_ok("1e3").as_int(), 1000);
  EXPECT_FALSE(parse_ok("1e3").is_integer_literal());
  EXPECT_FALSE(parse_ok("1.5").is_integer());
  EXPECT_FALSE(parse_ok("1e19").is_integer());   // does not fit int64
  EXPECT_FALSE(parse_ok("\"1\"").is_integer());  // not a number
  EXPECT_FALSE(parse_ok("9223372036854775808").is_integer());
  EXPECT_TRUE(parse_ok("9223372036854775808").is_integer_literal());
  EXPECT_EQ(parse_ok("-9223372036854775808").as_int(), INT64_MIN);
  // Exact beyond 2^53, where a double would round.
  EXPECT_EQ(parse_ok("9007199254740993").as_int(), 9007199254740993LL);
  EXPECT_EQ(parse_ok("9223372036854775807").as_int(), INT64_MAX);
}

TEST(Json, NumberEdgeCases) {
  EXPECT_DOUBLE_EQ(parse_ok("1.7976931348623157e308").as_double(), 1.7976931348623157e308);
  EXPECT_DOUBLE_EQ(parse_ok("4.9e-324").as_double(), 4.9e-324);
  EXPECT_EQ(parse_ok("1e-400").as_double(), 0.0);  // underflow reads as zero
  EXPECT_EQ(parse_ok("0E+2").as_double(), 0.0);
  EXPECT_NE(parse_error("1e400").find("out of range"), std::string::npos);
  EXPECT_NE(parse_error("-123456789e999").find("out of range"), std::string::npos);
}

TEST(Json, StringEscapes) {
  EXPECT_EQ(parse_ok(R"("\"\\\/\b\f\n\r\t")").as_string(), "\"\\/\b\f\n\r\t");
  EXPECT_EQ(parse_ok(R"("\u0041\u00e9\u20AC")").as_string(), "A\xC3\xA9\xE2\x82\xAC");
  EXPECT_EQ(parse_ok(R"("\ud83d\ude00")").as_string(), "\xF0\x9F\x98\x80");  // U+1F600
  EXPECT_EQ(parse_ok(R"("\u0000")").as_string(), std::string(1, '\0'));
  EXPECT_EQ(parse_ok("\"\xE2\x82\xAC\"").as_string(), "\xE2\x82\xAC");  // raw UTF-8
}

TEST(Json, StringErrors) {
  EXPECT_NE(parse_error(R"("\ud83d")").find("surrogate"), std::string::npos);
  EXPECT_NE(parse_error(R"("\ud83dx")").find("surrogate"), std::string::npos);
  EXPECT_NE(parse_error(R"("\ud83d\u0041")").find("surrogate"), std::string::npos);
  EXPECT_NE(parse_error(R"("\ude00")").find("lone low surrogate"), std::string::npos);
  EXPECT_NE(parse_error("\"a\tb\"").find("control"), std::string::npos);
  EXPECT_NE(parse_error("\"a\nb\"").find("control"), std::string::npos);
  EXPECT_NE(parse_error(R"("\x")").find("invalid escape"), std::string::npos);
  EXPECT_NE(parse_error(R"("\u12G4")").find("hex digit"), std::string::npos);
  EXPECT_NE(parse_error(R"("\u12)").find("\\u escape"), std::string::npos);
  EXPECT_NE(parse_error("\"abc").find("unterminated"), std::string::npos);
  EXPECT_NE(parse_error("\"\xC0\xAF\"").find("UTF-8"), std::string::npos);          // overlong
  EXPECT_NE(parse_error("\"\xED\xA0\x80\"").find("UTF-8"), std::string::npos);      // surrogate
  EXPECT_NE(parse_error("\"\xF4\x90\x80\x80\"").find("UTF-8"), std::string::npos);  // > U+10FFFF
  EXPECT_NE(parse_error("\"\xE2\x82\"").find("UTF-8"), std::string::npos);          // cut short
  EXPECT_NE(parse_error("\"\xFF\"").find("UTF-8"), std::string::npos);
}

TEST(Json, SyntaxErrors) {
  const char* bad[] = {
      "",           " ",         "01",    "-01",      "00",         "1.",
      ".5",         "1e",        "1e+",   "-",        "+1",         "NaN",
      "Infinity",   "-Infinity", "nul",   "tru",      "[1,]",       "[1 2]",
      "{\"a\":1,}", "{\"a\" 1}", "{a:1}", "{\"a\":}", "[",          "]",
      "{",          "1 2",       "[1]x",  "'a'",      "\"a\"\"b\"", "{\"a\":1 \"b\":2}",
      "0x10",
  };
  for (const char* text : bad) {
    std::string message = parse_error(text);
    EXPECT_EQ(message.rfind("test.json: invalid JSON at line ", 0), 0u)
        << text << " -> " << message;
  }
  EXPECT_NE(parse_error("01").find("leading zeros"), std::string::npos);
  EXPECT_NE(parse_error("NaN").find("NaN"), std::string::npos);
  EXPECT_NE(parse_error("-Infinity").find("Infinity"), std::string::npos);
}

TEST(Json, ErrorReportsLineAndColumn) {
  std::string message = parse_error("{\n  \"a\": 1,\n  \"b\": tru\n}");
  EXPECT_EQ(message,
            "test.json: invalid JSON at line 3, column 8: invalid literal, expected 'true'");
  message = parse_error("[1,\n2,]");
  EXPECT_NE(message.find("line 2, column 3"), std::string::npos) << message;
}

TEST(Json, DuplicateKeysRejected) {
  std::string message = parse_error(R"({"a": 1, "b": 2, "a": 3})");
  EXPECT_NE(message.find("duplicate key \"a\""), std::string::npos) << message;
  EXPECT_NE(message.find("column 18"), std::string::npos) << message;
  // The same key in different objects is fine.
  EXPECT_NO_THROW(parse_ok(R"({"a": {"a": 1}, "b": {"a": 2}})"));
}

TEST(Json, DepthLimit) {
  std::string ok = std::string(256, '[') + std::string(256, ']');
  EXPECT_NO_THROW(parse_ok(ok));
  std::string deep = std::string(257, '[') + std::string(257, ']');
  EXPECT_NE(parse_error(deep).find("nesting deeper than 256"), std::string::npos);
  // Far deeper input must fail cleanly, not overflow the stack.
  std::string very_deep(100000, '[');
  EXPECT_NE(parse_error(very_deep).find("nesting"), std::string::npos);
  std::string objects;
  for (int i = 0; i < 300; ++i) objects += "{\"k\":";
  EXPECT_NE(parse_error(objects).find("nesting"), std::string::npos);
}

TEST(Json, ByteOrderMarkIgnored) {
  EXPECT_EQ(parse_ok("\xEF\xBB\xBF[1]").as_array().size(), 1u);
}

TEST(Json, AccessorsThrowOnTypeMismatch) {
  Value v = parse_ok(R"({"s": "x", "n": 1.5})");
  try {
    v.find("s")->as_int();
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("string"), std::string::npos) << e.what();
  }
  EXPECT_THROW(v.find("n")->as_int(), Error);
  EXPECT_THROW(v.find("n")->as_string(), Error);
  EXPECT_THROW(v.as_array(), Error);
  EXPECT_THROW(v.find("s")->as_object(), Error);
  EXPECT_THROW(v.find("s")->as_bool(), Error);
  EXPECT_THROW(v.find("s")->as_double(), Error);
  EXPECT_STREQ(v.type_name(), "object");
  EXPECT_STREQ(v.find("n")->type_name(), "number");
}

TEST(Json, DumpIsCompactAndRoundTrips) {
  const char* text =
      R"({"a":[1,2.5,-3e-07,true,false,null],"s":"q\"\\\n\u0001é","o":{},"e":[],"big":12345678901234567})";
  Value v = parse_ok(text);
  std::string dumped = v.dump();
  EXPECT_EQ(
      dumped,
      R"({"a":[1,2.5,-3e-07,true,false,null],"s":"q\"\\\n\u0001é","o":{},"e":[],"big":12345678901234567})");
  EXPECT_EQ(parse_ok(dumped).dump(), dumped);
  EXPECT_EQ(parse_ok(" [ 1 , { \"k\" : null } ] ").dump(), "[1,{\"k\":null}]");
  EXPECT_EQ(parse_ok("0.1").dump(), "0.1");
  EXPECT_EQ(parse_ok("2.0").dump(), "2");
  EXPECT_EQ(Value::make_number(1.0 / 3.0, false).dump(), "0.3333333333333333");
  EXPECT_EQ(Value::make_int(-7).dump(), "-7");
}

TEST(Json, Builders) {
  Value::Object o;
  o.emplace_back("x", Value::make_int(3));
  o.emplace_back("y", Value::make_array({Value::make_string("a"), Value()}));
  Value v = Value::make_object(std::move(o));
  EXPECT_EQ(v.dump(), R"({"x":3,"y":["a",null]})");
  EXPECT_EQ(v.find("x")->as_int(), 3);
  Value copy = v;  // copies share the immutable children
  EXPECT_EQ(copy.dump(), v.dump());
}

}  // namespace
}  // namespace deepinfer::json
