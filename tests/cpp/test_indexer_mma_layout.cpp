// The channel permutation and shared-memory swizzle of the tensor-core indexer kernel
// (cuda/indexer/indexer_mma_layout.h), checked on the host: the device cannot run here, and a
// wrong index there gives wrong scores only on the GPU. The test plays the kernel's lanes: it
// builds q's A fragments and the keys' B fragments the way indexer_score_mma.cu reads them, runs
// mma.sync m16n8k16 by the PTX ISA's fragment layout, and compares with the plain dot products.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "cuda/indexer/indexer_mma_layout.h"

namespace deepinfer::cuda::indexer_mma {
namespace {

constexpr int kDim = 128;  // kMmaDim
constexpr int kSteps = kDim / 16;

TEST(IndexerMmaLayout, EveryChannelPlaysExactlyOneK) {
  for (const int elem : {1, 2}) {
    std::set<int> seen;
    for (int s = 0; s < kSteps; ++s)
      for (int c = 0; c < kQuad; ++c)
        for (int r = 0; r < 2; ++r)
          for (int e = 0; e < 2; ++e) {
            const int ch = mma_channel(s, c, r, e, elem);
            EXPECT_GE(ch, 0);
            EXPECT_LT(ch, kDim);
            EXPECT_TRUE(seen.insert(ch).second) << "elem " << elem << " channel " << ch;
          }
    EXPECT_EQ(seen.size(), size_t{kDim}) << "elem " << elem;
  }
}

// A lane's 32-bit word u of its chunk i holds the channels mma_channel names: the register pairs
// the kernel hands to the MMA are the channels its q fragments took.
TEST(IndexerMmaLayout, ChunkWordsHoldTheNamedChannels) {
  for (const int elem : {1, 2}) {
    const int per_chunk = chunk_channels(elem);
    for (int s = 0; s < kSteps; ++s)
      for (int c = 0; c < kQuad; ++c)
        for (int r = 0; r < 2; ++r) {
          // fp8: word u = s % 4, low half register 0 and high half register 1 (2 codes each);
          // bf16: word 2 (s % 2) + r (2 channels).
          const int first_in_chunk = elem == 1 ? 4 * (s % 4) + 2 * r : 2 * (2 * (s % 2) + r);
          const int chunk = lane_chunk(s, c, elem);
          EXPECT_EQ(mma_channel(s, c, r, 0, elem), chunk * per_chunk + first_in_chunk);
          EXPECT_EQ(mma_channel(s, c, r, 1, elem), chunk * per_chunk + first_in_chunk + 1);
        }
  }
}

// The 8 lanes of one phase of a 16-byte shared-memory load (keys n, n + 1 at even n, lanes c =
// 0..3 of each) cover 32 distinct banks, for every chunk index a lane reads.
TEST(IndexerMmaLayout, QuadLoadsAreFreeOfBankConflicts) {
  for (const int elem : {1, 2}) {
    const int row_bytes = kDim * elem;
    const int lane_chunks = row_bytes / kChunkBytes / kQuad;
    for (int n0 = 0; n0 < 64; n0 += 2)
      for (int i = 0; i < lane_chunks; ++i) {
        std::set<int> banks;
        for (int k = 0; k < 2; ++k)
          for (int c = 0; c < kQuad; ++c) {
            const int n = n0 + k;
            const int byte = n * row_bytes + kChunkBytes * smem_chunk(n, kQuad * i + c);
            for (int w = 0; w < 4; ++w) banks.insert((byte / 4 + w) % 32);
          }
        EXPECT_EQ(banks.size(), 32u) << "elem " << elem << " keys " << n0 << " chunk " << i;
      }
  }
}

// The whole product: 16 heads x 8 keys of small integers (exact in any order), fragments built
// and multiplied as the kernel does, against the plain dot products.
TEST(IndexerMmaLayout, EmulatedMmaMatchesTheDotProducts) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> val(-8, 8);
  for (const int elem : {1, 2}) {
    std::vector<std::array<int, kDim>> q(16), k(8);
    for (auto& row : q)
      for (int& x : row) x = val(rng);
    for (auto& row : k)
      for (int& x : row) x = val(rng);
    // Shared memory as issue_key_tile fills it: chunk q of key n at smem_chunk(n, q), each
    // channel one element (its value, not its bytes: the layout is what is checked).
    const int per_chunk = chunk_channels(elem);
    std::vector<int> smem(8 * kDim);
    for (int n = 0; n < 8; ++n)
      for (int ch = 0; ch < kDim; ++ch)
        smem[n * kDim + smem_chunk(n, ch / per_chunk) * per_chunk + ch % per_chunk] = k[n][ch];
    int64_t acc[32][4] = {};
    for (int s = 0; s < kSteps; ++s) {
      // Per lane: A (a0..a3, two halves each) and B (b0, b1) as the kernel loads them.
      int a[32][4][2], b[32][2][2];
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, c = lane % 4;
        for (int r = 0; r < 2; ++r)
          for (int e = 0; e < 2; ++e) {
            const int ch = mma_channel(s, c, r, e, elem);
            a[lane][2 * r][e] = q[g][ch];
            a[lane][2 * r + 1][e] = q[g + 8][ch];
            // The key element at that channel, found through the lane's swizzled chunk read.
            const int chunk = lane_chunk(s, c, elem);
            const int in_chunk = ch - chunk * per_chunk;
            b[lane][r][e] = smem[g * kDim + smem_chunk(g, chunk) * per_chunk + in_chunk];
          }
      }
      // mma.sync m16n8k16 (PTX ISA fragment layouts): A[row][col] with row = g (+8 for a1, a3)
      // and col = 2c + e (+8 for a2, a3); B[k][n] with k = 2c + e (+8 for b1) and n = g.
      int A[16][16], B[16][8];
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, c = lane % 4;
        for (int e = 0; e < 2; ++e) {
          A[g][2 * c + e] = a[lane][0][e];
          A[g + 8][2 * c + e] = a[lane][1][e];
          A[g][2 * c + 8 + e] = a[lane][2][e];
          A[g + 8][2 * c + 8 + e] = a[lane][3][e];
          B[2 * c + e][g] = b[lane][0][e];
          B[2 * c + 8 + e][g] = b[lane][1][e];
        }
      }
      // C: lane holds C[g][2c + {0, 1}] and C[g + 8][2c + {0, 1}].
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, c = lane % 4;
        for (int x = 0; x < 4; ++x) {
          const int row = g + 8 * (x / 2), col = 2 * c + x % 2;
          for (int kk = 0; kk < 16; ++kk) acc[lane][x] += int64_t{A[row][kk]} * B[kk][col];
        }
      }
    }
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, c = lane % 4;
      for (int x = 0; x < 4; ++x) {
        const int h = g + 8 * (x / 2), n = 2 * c + x % 2;
        int64_t want = 0;
        for (int ch = 0; ch < kDim; ++ch) want += int64_t{q[h][ch]} * k[n][ch];
        EXPECT_EQ(acc[lane][x], want) << "elem " << elem << " head " << h << " key " << n;
      }
    }
  }
}

// The wgmma kernel over fp8 keys (indexer_score_wgmma.cu), played the same way: each thread's A
// registers from the words it loads of its two keys' codes, q's B tile written as the kernel
// writes it and read back through the descriptor's canonical layout (K-major, no swizzle: rows of
// 16 bytes, the next 8 k at the leading byte offset, the next 8 columns at the stride byte
// offset), wgmma.m64n128k16 by the PTX ISA's fragment layout (warp w: rows 16w + g, 16w + g + 8).
TEST(IndexerMmaLayout, WgmmaChannelsAndQTileGiveTheDotProducts) {
  constexpr int kKeys = 64, kCols = 128, kTileBytes = kCols * kDim * 2;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> dist(-7, 7);
  std::vector<std::array<int, kDim>> k(kKeys), q(kCols);
  for (auto& row : k)
    for (int& x : row) x = dist(rng);
  for (auto& row : q)
    for (int& x : row) x = dist(rng);
  // Every channel plays exactly one k.
  std::set<int> ks;
  for (int ch = 0; ch < kDim; ++ch) ks.insert(wgmma_k_of_channel(ch));
  EXPECT_EQ(ks.size(), size_t{kDim});
  EXPECT_EQ(*ks.begin(), 0);
  EXPECT_EQ(*ks.rbegin(), kDim - 1);
  // q's tile: the kernel writes channel pairs (ch, ch + 1), ch even, at wgmma_q_offset(k of ch):
  // channel ch + 1 must be the next element.
  std::vector<int> tile(kTileBytes / 2, 1 << 30);
  for (int col = 0; col < kCols; ++col)
    for (int ch = 0; ch < kDim; ch += 2) {
      const int k0 = wgmma_k_of_channel(ch);
      EXPECT_EQ(wgmma_k_of_channel(ch + 1), k0 + 1);
      const int off = wgmma_q_offset(k0, col);
      ASSERT_EQ(off % 4, 0);
      ASSERT_LT(off + 2, kTileBytes);
      EXPECT_EQ(tile[size_t(off / 2)], 1 << 30) << "written twice";
      tile[size_t(off / 2)] = q[size_t(col)][size_t(ch)];
      tile[size_t(off / 2 + 1)] = q[size_t(col)][size_t(ch + 1)];
    }
  std::vector<std::array<int64_t, kCols>> acc(kKeys);
  for (auto& row : acc) row.fill(0);
  for (int s = 0; s < kSteps; ++s) {
    int A[kKeys][16];
    for (int w = 0; w < 4; ++w)
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, c = lane % 4;
        for (int half = 0; half < 2; ++half) {  // keys 16w + g and 16w + g + 8
          const int key = 16 * w + g + 8 * half;
          // Word 8c + s of the key's codes: bytes 0, 1 -> register half (k 2c, 2c + 1), bytes
          // 2, 3 -> register 2 + half (k 2c + 8, 2c + 9).
          for (int byte = 0; byte < 4; ++byte) {
            const int ch = 4 * (8 * c + s) + byte;
            const int kk = 2 * c + 8 * (byte / 2) + byte % 2;
            EXPECT_EQ(16 * s + kk, wgmma_k_of_channel(ch));
            A[key][kk] = k[size_t(key)][size_t(ch)];
          }
        }
      }
    const int start = 2 * s * kWgmmaCoreBytes, lead = kWgmmaCoreBytes,
              stride = kWgmmaKChunks * kWgmmaCoreBytes;
    for (int m = 0; m < kKeys; ++m)
      for (int n = 0; n < kCols; ++n)
        for (int kk = 0; kk < 16; ++kk) {
          const int off = start + (n / 8) * stride + (n % 8) * 16 + (kk / 8) * lead + (kk % 8) * 2;
          acc[size_t(m)][size_t(n)] += int64_t{A[m][kk]} * tile[size_t(off / 2)];
        }
  }
  for (int m = 0; m < kKeys; ++m)
    for (int n = 0; n < kCols; ++n) {
      int64_t want = 0;
      for (int ch = 0; ch < kDim; ++ch)
        want += int64_t{q[size_t(n)][size_t(ch)]} * k[size_t(m)][size_t(ch)];
      EXPECT_EQ(acc[size_t(m)][size_t(n)], want) << "key " << m << " column " << n;
    }
}

// The lo-part variant's e4m3 steps (wgmma.m64n64k32 on the codes as loaded): each thread's A
// registers are its keys' words 8c + 2t and 8c + 2t + 1 (PTX ISA: registers 0 / 1 rows g / g + 8
// at k 4c .. 4c + 3, registers 2 / 3 at k 16 + 4c ..), q's lo tile written at wgmma_q8_offset of
// each channel's k and read back through the K-major canonical layout of 16-byte rows.
TEST(IndexerMmaLayout, WgmmaE4m3StepsGiveTheDotProducts) {
  constexpr int kKeys = 64, kCols = 64, kTileBytes = kCols * kDim;
  std::mt19937 rng(12);
  std::uniform_int_distribution<int> dist(-7, 7);
  std::vector<std::array<int, kDim>> k(kKeys), q(kCols);
  for (auto& row : k)
    for (int& x : row) x = dist(rng);
  for (auto& row : q)
    for (int& x : row) x = dist(rng);
  std::set<int> ks;
  for (int ch = 0; ch < kDim; ++ch) ks.insert(wgmma_k8_of_channel(ch));
  EXPECT_EQ(ks.size(), size_t{kDim});
  EXPECT_EQ(*ks.rbegin(), kDim - 1);
  std::vector<int> tile(kTileBytes, 1 << 30);
  for (int col = 0; col < kCols; ++col)
    for (int ch = 0; ch < kDim; ch += 2) {  // the kernel stores channel pairs
      const int k0 = wgmma_k8_of_channel(ch);
      EXPECT_EQ(wgmma_k8_of_channel(ch + 1), k0 + 1);
      const int off = wgmma_q8_offset(k0, col);
      ASSERT_EQ(off % 2, 0);
      ASSERT_LT(off + 1, kTileBytes);
      EXPECT_EQ(tile[size_t(off)], 1 << 30) << "written twice";
      tile[size_t(off)] = q[size_t(col)][size_t(ch)];
      tile[size_t(off + 1)] = q[size_t(col)][size_t(ch + 1)];
    }
  std::vector<std::array<int64_t, kCols>> acc(kKeys);
  for (auto& row : acc) row.fill(0);
  for (int t = 0; t < kDim / 32; ++t) {
    int A[kKeys][32];
    for (int w = 0; w < 4; ++w)
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, c = lane % 4;
        for (int half = 0; half < 2; ++half) {
          const int key = 16 * w + g + 8 * half;
          for (int u = 0; u < 2; ++u)
            for (int byte = 0; byte < 4; ++byte) {
              const int ch = 4 * (8 * c + 2 * t + u) + byte;
              const int kk = 16 * u + 4 * c + byte;
              EXPECT_EQ(32 * t + kk, wgmma_k8_of_channel(ch));
              A[key][kk] = k[size_t(key)][size_t(ch)];
            }
        }
      }
    const int start = 2 * t * kWgmmaCoreBytes, lead = kWgmmaCoreBytes,
              stride = kWgmmaKChunks / 2 * kWgmmaCoreBytes;
    for (int m = 0; m < kKeys; ++m)
      for (int n = 0; n < kCols; ++n)
        for (int kk = 0; kk < 32; ++kk) {
          const int off = start + (n / 8) * stride + (n % 8) * 16 + (kk / 16) * lead + kk % 16;
          acc[size_t(m)][size_t(n)] += int64_t{A[m][kk]} * tile[size_t(off)];
        }
  }
  for (int m = 0; m < kKeys; ++m)
    for (int n = 0; n < kCols; ++n) {
      int64_t want = 0;
      for (int ch = 0; ch < kDim; ++ch)
        want += int64_t{q[size_t(n)][size_t(ch)]} * k[size_t(m)][size_t(ch)];
      EXPECT_EQ(acc[size_t(m)][size_t(n)], want) << "key " << m << " column " << n;
    }
}

}  // namespace
}  // namespace deepinfer::cuda::indexer_mma
