// RankRouter (engine/rank_router.h), the least-loaded routing of a group's front:
//   LeastLoadedByRequestsThenTokens   fewest unfinished requests, then fewest tokens, then rank
//   AFinishSeenBeforeItsAssignment    a request that finished in a step running between its add
//                                     and its assignment is never counted (the front would
//                                     otherwise report it unfinished forever)
#include <gtest/gtest.h>

#include <vector>

#include "engine/rank_router.h"

namespace deepinfer::engine {
namespace {

RequestOutput finished(RequestId id) {
  RequestOutput o;
  o.id = id;
  o.finish = FinishReason::kRejected;
  return o;
}

TEST(RankRouter, LeastLoadedByRequestsThenTokens) {
  RankRouter r(3);
  EXPECT_EQ(r.least_loaded(), 0);
  r.assigned(0, 1, 500);
  EXPECT_EQ(r.least_loaded(), 1);
  r.assigned(1, 2, 10);
  r.assigned(2, 3, 20);
  EXPECT_EQ(r.least_loaded(), 1);  // one request each: rank 1 has the fewest tokens
  RequestOutput tokens;
  tokens.id = 2;
  tokens.tokens = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};  // rank 1 now holds 21 tokens
  r.account({tokens}, rank_of_request, 3);
  EXPECT_EQ(r.least_loaded(), 2);
  r.account({finished(1)}, rank_of_request, 3);
  EXPECT_EQ(r.least_loaded(), 0);
  EXPECT_EQ(r.unfinished(), 2);
}

TEST(RankRouter, AFinishSeenBeforeItsAssignment) {
  RankRouter r(2);
  r.account({finished(4)}, rank_of_request, 2);
  r.assigned(1, 4, 30);
  EXPECT_EQ(r.unfinished(), 0);
  EXPECT_EQ(r.least_loaded(), 0);
  r.assigned(1, 6, 30);  // later requests count as usual
  EXPECT_EQ(r.unfinished(), 1);
}

}  // namespace
}  // namespace deepinfer::engine
