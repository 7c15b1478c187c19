#include "dist/byte_collectives.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "deepinfer/error.h"

namespace deepinfer::dist {
namespace {

int64_t words_for(uint64_t bytes) {
  return static_cast<int64_t>((bytes + sizeof(int32_t) - 1) / sizeof(int32_t));
}

}  // namespace

std::vector<uint8_t> broadcast_bytes(Communicator& comm, const std::vector<uint8_t>& bytes,
                                     int root) {
  if (root < 0 || root >= comm.size()) {
    throw Error(ErrorCode::kInvalidArgument, "broadcast_bytes: root " + std::to_string(root) +
                                                 " is outside the group of " +
                                                 std::to_string(comm.size()));
  }
  const std::vector<uint64_t> mine = {comm.rank() == root ? bytes.size() : 0};
  const uint64_t size = comm.all_reduce_host(mine, HostReduceOp::kSum)[0];
  // One word more than needed, so an empty message still has a row to move.
  Tensor words = Tensor::zeros({words_for(size) + 1}, DType::kI32);
  if (comm.rank() == root && size > 0) std::memcpy(words.data<int32_t>(), bytes.data(), size);
  comm.broadcast(words, root);
  std::vector<uint8_t> out(static_cast<size_t>(size));
  if (size > 0) std::memcpy(out.data(), words.data<int32_t>(), static_cast<size_t>(size));
  return out;
}

std::vector<std::vector<uint8_t>> gather_bytes(Communicator& comm,
                                               const std::vector<uint8_t>& mine) {
  const auto n = static_cast<size_t>(comm.size());
  std::vector<uint64_t> sizes(n, 0);
  sizes[static_cast<size_t>(comm.rank())] = mine.size();
  sizes = comm.all_reduce_host(sizes, HostReduceOp::kSum);
  const int64_t width = words_for(*std::max_element(sizes.begin(), sizes.end())) + 1;
  Tensor row = Tensor::zeros({1, width}, DType::kI32);
  if (!mine.empty()) std::memcpy(row.data<int32_t>(), mine.data(), mine.size());
  Tensor all = Tensor::zeros({static_cast<int64_t>(n), width}, DType::kI32);
  comm.all_gather(row, all);
  std::vector<std::vector<uint8_t>> out(n);
  const auto* base = reinterpret_cast<const uint8_t*>(all.data<int32_t>());
  for (size_t r = 0; r < n; ++r) {
    const uint8_t* p = base + r * static_cast<size_t>(width) * sizeof(int32_t);
    out[r].assign(p, p + sizes[r]);
  }
  return out;
}

}  // namespace deepinfer::dist
