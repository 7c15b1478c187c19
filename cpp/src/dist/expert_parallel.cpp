// Expert-parallel routed experts: dispatch, local experts, return, combine in token order (see
// expert_parallel.h).
#include "dist/expert_parallel.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "deepinfer/error.h"

namespace deepinfer::dist {
namespace {

size_t sz(int64_t v) {
  return static_cast<size_t>(v);
}

// FNV-1a over the placement, so ranks can check they hold the same one with one host all-reduce.
uint64_t fingerprint(const ExpertPlacement& p) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) {
    h ^= v;
    h *= 1099511628211ull;
  };
  mix(static_cast<uint64_t>(p.num_logical()));
  mix(static_cast<uint64_t>(p.num_ranks()));
  for (int32_t e : p.physical_to_logical()) mix(static_cast<uint32_t>(e));
  return h;
}

// This rank's argument errors ("" = none). Reads the expert ids into `ids` when the shapes are
// right, to check that they name logical experts.
std::string check_arguments(const Communicator& comm, Backend& backend, const Tensor& x,
                            const Routing& routing, const ExpertPlacement& placement,
                            const ExpertWeights& local, std::vector<int32_t>& ids) {
  if (placement.num_ranks() != comm.size()) {
    return "the placement is for " + std::to_string(placement.num_ranks()) +
           " ranks but the group has " + std::to_string(comm.size());
  }
  if (!x.defined() || x.dim() != 2 || x.dtype() != DType::kF32) {
    return "x must be f32 [T, H], got " + (x.defined() ? x.describe() : std::string("undefined"));
  }
  const Tensor& e = routing.expert_ids;
  const Tensor& w = routing.weights;
  if (!e.defined() || !w.defined() || e.dim() != 2 || e.dtype() != DType::kI32 ||
      e.size(0) != x.size(0) || w.dtype() != DType::kF32 || w.shape() != e.shape()) {
    return "routing must be i32 [T, k] expert ids and f32 [T, k] weights for T = " +
           std::to_string(x.size(0)) + " tokens, got " +
           (e.defined() ? e.describe() : std::string("undefined")) + " and " +
           (w.defined() ? w.describe() : std::string("undefined"));
  }
  const auto slots = static_cast<size_t>(placement.slots_per_rank());
  if (local.w1.size() != slots || local.w3.size() != slots || local.w2.size() != slots) {
    return "local holds " + std::to_string(local.w1.size()) + "/" +
           std::to_string(local.w3.size()) + "/" + std::to_string(local.w2.size()) +
           " w1/w3/w2 weights but the placement has " + std::to_string(slots) + " slots per rank";
  }
  const Tensor host = backend.to_host(e);
  ids.assign(host.data<int32_t>(), host.data<int32_t>() + host.numel());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= placement.num_logical()) {
      const int64_t k = e.size(1);
      return "routing.expert_ids[" + std::to_string(static_cast<int64_t>(i) / k) + "][" +
             std::to_string(static_cast<int64_t>(i) % k) + "] = " + std::to_string(ids[i]) +
             " is outside [0, " + std::to_string(placement.num_logical()) + ")";
    }
  }
  return "";
}

// Step 1: every rank's token count, after agreeing that every rank's arguments are valid and the
// placements are the same (else Error(kInvalidArgument) on every rank).
std::vector<int64_t> agree_token_counts(Communicator& comm, const std::string& local_error,
                                        int64_t tokens, uint64_t placement_fingerprint) {
  const int n = comm.size();
  const int me = comm.rank();
  // [tokens of rank r | error flag of rank r | placement fingerprint of rank r], each rank
  // filling its own entries; kSum of zeros elsewhere reads every rank's values.
  std::vector<uint64_t> v(sz(3 * n), 0);
  v[sz(me)] = static_cast<uint64_t>(tokens);
  v[sz(n + me)] = local_error.empty() ? 0 : 1;
  v[sz(2 * n + me)] = placement_fingerprint;
  const std::vector<uint64_t> all = comm.all_reduce_host(v, HostReduceOp::kSum);
  const std::string where = "ep_moe_experts on rank " + std::to_string(me) + ": ";
  if (!local_error.empty()) throw Error(ErrorCode::kInvalidArgument, where + local_error);
  for (int r = 0; r < n; ++r) {
    if (all[sz(n + r)] != 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  where + "rank " + std::to_string(r) + " passed invalid arguments");
    }
  }
  for (int r = 1; r < n; ++r) {
    if (all[sz(2 * n + r)] != all[sz(2 * n)]) {
      throw Error(ErrorCode::kInvalidArgument,
                  where + "rank " + std::to_string(r) +
                      "'s expert placement differs from rank 0's (one placement per layer)");
    }
  }
  return {all.begin(), all.begin() + n};
}

}  // namespace

Tensor ep_moe_experts(Communicator& comm, Backend& backend, const Tensor& x, const Routing& routing,
                      const ExpertPlacement& placement, const ExpertWeights& local,
                      float swiglu_limit, std::vector<int64_t>* slot_counts) {
  const int n = comm.size();
  const int me = comm.rank();
  std::vector<int32_t> ids;
  const std::string error = check_arguments(comm, backend, x, routing, placement, local, ids);
  const int64_t tokens = error.empty() ? x.size(0) : 0;
  const std::vector<int64_t> counts =
      agree_token_counts(comm, error, tokens, fingerprint(placement));
  const int64_t hidden = x.size(1);
  const int64_t k = routing.expert_ids.size(1);
  const int64_t pairs = tokens * k;

  // Step 2: slots, keyed by the global token index.
  uint64_t first_key = 0;
  for (int r = 0; r < me; ++r) first_key += static_cast<uint64_t>(counts[sz(r)]);
  const std::vector<int32_t> slots = placement.map_to_slots(ids, static_cast<int>(k), first_key);
  if (slot_counts != nullptr) {
    if (slot_counts->size() != sz(placement.num_slots()))
      slot_counts->assign(sz(placement.num_slots()), 0);
    for (int32_t s : slots) ++(*slot_counts)[sz(s)];
  }

  // Step 3: group the pairs by destination rank, (token, j) order within a destination.
  const int per_rank = placement.slots_per_rank();
  std::vector<int64_t> send_rows(sz(n), 0);
  for (int32_t s : slots) ++send_rows[sz(placement.rank_of_slot(s))];
  std::vector<int64_t> fill(sz(n), 0);
  for (int d = 1; d < n; ++d) fill[sz(d)] = fill[sz(d - 1)] + send_rows[sz(d - 1)];
  std::vector<int64_t> position(sz(pairs));  // pair -> its row in the send (and return) buffer
  std::vector<int32_t> send_token(sz(pairs));
  std::vector<int32_t> send_slot(sz(pairs));
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t s = slots[sz(p)];
    const int64_t row = fill[sz(placement.rank_of_slot(s))]++;
    position[sz(p)] = row;
    send_token[sz(row)] = static_cast<int32_t>(p / k);
    send_slot[sz(row)] = s % per_rank;
  }
  std::vector<int64_t> matrix(sz(n * n), 0);  // [src, dst] rows
  std::copy(send_rows.begin(), send_rows.end(), matrix.begin() + n * me);
  matrix = comm.all_reduce_host(matrix, HostReduceOp::kSum);
  std::vector<int64_t> recv_rows(sz(n));
  int64_t received = 0;
  for (int src = 0; src < n; ++src) {
    recv_rows[sz(src)] = matrix[sz(src * n + me)];
    received += recv_rows[sz(src)];
  }

  const Tensor send_x =
      pairs > 0 ? backend.gather_rows(
                      x, backend.upload(Tensor::from_vector(send_token, {pairs}), DType::kI32))
                : backend.zeros({0, hidden}, DType::kF32);
  const Tensor send_s = backend.upload(Tensor::from_vector(send_slot, {pairs, 1}), DType::kI32);
  const Tensor recv_x = backend.empty({received, hidden}, DType::kF32);
  const Tensor recv_s = backend.empty({received, 1}, DType::kI32);
  comm.all_to_all(send_x, send_rows, recv_x, recv_rows);
  comm.all_to_all(send_s, send_rows, recv_s, recv_rows);

  // Step 4: one output row per received pair.
  const Tensor y =
      received > 0
          ? backend.moe_experts(
                recv_x,
                Routing{recv_s,
                        backend.upload(Tensor::from_vector(std::vector<float>(sz(received), 1.0f),
                                                           {received, 1}),
                                       DType::kF32)},
                local, swiglu_limit)
          : backend.zeros({0, hidden}, DType::kF32);

  // Step 5: back to the source ranks, then combine in the token's own (j) order.
  const Tensor back = backend.empty({pairs, hidden}, DType::kF32);
  comm.all_to_all(y, recv_rows, back, send_rows);
  const Tensor back_h = backend.to_host(back);
  const Tensor weights_h = backend.to_host(routing.weights);
  Tensor out = Tensor::zeros({tokens, hidden}, DType::kF32);
  const float* yp = back_h.data<float>();
  const float* wp = weights_h.data<float>();
  float* op = out.data<float>();
  for (int64_t t = 0; t < tokens; ++t) {
    float* o = op + t * hidden;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t p = t * k + j;
      const float w = wp[p];
      const float* yr = yp + position[sz(p)] * hidden;
      for (int64_t h = 0; h < hidden; ++h) o[h] += w * yr[h];
    }
  }
  return backend.upload(out, DType::kF32);
}

}  // namespace deepinfer::dist
