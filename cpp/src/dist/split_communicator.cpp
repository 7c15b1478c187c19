#include "dist/split_communicator.h"

#include <string>
#include <utility>

#include "deepinfer/error.h"

namespace deepinfer::dist {
namespace {

class SplitCommunicator final : public Communicator {
 public:
  SplitCommunicator(std::unique_ptr<Communicator> device, std::unique_ptr<Communicator> host)
      : device_(std::move(device)), host_(std::move(host)) {}

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }

  void all_reduce_sum(const Tensor& t) override { pick("all_reduce_sum", t, t).all_reduce_sum(t); }
  void all_gather(const Tensor& input, const Tensor& output) override {
    pick("all_gather", input, output).all_gather(input, output);
  }
  void reduce_scatter_sum(const Tensor& input, const Tensor& output) override {
    pick("reduce_scatter_sum", input, output).reduce_scatter_sum(input, output);
  }
  void all_to_all(const Tensor& send, std::span<const int64_t> send_rows, const Tensor& recv,
                  std::span<const int64_t> recv_rows) override {
    pick("all_to_all", send, recv).all_to_all(send, send_rows, recv, recv_rows);
  }
  void broadcast(const Tensor& t, int root) override { pick("broadcast", t, t).broadcast(t, root); }
  void barrier() override {
    device_->barrier();
    host_->barrier();
  }
  std::vector<int64_t> all_reduce_host(std::span<const int64_t> values, HostReduceOp op) override {
    return host_->all_reduce_host(values, op);
  }
  std::vector<uint64_t> all_reduce_host(std::span<const uint64_t> values,
                                        HostReduceOp op) override {
    return host_->all_reduce_host(values, op);
  }
  void abort(const std::string& reason) override {
    // Both: the peers may wait in either.
    device_->abort(reason);
    host_->abort(reason);
  }

 private:
  static bool on_host(const Tensor& t) {
    return !t.defined() || t.device().kind == DeviceKind::kCpu;
  }
  Communicator& pick(const char* name, const Tensor& a, const Tensor& b) {
    if (on_host(a) != on_host(b)) {
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(name) + " on rank " + std::to_string(rank()) +
                      ": one tensor is on the host and the other on a device");
    }
    return on_host(a) ? *host_ : *device_;
  }

  std::unique_ptr<Communicator> device_;
  std::unique_ptr<Communicator> host_;
};

}  // namespace

std::unique_ptr<Communicator> make_split_communicator(std::unique_ptr<Communicator> device,
                                                      std::unique_ptr<Communicator> host) {
  if (device == nullptr || host == nullptr || device->rank() != host->rank() ||
      device->size() != host->size()) {
    throw Error(ErrorCode::kInvalidArgument,
                "make_split_communicator: both communicators must be the same rank of groups of "
                "the same size");
  }
  return std::make_unique<SplitCommunicator>(std::move(device), std::move(host));
}

}  // namespace deepinfer::dist
