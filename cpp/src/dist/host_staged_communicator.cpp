#include "dist/host_staged_communicator.h"

#include <utility>

#include "deepinfer/error.h"
#include "dist/inprocess_communicator.h"

namespace deepinfer::dist {
namespace {

class HostStagedCommunicator final : public Communicator {
 public:
  HostStagedCommunicator(std::unique_ptr<Communicator> host, Backend& backend)
      : host_(std::move(host)), backend_(backend) {}

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }

  void all_reduce_sum(const Tensor& t) override {
    Tensor h = stage(t);
    host_->all_reduce_sum(h);
    unstage(t, h);
  }
  void all_gather(const Tensor& input, const Tensor& output) override {
    Tensor out = host_like(output);
    host_->all_gather(stage(input), out);
    unstage(output, out);
  }
  void reduce_scatter_sum(const Tensor& input, const Tensor& output) override {
    Tensor out = host_like(output);
    host_->reduce_scatter_sum(stage(input), out);
    unstage(output, out);
  }
  void all_to_all(const Tensor& send, std::span<const int64_t> send_rows, const Tensor& recv,
                  std::span<const int64_t> recv_rows) override {
    Tensor out = host_like(recv);
    host_->all_to_all(stage(send), send_rows, out, recv_rows);
    unstage(recv, out);
  }
  void broadcast(const Tensor& t, int root) override {
    Tensor h = stage(t);
    host_->broadcast(h, root);
    unstage(t, h);
  }
  void barrier() override {
    backend_.synchronize();
    host_->barrier();
  }
  std::vector<int64_t> all_reduce_host(std::span<const int64_t> values, HostReduceOp op) override {
    return host_->all_reduce_host(values, op);
  }
  std::vector<uint64_t> all_reduce_host(std::span<const uint64_t> values,
                                        HostReduceOp op) override {
    return host_->all_reduce_host(values, op);
  }
  void abort(const std::string& reason) override { host_->abort(reason); }

 private:
  // A host copy of a device tensor, after the rank's stream finished the work that writes it (a
  // host backend's tensors are used in place once its stream is done; an undefined tensor stays
  // undefined, so the in-process group reports it by name).
  Tensor stage(const Tensor& t) {
    try {
      backend_.synchronize();
      if (!t.defined() || t.device().kind == DeviceKind::kCpu) return t;
      return backend_.to_host(t);
    } catch (const std::exception& e) {
      host_->abort("rank " + std::to_string(rank()) + "'s stream failed: " + e.what());
      throw;
    }
  }
  static Tensor host_like(const Tensor& t) {
    if (!t.defined() || t.device().kind == DeviceKind::kCpu) return t;
    return Tensor::zeros(t.shape(), t.dtype());
  }
  void unstage(const Tensor& device, const Tensor& host) {
    if (!device.defined() || device.device().kind == DeviceKind::kCpu) return;
    backend_.upload_into(device, host);
    backend_.synchronize();
  }

  std::unique_ptr<Communicator> host_;
  Backend& backend_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_host_staged_group(
    const std::vector<Backend*>& backends) {
  for (size_t r = 0; r < backends.size(); ++r) {
    if (backends[r] == nullptr) {
      throw Error(ErrorCode::kInvalidArgument,
                  "make_host_staged_group: rank " + std::to_string(r) + " has no backend");
    }
  }
  // The host group has no streams to wait for: staging waited already.
  std::vector<std::unique_ptr<Communicator>> host =
      make_inprocess_group(static_cast<int>(backends.size()));
  std::vector<std::unique_ptr<Communicator>> group;
  for (size_t r = 0; r < backends.size(); ++r)
    group.push_back(std::make_unique<HostStagedCommunicator>(std::move(host[r]), *backends[r]));
  return group;
}

}  // namespace deepinfer::dist
