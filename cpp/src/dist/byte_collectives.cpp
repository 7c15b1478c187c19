#include "dist/byte_collectives.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "deepinfer/error.h"
#include "deepinfer/tensor.h"

namespace deepinfer::dist {
namespace {

// A length as two i32 words (low, high): the collectives move i32, and a length may pass 2^31.
void put_length(int32_t* words, uint64_t n) {
  const auto lo = static_cast<uint32_t>(n & 0xffffffffu);
  const auto hi = static_cast<uint32_t>(n >> 32);
  std::memcpy(&words[0], &lo, sizeof(lo));
  std::memcpy(&words[1], &hi, sizeof(hi));
}

uint64_t get_length(const int32_t* words) {
  uint32_t lo = 0, hi = 0;
  std::memcpy(&lo, &words[0], sizeof(lo));
  std::memcpy(&hi, &words[1], sizeof(hi));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

int64_t words_for(uint64_t bytes) {
  return static_cast<int64_t>((bytes + 3) / 4);
}

}  // namespace

std::vector<uint8_t> broadcast_bytes(Communicator& comm, std::vector<uint8_t> bytes_on_root,
                                     int root) {
  const bool is_root = comm.rank() == root;
  // The length travels by broadcast too, so a bad or disagreeing root is the communicator's
  // error on every rank, not a hang.
  Tensor length = Tensor::zeros({2}, DType::kI32);
  if (is_root) put_length(length.data<int32_t>(), bytes_on_root.size());
  comm.broadcast(length, root);
  const uint64_t n = get_length(length.data<int32_t>());
  if (n == 0) return {};
  Tensor words = Tensor::zeros({words_for(n)}, DType::kI32);
  if (is_root) std::memcpy(words.raw_data(), bytes_on_root.data(), bytes_on_root.size());
  comm.broadcast(words, root);
  if (is_root) return bytes_on_root;
  std::vector<uint8_t> out(static_cast<size_t>(n));
  std::memcpy(out.data(), words.raw_data(), out.size());
  return out;
}

std::vector<std::vector<uint8_t>> gather_bytes(Communicator& comm,
                                               const std::vector<uint8_t>& mine) {
  const int n = comm.size();
  Tensor my_length = Tensor::zeros({1, 2}, DType::kI32);
  put_length(my_length.data<int32_t>(), mine.size());
  Tensor lengths = Tensor::zeros({n, 2}, DType::kI32);
  comm.all_gather(my_length, lengths);
  std::vector<uint64_t> sizes(static_cast<size_t>(n));
  uint64_t longest = 0;
  for (int r = 0; r < n; ++r) {
    sizes[static_cast<size_t>(r)] = get_length(lengths.data<int32_t>() + 2 * r);
    longest = std::max(longest, sizes[static_cast<size_t>(r)]);
  }
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(n));
  if (longest == 0) return out;  // every rank sees the same lengths, so all of them stop here
  // Padded to the longest so every rank passes the same shape (all_gather's contract).
  const int64_t w = words_for(longest);
  Tensor padded = Tensor::zeros({w}, DType::kI32);
  if (!mine.empty()) std::memcpy(padded.raw_data(), mine.data(), mine.size());
  Tensor all = Tensor::zeros({n * w}, DType::kI32);
  comm.all_gather(padded, all);
  const auto* base = static_cast<const uint8_t*>(all.raw_data());
  for (int r = 0; r < n; ++r) {
    const uint8_t* at = base + static_cast<size_t>(r) * static_cast<size_t>(w) * 4;
    out[static_cast<size_t>(r)].assign(at, at + sizes[static_cast<size_t>(r)]);
  }
  return out;
}

}  // namespace deepinfer::dist
