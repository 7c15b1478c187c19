// Rows of select_tokens, apart from the dense ops because its signature is changing (in place:
// select_tokens(tokens, remap, previous)); run_select_tokens is the one place that calls it.
#include <string>
#include <vector>

#include "cases.h"
#include "inputs.h"

namespace deepinfer::backend_ops {
namespace {

// in: host tokens [n], remap [n] (-1 or an index of previous), previous [n / 2 + 1].
Outputs run_select_tokens(Backend& be, const Tensors& in) {
  return out(be.select_tokens(up(be, in[0]), up(be, in[1]), up(be, in[2])));
}

}  // namespace

std::vector<OpCase> select_tokens_cases() {
  std::vector<OpCase> t;
  for (const int64_t n : {1, 5, 37, 300}) {
    const int64_t prev = n / 2 + 1;
    add(t, Case<Tensors>{
               .op = "select_tokens",
               .label = "n" + std::to_string(n),
               .draw =
                   [n, prev](Rng& rng) {
                     Tensor host = random_ids(rng, n, 0, 129279);
                     Tensor remap = random_ids(rng, n, -1, static_cast<int32_t>(prev - 1));
                     return Tensors{host, remap, random_ids(rng, prev, 0, 129279)};
                   },
               .run = run_select_tokens,
               .expect = exact(),
           });
  }
  return t;
}

}  // namespace deepinfer::backend_ops
