#include "dist/inprocess_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "deepinfer/error.h"
#include "dist/collective_args.h"

namespace deepinfer::dist {

const char* host_reduce_op_name(HostReduceOp op) {
  switch (op) {
    case HostReduceOp::kOr:
      return "or";
    case HostReduceOp::kAnd:
      return "and";
    case HostReduceOp::kSum:
      return "sum";
    case HostReduceOp::kMax:
      return "max";
  }
  return "?";
}

namespace {

// One rank's arguments to the collective in progress, posted for the other ranks to read.
struct Post {
  const char* name = "";
  std::string local_error;  // an argument error of this rank alone ("" = none)
  std::string signature;    // what must equal rank 0's (shape, dtype, root, op, length)
  const Tensor* a = nullptr;
  const Tensor* b = nullptr;
  std::span<const int64_t> send_rows;
  std::span<const int64_t> recv_rows;
  int root = 0;
  const void* host = nullptr;  // all_reduce_host: the values (i64 or u64)
};

// The in-process group reads the other ranks' tensors in place: host memory only.
std::string host_only(const char* arg, const Tensor& t) {
  if (t.device().kind != DeviceKind::kCpu) {
    return std::string(arg) + " is " + t.describe() +
           ": the in-process communicator takes CPU tensors";
  }
  return "";
}

// Where ranks wait for each other: a reusable two-phase barrier with an abort flag.
class Rendezvous {
 public:
  explicit Rendezvous(int n) : n_(n), posts_(static_cast<size_t>(n)) {}

  int size() const { return n_; }

  // Posts `post` as `rank`'s arguments and waits for every rank.
  void arrive(int rank, const Post* post) {
    std::unique_lock lock(mutex_);
    posts_[static_cast<size_t>(rank)] = post;
    wait_locked(lock, post->name, rank);
  }
  // Waits for every rank without posting.
  void wait(const char* name, int rank) {
    std::unique_lock lock(mutex_);
    wait_locked(lock, name, rank);
  }
  // Valid between the first and second barrier of a collective.
  const Post& post(int rank) const { return *posts_[static_cast<size_t>(rank)]; }

  void abort(const std::string& reason) {
    std::lock_guard lock(mutex_);
    if (!aborted_) {
      aborted_ = true;
      reason_ = reason;
    }
    cv_.notify_all();
  }

 private:
  void wait_locked(std::unique_lock<std::mutex>& lock, const char* name, int rank) {
    if (aborted_) throw_aborted(name, rank);
    const uint64_t generation = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation || aborted_; });
    if (generation_ == generation) throw_aborted(name, rank);
  }
  [[noreturn]] void throw_aborted(const char* name, int rank) const {
    throw Error(ErrorCode::kInternal, std::string(name) + " on rank " + std::to_string(rank) +
                                          ": the group was aborted: " + reason_);
  }

  const int n_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::string reason_;
  std::vector<const Post*> posts_;
};

std::optional<Mismatch> common_checks(const Rendezvous& rv) {
  std::vector<RankCall> calls;
  for (int r = 0; r < rv.size(); ++r) {
    const Post& p = rv.post(r);
    calls.push_back({p.name, p.local_error, p.signature});
  }
  return first_mismatch(calls);
}

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Rendezvous> rv, int rank, Backend* backend)
      : rv_(std::move(rv)), rank_(rank), backend_(backend) {}
  ~InProcessCommunicator() override {
    rv_->abort("rank " + std::to_string(rank_) +
               " left the group (its communicator was destroyed)");
  }

  int rank() const override { return rank_; }
  int size() const override { return rv_->size(); }

  void all_reduce_sum(const Tensor& t) override {
    Post p;
    p.name = "all_reduce_sum";
    set_args(p, all_reduce_args(t, host_only));
    p.a = &t;
    std::vector<float> out;
    run(
        p, [&] { sum_in_rank_order(out, 0, static_cast<size_t>(t.numel())); },
        [&] { std::memcpy(t.raw_data(), out.data(), out.size() * sizeof(float)); });
  }

  void all_gather(const Tensor& input, const Tensor& output) override {
    Post p;
    p.name = "all_gather";
    set_args(p, all_gather_args(input, output, size(), host_only));
    p.a = &input;
    std::vector<uint8_t> out;
    run(
        p,
        [&] {
          const size_t bytes = input.nbytes();
          out.resize(bytes * static_cast<size_t>(size()));
          for (int r = 0; r < size(); ++r) {
            std::memcpy(out.data() + bytes * static_cast<size_t>(r), rv_->post(r).a->raw_data(),
                        bytes);
          }
        },
        [&] { std::memcpy(output.raw_data(), out.data(), out.size()); });
  }

  void reduce_scatter_sum(const Tensor& input, const Tensor& output) override {
    Post p;
    p.name = "reduce_scatter_sum";
    set_args(p, reduce_scatter_args(input, output, size(), host_only));
    p.a = &input;
    std::vector<float> out;
    run(
        p,
        [&] {
          const auto n = static_cast<size_t>(output.numel());
          sum_in_rank_order(out, n * static_cast<size_t>(rank_), n);
        },
        [&] { std::memcpy(output.raw_data(), out.data(), out.size() * sizeof(float)); });
  }

  void all_to_all(const Tensor& send, std::span<const int64_t> send_rows, const Tensor& recv,
                  std::span<const int64_t> recv_rows) override {
    Post p;
    p.name = "all_to_all";
    set_args(p, all_to_all_args(send, send_rows, recv, recv_rows, size(), host_only));
    p.a = &send;
    p.send_rows = send_rows;
    p.recv_rows = recv_rows;
    std::vector<uint8_t> out;
    run(
        p,
        [&] {
          // Counts must agree pairwise: what p sends to q is what q expects from p.
          for (int src = 0; src < size(); ++src) {
            for (int dst = 0; dst < size(); ++dst) {
              const int64_t sent = rv_->post(src).send_rows[static_cast<size_t>(dst)];
              const int64_t expected = rv_->post(dst).recv_rows[static_cast<size_t>(src)];
              if (sent != expected) {
                return std::optional<Mismatch>(Mismatch{
                    dst, "rank " + std::to_string(src) + " sends " + std::to_string(sent) +
                             " rows to rank " + std::to_string(dst) + " but rank " +
                             std::to_string(dst) + " expects " + std::to_string(expected)});
              }
            }
          }
          const size_t rb = row_bytes(recv);
          out.resize(recv.nbytes());
          size_t at = 0;
          for (int src = 0; src < size(); ++src) {
            const Post& q = rv_->post(src);
            int64_t first = 0;
            for (int d = 0; d < rank_; ++d) first += q.send_rows[static_cast<size_t>(d)];
            const size_t n = static_cast<size_t>(q.send_rows[static_cast<size_t>(rank_)]) * rb;
            if (n > 0) {
              std::memcpy(
                  out.data() + at,
                  static_cast<const uint8_t*>(q.a->raw_data()) + static_cast<size_t>(first) * rb,
                  n);
            }
            at += n;
          }
          return std::optional<Mismatch>();
        },
        [&] {
          if (!out.empty()) std::memcpy(recv.raw_data(), out.data(), out.size());
        });
  }

  void broadcast(const Tensor& t, int root) override {
    Post p;
    p.name = "broadcast";
    set_args(p, broadcast_args(t, root, size(), host_only));
    p.a = &t;
    p.root = root;
    std::vector<uint8_t> out;
    run(
        p,
        [&] {
          const Tensor& src = *rv_->post(root).a;
          out.assign(static_cast<const uint8_t*>(src.raw_data()),
                     static_cast<const uint8_t*>(src.raw_data()) + src.nbytes());
        },
        [&] {
          if (rank_ != root && !out.empty()) std::memcpy(t.raw_data(), out.data(), out.size());
        });
  }

  void barrier() override {
    Post p;
    p.name = "barrier";
    run(
        p, [] {}, [] {});
  }

  std::vector<int64_t> all_reduce_host(std::span<const int64_t> values, HostReduceOp op) override {
    return host_reduce<int64_t>(values, op, "i64");
  }
  std::vector<uint64_t> all_reduce_host(std::span<const uint64_t> values,
                                        HostReduceOp op) override {
    return host_reduce<uint64_t>(values, op, "u64");
  }

  void abort(const std::string& reason) override {
    rv_->abort("rank " + std::to_string(rank_) + " aborted: " + reason);
  }

 private:
  static void set_args(Post& p, const CollectiveArgs& a) {
    p.local_error = a.local_error;
    p.signature = a.signature;
  }

  // out[i] = ((x0[off + i] + x1[off + i]) + x2[off + i]) + ... for i < count, x_r being rank r's
  // tensor `a`: the same additions in the same order on every rank and every run.
  void sum_in_rank_order(std::vector<float>& out, size_t off, size_t n) const {
    const Tensor& t0 = *rv_->post(0).a;
    out.assign(static_cast<const float*>(t0.raw_data()) + off,
               static_cast<const float*>(t0.raw_data()) + off + n);
    for (int r = 1; r < size(); ++r) {
      const float* x = static_cast<const float*>(rv_->post(r).a->raw_data()) + off;
      for (size_t i = 0; i < n; ++i) out[i] += x[i];
    }
  }

  template <typename T>
  std::vector<T> host_reduce(std::span<const T> values, HostReduceOp op, const char* type) {
    Post p;
    p.name = "all_reduce_host";
    p.signature = std::string(host_reduce_op_name(op)) + " of " + std::to_string(values.size()) +
                  " " + type + " values";
    p.host = values.data();
    std::vector<T> out;
    const size_t n = values.size();
    run(
        p,
        [&] {
          out.assign(static_cast<const T*>(rv_->post(0).host),
                     static_cast<const T*>(rv_->post(0).host) + n);
          for (int r = 1; r < size(); ++r) {
            host_reduce_into<T>(out, {static_cast<const T*>(rv_->post(r).host), n}, op);
          }
        },
        [] {}, /*device=*/false);
    return out;
  }

  // Runs one collective: the five steps of the header. `compute` fills this rank's result from
  // the posts (it may return a further Mismatch), `finish` writes it out.
  template <typename Compute, typename Finish>
  void run(Post& mine, Compute&& compute, Finish&& finish, bool device = true) {
    if (device && backend_ != nullptr) {
      try {
        backend_->synchronize();
      } catch (const std::exception& e) {
        abort(std::string("its stream failed before ") + mine.name + ": " + e.what());
        throw;
      }
    }
    rv_->arrive(rank_, &mine);
    std::optional<Mismatch> bad;
    try {
      bad = common_checks(*rv_);
      if (!bad) {
        if constexpr (std::is_same_v<decltype(compute()), void>) {
          compute();
        } else {
          bad = compute();
        }
      }
    } catch (const std::exception& e) {
      abort(std::string("error inside ") + mine.name + ": " + e.what());
      throw;
    }
    rv_->wait(mine.name, rank_);
    if (bad) {
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(mine.name) + " on rank " + std::to_string(rank_) + ": " + bad->what);
    }
    finish();
  }

  std::shared_ptr<Rendezvous> rv_;
  int rank_;
  Backend* backend_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_inprocess_group(
    const std::vector<Backend*>& backends) {
  if (backends.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "make_inprocess_group: a group needs at least one rank");
  }
  const int n = static_cast<int>(backends.size());
  for (int r = 0; r < n; ++r) {
    if (backends[static_cast<size_t>(r)] != nullptr &&
        backends[static_cast<size_t>(r)]->device_kind() != DeviceKind::kCpu) {
      throw Error(ErrorCode::kUnsupported,
                  "make_inprocess_group: rank " + std::to_string(r) + "'s backend is " +
                      backends[static_cast<size_t>(r)]->name() +
                      "; the in-process communicator runs over CPU backends");
    }
  }
  auto rv = std::make_shared<Rendezvous>(n);
  std::vector<std::unique_ptr<Communicator>> group;
  for (int r = 0; r < n; ++r) {
    group.push_back(
        std::make_unique<InProcessCommunicator>(rv, r, backends[static_cast<size_t>(r)]));
  }
  return group;
}

std::vector<std::unique_ptr<Communicator>> make_inprocess_group(int n) {
  if (n < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "make_inprocess_group: a group needs at least one rank, got " + std::to_string(n));
  }
  return make_inprocess_group(std::vector<Backend*>(static_cast<size_t>(n), nullptr));
}

}  // namespace deepinfer::dist
