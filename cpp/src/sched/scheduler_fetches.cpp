// The scheduler's part of the KV tiers' asynchronous fetches: requests waiting in kFetching
// while their blocks come up from the store, or while another request's fetch brings up the
// blocks they would read (scheduler.h, docs/kv_store.md).
#include <utility>
#include <vector>

#include "sched/scheduler.h"

namespace deepinfer::sched {

int Scheduler::num_fetching() const {
  int n = 0;
  for (const Sequence* s : fetching_) n += s->state == SeqState::kFetching ? 1 : 0;
  return n;
}

void Scheduler::poll_fetches(std::vector<RequestOutput>& out) {
  std::vector<Sequence*> ready;  // by admission, oldest first
  std::vector<Sequence*> keep;
  for (Sequence* s : fetching_) {
    if (s->state != SeqState::kFetching) continue;  // aborted: released, retired later
    if (s->fetch_wait != 0) {
      if (kv_.fetch_waiting(*s)) {
        keep.push_back(s);
      } else {
        s->state = SeqState::kWaiting;  // behind the fetch it waited for, which came earlier
        ready.push_back(s);
      }
      continue;
    }
    const Admission a = kv_.poll_fetch(*s);
    if (a.status == AdmitStatus::kFetching) {
      keep.push_back(s);
      continue;
    }
    s->state = SeqState::kWaiting;
    if (a.status == AdmitStatus::kAdmitted) {
      on_admitted(*s, a, out);
    } else {
      --num_holding_;  // failed: it holds nothing now and is admitted again from the GPU index
    }
    ready.push_back(s);
  }
  fetching_ = std::move(keep);
  // They were admitted before everything still waiting, so they go first.
  waiting_.insert(waiting_.begin(), ready.begin(), ready.end());
}

}  // namespace deepinfer::sched
