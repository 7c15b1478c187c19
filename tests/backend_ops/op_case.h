// The backend op table: every op of every compiled device backend against the CPU reference op on
// the same random inputs (DESIGN.md section 6), one row per (op, shape or variant).
//
// A row is a Case<In>: the op's name, a short label ([A-Za-z0-9_], unique per op), `draw`, which
// makes the host inputs In from an RNG seeded by the row's name, `run`, which uploads them to a
// Backend in the dtypes the op takes and calls the op, and `expect`, the tolerance rule. The
// harness (test_backend_ops.cpp) runs every row on the CPU reference and on each device backend
// with host syncs forbidden, copies the outputs to the host and compares them, reporting
// `<backend>__<op>__<label>`. To add a test, add a row to the cases_*.cpp of the op's family:
//
//   add(table, Case<Tensors>{
//       .op = "scale",
//       .label = "3x4096",
//       .draw = [](Rng& rng) { return Tensors{random_f32(rng, {3, 4096})}; },
//       .run = [](Backend& be, const Tensors& in) { return out(be.scale(up(be, in[0]), 0.5f)); },
//       .expect = exact(),
//   });
#pragma once

#include <gtest/gtest.h>

#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/tensor.h"

namespace deepinfer::backend_ops {

using Rng = std::mt19937;
using Tensors = std::vector<Tensor>;

// One output of a run: on the backend that computed it, then (after the harness copies it) on the
// host.
struct Output {
  std::string name;
  Tensor value;
};
using Outputs = std::vector<Output>;

inline Outputs out(Tensor value) {
  return {{"out", std::move(value)}};
}

// How a device output is held against the reference output.
struct Tolerance {
  enum class Kind {
    kBytes,  // identical dtype, shape and bytes (copies of any dtype)
    kClose,  // max |ref - dev| <= atol + rtol * max |ref| (f32 or i32; rtol = atol = 0: equal)
    kBf16,   // tensor-core math on bf16-rounded operands, see bf16_close in compare.h
  };
  Kind kind = Kind::kClose;
  double rtol = 0;
  double atol = 0;
};
inline Tolerance bytes() {
  return {Tolerance::Kind::kBytes};
}
inline Tolerance exact() {
  return {Tolerance::Kind::kClose, 0, 0};
}
inline Tolerance close(double rtol, double atol) {
  return {Tolerance::Kind::kClose, rtol, atol};
}
inline Tolerance bf16_math() {
  return {Tolerance::Kind::kBf16};
}

// A comparison written for one op (tie rules, sampling): it sees the inputs and the host outputs
// of the reference and of the device, and reports with EXPECT/ADD_FAILURE.
template <class In>
using CustomCheck = std::function<void(const In& in, const Outputs& ref, const Outputs& dev)>;

// The tolerance rule of a row: one Tolerance for every output, one per output (in order), or a
// custom check.
template <class In>
struct Expect {
  std::vector<Tolerance> per_output;
  CustomCheck<In> custom;

  // Implicit, so that a row reads `.expect = exact()`.
  Expect(Tolerance t) : per_output{t} {}
  Expect(std::initializer_list<Tolerance> t) : per_output(t) {}
  template <class F>
  requires std::invocable<F, const In&, const Outputs&, const Outputs&> Expect(F check)
      : custom(std::move(check)) {}
};

// A row with its inputs drawn: what the harness runs and compares.
class DrawnCase {
 public:
  virtual ~DrawnCase() = default;
  virtual Outputs run(Backend& be) const = 0;
  virtual Outputs run_reference(Backend& cpu) const = 0;
  virtual void check(const Outputs& ref, const Outputs& dev) const = 0;
};

// A row of the table, type-erased (see Case for the fields).
struct OpCase {
  std::string op;
  std::string label;
  std::vector<std::string> only_backends;
  std::string only_why;
  bool bf16_weights = false;
  bool deterministic = false;
  bool own_reference = false;  // Case::reference is set
  std::function<std::unique_ptr<DrawnCase>(Rng&)> draw;

  std::string name() const { return op + "__" + label; }
  // The RNG seed of the row: a hash of its name, so rows are independent of their order.
  uint32_t seed() const;
  // Empty when the row applies to device backend `backend` (named as in device_backend_names),
  // else why not.
  std::string skip_reason(const std::string& backend, const Backend& be) const;
};

template <class In>
struct Case {
  std::string op;
  std::string label;
  std::function<In(Rng&)> draw;
  // Uploads the inputs to `be` and runs the op; returns its outputs on `be`.
  std::function<Outputs(Backend& be, const In& in)> run;
  Expect<In> expect;
  // What the CPU reference runs instead of `run`, where a device defines an input the CPU op
  // rejects (an out-of-range expert id is dropped on a device; the reference gets weight 0).
  std::function<Outputs(Backend& cpu, const In& in)> reference = {};
  // Device backends the row applies to (empty: all), and why, when its reference or tolerance
  // models one backend's kernel choice.
  std::vector<std::string> only_backends = {};
  std::string only_why = {};
  // The row uploads matrix weights as the backend's bf16 weight dtype: it applies to backends
  // that keep bf16 weights in bf16 (elsewhere its f32 twin covers it).
  bool bf16_weights = false;
  // The device must give the same bytes when the row runs again.
  bool deterministic = false;
};

void check_outputs(const std::vector<Tolerance>& rules, const Outputs& ref, const Outputs& dev);

template <class In>
void add(std::vector<OpCase>& table, Case<In> c) {
  struct Drawn final : DrawnCase {
    std::shared_ptr<const Case<In>> c;
    In in;
    Drawn(std::shared_ptr<const Case<In>> cs, In input) : c(std::move(cs)), in(std::move(input)) {}
    Outputs run(Backend& be) const override { return c->run(be, in); }
    Outputs run_reference(Backend& cpu) const override {
      return c->reference ? c->reference(cpu, in) : c->run(cpu, in);
    }
    void check(const Outputs& ref, const Outputs& dev) const override {
      if (c->expect.custom) {
        c->expect.custom(in, ref, dev);
      } else {
        check_outputs(c->expect.per_output, ref, dev);
      }
    }
  };
  auto shared = std::make_shared<const Case<In>>(std::move(c));
  const Case<In>& r = *shared;
  table.push_back(OpCase{.op = r.op,
                         .label = r.label,
                         .only_backends = r.only_backends,
                         .only_why = r.only_why,
                         .bf16_weights = r.bf16_weights,
                         .deterministic = r.deterministic,
                         .own_reference = static_cast<bool>(r.reference),
                         .draw = [shared](Rng& rng) -> std::unique_ptr<DrawnCase> {
                           return std::make_unique<Drawn>(shared, shared->draw(rng));
                         }});
}

// ---- label helpers --------------------------------------------------------------------------

// "37x64" for {37, 64}.
std::string dims(const Shape& shape);
// A number in a label: 0.75 -> "0p75", 1e30 -> "1e30", -2 -> "m2".
std::string num(double value);

}  // namespace deepinfer::backend_ops
