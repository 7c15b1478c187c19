// Launch shapes of the Engram ops (engram.cu): the hash's and the FP8 lookup's threads and the
// gate's threads per (token, stream) row. Host code on shapes only.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

// The hash passes its constants as a kernel argument (graph-safe, nothing to upload), so their
// number is bounded: (n - 1) * heads tables and n multipliers. V4.1-Flash has 24 and 4.
constexpr int kEngramMaxTables = 128;
constexpr int kEngramMaxOrder = 16;

// The hash runs one thread per (token, head) over a grid-stride loop: enough blocks to fill the
// device, never more than the pairs need.
constexpr int kEngramHashThreads = 256;

inline unsigned engram_hash_blocks(int64_t pairs, int num_sms) {
  const int64_t need = (pairs + kEngramHashThreads - 1) / kEngramHashThreads;
  const int64_t fill = static_cast<int64_t>(num_sms) * 8;
  return static_cast<unsigned>(need < fill ? need : fill);
}

// embedding_fp8 runs one thread per (looked-up row, column) over a grid-stride loop, sized as
// the hash's.
constexpr int kEngramLookupThreads = 256;

inline unsigned engram_lookup_blocks(int64_t elements, int num_sms) {
  const int64_t need = (elements + kEngramLookupThreads - 1) / kEngramLookupThreads;
  const int64_t fill = static_cast<int64_t>(num_sms) * 8;
  return static_cast<unsigned>(need < fill ? need : fill);
}

// The gate runs one block per (token, stream) row of H channels. Few rows (decode: T * N = 4 at
// V4.1-Flash) leave most SMs idle, so each row then gets more threads to shorten its reductions;
// many rows fill the device with smaller blocks.
inline int engram_gate_threads(int64_t rows, int64_t hidden, int num_sms) {
  int threads = rows < num_sms ? 1024 : 256;
  while (threads > 32 && threads / 2 >= hidden) threads /= 2;  // no idle warps on tiny rows
  return threads;
}

}  // namespace deepinfer::cuda
