// Rows of select_tokens (in place: tokens[i] = previous[remap[i]] where remap[i] >= 0).
#include <string>
#include <vector>

#include "cases.h"
#include "inputs.h"

namespace deepinfer::backend_ops {
namespace {

// in: tokens [n], remap [n] (-1 or an index of previous), previous [n / 2 + 1]; out: the tokens
// after the patch.
Outputs run_select_tokens(Backend& be, const Tensors& in) {
  Tensor tokens = up(be, in[0]);
  be.select_tokens(tokens, up(be, in[1]), up(be, in[2]));
  return out(tokens);
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
