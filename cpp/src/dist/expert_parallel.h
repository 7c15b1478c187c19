// Expert-parallel routed experts of one MoE layer (issue 12 item 2, the MoE half): each rank holds
// its own tokens and `slots_per_rank` physical expert slots; a token's (token, j) pairs travel to
// the ranks holding their experts, are computed there, travel back and are combined on the
// token's own rank. A building block: the model does not call it yet.
//
// The steps, on every rank of the group (the same collectives in the same order):
//   1. Agree (host all-reduce): every rank's token count, argument errors and placement
//      fingerprint, so a bad argument on one rank is Error(kInvalidArgument) on every rank instead
//      of a hang, and each rank learns its first global token index.
//   2. Map each pair to a physical slot with placement.slot_for(expert, key), key = the token's
//      global index (rank r's token t has key sum(T of ranks < r) + t, i.e. its row in the
//      concatenation of the ranks' tokens), so a hot expert's tokens spread over its replicas.
//   3. Exchange the send counts (host all-reduce of the [src, dst] count matrix: the routing was
//      read to the host, so the counts are host-known; a device-count, graph-safe exchange is
//      later work), then all_to_all the x rows (one per pair, grouped by destination, pairs in
//      (token, j) order within a destination) and their local slot indices.
//   4. Run the local experts on the received rows: backend.moe_experts with k = 1, weight 1 and
//      expert id = the local slot index, one output row per received pair (0 + y * 1 = y, so the
//      row is the expert output itself, whatever other rows share the expert's GEMM).
//   5. all_to_all the output rows back and combine on the token's rank in the token's own order:
//      out[t] = ((0 + w[t,0] y[t,0]) + w[t,1] y[t,1]) + ..., which does not depend on the
//      placement, the slot chosen or the number of ranks: the result is bit-identical to one rank
//      computing every pair alone and combining in (token, j) order. (Backend::moe_experts adds
//      in expert-id order instead, so it agrees to rounding only.)
// Host-synchronous (reads the routing and the returned rows on the host): not for graph capture
// or under HostSyncForbidden.
#pragma once

#include <cstdint>
#include <vector>

#include "deepinfer/backend.h"
#include "dist/communicator.h"
#include "dist/expert_placement.h"

namespace deepinfer::dist {

// x [T, H] f32: this rank's tokens (T may be 0). routing: [T, k] logical expert ids (i32) and
// weights (f32). placement: the layer's placement, identical on every rank, num_ranks() ==
// comm.size(). local: this rank's physical slots [rank * slots_per_rank, +slots_per_rank), in slot
// order (replicas hold their logical expert's weights). Returns [T, H] f32 on `backend`.
// `slot_counts` (optional, EPLB statistics): resized to placement.num_slots() if it has another
// size, then slot_counts[s] += the (token, j) pairs this rank sent to global slot s. The counts
// are host-known already (step 3), so this costs one pass over this rank's pairs.
Tensor ep_moe_experts(Communicator& comm, Backend& backend, const Tensor& x, const Routing& routing,
                      const ExpertPlacement& placement, const ExpertWeights& local,
                      float swiglu_limit, std::vector<int64_t>* slot_counts = nullptr);

}  // namespace deepinfer::dist
