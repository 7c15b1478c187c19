// Batch layouts of the cache and attention op tests: several sequences with their own context
// length, query length, state slot and a shuffled block table (block 0 never handed out),
// uploaded identically to every backend.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/tensor.h"

namespace deepinfer::backend_ops {

struct SeqSpec {
  int ctx;   // tokens already in the caches
  int q;     // rows of this call
  int slot;  // state slot
};

struct HostBatch {
  std::vector<SeqSpec> seqs;
  int block_size = 128;
  int max_blocks = 0;
  int num_blocks = 0;                // physical blocks of the paged caches (block 0 unused)
  std::vector<int32_t> block_table;  // [B, max_blocks]
  std::vector<int32_t> positions;    // [T]
  std::vector<int32_t> token_seq;    // [T]
  std::vector<int32_t> q_start;      // [B + 1]

  // Each sequence gets the blocks its ctx + q tokens need, distinct physical blocks drawn in
  // shuffled order; unused columns (up to max_blocks_per_seq, at least the longest sequence's
  // need) stay 0.
  HostBatch(std::mt19937& rng, std::vector<SeqSpec> s, int block, int max_blocks_per_seq = 0)
      : seqs(std::move(s)), block_size(block) {
    int need_max = 1;
    for (const SeqSpec& q : seqs) need_max = std::max(need_max, blocks_for(q));
    max_blocks = std::max(need_max, max_blocks_per_seq);
    int total = 0;
    for (const SeqSpec& q : seqs) total += blocks_for(q);
    num_blocks = 1 + total;
    std::vector<int32_t> physical(static_cast<size_t>(total));
    std::iota(physical.begin(), physical.end(), 1);
    std::shuffle(physical.begin(), physical.end(), rng);
    block_table.assign(seqs.size() * static_cast<size_t>(max_blocks), 0);
    size_t next = 0;
    q_start.push_back(0);
    for (size_t b = 0; b < seqs.size(); ++b) {
      for (int i = 0; i < blocks_for(seqs[b]); ++i) {
        block_table[b * static_cast<size_t>(max_blocks) + static_cast<size_t>(i)] =
            physical[next++];
      }
      for (int i = 0; i < seqs[b].q; ++i) {
        positions.push_back(seqs[b].ctx + i);
        token_seq.push_back(static_cast<int32_t>(b));
      }
      q_start.push_back(static_cast<int32_t>(positions.size()));
    }
  }

  int blocks_for(const SeqSpec& s) const { return (s.ctx + s.q + block_size - 1) / block_size; }
  int num_tokens() const { return static_cast<int>(positions.size()); }
  int num_seqs() const { return static_cast<int>(seqs.size()); }
  // Row of entry j of sequence b in a paged cache with `epb` entries per block.
  int64_t entry_row(size_t b, int64_t j, int epb) const {
    return int64_t{
               block_table[b * static_cast<size_t>(max_blocks) + static_cast<size_t>(j / epb)]} *
               epb +
           j % epb;
  }

  BatchLayout upload(Backend& be) const {
    const auto t = static_cast<int64_t>(positions.size());
    const auto b = static_cast<int64_t>(seqs.size());
    std::vector<int32_t> ctx, slot, ids(static_cast<size_t>(t), 0);
    for (const SeqSpec& s : seqs) {
      ctx.push_back(s.ctx);
      slot.push_back(s.slot);
    }
    BatchLayout l;
    l.num_tokens = static_cast<int>(t);
    l.num_seqs = static_cast<int>(b);
    l.block_size = block_size;
    l.max_blocks_per_seq = max_blocks;
    l.token_ids = be.upload(Tensor::from_vector(ids, {t}), DType::kI32);
    l.positions = be.upload(Tensor::from_vector(positions, {t}), DType::kI32);
    l.token_seq = be.upload(Tensor::from_vector(token_seq, {t}), DType::kI32);
    l.seq_q_start = be.upload(Tensor::from_vector(q_start, {b + 1}), DType::kI32);
    l.seq_ctx_len = be.upload(Tensor::from_vector(ctx, {b}), DType::kI32);
    l.seq_slot = be.upload(Tensor::from_vector(slot, {b}), DType::kI32);
    l.block_table = be.upload(Tensor::from_vector(block_table, {b, max_blocks}), DType::kI32);
    return l;
  }
};

// Per token: distinct visible entries (j < (pos + 1) / ratio) in random order with -1 anywhere;
// usually min(k, visible) of them, sometimes fewer. The `topk` input of a sparse attention layer.
inline Tensor random_topk(std::mt19937& rng, const HostBatch& hb, int ratio, int k) {
  std::vector<int32_t> out;
  for (int t = 0; t < hb.num_tokens(); ++t) {
    const int visible = (hb.positions[size_t(t)] + 1) / ratio;
    std::vector<int32_t> pick(static_cast<size_t>(visible));
    std::iota(pick.begin(), pick.end(), 0);
    std::shuffle(pick.begin(), pick.end(), rng);
    int n = std::min(k, visible);
    if (rng() % 3 == 0) n = int(rng() % unsigned(n + 1));
    pick.resize(size_t(n));
    pick.resize(size_t(k), -1);
    std::shuffle(pick.begin(), pick.end(), rng);
    out.insert(out.end(), pick.begin(), pick.end());
  }
  return Tensor::from_vector(out, {hb.num_tokens(), k});
}

}  // namespace deepinfer::backend_ops
