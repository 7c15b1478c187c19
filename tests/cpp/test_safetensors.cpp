#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "deepinfer/error.h"
#include "model/safetensors.h"
#include "temp_dir.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;

using test::TempDir;

std::string read_bytes(const std::string& path) {
  std::string bytes(fs::file_size(path), '\0');
  std::ifstream in(path, std::ios::binary);
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return bytes;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string u64_le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>(v >> (8 * i));
  return s;
}

// A safetensors file from a header text and a data section, written as is.
std::string raw_file(const std::string& header, size_t data_bytes) {
  return u64_le(header.size()) + header + std::string(data_bytes, '\x01');
}

// Opens `path` expecting Error(code); returns the message.
std::string open_error(const std::string& path, ErrorCode code = ErrorCode::kCorruptFile) {
  try {
    SafetensorsFile::open(path);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "opened without error: " << path;
  return "";
}

Tensor make_f32(const std::vector<float>& values, Shape shape) {
  return Tensor::from_vector(values, std::move(shape));
}

TEST(Safetensors, RoundTrip) {
  TempDir dir;
  std::string path = dir.file("a.safetensors");
  Tensor f32 = make_f32({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor bf16 = make_f32({0.5f, -1.0f, 3.0f}, {3}).to(DType::kBF16);  // 6 bytes: misaligns the next
  Tensor i64 = Tensor::from_vector<int64_t>({-1, 1LL << 40}, {2});
  Tensor f16 = make_f32({2.5f}, {}).to(DType::kF16);  // a scalar
  Tensor f8 = make_f32({1, -2, 0.5f, 448}, {2, 2}).to(DType::kF8E4M3);
  Tensor empty = Tensor::zeros({0, 4}, DType::kI32);
  write_safetensors(path,
                    {{"w.f32", f32},
                     {"w.bf16", bf16},
                     {"w.i64", i64},
                     {"w.f16", f16},
                     {"w.f8", f8},
                     {"w.empty", empty}},
                    {{"format", "pt"}, {"note", "quote\" and \\ and é"}});

  auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->path(), path);
  ASSERT_EQ(file->entries().size(), 6u);
  const char* order[] = {"w.f32", "w.bf16", "w.i64", "w.f16", "w.f8", "w.empty"};
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(file->entries()[i].name, order[i]);
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->metadata().at("note"), "quote\" and \\ and é");

  // The data section starts 8-byte aligned.
  std::string bytes = read_bytes(path);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) {
    header_len = header_len << 8 | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  }
  EXPECT_EQ((8 + header_len) % 8, 0u);

  const SafetensorsEntry* e = file->find("w.bf16");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->dtype_name, "BF16");
  EXPECT_TRUE(e->dtype_supported);
  EXPECT_EQ(e->dtype, DType::kBF16);
  EXPECT_EQ(e->shape, (Shape{3}));
  EXPECT_EQ(e->begin, 24u);
  EXPECT_EQ(e->end, 30u);
  EXPECT_EQ(file->find("nope"), nullptr);

  auto expect_same = [&](const char* name, const Tensor& want) {
    Tensor got = file->tensor(*file->find(name));
    EXPECT_EQ(got.dtype(), want.dtype()) << name;
    EXPECT_EQ(got.shape(), want.shape()) << name;
    ASSERT_EQ(got.nbytes(), want.nbytes()) << name;
    if (want.nbytes() != 0) {
      EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()), 0) << name;
    }
  };
  expect_same("w.f32", f32);
  expect_same("w.bf16", bf16);
  expect_same("w.i64", i64);
  expect_same("w.f16", f16);
  expect_same("w.f8", f8);
  expect_same("w.empty", empty);
  EXPECT_EQ(file->tensor(*file->find("w.i64")).item(1), static_cast<double>(1LL << 40));
}

TEST(Safetensors, ZeroCopyWhenAlignedCopyOtherwise) {
  TempDir dir;
  std::string path = dir.file("z.safetensors");
  write_safetensors(path, {{"aligned", make_f32({1, 2, 3, 4}, {4})},
                           {"odd", make_f32({1, 2, 3}, {3}).to(DType::kBF16)},
                           {"misaligned", make_f32({7, 8}, {2})}});
  auto file = SafetensorsFile::open(path);
  const SafetensorsEntry& aligned = *file->find("aligned");
  const SafetensorsEntry& misaligned = *file->find("misaligned");
  EXPECT_EQ(misaligned.begin, 22u);

  Tensor view = file->tensor(aligned);
  // The view points into the mapping itself: the bytes lie between the first and the last
  // tensor's bytes of this file.
  EXPECT_EQ(view.raw_data(), file->bytes(aligned));
  const auto* p = static_cast<const uint8_t*>(view.raw_data());
  EXPECT_GE(p, file->bytes(file->entries().front()));
  EXPECT_LE(p + view.nbytes(), file->bytes(file->entries().back()) + 8);
  EXPECT_EQ(view.item(3), 4.0);

  Tensor copy = file->tensor(misaligned);
  EXPECT_NE(copy.raw_data(), file->bytes(misaligned));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(copy.raw_data()) % 4, 0u);
  EXPECT_EQ(copy.item(0), 7.0);
  EXPECT_EQ(copy.item(1), 8.0);

  // The view keeps the mapping alive after the file object is gone.
  file.reset();
  EXPECT_EQ(view.item(0), 1.0);
  EXPECT_EQ(view.contiguous().item(2), 3.0);
}

TEST(Safetensors, UnsupportedDTypeIsListedButNotLoadable) {
  TempDir dir;
  std::string path = dir.file("scale.safetensors");
  write_bytes(path, raw_file(R"({"w.scale":{"dtype":"F8_E5M2","shape":[2,2],"data_offsets":[0,4]},)"
                             R"("w.weight":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                             8));
  auto file = SafetensorsFile::open(path);
  const SafetensorsEntry& scale = *file->find("w.scale");
  EXPECT_FALSE(scale.dtype_supported);
  EXPECT_EQ(scale.dtype_name, "F8_E5M2");
  EXPECT_EQ(file->bytes(scale)[0], 1);
  try {
    file->tensor(scale);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    std::string m = e.what();
    EXPECT_EQ(m.rfind(path, 0), 0u) << m;
    EXPECT_NE(m.find("w.scale"), std::string::npos) << m;
    EXPECT_NE(m.find("F8_E5M2"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(file->tensor(*file->find("w.weight")));
}

TEST(Safetensors, DTypeSizes) {
  EXPECT_EQ(safetensors_dtype_size("F64"), 8u);
  EXPECT_EQ(safetensors_dtype_size("U64"), 8u);
  EXPECT_EQ(safetensors_dtype_size("BOOL"), 1u);
  EXPECT_EQ(safetensors_dtype_size("F8_E8M0"), 1u);
  EXPECT_EQ(safetensors_dtype_size("F8_E5M2"), 1u);
  EXPECT_EQ(safetensors_dtype_size("BF16"), 2u);
  EXPECT_EQ(safetensors_dtype_size("U16"), 2u);
  EXPECT_EQ(safetensors_dtype_size("U32"), 4u);
  EXPECT_EQ(safetensors_dtype_size("f32"), 0u);  // names are case-sensitive
  EXPECT_EQ(safetensors_dtype_size("F4"), 0u);
}

TEST(Safetensors, EmptyHeaderAndTrailingSpaces) {
  TempDir dir;
  std::string path = dir.file("e.safetensors");
  write_bytes(path, raw_file("{}      ", 0));
  EXPECT_TRUE(SafetensorsFile::open(path)->entries().empty());
  write_safetensors(path, {});
  EXPECT_TRUE(SafetensorsFile::open(path)->entries().empty());
}

struct CorruptCase {
  const char* label;
  std::string bytes;
  std::vector<std::string> must_mention;
};

TEST(Safetensors, CorruptInputsAreRejectedWithClearMessages) {
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  std::vector<CorruptCase> cases = {
      {"empty file", "", {"truncated", "0 bytes"}},
      {"shorter than 8 bytes", "abc", {"truncated", "3 bytes"}},
      {"huge header length", u64_le(1ULL << 60) + "{}", {"truncated", "header length"}},
      {"header length one past the end", u64_le(3) + "{}", {"truncated"}},
      {"header not JSON", raw_file("{not json", 0), {"invalid JSON", "line 1"}},
      {"header is an array", raw_file("[1,2]", 0), {"array", "expected an object"}},
      {"entry not an object", raw_file(R"({"t":3})", 0), {"'t'", "expected an object"}},
      {"missing dtype",
       raw_file(R"({"t":{"shape":[1],"data_offsets":[0,4]}})", 4),
       {"'t'", "dtype"}},
      {"missing shape",
       raw_file(R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", 4),
       {"'t'", "shape"}},
      {"missing data_offsets",
       raw_file(R"({"t":{"dtype":"F32","shape":[1]}})", 4),
       {"'t'", "data_offsets"}},
      {"dtype not a string",
       raw_file(R"({"t":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4),
       {"'t'", "dtype"}},
      {"unknown dtype",
       raw_file(R"({"t":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16),
       {"'t'", "unknown dtype", "F128"}},
      {"negative shape",
       raw_file(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
       {"'t'", "-1", "non-negative"}},
      {"fractional shape",
       raw_file(R"({"t":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4),
       {"'t'", "1.5"}},
      {"shape not an array",
       raw_file(R"({"t":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", 8),
       {"'t'", "shape"}},
      {"size mismatch",
       raw_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 8),
       {"'t'", "4 bytes", "expected 8"}},
      {"shape overflow",
       raw_file(
           R"({"t":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,8]}})",
           8),
       {"'t'", "2^64"}},
      {"offsets reversed",
       raw_file(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8),
       {"'t'", "begin after end"}},
      {"offsets not a pair",
       raw_file(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 8),
       {"'t'", "[begin, end]"}},
      {"negative offset",
       raw_file(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 8),
       {"'t'", "non-negative"}},
      {"data past the end",
       raw_file("{" + ok_entry + "}", 5),
       {"truncated", "'t'", "[0, 8]", "5 bytes"}},
      {"overlap",
       raw_file("{" + ok_entry + R"(,"u":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
       {"'t'", "'u'", "overlap"}},
      {"metadata not an object", raw_file(R"({"__metadata__":[1]})", 0), {"__metadata__"}},
      {"metadata value not a string",
       raw_file(R"({"__metadata__":{"k":1}})", 0),
       {"__metadata__", "'k'", "expected a string"}},
      {"duplicate tensor", raw_file("{" + ok_entry + "," + ok_entry + "}", 8), {"duplicate key"}},
  };
  TempDir dir;
  for (const CorruptCase& c : cases) {
    std::string path = dir.file("corrupt.safetensors");
    write_bytes(path, c.bytes);
    std::string message = open_error(path);
    EXPECT_EQ(message.rfind(path, 0), 0u) << c.label << ": " << message;
    for (const std::string& word : c.must_mention) {
      EXPECT_NE(message.find(word), std::string::npos)
          << c.label << ": '" << word << "' missing from: " << message;
    }
  }
}

TEST(Safetensors, TruncatedDataSectionNamesTensorAndPath) {
  TempDir dir;
  std::string path = dir.file("cut.safetensors");
  write_safetensors(
      path, {{"first", make_f32({1, 2}, {2})}, {"layers.0.big", Tensor::zeros({64}, DType::kF32)}});
  std::string bytes = read_bytes(path);
  write_bytes(path, bytes.substr(0, bytes.size() - 10));
  std::string message = open_error(path);
  EXPECT_EQ(message.rfind(path, 0), 0u) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  EXPECT_NE(message.find("'layers.0.big'"), std::string::npos) << message;
  EXPECT_NE(message.find("[8, 264]"), std::string::npos) << message;
  EXPECT_NE(message.find("254 bytes"), std::string::npos) << message;
}

TEST(Safetensors, FileSystemErrors) {
  TempDir dir;
  std::string missing = dir.file("missing.safetensors");
  std::string message = open_error(missing, ErrorCode::kNotFound);
  EXPECT_NE(message.find(missing), std::string::npos) << message;
  message = open_error(dir.file(""), ErrorCode::kIo);
  EXPECT_NE(message.find("directory"), std::string::npos) << message;
  EXPECT_THROW(write_safetensors(dir.file("no/such/dir/x.safetensors"), {}), Error);
}

TEST(Safetensors, WriterRejectsBadInput) {
  TempDir dir;
  std::string path = dir.file("w.safetensors");
  EXPECT_THROW(write_safetensors(path, {{"t", Tensor()}}), Error);
  EXPECT_THROW(write_safetensors(path, {{"t", make_f32({1}, {1})}, {"t", make_f32({1}, {1})}}),
               Error);
  EXPECT_THROW(write_safetensors(path, {{"__metadata__", make_f32({1}, {1})}}), Error);
}

TEST(Safetensors, WriterMakesStridedViewsContiguous) {
  TempDir dir;
  std::string path = dir.file("s.safetensors");
  Tensor t = make_f32({0, 1, 2, 3, 4, 5}, {2, 3});
  write_safetensors(path, {{"col", t.narrow(1, 1, 2)}});
  auto file = SafetensorsFile::open(path);
  Tensor got = file->tensor(*file->find("col"));
  ASSERT_EQ(got.shape(), (Shape{2, 2}));
  EXPECT_EQ(got.item(0), 1.0);
  EXPECT_EQ(got.item(1), 2.0);
  EXPECT_EQ(got.item(2), 4.0);
  EXPECT_EQ(got.item(3), 5.0);
}

// Reads every byte a successfully opened file claims, so out-of-bounds entries would fault.
double touch_all(const SafetensorsFile& file) {
  double sum = 0;
  for (const SafetensorsEntry& e : file.entries()) {
    const uint8_t* p = file.bytes(e);
    for (uint64_t i = 0; i < e.end - e.begin; ++i) sum += p[i];
    if (e.dtype_supported) sum += static_cast<double>(file.tensor(e).nbytes());
  }
  return sum;
}

TEST(Safetensors, FuzzedFilesOpenOrThrowError) {
  TempDir dir;
  std::string base_path = dir.file("base.safetensors");
  write_safetensors(base_path,
                    {{"a", make_f32({1, 2, 3, 4}, {2, 2})},
                     {"b", make_f32({1, 2, 3}, {3}).to(DType::kBF16)},
                     {"c", Tensor::from_vector<int64_t>({5, 6}, {2})},
                     {"d", make_f32({1, 2, 3, 4, 5, 6, 7, 8}, {8}).to(DType::kF8E4M3)}},
                    {{"k", "v"}});
  const std::string base = read_bytes(base_path);
  std::mt19937 rng(12345);  // fixed seed: the same 500 files on every run
  auto pick = [&rng](size_t n) { return static_cast<size_t>(rng() % n); };
  std::string path = dir.file("fuzz.safetensors");
  int opened = 0;
  for (int iter = 0; iter < 500; ++iter) {
    std::string bytes = base;
    switch (iter % 4) {
      case 0:  // flip a few bits anywhere
        for (size_t k = 0, n = 1 + pick(4); k < n; ++k) {
          bytes[pick(bytes.size())] ^= static_cast<char>(1u << pick(8));
        }
        break;
      case 1:  // replace a header byte with a structural character or digit
        bytes[8 + pick(bytes.size() - 8)] = "{}[]\",:-0123456789 eE."[pick(22)];
        break;
      case 2:  // truncate
        bytes.resize(pick(bytes.size()));
        break;
      default:  // corrupt the header length
        bytes[pick(8)] = static_cast<char>(rng());
        break;
    }
    write_bytes(path, bytes);
    try {
      auto file = SafetensorsFile::open(path);
      touch_all(*file);
      ++opened;
    } catch (const Error&) {
      // Expected for most mutations.
    } catch (const std::exception& e) {
      FAIL() << "iteration " << iter << ": non-deepinfer exception: " << e.what();
    }
  }
  // Some mutations (bit flips in tensor data) must leave the file valid.
  EXPECT_GT(opened, 0);
}

}  // namespace
}  // namespace deepinfer
