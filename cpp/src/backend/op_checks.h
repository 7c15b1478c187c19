// Metadata checks of op arguments, written once for every backend: the Backend front
// (backend.cpp) runs them on the calling thread before it calls a backend's implementation.
// They look at dtype, shape, contiguity and device only, never at contents (which may not have
// been computed yet). Every failure is Error(kInvalidArgument) "<op>: <what>", naming the
// argument: "linear: argument w must be f32[*, 3], got f32[2, 4] on cpu".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "deepinfer/backend.h"
#include "deepinfer/tensor.h"

namespace deepinfer::checks {

[[noreturn]] void fail(const char* op, const std::string& what);

// The dtypes an argument may have.
class DTypeSet {
 public:
  // Implicit: where one dtype is expected, the set of that dtype.
  DTypeSet(DType dtype) : bits_(bit(dtype)) {}
  DTypeSet(std::initializer_list<DType> dtypes);
  static DTypeSet any();
  bool contains(DType dtype) const { return (bits_ & bit(dtype)) != 0; }
  std::string str() const;  // "f32", "f32 or bf16"

 private:
  DTypeSet() = default;
  static uint32_t bit(DType dtype) { return 1u << static_cast<unsigned>(dtype); }
  uint32_t bits_ = 0;
};

// The checks of one op call on a backend whose tensors live on `device`.
class OpChecks {
 public:
  OpChecks(const char* op, DeviceKind device) : op_(op), device_(device) {}

  [[noreturn]] void fail(const std::string& what) const { checks::fail(op_, what); }

  // A defined, contiguous tensor on the device of one of `dtypes` whose shape matches `shape`;
  // an entry of -1 in `shape` accepts any size.
  void tensor(const char* arg, const Tensor& t, DTypeSet dtypes, const Shape& shape) const;
  // `tensor` when `t` is defined; an undefined `t` is accepted (an optional argument).
  void optional(const char* arg, const Tensor& t, DTypeSet dtypes, const Shape& shape) const;
  // A defined, contiguous tensor on the device of one of `dtypes` with a rank in
  // [min_rank, max_rank].
  void rank(const char* arg, const Tensor& t, DTypeSet dtypes, int64_t min_rank,
            int64_t max_rank) const;
  // A defined, contiguous tensor on the device of one of `dtypes` (any shape) with at least
  // `min_rank` dimensions.
  void dense(const char* arg, const Tensor& t, DTypeSet dtypes = DTypeSet::any(),
             int64_t min_rank = 0) const;
  // A matrix weight of logical shape [rows, cols] (-1: any size) on the device (on the host with
  // `on_host`): dense values of one of `dense_dtypes`, or a quantized format whose values,
  // scales and blocks agree with each other (weight.h). Messages name `arg` and the part.
  void weight(const std::string& arg, const MatrixWeight& w, DTypeSet dense_dtypes, int64_t rows,
              int64_t cols, bool on_host = false) const;
  // Whether `weight` would pass, building no strings (for callers that name the argument only
  // when it fails, e.g. the 768 expert matrices of a V4 MoE layer).
  bool weight_ok(const MatrixWeight& w, DTypeSet dense_dtypes, int64_t rows, int64_t cols,
                 bool on_host = false) const;
  // A defined tensor on the device, any dtype and strides.
  void on_device(const char* arg, const Tensor& t) const;
  // A defined tensor in host memory, any dtype; `contiguous` also requires a contiguous one.
  void host(const char* arg, const Tensor& t, bool contiguous) const;
  // `a` and `b` have one dtype and one shape.
  void same_dtype_and_shape(const Tensor& a, const Tensor& b) const;
  // The metadata of every tensor of `layout`; `need_block_table` also requires
  // block_table [B, max_blocks_per_seq].
  void layout(const BatchLayout& layout, bool need_block_table) const;
  // A KV cache (backend.h, "KV caches") whose shape is `shape` except for the last dimension,
  // the width a row of `dim` channels takes in its dtype (f32 / bf16: dim; kU8, kF8E4M3,
  // kE2M1x2: the record that the dtype and `rope_dim` select, kv_record.h). `supported`: whether
  // the backend has kernels for its dtype (otherwise Error(kUnsupported)).
  void kv_cache(const char* arg, const Tensor& t, Shape shape, int64_t dim, int64_t rope_dim,
                bool supported) const;
  // A KV cache dtype `dtype` (argument `arg`, not a tensor: an op's output format) for rows of
  // `dim` channels with `rope_dim` RoPE channels, as kv_cache checks a cache's.
  void kv_dtype(const char* arg, DType dtype, int64_t dim, int64_t rope_dim, bool supported) const;
  // Error(kUnsupported) naming `arg`, a KV cache of t's dtype, unless `supported`.
  void kv_cache_supported(const char* arg, const Tensor& t, bool supported) const;
  // A compression ratio >= 1 that divides the layout's block size.
  void ratio(int ratio, const BatchLayout& layout) const;

 private:
  void defined_on(const char* arg, const Tensor& t, DeviceKind device,
                  const std::string& expected) const;
  void contiguous(const char* arg, const Tensor& t) const;
  // Defined, on `device` and contiguous (the passing case of defined_on + contiguous).
  bool placed(const Tensor& t, DeviceKind device) const;

  const char* op_;
  DeviceKind device_;
};

}  // namespace deepinfer::checks
