#include "backend/op_checks.h"

#include <iterator>

#include "deepinfer/error.h"
#include "tensor/kv_record.h"

namespace deepinfer::checks {

namespace {

constexpr DType kAllDTypes[] = {DType::kF32, DType::kBF16, DType::kF16,  DType::kF8E4M3,
                                DType::kI32, DType::kI64,  DType::kE8M0, DType::kE2M1x2,
                                DType::kI8,  DType::kU8};
static_assert(std::size(kAllDTypes) == static_cast<size_t>(DType::kU8) + 1,
              "kAllDTypes lists every DType");

std::string shape_pattern(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += shape[i] < 0 ? std::string("*") : std::to_string(shape[i]);
  }
  return s + "]";
}

// "in host memory" / "on the cuda device".
std::string where(DeviceKind device) {
  if (device == DeviceKind::kCpu) return "in host memory";
  return std::string("on the ") + device_kind_name(device) + " device";
}

}  // namespace

void fail(const char* op, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": " + what);
}

DTypeSet::DTypeSet(std::initializer_list<DType> dtypes) {
  for (DType d : dtypes) bits_ |= bit(d);
}

DTypeSet DTypeSet::any() {
  DTypeSet all;
  for (DType d : kAllDTypes) all.bits_ |= bit(d);
  return all;
}

std::string DTypeSet::str() const {
  std::string s;
  for (DType d : kAllDTypes) {
    if (!contains(d)) continue;
    if (!s.empty()) s += " or ";
    s += dtype_name(d);
  }
  return s;
}

void OpChecks::defined_on(const char* arg, const Tensor& t, DeviceKind device,
                          const std::string& expected) const {
  if (!t.defined()) {
    fail(std::string("argument ") + arg + " must be " + expected + ", got an undefined tensor");
  }
  if (t.device().kind != device) {
    fail(std::string("argument ") + arg + " must be " + where(device) + ", got " + t.describe());
  }
}

void OpChecks::contiguous(const char* arg, const Tensor& t) const {
  if (!t.is_contiguous()) {
    fail(std::string("argument ") + arg + " must be contiguous, got a strided view " +
         t.describe());
  }
}

bool OpChecks::placed(const Tensor& t, DeviceKind device) const {
  return t.defined() && t.device().kind == device && t.is_contiguous();
}

void OpChecks::tensor(const char* arg, const Tensor& t, DTypeSet dtypes, const Shape& shape) const {
  // The passing case builds no strings: checks run before every op, eager steps call hundreds.
  bool ok = placed(t, device_) && dtypes.contains(t.dtype()) && t.shape().size() == shape.size();
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 || shape[i] == t.shape()[i];
  if (ok) return;
  const std::string names = dtypes.str();
  const std::string expected =
      (names.find(' ') == std::string::npos ? names : "(" + names + ")") + shape_pattern(shape);
  defined_on(arg, t, device_, expected);
  contiguous(arg, t);
  fail(std::string("argument ") + arg + " must be " + expected + ", got " + t.describe());
}

void OpChecks::optional(const char* arg, const Tensor& t, DTypeSet dtypes,
                        const Shape& shape) const {
  if (t.defined()) tensor(arg, t, dtypes, shape);
}

void OpChecks::rank(const char* arg, const Tensor& t, DTypeSet dtypes, int64_t min_rank,
                    int64_t max_rank) const {
  if (placed(t, device_) && dtypes.contains(t.dtype()) && t.dim() >= min_rank &&
      t.dim() <= max_rank)
    return;
  const std::string expected = dtypes.str() + " of rank " + std::to_string(min_rank) +
                               (max_rank != min_rank ? "-" + std::to_string(max_rank) : "");
  defined_on(arg, t, device_, expected);
  contiguous(arg, t);
  if (!dtypes.contains(t.dtype()) || t.dim() < min_rank || t.dim() > max_rank) {
    fail(std::string("argument ") + arg + " must be " + expected + ", got " + t.describe());
  }
}

void OpChecks::dense(const char* arg, const Tensor& t, DTypeSet dtypes, int64_t min_rank) const {
  defined_on(arg, t, device_, "a tensor");
  contiguous(arg, t);
  if (!dtypes.contains(t.dtype())) {
    fail(std::string("argument ") + arg + " must be " + dtypes.str() + ", got " + t.describe());
  }
  if (t.dim() < min_rank) {
    fail(std::string("argument ") + arg + " must have at least " +
         (min_rank == 1 ? std::string("one dimension") : std::to_string(min_rank) + " dimensions") +
         ", got " + t.describe());
  }
}

bool OpChecks::weight_ok(const MatrixWeight& w, DTypeSet dense_dtypes, int64_t rows, int64_t cols,
                         bool on_host) const {
  const DeviceKind where = on_host ? DeviceKind::kCpu : device_;
  if (!placed(w.values, where) || w.values.dim() != 2 || w.act_group < 0) return false;
  if ((rows >= 0 && w.rows() != rows) || (cols >= 0 && w.cols() != cols)) return false;
  switch (w.format) {
    case WeightFormat::kDense:
      return dense_dtypes.contains(w.values.dtype()) && !w.scales.defined();
    case WeightFormat::kFp8Block:
    case WeightFormat::kMxfp4: {
      const bool fp8 = w.format == WeightFormat::kFp8Block;
      if (w.values.dtype() != (fp8 ? DType::kF8E4M3 : DType::kE2M1x2)) return false;
      if (fp8 ? (w.block_rows < 1 || w.block_cols < 1)
              : (w.block_rows != 1 || w.block_cols != 32 || w.cols() % 32 != 0))
        return false;
      const Shape& s = w.scales.shape();
      return placed(w.scales, where) && w.scales.dtype() == (fp8 ? DType::kF32 : DType::kE8M0) &&
             s.size() == 2 && s[0] == (w.rows() + w.block_rows - 1) / w.block_rows &&
             s[1] == (w.cols() + w.block_cols - 1) / w.block_cols;
    }
  }
  return false;
}

void OpChecks::weight(const std::string& arg, const MatrixWeight& w, DTypeSet dense_dtypes,
                      int64_t rows, int64_t cols, bool on_host) const {
  if (weight_ok(w, dense_dtypes, rows, cols, on_host)) return;
  if (w.format == WeightFormat::kDense && !on_host) {
    // A dense weight is checked as the plain matrix it is (the messages name it `arg`).
    tensor(arg.c_str(), w.values, dense_dtypes, {rows, cols});
    if (w.scales.defined())
      fail("argument " + arg + " is dense but has scales " + w.scales.describe());
    if (w.act_group < 0) {
      fail("argument " + arg + " has act_group " + std::to_string(w.act_group) +
           " (expected 0 or a positive group size)");
    }
    return;
  }
  const std::string values_arg = arg + ".values";
  defined_on(values_arg.c_str(), w.values, on_host ? DeviceKind::kCpu : device_, "a matrix");
  contiguous(values_arg.c_str(), w.values);
  if (w.values.dim() != 2) {
    fail("argument " + values_arg + " must be a matrix, got " + w.values.describe());
  }
  if (w.act_group < 0) {
    fail("argument " + arg + " has act_group " + std::to_string(w.act_group) +
         " (expected 0 or a positive group size)");
  }
  auto expect_dtype = [&](DTypeSet dtypes) {
    if (!dtypes.contains(w.values.dtype())) {
      fail("argument " + values_arg + " of a " + weight_format_name(w.format) + " weight must be " +
           dtypes.str() + ", got " + w.values.describe());
    }
  };
  switch (w.format) {
    case WeightFormat::kDense:
      expect_dtype(dense_dtypes);
      if (w.scales.defined()) {
        fail("argument " + arg + " is dense but has scales " + w.scales.describe());
      }
      break;
    case WeightFormat::kFp8Block:
    case WeightFormat::kMxfp4: {
      const bool fp8 = w.format == WeightFormat::kFp8Block;
      expect_dtype(fp8 ? DType::kF8E4M3 : DType::kE2M1x2);
      if (fp8 ? (w.block_rows < 1 || w.block_cols < 1)
              : (w.block_rows != 1 || w.block_cols != 32)) {
        fail("argument " + arg + " has blocks " + std::to_string(w.block_rows) + "x" +
             std::to_string(w.block_cols) + ", expected " +
             (fp8 ? std::string("positive sizes") : std::string("1x32 (mxfp4)")));
      }
      if (!fp8 && w.cols() % 32 != 0) {
        fail("argument " + values_arg + " " + w.values.describe() + " packs " +
             std::to_string(w.cols()) + " columns, not a multiple of the mxfp4 block 32");
      }
      const std::string scales_arg = arg + ".scales";
      const DType scale_dtype = fp8 ? DType::kF32 : DType::kE8M0;
      const Shape grid = weight_scale_shape(w.rows(), w.cols(), w.block_rows, w.block_cols);
      const std::string expected = std::string(dtype_name(scale_dtype)) + shape_str(grid);
      defined_on(scales_arg.c_str(), w.scales, on_host ? DeviceKind::kCpu : device_, expected);
      contiguous(scales_arg.c_str(), w.scales);
      if (w.scales.dtype() != scale_dtype || w.scales.shape() != grid) {
        fail("argument " + scales_arg + " must be " + expected + " (one scale per " +
             std::to_string(w.block_rows) + "x" + std::to_string(w.block_cols) + " block of " +
             values_arg + " " + w.values.describe() + "), got " + w.scales.describe());
      }
      break;
    }
  }
  if ((rows >= 0 && w.rows() != rows) || (cols >= 0 && w.cols() != cols)) {
    fail("argument " + arg + " must be [" + (rows >= 0 ? std::to_string(rows) : "*") + ", " +
         (cols >= 0 ? std::to_string(cols) : "*") + "] (logical), got " + w.describe());
  }
}

void OpChecks::on_device(const char* arg, const Tensor& t) const {
  defined_on(arg, t, device_, "a tensor");
}

void OpChecks::host(const char* arg, const Tensor& t, bool must_be_contiguous) const {
  defined_on(arg, t, DeviceKind::kCpu, "a tensor");
  if (must_be_contiguous) contiguous(arg, t);
}

void OpChecks::same_dtype_and_shape(const Tensor& a, const Tensor& b) const {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) {
    fail("needs tensors of one dtype and shape, got " + a.describe() + " and " + b.describe());
  }
}

void OpChecks::layout(const BatchLayout& layout, bool need_block_table) const {
  const int64_t t = layout.num_tokens;
  const int64_t b = layout.num_seqs;
  // Every row belongs to a sequence, so rows need at least one.
  if (t < 0 || b < 0 || layout.block_size <= 0 || layout.max_blocks_per_seq < 0 ||
      (t > 0 && b == 0)) {
    fail("layout has num_tokens " + std::to_string(t) + ", num_seqs " + std::to_string(b) +
         ", block_size " + std::to_string(layout.block_size) + ", max_blocks_per_seq " +
         std::to_string(layout.max_blocks_per_seq) +
         " (expected >= 0, >= 1 when there are tokens, > 0, >= 0)");
  }
  tensor("layout.positions", layout.positions, DType::kI32, {t});
  tensor("layout.seq_q_start", layout.seq_q_start, DType::kI32, {b + 1});
  tensor("layout.seq_ctx_len", layout.seq_ctx_len, DType::kI32, {b});
  tensor("layout.seq_slot", layout.seq_slot, DType::kI32, {b});
  if (need_block_table) {
    tensor("layout.block_table", layout.block_table, DType::kI32, {b, layout.max_blocks_per_seq});
  }
}

namespace {

DTypeSet kv_dtypes() {
  return {DType::kF32, DType::kBF16, DType::kU8, DType::kF8E4M3, DType::kE2M1x2};
}

[[noreturn]] void fail_unsupported_kv(const char* op, const char* arg, DType dtype) {
  throw Error(ErrorCode::kUnsupported,
              std::string(op) + ": argument " + arg + " is a " + dtype_name(dtype) +
                  " KV cache, which this backend cannot use yet (kv_cache_dtype: it has no "
                  "kernels for this KV format); use f32 caches");
}

}  // namespace

void OpChecks::kv_cache(const char* arg, const Tensor& t, Shape shape, int64_t dim,
                        int64_t rope_dim, bool supported) const {
  if (rope_dim < 0 || rope_dim > dim) {
    fail("rope_dim " + std::to_string(rope_dim) + " must be in [0, " + std::to_string(dim) +
         "] (the channels of a row of argument " + arg + ")");
  }
  // The dtype decides the row width; checked against the set first so a wrong dtype is named.
  if (!t.defined()) defined_on(arg, t, device_, "a KV cache (" + kv_dtypes().str() + ")");
  defined_on(arg, t, device_, "a KV cache");
  const bool known = kv_dtypes().contains(t.dtype());
  const DType dtype = known ? t.dtype() : DType::kF32;
  shape.back() = kv_record::row_width(dtype, dim, rope_dim);
  tensor(arg, t, known ? DTypeSet(dtype) : kv_dtypes(), shape);
  if (!supported) fail_unsupported_kv(op_, arg, dtype);
}

void OpChecks::kv_dtype(const char* arg, DType dtype, int64_t dim, int64_t rope_dim,
                        bool supported) const {
  if (rope_dim < 0 || rope_dim > dim) {
    fail("rope_dim " + std::to_string(rope_dim) + " must be in [0, " + std::to_string(dim) +
         "] (the channels of a row of " + arg + ")");
  }
  if (!kv_dtypes().contains(dtype)) {
    fail(std::string(arg) + " must be a KV cache dtype (" + kv_dtypes().str() + "), got " +
         dtype_name(dtype));
  }
  if (!supported) fail_unsupported_kv(op_, arg, dtype);
}

void OpChecks::kv_cache_supported(const char* arg, const Tensor& t, bool supported) const {
  if (!supported) fail_unsupported_kv(op_, arg, t.dtype());
}

void OpChecks::ratio(int ratio, const BatchLayout& layout) const {
  if (ratio < 1 || layout.block_size % ratio != 0) {
    fail("compression ratio " + std::to_string(ratio) + " must be >= 1 and divide block_size " +
         std::to_string(layout.block_size));
  }
}

}  // namespace deepinfer::checks
