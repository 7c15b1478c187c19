// Rows of accept_drafts (the drafts each verify row accepted) and shift_rows: a forward's packed
// metadata with rows planned at optimistic positions (ForwardRow::shift_from), moved by the
// previous step's accepted drafts (model/batch_plan.h, shift_carried_rows). Output: the counts,
// and the whole buffer after the move, which must equal the CPU's bit for bit
// (tests/cpp/test_row_shift.cpp checks the CPU against the host rule and against packing the true
// positions).
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "cases.h"
#include "inputs.h"
#include "model/batch_plan.h"
#include "model/decode_graphs.h"

namespace deepinfer::backend_ops {
namespace {

const std::vector<int> kRatios = {4, 128};

struct ShiftIn {
  Tensor metadata;  // [size] i32, host
  BatchGeometry geometry;
  int num_real = 0;
  Tensor accepted;  // [K] i32, host
};

enum class Layout { kExact, kDecodeGraph, kVerifyGraph };

// `num_rows` rows of 1..max_tokens tokens at positions up to ~1900 (a block table of at most 16
// blocks), two in three carried after a verify row of the previous step.
ShiftIn draw_shift(Rng& rng, int num_rows, Layout layout) {
  const int max_tokens = layout == Layout::kDecodeGraph ? 1 : 6;
  std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(num_rows)),
      tables(static_cast<size_t>(num_rows));
  std::vector<ForwardRow> rows;
  std::vector<int32_t> accepted;
  int32_t next_block = 1;
  size_t max_blocks = 1;
  for (int s = 0; s < num_rows; ++s) {
    const int n = std::uniform_int_distribution<int>(1, max_tokens)(rng);
    const int start = std::uniform_int_distribution<int>(6, 1900)(rng);
    tokens[s].assign(static_cast<size_t>(n), 9);
    for (int j = 0; j < (start + n + 127) / 128; ++j) tables[s].push_back(next_block++);
    std::shuffle(tables[s].begin(), tables[s].end(), rng);
    max_blocks = std::max(max_blocks, tables[s].size());
    ForwardRow r{.slot = s + 1,
                 .start_pos = start,
                 .num_tokens = n,
                 .tokens = tokens[s],
                 .block_table = tables[s],
                 .num_logits = n,
                 .history = {}};
    if (rng() % 3 != 0) {
      const int max_shift = std::uniform_int_distribution<int>(1, 5)(rng);
      r.shift_from = static_cast<int32_t>(accepted.size());
      r.max_shift = max_shift;
      r.token_from_previous = 6 * r.shift_from + max_shift;
      accepted.push_back(std::uniform_int_distribution<int>(0, max_shift)(rng));
    }
    rows.push_back(r);
  }
  if (accepted.empty()) accepted.push_back(0);
  ShiftIn in;
  in.num_real = num_rows;
  switch (layout) {
    case Layout::kExact:
      in.geometry = BatchGeometry::exact(rows, kRatios, max_blocks, LogitsMode::kLast);
      break;
    case Layout::kDecodeGraph:
      in.geometry = BatchGeometry::padded(16, 16, kRatios.size());
      break;
    case Layout::kVerifyGraph: {
      const DecodeGraphs::Shape shape =
          DecodeGraphs::shape_for(rows, DecodeGraphs::buckets_up_to(64), max_blocks);
      in.geometry =
          BatchGeometry::padded_verify(shape.bucket, shape.row_tokens, shape.width, kRatios);
      break;
    }
  }
  std::vector<int32_t> host;
  pack_batch(rows, in.geometry, kRatios, 128, /*scratch_slot=*/0, host);
  in.metadata = Tensor::from_vector(host, {static_cast<int64_t>(host.size())});
  in.accepted = Tensor::from_vector(accepted, {static_cast<int64_t>(accepted.size())});
  return in;
}

Outputs run_shift(Backend& be, const ShiftIn& in) {
  const Tensor meta = up(be, in.metadata);
  const BatchPlan plan = plan_views(meta, in.geometry, kRatios, 128);
  be.shift_rows(row_shift_of(plan, in.num_real, up(be, in.accepted)));
  return out(meta);
}

}  // namespace

std::vector<OpCase> shift_rows_cases() {
  std::vector<OpCase> t;
  // accept_drafts: rows of 1..6 token rows; three token values, so runs of matches of every
  // length come up.
  for (const int rows : {1, 7, 64, 300}) {
    add(t,
        Case<Tensors>{
            .op = "accept_drafts",
            .label = "rows" + std::to_string(rows),
            .draw =
                [rows](Rng& rng) {
                  std::vector<int32_t> starts = {0};
                  for (int r = 0; r < rows; ++r)
                    starts.push_back(starts.back() + std::uniform_int_distribution<int>(1, 6)(rng));
                  const int64_t n = starts.back();
                  return Tensors{random_ids(rng, n, 0, 2), random_ids(rng, n, 0, 2),
                                 Tensor::from_vector(starts, {rows + 1})};
                },
            .run =
                [](Backend& be, const Tensors& in) {
                  return out(be.accept_drafts(up(be, in[0]), up(be, in[1]), up(be, in[2])));
                },
            .expect = exact(),
        });
  }
  const std::pair<Layout, const char*> layouts[] = {{Layout::kExact, "exact"},
                                                    {Layout::kDecodeGraph, "decode_graph"},
                                                    {Layout::kVerifyGraph, "verify_graph"}};
  for (const auto& [layout, name] : layouts) {
    for (const int rows : {1, 3, 16}) {
      add(t, Case<ShiftIn>{
                 .op = "shift_rows",
                 .label = std::string(name) + "_rows" + std::to_string(rows),
                 .draw = [rows, layout](Rng& rng) { return draw_shift(rng, rows, layout); },
                 .run = run_shift,
                 .expect = exact(),
             });
    }
  }
  return t;
}

}  // namespace deepinfer::backend_ops
