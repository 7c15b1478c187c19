#include "dist/collective_args.h"

namespace deepinfer::dist {

std::string tensor_signature(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + shape_str(t.shape());
}

Shape trailing_shape(const Tensor& t) {
  return Shape(t.shape().begin() + 1, t.shape().end());
}

size_t row_bytes(const Tensor& t) {
  size_t bytes = dtype_size(t.dtype());
  for (int64_t d : trailing_shape(t)) bytes *= static_cast<size_t>(d);
  return bytes;
}

std::string tensor_error(const char* arg, const Tensor& t, bool sum, bool rows,
                         const PlacementRule& placement) {
  if (!t.defined()) return std::string(arg) + " is undefined";
  if (std::string placed = placement(arg, t); !placed.empty()) return placed;
  if (!t.is_contiguous()) return std::string(arg) + " " + t.describe() + " is not contiguous";
  if (sum ? t.dtype() != DType::kF32 : (t.dtype() != DType::kF32 && t.dtype() != DType::kI32)) {
    return std::string(arg) + " is " + tensor_signature(t) + " but must be f32" +
           (sum ? "" : " or i32");
  }
  if (rows && t.dim() < 1) {
    return std::string(arg) + " " + tensor_signature(t) + " has no rows (dim 0)";
  }
  return "";
}

std::string counts_error(const char* arg, const Tensor& t, std::span<const int64_t> rows,
                         int size) {
  if (static_cast<int>(rows.size()) != size) {
    return std::string(arg) + "_rows has " + std::to_string(rows.size()) + " counts for " +
           std::to_string(size) + " ranks";
  }
  int64_t total = 0;
  for (int64_t n : rows) {
    if (n < 0) return std::string(arg) + "_rows holds a negative count " + std::to_string(n);
    total += n;
  }
  if (total != t.size(0)) {
    return std::string(arg) + " " + tensor_signature(t) + " has " + std::to_string(t.size(0)) +
           " rows but " + arg + "_rows sum to " + std::to_string(total);
  }
  return "";
}

CollectiveArgs all_reduce_args(const Tensor& t, const PlacementRule& placement) {
  return {tensor_error("tensor", t, true, false, placement),
          t.defined() ? tensor_signature(t) : ""};
}

CollectiveArgs all_gather_args(const Tensor& input, const Tensor& output, int size,
                               const PlacementRule& placement) {
  CollectiveArgs a;
  a.local_error = tensor_error("input", input, false, true, placement);
  if (a.local_error.empty()) a.local_error = tensor_error("output", output, false, true, placement);
  if (a.local_error.empty()) {
    Shape want = input.shape();
    want[0] *= size;
    if (output.dtype() != input.dtype() || output.shape() != want) {
      a.local_error = "output is " + tensor_signature(output) + " but must be " +
                      dtype_name(input.dtype()) + shape_str(want) + " for input " +
                      tensor_signature(input);
    }
  }
  a.signature = input.defined() ? tensor_signature(input) : "";
  return a;
}

CollectiveArgs reduce_scatter_args(const Tensor& input, const Tensor& output, int size,
                                   const PlacementRule& placement) {
  CollectiveArgs a;
  a.local_error = tensor_error("input", input, true, true, placement);
  if (a.local_error.empty()) a.local_error = tensor_error("output", output, true, true, placement);
  if (a.local_error.empty()) {
    Shape want = output.shape();
    want[0] *= size;
    if (input.shape() != want) {
      a.local_error = "input is " + tensor_signature(input) + " but must be f32" + shape_str(want) +
                      " for output " + tensor_signature(output);
    }
  }
  a.signature = input.defined() ? tensor_signature(input) : "";
  return a;
}

CollectiveArgs all_to_all_args(const Tensor& send, std::span<const int64_t> send_rows,
                               const Tensor& recv, std::span<const int64_t> recv_rows, int size,
                               const PlacementRule& placement) {
  CollectiveArgs a;
  a.local_error = tensor_error("send", send, false, true, placement);
  if (a.local_error.empty()) a.local_error = tensor_error("recv", recv, false, true, placement);
  if (a.local_error.empty()) a.local_error = counts_error("send", send, send_rows, size);
  if (a.local_error.empty()) a.local_error = counts_error("recv", recv, recv_rows, size);
  if (a.local_error.empty() &&
      (recv.dtype() != send.dtype() || trailing_shape(recv) != trailing_shape(send))) {
    a.local_error = "recv " + tensor_signature(recv) + " does not match send " +
                    tensor_signature(send) + " in dtype and trailing shape";
  }
  if (send.defined()) {
    // "f32[rows, 8]": the row counts are checked pairwise, not against rank 0's.
    a.signature = std::string(dtype_name(send.dtype())) + "[rows";
    for (int64_t d : trailing_shape(send)) a.signature += ", " + std::to_string(d);
    a.signature += "]";
  }
  return a;
}

CollectiveArgs broadcast_args(const Tensor& t, int root, int size, const PlacementRule& placement) {
  CollectiveArgs a;
  a.local_error = tensor_error("tensor", t, false, false, placement);
  if (a.local_error.empty() && (root < 0 || root >= size)) {
    a.local_error =
        "root " + std::to_string(root) + " is not a rank of a group of " + std::to_string(size);
  }
  a.signature = (t.defined() ? tensor_signature(t) : "") + " from root " + std::to_string(root);
  return a;
}

std::optional<Mismatch> first_mismatch(std::span<const RankCall> calls) {
  const RankCall& first = calls[0];
  for (size_t r = 0; r < calls.size(); ++r) {
    if (calls[r].name != first.name) {
      return Mismatch{static_cast<int>(r), "rank " + std::to_string(r) + " called " +
                                               std::string(calls[r].name) +
                                               " while rank 0 called " + std::string(first.name)};
    }
  }
  for (size_t r = 0; r < calls.size(); ++r) {
    if (!calls[r].local_error.empty()) {
      return Mismatch{static_cast<int>(r),
                      "rank " + std::to_string(r) + ": " + std::string(calls[r].local_error)};
    }
  }
  for (size_t r = 1; r < calls.size(); ++r) {
    if (calls[r].signature != first.signature) {
      return Mismatch{static_cast<int>(r),
                      "rank " + std::to_string(r) + " passed " + std::string(calls[r].signature) +
                          " but rank 0 passed " + std::string(first.signature)};
    }
  }
  return std::nullopt;
}

}  // namespace deepinfer::dist
