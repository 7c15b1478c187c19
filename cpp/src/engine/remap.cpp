#include "engine/remap.h"

namespace deepinfer::engine {

bool BatchRemapper::remap(std::span<const RowKey> previous, std::span<const RowKey> current,
                          std::vector<int32_t>& out) {
  out.assign(current.size(), -1);
  if (previous.size() == current.size()) {
    bool same = true;
    for (size_t i = 0; i < current.size() && same; ++i) same = previous[i] == current[i];
    if (same) {
      for (size_t i = 0; i < current.size(); ++i) out[i] = static_cast<int32_t>(i);
      return true;
    }
  }
  index_.clear();
  for (size_t j = 0; j < previous.size(); ++j) {
    index_[previous[j].first] = {previous[j].second, static_cast<int32_t>(j)};
  }
  for (size_t i = 0; i < current.size(); ++i) {
    auto it = index_.find(current[i].first);
    if (it != index_.end() && it->second.first == current[i].second) out[i] = it->second.second;
  }
  return false;
}

}  // namespace deepinfer::engine
