#include "dist/load_window.h"

#include <algorithm>
#include <string>

#include "deepinfer/error.h"

namespace deepinfer::dist {

namespace {

size_t idx(int64_t v) {
  return static_cast<size_t>(v);
}

}  // namespace

LoadWindow::LoadWindow(int num_layers, int num_logical, int window_steps, int bucket_steps)
    : num_layers_(num_layers),
      num_logical_(num_logical),
      bucket_steps_(bucket_steps),
      num_buckets_(bucket_steps > 0 ? window_steps / bucket_steps : 0) {
  if (num_layers < 1 || num_logical < 1 || bucket_steps < 1 || window_steps < bucket_steps ||
      window_steps % bucket_steps != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "LoadWindow: needs layers, experts >= 1 and a window that is a multiple of the "
                "bucket, got window " +
                    std::to_string(window_steps) + ", bucket " + std::to_string(bucket_steps));
  }
  counts_.assign(idx(num_buckets_) * idx(num_layers_) * idx(num_logical_), 0);
}

void LoadWindow::record_step(std::span<const std::vector<int64_t>> slot_counts,
                             std::span<const ExpertPlacement> placements) {
  if (slot_counts.size() != idx(num_layers_) || placements.size() != idx(num_layers_)) {
    throw Error(ErrorCode::kInvalidArgument,
                "LoadWindow::record_step: need one count vector and "
                "one placement per layer");
  }
  if (steps_in_current_ == bucket_steps_) {
    current_ = (current_ + 1) % num_buckets_;
    steps_in_current_ = 0;
    const auto stride = idx(num_layers_) * idx(num_logical_);
    std::fill_n(counts_.begin() + static_cast<std::ptrdiff_t>(idx(current_) * stride), stride, 0);
  }
  for (int l = 0; l < num_layers_; ++l) {
    const ExpertPlacement& p = placements[idx(l)];
    const std::vector<int64_t>& c = slot_counts[idx(l)];
    if (p.num_logical() != num_logical_ || c.size() != idx(p.num_slots())) {
      throw Error(ErrorCode::kInvalidArgument, "LoadWindow::record_step: layer " +
                                                   std::to_string(l) +
                                                   " counts do not match its placement");
    }
    int64_t* row = counts_.data() + (idx(current_) * idx(num_layers_) + idx(l)) * idx(num_logical_);
    for (size_t s = 0; s < c.size(); ++s) row[p.logical_of(static_cast<int>(s))] += c[s];
  }
  ++steps_in_current_;
  ++steps_;
}

ExpertLoads LoadWindow::loads(int layer) const {
  DEEPINFER_CHECK(layer >= 0 && layer < num_layers_, "layer in range");
  const int64_t seen =
      std::min<int64_t>(num_buckets_, (steps_ + bucket_steps_ - 1) / bucket_steps_);
  ExpertLoads out;
  out.num_samples = static_cast<int>(std::max<int64_t>(seen, 1));
  out.num_experts = num_logical_;
  out.counts.reserve(idx(out.num_samples) * idx(num_logical_));
  // Oldest first: the bucket after `current_` when the ring is full, bucket 0 otherwise.
  const int start = seen == num_buckets_ ? (current_ + 1) % num_buckets_ : 0;
  for (int i = 0; i < out.num_samples; ++i) {
    const int b = (start + i) % num_buckets_;
    const int64_t* row =
        counts_.data() + (idx(b) * idx(num_layers_) + idx(layer)) * idx(num_logical_);
    out.counts.insert(out.counts.end(), row, row + num_logical_);
  }
  return out;
}

std::vector<int64_t> LoadWindow::totals(int layer) const {
  const ExpertLoads l = loads(layer);
  std::vector<int64_t> t(idx(num_logical_), 0);
  for (int s = 0; s < l.num_samples; ++s) {
    for (int e = 0; e < num_logical_; ++e) t[idx(e)] += l.at(s, e);
  }
  return t;
}

RebalanceSchedule::RebalanceSchedule(int64_t interval)
    : interval_(interval), first_(std::max<int64_t>(interval / 4, 1)) {
  if (interval < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "RebalanceSchedule: interval must be >= 0, got " + std::to_string(interval));
  }
}

bool RebalanceSchedule::due(int64_t steps_done) const {
  if (interval_ == 0 || steps_done < first_) return false;
  return (steps_done - first_) % interval_ == 0;
}

}  // namespace deepinfer::dist
