// Tile shapes of the quantized expert GEMMs (sm80/experts_quant.cu), shared with the MoE
// heuristics, which choose between them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace deepinfer::cuda {

// The two weight formats the quantized expert kernels decode in registers.
enum class QuantFormat {
  kMxfp4,  // e2m1 pairs [N, K / 2] + e8m0 scales [N, K / 32]
  kFp8,    // e4m3 [N, K] + f32 scales per block_rows x block_cols block
};

// k per shared-memory slice of the activations and per weight step of a warp.
constexpr int kQuantSliceK = 128;
// 32-bit words (bf16 pairs) per staged activation row of one slice: 64, padded by 8 so that the
// rows of 8 tokens start 8 banks apart (the B-fragment reads are then conflict-free, see
// experts_quant.cu).
constexpr int kQuantRowWords = kQuantSliceK / 2 + 8;

// A CTA: kWarps warps of kMTiles m16 weight tiles (16 weight rows each) times the kTok token
// rows of one tile of the tile list, 256 weight rows in all (gate/up: 128 columns of w1 and the
// same of w3; down: 256 rows of w2).
template <int kWarpsT, int kMTilesT, int kTokT>
struct ExpertQuantTile {
  static constexpr int kWarps = kWarpsT;
  static constexpr int kMTiles = kMTilesT;
  static constexpr int kTok = kTokT;  // the tile list's tile_rows
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWeightRows = 16 * kMTiles * kWarps;
  static_assert(kWeightRows == 256 && kMTiles % 2 == 0 && kTok % 8 == 0, "256 rows per CTA");
  // Two slices of kPlanes x kTok rows in shared memory (double buffer).
  static constexpr size_t smem_bytes(int planes) {
    return size_t{2} * planes * kTok * kQuantRowWords * sizeof(uint32_t);
  }
};

// Decode: 16-token tiles (an expert with <= 16 pairs is one tile, its weights read once), four
// warps of 64 weight rows (more 16-byte loads in flight per thread, each B fragment used 4 times).
using ExpertQuantDecode = ExpertQuantTile<4, 4, 16>;
// FP8 decode: twice the bytes per weight row, so eight warps of 32 rows keep the registers of two
// slices of loads in bounds.
using ExpertQuantDecodeFp8 = ExpertQuantTile<8, 2, 16>;
// Prefill: 64-token tiles, eight warps of 32 weight rows (64 accumulators per thread).
using ExpertQuantPrefill = ExpertQuantTile<8, 2, 64>;

// The streaming decode shape (experts_quant_stream.cu): kWarps warps of kMTiles m16 weight tiles
// times kTok token rows, every lane copying its own 16-byte weight chunks into a ring of kStages
// slices in shared memory (cp.async), so that kStages - 1 slices of weights are in flight while
// one is multiplied; the activation slices share the ring.
template <int kWarpsT, int kMTilesT, int kTokT, int kStagesT>
struct ExpertQuantStreamTile {
  static constexpr int kWarps = kWarpsT;
  static constexpr int kMTiles = kMTilesT;
  static constexpr int kTok = kTokT;  // the tile list's tile_rows
  static constexpr int kStages = kStagesT;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWeightRows = 16 * kMTiles * kWarps;
  static_assert(kMTiles % 2 == 0 && kTok % 8 == 0 && kStages >= 2, "gate/up pairs m16 tiles");
  // 16-byte weight chunks a thread copies per slice: rows g and g + 8 of each m16 tile, `loads`
  // chunks each (1 for MXFP4, 2 for FP8).
  static constexpr size_t weight_slice_bytes(int loads) {
    return size_t{16} * kThreads * kMTiles * 2 * loads;
  }
  static constexpr size_t act_slice_bytes(int planes) {
    return size_t{4} * planes * kTok * kQuantRowWords;
  }
  static constexpr size_t smem_bytes(int loads, int planes) {
    return kStages * (weight_slice_bytes(loads) + act_slice_bytes(planes));
  }
  // The lean MXFP4 variant's scale ring after the weights: 4 e8m0 bytes per weight row and slice.
  static constexpr size_t scale_ring_bytes() { return size_t{4} * kStages * kWeightRows; }
};

// L2 prefetch of the streaming kernel's weight copies (cp.async .L2::128B): each copy of 64
// bytes of a row fetches its whole 128-byte line, whose other half the next slice copies.
constexpr int kExpertQuantStreamL2Prefetch = 128;

// MXFP4: 256 weight rows (16 KB of weights per slice), 5 stages: 103 KB of shared memory with
// quantized activations, so 2 CTAs (16 warps) and 8 slices (128 KB) of weights in flight per SM.
using ExpertQuantStreamMx = ExpertQuantStreamTile<8, 2, 16, 5>;
// FP8: 256 weight rows (32 KB per slice), 3 stages: 110 KB, 2 CTAs and 128 KB in flight per SM.
using ExpertQuantStreamFp8 = ExpertQuantStreamTile<8, 2, 16, 3>;
// Two CTAs per SM on sm_90 with quantized activations: 228 KB of shared memory per SM, 1 KB of it
// reserved per CTA, and 1 KB of static shared memory per CTA (ptxas: 1152 bytes).
constexpr size_t kSm90SmemPerSm = 228 * 1024;
static_assert(2 * (ExpertQuantStreamMx::smem_bytes(1, 1) + ExpertQuantStreamMx::scale_ring_bytes() +
                   2048 + 128) <=
                      kSm90SmemPerSm &&
                  2 * (ExpertQuantStreamFp8::smem_bytes(2, 1) + 2048 + 128) <= kSm90SmemPerSm,
              "two streaming CTAs per SM");
// MXFP4 lean, passes of at most 8 tokens on one activation plane (expert_stream_narrow_tiles):
// half the weight rows per CTA (4 warps of 32 rows; gate/up 64 columns of w1 and the same of w3)
// and 8 staged rows (8-row tiles), so that four CTAs fit on an SM and twice as many CTAs spread
// the weight bytes over the SMs.
using ExpertQuantStreamMxNarrow = ExpertQuantStreamTile<4, 2, 8, 5>;
static_assert(4 * (ExpertQuantStreamMxNarrow::smem_bytes(1, 1) +
                   ExpertQuantStreamMxNarrow::scale_ring_bytes() + 2048 + 128) <=
                  kSm90SmemPerSm,
              "four narrow streaming CTAs per SM");
// Rows of the tensor copies (cp.async.bulk.tensor) of the lean MXFP4 kernel's weights on sm_90:
// a box is 64 rows x one slice's 64 bytes of one matrix (experts_quant_stream_copy.cuh:
// TensorWeightFill).
constexpr int kExpertTensorBoxRows = 64;
// The streaming kernels' threads per SM that their launch bounds promise registers for (128
// registers per thread): two CTAs of the 8-warp shapes, four of the narrow one.
constexpr int kExpertStreamThreadsPerSm = 512;
static_assert(ExpertQuantStreamMx::kTok == ExpertQuantDecode::kTok &&
                  ExpertQuantStreamFp8::kTok == ExpertQuantDecode::kTok,
              "the streaming and register decode shapes share the tile list");
// The most shared memory either streaming shape asks for (three activation planes; MXFP4 with
// the lean variant's scale ring).
constexpr size_t kExpertQuantStreamMaxSmem =
    ExpertQuantStreamFp8::smem_bytes(2, 3) >
            ExpertQuantStreamMx::smem_bytes(1, 3) + ExpertQuantStreamMx::scale_ring_bytes()
        ? ExpertQuantStreamFp8::smem_bytes(2, 3)
        : ExpertQuantStreamMx::smem_bytes(1, 3) + ExpertQuantStreamMx::scale_ring_bytes();

// The Hopper prefill shape (sm90/experts_quant_wgmma.cu): two warpgroups of 128 weight rows each
// (two m64 wgmma tiles: gate/up one of w1 and the same columns of w3; down two of w2) times kTok
// token rows of one tile of the tile list. A ring of `stages` slices (kQuantSliceK inputs) in
// shared memory, each the tile's activation rows (the wgmma B operand) and every lane's own
// 16-byte weight chunks (decoded in registers into the A operand), filled by cp.async.
struct ExpertQuantWgmma {
  static constexpr int kWarps = 8;
  static constexpr int kMTiles = 2;  // m16 tiles per warp: one row block of each m64 tile
  static constexpr int kTok = 128;   // the tile list's tile_rows: wgmma n of a full tile
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWeightRows = 16 * kMTiles * kWarps;
  static constexpr int kMaxStages = 4;
  // Dynamic shared memory a CTA may take on sm_90 (227 KB opt-in) less its static row table.
  static constexpr size_t kSmemBudget = 227 * 1024 - 2048;
  static_assert(kWeightRows == 256, "the column blocks of the mma.sync prefill shape");
  // One slice of the tile's staged rows: planes x kTok rows x 256 bytes.
  static constexpr size_t act_stage_bytes(int planes) {
    return size_t{2} * planes * kTok * kQuantSliceK;
  }
  // One slice of weights: `loads` 16-byte chunks (MXFP4 1, FP8 2) of rows g and g + 8 of each of
  // a lane's m16 tiles.
  static constexpr size_t weight_stage_bytes(int loads) {
    return size_t{16} * kThreads * kMTiles * 2 * loads;
  }
  static constexpr size_t stage_bytes(int planes, int loads) {
    return act_stage_bytes(planes) + weight_stage_bytes(loads);
  }
  static constexpr int stages(int planes, int loads) {
    const size_t fit = kSmemBudget / stage_bytes(planes, loads);
    return fit < kMaxStages ? static_cast<int>(fit) : kMaxStages;
  }
  // Whether the ring has at least two slots for this format (loads) and plane count: all but
  // FP8 without activation quantization (3 planes), which keeps the mma.sync prefill kernel.
  static constexpr bool fits(int planes, int loads) { return stages(planes, loads) >= 2; }
  static constexpr size_t smem_bytes(int planes, int loads) {
    return stages(planes, loads) * stage_bytes(planes, loads);
  }
};
static_assert(ExpertQuantWgmma::stages(1, 1) == 4 && ExpertQuantWgmma::stages(3, 1) == 2 &&
                  ExpertQuantWgmma::stages(1, 2) == 3 && !ExpertQuantWgmma::fits(3, 2),
              "the ring depths the head comment of sm90/experts_quant_wgmma.cu describes");

// K splits of the streaming decode kernels (experts_quant_stream.cu). A pass whose CTAs (the host's
// tile bound times the column blocks) fill at most half the slots of two CTAs per SM leaves SMs
// idle and the rest at one CTA, and the kernel is bound by instruction issue per SM (session 16):
// at B = 1 (top-6 of 256 experts) 112 CTAs of 256 rows on 132 SMs. Its CTAs then split K into 2
// or 4 slice ranges, the CTAs of a tile and column block one cluster that adds their partial sums
// in split order; each range keeps at least kExpertStreamMinSplitSlices slices.
constexpr int kExpertStreamMaxSplits = 4;
constexpr int64_t kExpertStreamMinSplitSlices = 4;
// `ctas_per_sm`: CTAs of the shape an SM holds (2; the narrow shape 4).
inline int expert_stream_splits(int64_t ctas, int64_t slices, int num_sms, int ctas_per_sm = 2) {
  int s = 1;
  while (2 * s <= kExpertStreamMaxSplits &&
         ctas * 2 * s <= static_cast<int64_t>(ctas_per_sm) * num_sms &&
         slices >= 2 * s * kExpertStreamMinSplitSlices) {
    s *= 2;
  }
  return s;
}

// Whether a lean MXFP4 decode pass of `tokens` tokens takes 8-row tiles and runs both GEMMs on
// the narrow shape: at most 8 tokens (top-k routing names an expert at most once per token, so no
// expert's pairs take two tiles; a hash-routed token that names one twice costs a second tile,
// not a wrong result), one activation plane in both GEMMs (`one_plane`: the ring then fits four
// CTAs per SM) and K whole slices in both (the lean kernel). On V4-Flash at B = 1 the 8-warp grid
// put two CTAs on 60 SMs and one on 72; 128-row CTAs put two or three on every SM. On the H100
// the step ran 0.2-5% faster at B = 1 (session 45) and 0.2-0.4% / 2.2-2.5% / 2.7-3.0% at
// B = 2 / 4 / 8 (session 46, benchmarks/RESULTS.md).
inline bool expert_stream_narrow_tiles(int64_t tokens, bool one_plane, int64_t hidden,
                                       int64_t inter) {
  return tokens <= ExpertQuantStreamMxNarrow::kTok && one_plane && hidden % kQuantSliceK == 0 &&
         inter % kQuantSliceK == 0;
}

// Pairs per expert on average up to which a pass takes the decode shape.
constexpr int64_t kExpertQuantDecodeMaxPairs = 16;

}  // namespace deepinfer::cuda
