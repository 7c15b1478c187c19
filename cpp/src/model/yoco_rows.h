// The rows DeepSeek-V4.1's YOCO consumer layers run on under prefill truncation (engine.md 6.3,
// model.md C.6; docs/model.md#yoco-prefill-truncation).
//
// A row belongs to a prefill ending at L (ForwardRow::prompt_end); its consumer layers see sliding
// keys only in [L - keep, L). In mode "mask" every row still runs through them; in "compact" the
// rows before L - keep are dropped at the boundary layer, after its compressor and index keys saw
// every row. A chunk that ends before L - keep then does no consumer work at all: the consumer
// rings need only the positions from L - keep on, which later chunks write. Decode and
// verification rows (prompt_end 0: their own end, and keep >= window + rollback) are never
// narrowed, so a batch of those plans nothing here.
#pragma once

#include <cstdint>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/model_runner.h"
#include "deepinfer/v41_config.h"
#include "model/batch_plan.h"

namespace deepinfer {

// Per row of a call: the first position the consumer layers keep ([first_kept, end) in compact,
// the row's start otherwise) and the first sliding position they see.
struct YocoRowRange {
  int32_t first_kept = 0;
  int32_t swa_start = 0;
};

// The ranges of `rows` under `config`'s truncation and keep count, and whether any query is
// narrowed (false: the consumer layers run as in mode "off"). A row's swa_valid_start (a replayed
// KV-tier hit) bounds its swa_start too, also when truncation is off. Error(kInvalidArgument)
// naming the row when its prompt_end lies before its end.
bool yoco_row_ranges(RowSpan rows, const V41TextConfig& config, std::vector<YocoRowRange>& ranges);

// The indices, among the logits rows a forward of `rows` in `mode` wants (BatchGeometry order),
// of those whose token rows compact truncation dropped: the forward returns the others only.
std::vector<int32_t> yoco_dropped_logit_rows(RowSpan rows, const V41TextConfig& config,
                                             LogitsMode mode);

struct YocoRows {
  bool narrows = false;  // false: every other field is empty
  Tensor swa_start;      // [B] i32: AttentionSpec::swa_start of the consumer layers
  // Compact with rows dropped: the consumer layers run on `layout` (its token_ids gathered on the
  // device by the forward), whose rows are the full layout's rows `kept_rows`.
  bool drops = false;
  Tensor kept_rows;  // [T'] i32
  BatchLayout layout;
  int num_logit_rows = 0;  // the wanted logits rows that were kept
  Tensor logit_rows;       // [S'] i32 rows of `layout`; undefined: every kept row
  Tensor next_positions;   // [S'] i32
  Tensor metadata;         // the device buffer the tensors above are views of
};

// Plans the consumer rows of `rows` (packed as `plan` in `mode`) and uploads them in one call.
YocoRows plan_yoco_rows(RowSpan rows, const BatchPlan& plan, const V41TextConfig& config,
                        LogitsMode mode, Backend& backend);

}  // namespace deepinfer
