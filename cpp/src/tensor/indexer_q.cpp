#include "tensor/indexer_q.h"

#include <algorithm>
#include <cmath>

#include "deepinfer/dtype.h"
#include "tensor/kv_record.h"

namespace deepinfer::indexer_q {

float quantize_row(const float* q, int64_t dim, uint8_t* codes) {
  float amax = 0.0f;
  for (int64_t c = 0; c < dim; ++c) amax = std::max(amax, std::fabs(q[c]));
  const float scale = kv_record::fp8_scale(amax);
  for (int64_t c = 0; c < dim; ++c) codes[c] = f32_to_f8e4m3(q[c] / scale);
  return scale;
}

}  // namespace deepinfer::indexer_q
