// The arguments a rank checks on its own before a collective, and the signature that must equal
// rank 0's, written once for the communicators that compare every rank's arguments (the
// in-process and TCP ones): the same checks give the same messages whichever carries the bytes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "deepinfer/communicator.h"
#include "deepinfer/tensor.h"

namespace deepinfer::dist {

// "f32[4, 8]".
std::string tensor_signature(const Tensor& t);
// The shape past dim 0.
Shape trailing_shape(const Tensor& t);
// Bytes of one row (dim 0 index).
size_t row_bytes(const Tensor& t);

// Where a communicator takes its tensors: "" when `t` (named `arg`) is on a device it takes, else
// why not. Checked after "is undefined" and before contiguity and dtype.
using PlacementRule = std::function<std::string(const char* arg, const Tensor& t)>;

// The problem with one tensor argument ("" when fine): defined, placed as `placement` says,
// contiguous, f32 (`sum`) or f32/i32, and with a dim 0 when `rows`.
std::string tensor_error(const char* arg, const Tensor& t, bool sum, bool rows,
                         const PlacementRule& placement);
// The problem with all_to_all's per-peer row counts for `t` in a group of `size`.
std::string counts_error(const char* arg, const Tensor& t, std::span<const int64_t> rows, int size);

struct CollectiveArgs {
  std::string local_error;  // this rank's own argument error ("" = none)
  std::string signature;    // what must equal rank 0's
};
CollectiveArgs all_reduce_args(const Tensor& t, const PlacementRule& placement);
CollectiveArgs all_gather_args(const Tensor& input, const Tensor& output, int size,
                               const PlacementRule& placement);
CollectiveArgs reduce_scatter_args(const Tensor& input, const Tensor& output, int size,
                                   const PlacementRule& placement);
CollectiveArgs all_to_all_args(const Tensor& send, std::span<const int64_t> send_rows,
                               const Tensor& recv, std::span<const int64_t> recv_rows, int size,
                               const PlacementRule& placement);
CollectiveArgs broadcast_args(const Tensor& t, int root, int size, const PlacementRule& placement);

// acc[i] = acc[i] (op) x[i], the host all-reduce's element rule: kOr / kAnd bitwise, kSum
// modulo 2^64, kMax signed for i64 and unsigned for u64. Ranks fold in rank order.
template <typename T>
void host_reduce_into(std::span<T> acc, std::span<const T> x, HostReduceOp op) {
  using U = std::make_unsigned_t<T>;
  for (size_t i = 0; i < acc.size(); ++i) {
    switch (op) {
      case HostReduceOp::kOr:
        acc[i] = static_cast<T>(static_cast<U>(acc[i]) | static_cast<U>(x[i]));
        break;
      case HostReduceOp::kAnd:
        acc[i] = static_cast<T>(static_cast<U>(acc[i]) & static_cast<U>(x[i]));
        break;
      case HostReduceOp::kSum:
        acc[i] = static_cast<T>(static_cast<U>(acc[i]) + static_cast<U>(x[i]));
        break;
      case HostReduceOp::kMax:
        acc[i] = std::max(acc[i], x[i]);
        break;
    }
  }
}

// The first disagreement among every rank's arguments to one collective, the same on every rank
// that computes it: a rank calling another collective than rank 0, then a rank's own argument
// error, then a signature that differs from rank 0's.
struct RankCall {
  std::string_view name;
  std::string_view local_error;
  std::string_view signature;
};
struct Mismatch {
  int rank;  // the rank whose arguments are wrong
  std::string what;
};
std::optional<Mismatch> first_mismatch(std::span<const RankCall> calls);

}  // namespace deepinfer::dist
