#include "dist/tcp_communicator.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "deepinfer/error.h"
#include "dist/collective_args.h"

namespace deepinfer::dist {
namespace {

using Clock = std::chrono::steady_clock;

// Frame types. Every message is [type u8][body length u64, little-endian][body].
enum : uint8_t {
  kHello = 1,     // rank r -> 0 at setup: magic, rank, size
  kWelcome = 2,   // 0 -> r: every rank arrived, the group is formed
  kRefused = 3,   // 0 -> r at setup: why the group cannot form
  kCall = 4,      // r -> 0: one collective's arguments and payload
  kResult = 5,    // 0 -> r: that rank's result
  kMismatch = 6,  // 0 -> r: the agreed argument error
  kAbort = 7,     // either way: the group is aborted, body = the reason
};
constexpr uint32_t kMagic = 0x44495443;  // "DITC": tells a deepinfer peer from a stray connection
// A frame larger than this is garbage on the wire, not a payload (refuse to allocate it).
constexpr uint64_t kMaxFrame = uint64_t{1} << 40;

std::string errno_text(int err) {
  return std::strerror(err);
}

std::string endpoint(const std::string& address, int port) {
  return address + ":" + std::to_string(port);
}

// --- Byte-level socket IO -------------------------------------------------------------------

// Writes all of [data, data + n), across partial writes and EINTR. MSG_NOSIGNAL: a peer that
// closed must read as an error here, not kill the process with SIGPIPE. Returns 0 or errno.
int write_all(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return 0;
}

enum class ReadStatus { kOk, kEof, kError, kTimeout };

// Waits until fd is readable or the deadline passes (no deadline: forever).
ReadStatus wait_readable(int fd, const std::optional<Clock::time_point>& deadline, int* err) {
  for (;;) {
    int wait_ms = -1;
    if (deadline) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now()).count();
      if (left <= 0) return ReadStatus::kTimeout;
      wait_ms = static_cast<int>(std::min<int64_t>(left, 1 << 30));
    }
    pollfd p{fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, wait_ms);
    if (rc < 0) {
      if (errno == EINTR) continue;
      *err = errno;
      return ReadStatus::kError;
    }
    if (rc > 0) return ReadStatus::kOk;
  }
}

// Reads exactly n bytes, across partial reads and EINTR.
ReadStatus read_all(int fd, void* data, size_t n, const std::optional<Clock::time_point>& deadline,
                    int* err) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    if (deadline) {
      const ReadStatus s = wait_readable(fd, deadline, err);
      if (s != ReadStatus::kOk) return s;
    }
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0) {
      if (errno == EINTR) continue;
      *err = errno;
      return ReadStatus::kError;
    }
    if (k == 0) return ReadStatus::kEof;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return ReadStatus::kOk;
}

struct Frame {
  uint8_t type = 0;
  std::vector<uint8_t> body;
};

int send_frame(int fd, uint8_t type, const std::vector<uint8_t>& body) {
  std::vector<uint8_t> head(9);
  head[0] = type;
  for (int i = 0; i < 8; ++i) head[static_cast<size_t>(1 + i)] = (body.size() >> (8 * i)) & 0xff;
  // Small frames go out in one write (with TCP_NODELAY two writes could be two packets).
  if (body.size() < 65536) {
    head.insert(head.end(), body.begin(), body.end());
    return write_all(fd, head.data(), head.size());
  }
  if (const int e = write_all(fd, head.data(), head.size())) return e;
  return write_all(fd, body.data(), body.size());
}

int send_frame(int fd, uint8_t type, const std::string& text) {
  return send_frame(fd, type, std::vector<uint8_t>(text.begin(), text.end()));
}

ReadStatus read_frame(int fd, Frame& f, const std::optional<Clock::time_point>& deadline,
                      int* err) {
  uint8_t head[9];
  ReadStatus s = read_all(fd, head, sizeof(head), deadline, err);
  if (s != ReadStatus::kOk) return s;
  uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= static_cast<uint64_t>(head[1 + i]) << (8 * i);
  if (len > kMaxFrame) {
    *err = EPROTO;
    return ReadStatus::kError;
  }
  f.type = head[0];
  f.body.resize(static_cast<size_t>(len));
  return read_all(fd, f.body.data(), f.body.size(), deadline, err);
}

std::string text_of(const Frame& f) {
  return std::string(f.body.begin(), f.body.end());
}

// --- Message encoding (little-endian, length-prefixed) ---------------------------------------

class Writer {
 public:
  void u8(uint8_t v) { buf_.push_back(v); }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<uint8_t>((v >> (8 * i)) & 0xff));
  }
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void bytes(const void* data, size_t n) {
    u64(n);
    const auto* p = static_cast<const uint8_t*>(data);
    buf_.insert(buf_.end(), p, p + n);
  }
  void str(const std::string& s) { bytes(s.data(), s.size()); }
  std::vector<uint8_t> take() { return std::move(buf_); }

 private:
  std::vector<uint8_t> buf_;
};

// Reads what Writer wrote; a short or malformed body throws, naming the sender.
class Reader {
 public:
  Reader(const std::vector<uint8_t>& buf, std::string from) : buf_(buf), from_(std::move(from)) {}
  uint8_t u8() {
    need(1);
    return buf_[at_++];
  }
  uint64_t u64() {
    need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(buf_[at_++]) << (8 * i);
    return v;
  }
  int64_t i64() { return static_cast<int64_t>(u64()); }
  std::vector<uint8_t> bytes() {
    const uint64_t n = u64();
    need(n);
    std::vector<uint8_t> v(buf_.begin() + static_cast<std::ptrdiff_t>(at_),
                           buf_.begin() + static_cast<std::ptrdiff_t>(at_ + n));
    at_ += static_cast<size_t>(n);
    return v;
  }
  std::string str() {
    const std::vector<uint8_t> v = bytes();
    return std::string(v.begin(), v.end());
  }

 private:
  void need(uint64_t n) const {
    if (n > buf_.size() - at_) {
      throw Error(ErrorCode::kInternal, "malformed message from " + from_ + ": it ends at byte " +
                                            std::to_string(buf_.size()) + ", reading " +
                                            std::to_string(n) + " bytes at " + std::to_string(at_));
    }
  }
  const std::vector<uint8_t>& buf_;
  std::string from_;
  size_t at_ = 0;
};

// --- Sockets -----------------------------------------------------------------------------------

struct Resolved {
  sockaddr_storage addr{};
  socklen_t len = 0;
  int family = AF_INET;
};

Resolved resolve(const std::string& address, int port, bool passive, const std::string& who) {
  if (port < 0 || port > 65535) {
    throw Error(ErrorCode::kInvalidArgument,
                who + ": port " + std::to_string(port) + " is not in 0..65535");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc =
      ::getaddrinfo(address.empty() ? nullptr : address.c_str(), service.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    throw Error(ErrorCode::kIo, who + ": cannot resolve " + endpoint(address, port) + ": " +
                                    (rc != 0 ? ::gai_strerror(rc) : "no address"));
  }
  Resolved r;
  std::memcpy(&r.addr, found->ai_addr, found->ai_addrlen);
  r.len = found->ai_addrlen;
  r.family = found->ai_family;
  ::freeaddrinfo(found);
  return r;
}

// Collectives are small, latency-bound exchanges: do not let Nagle hold them back.
void set_nodelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void set_blocking(int fd, bool blocking) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, blocking ? (flags & ~O_NONBLOCK) : (flags | O_NONBLOCK));
}

// One connection attempt, bounded by the deadline. Returns the socket, or an invalid one with
// *err set.
UniqueFd try_connect(const Resolved& to, Clock::time_point deadline, int* err) {
  UniqueFd fd(::socket(to.family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    *err = errno;
    return {};
  }
  // Non-blocking, so that an unanswered SYN cannot outlast the setup timeout.
  set_blocking(fd.get(), false);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&to.addr), to.len) != 0) {
    if (errno != EINPROGRESS && errno != EINTR) {
      *err = errno;
      return {};
    }
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) {
        *err = ETIMEDOUT;
        return {};
      }
      pollfd p{fd.get(), POLLOUT, 0};
      const int rc = ::poll(&p, 1, static_cast<int>(left));
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0) {
        *err = errno;
        return {};
      }
      if (rc > 0) break;
    }
    int so_error = 0;
    socklen_t len = sizeof(so_error);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len);
    if (so_error != 0) {
      *err = so_error;
      return {};
    }
  }
  // Retrying a local port nobody listens on can, rarely, connect the socket to itself (TCP
  // simultaneous open): that is not rank 0.
  sockaddr_storage self{}, peer{};
  socklen_t self_len = sizeof(self), peer_len = sizeof(peer);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&self), &self_len) == 0 &&
      ::getpeername(fd.get(), reinterpret_cast<sockaddr*>(&peer), &peer_len) == 0 &&
      self_len == peer_len && std::memcmp(&self, &peer, self_len) == 0) {
    *err = ECONNREFUSED;
    return {};
  }
  set_blocking(fd.get(), true);
  set_nodelay(fd.get());
  return fd;
}

// --- Collective arguments ----------------------------------------------------------------------

// One rank's arguments to a collective: what rank 0 checks and computes from.
struct Call {
  std::string name;
  std::string local_error;  // an argument error of this rank alone ("" = none)
  std::string signature;    // what must equal rank 0's (the in-process communicator's strings)
  int64_t root = 0;
  uint8_t op = 0;    // all_reduce_host: HostReduceOp
  uint8_t elem = 0;  // all_reduce_host: 0 = i64, 1 = u64
  uint64_t row_bytes = 0;
  std::vector<int64_t> send_rows;
  std::vector<int64_t> recv_rows;
  std::vector<uint8_t> payload;
};

std::vector<uint8_t> encode(const Call& c) {
  Writer w;
  w.str(c.name);
  w.str(c.local_error);
  w.str(c.signature);
  w.i64(c.root);
  w.u8(c.op);
  w.u8(c.elem);
  w.u64(c.row_bytes);
  w.u64(c.send_rows.size());
  for (int64_t v : c.send_rows) w.i64(v);
  w.u64(c.recv_rows.size());
  for (int64_t v : c.recv_rows) w.i64(v);
  w.bytes(c.payload.data(), c.payload.size());
  return w.take();
}

Call decode(const std::vector<uint8_t>& body, int rank, int size) {
  Reader r(body, "rank " + std::to_string(rank));
  Call c;
  c.name = r.str();
  c.local_error = r.str();
  c.signature = r.str();
  c.root = r.i64();
  c.op = r.u8();
  c.elem = r.u8();
  c.row_bytes = r.u64();
  for (auto* rows : {&c.send_rows, &c.recv_rows}) {
    const uint64_t n = r.u64();
    // A count vector longer than the group is an argument error the sender already reported;
    // bounding it keeps garbage from allocating without limit.
    if (n > static_cast<uint64_t>(size) + 1024) {
      throw Error(ErrorCode::kInternal, "malformed message from rank " + std::to_string(rank) +
                                            ": " + std::to_string(n) + " row counts");
    }
    for (uint64_t i = 0; i < n; ++i) rows->push_back(r.i64());
  }
  c.payload = r.bytes();
  return c;
}

std::optional<Mismatch> common_checks(const std::vector<Call>& calls) {
  std::vector<RankCall> views;
  for (const Call& c : calls) views.push_back({c.name, c.local_error, c.signature});
  return first_mismatch(views);
}

// A payload of an unexpected size despite matching signatures: a peer that does not speak this
// protocol, i.e. a bug.
void expect_bytes(const Call& c, int rank, size_t want) {
  if (c.payload.size() != want) {
    throw Error(ErrorCode::kInternal, c.name + ": rank " + std::to_string(rank) + " sent " +
                                          std::to_string(c.payload.size()) + " bytes, expected " +
                                          std::to_string(want));
  }
}

std::vector<float> floats(const std::vector<uint8_t>& bytes, size_t off, size_t n) {
  std::vector<float> v(n);
  if (n > 0) std::memcpy(v.data(), bytes.data() + off * sizeof(float), n * sizeof(float));
  return v;
}

std::vector<uint8_t> as_bytes(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  return std::vector<uint8_t>(p, p + n);
}

// ((x0 + x1) + x2) + ... over floats [off, off + n) of every rank's payload: the in-process
// communicator's order, so the bits match it.
std::vector<uint8_t> sum_in_rank_order(const std::vector<Call>& calls, size_t off, size_t n) {
  std::vector<float> out = floats(calls[0].payload, off, n);
  for (size_t r = 1; r < calls.size(); ++r) {
    const std::vector<float> x = floats(calls[r].payload, off, n);
    for (size_t i = 0; i < n; ++i) out[i] += x[i];
  }
  return as_bytes(out.data(), out.size() * sizeof(float));
}

template <typename T>
std::vector<uint8_t> host_reduce(const std::vector<Call>& calls, HostReduceOp op) {
  const size_t n = calls[0].payload.size() / sizeof(T);
  std::vector<T> out(n), x(n);
  if (n > 0) std::memcpy(out.data(), calls[0].payload.data(), n * sizeof(T));
  for (size_t r = 1; r < calls.size(); ++r) {
    if (n > 0) std::memcpy(x.data(), calls[r].payload.data(), n * sizeof(T));
    host_reduce_into<T>(out, x, op);
  }
  return as_bytes(out.data(), n * sizeof(T));
}

// Rank 0's computation of every rank's result from every rank's (checked) call: results[r] for
// rank r, or the mismatch every rank reports.
std::optional<Mismatch> compute(const std::vector<Call>& calls,
                                std::vector<std::vector<uint8_t>>& results) {
  const int n = static_cast<int>(calls.size());
  const std::string& name = calls[0].name;
  const size_t bytes = calls[0].payload.size();
  results.assign(static_cast<size_t>(n), {});
  if (name == "all_reduce_sum") {
    for (int r = 0; r < n; ++r) expect_bytes(calls[static_cast<size_t>(r)], r, bytes);
    const std::vector<uint8_t> sum = sum_in_rank_order(calls, 0, bytes / sizeof(float));
    for (auto& out : results) out = sum;
  } else if (name == "all_gather") {
    std::vector<uint8_t> all;
    for (int r = 0; r < n; ++r) {
      expect_bytes(calls[static_cast<size_t>(r)], r, bytes);
      all.insert(all.end(), calls[static_cast<size_t>(r)].payload.begin(),
                 calls[static_cast<size_t>(r)].payload.end());
    }
    for (auto& out : results) out = all;
  } else if (name == "reduce_scatter_sum") {
    for (int r = 0; r < n; ++r) expect_bytes(calls[static_cast<size_t>(r)], r, bytes);
    const size_t block = bytes / sizeof(float) / static_cast<size_t>(n);
    for (int r = 0; r < n; ++r) {
      results[static_cast<size_t>(r)] =
          sum_in_rank_order(calls, block * static_cast<size_t>(r), block);
    }
  } else if (name == "all_to_all") {
    // Counts must agree pairwise: what p sends to q is what q expects from p.
    for (int src = 0; src < n; ++src) {
      const Call& s = calls[static_cast<size_t>(src)];
      int64_t total = 0;
      for (int64_t rows : s.send_rows) total += rows;
      expect_bytes(s, src, static_cast<size_t>(total) * s.row_bytes);
      for (int dst = 0; dst < n; ++dst) {
        const int64_t sent = s.send_rows[static_cast<size_t>(dst)];
        const int64_t expected =
            calls[static_cast<size_t>(dst)].recv_rows[static_cast<size_t>(src)];
        if (sent != expected) {
          return Mismatch{dst, "rank " + std::to_string(src) + " sends " + std::to_string(sent) +
                                   " rows to rank " + std::to_string(dst) + " but rank " +
                                   std::to_string(dst) + " expects " + std::to_string(expected)};
        }
      }
    }
    for (int src = 0; src < n; ++src) {
      const Call& s = calls[static_cast<size_t>(src)];
      size_t at = 0;
      for (int dst = 0; dst < n; ++dst) {
        const size_t len = static_cast<size_t>(s.send_rows[static_cast<size_t>(dst)]) * s.row_bytes;
        auto& out = results[static_cast<size_t>(dst)];
        out.insert(out.end(), s.payload.begin() + static_cast<std::ptrdiff_t>(at),
                   s.payload.begin() + static_cast<std::ptrdiff_t>(at + len));
        at += len;
      }
    }
  } else if (name == "broadcast") {
    const auto root = static_cast<size_t>(calls[0].root);
    for (int r = 0; r < n; ++r) expect_bytes(calls[static_cast<size_t>(r)], r, bytes);
    for (size_t r = 0; r < results.size(); ++r) {
      if (r != root) results[r] = calls[root].payload;  // the root keeps its own tensor
    }
  } else if (name == "barrier") {
    // Nothing to compute: arriving was the point.
  } else if (name == "all_reduce_host") {
    for (int r = 0; r < n; ++r) expect_bytes(calls[static_cast<size_t>(r)], r, bytes);
    const auto op = static_cast<HostReduceOp>(calls[0].op);
    const std::vector<uint8_t> out =
        calls[0].elem == 0 ? host_reduce<int64_t>(calls, op) : host_reduce<uint64_t>(calls, op);
    for (auto& r : results) r = out;
  } else {
    throw Error(ErrorCode::kInternal, "unknown collective '" + name + "'");
  }
  return std::nullopt;
}

// --- The communicator --------------------------------------------------------------------------

class TcpCommunicator final : public Communicator {
 public:
  // peers[r]: on rank 0 the socket to rank r (r >= 1); on another rank, peers[0] is the socket to
  // rank 0.
  TcpCommunicator(int rank, int size, std::vector<UniqueFd> peers, Backend* backend)
      : rank_(rank), size_(size), peers_(std::move(peers)), backend_(backend) {
    // The self-pipe lets abort() from another thread wake a rank blocked in poll().
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      throw Error(ErrorCode::kIo, "TcpCommunicator rank " + std::to_string(rank) +
                                      ": pipe2 failed: " + errno_text(errno));
    }
    wake_read_ = UniqueFd(fds[0]);
    wake_write_ = UniqueFd(fds[1]);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(const Tensor& t) override {
    Call c;
    c.name = "all_reduce_sum";
    set_args(c, all_reduce_args(t, placement()));
    stage(c, t);
    const std::vector<uint8_t> out = exchange(c);
    unstage(c.name, t, out);
  }

  void all_gather(const Tensor& input, const Tensor& output) override {
    Call c;
    c.name = "all_gather";
    set_args(c, all_gather_args(input, output, size_, placement()));
    stage(c, input);
    const std::vector<uint8_t> out = exchange(c);
    unstage(c.name, output, out);
  }

  void reduce_scatter_sum(const Tensor& input, const Tensor& output) override {
    Call c;
    c.name = "reduce_scatter_sum";
    set_args(c, reduce_scatter_args(input, output, size_, placement()));
    stage(c, input);
    const std::vector<uint8_t> out = exchange(c);
    unstage(c.name, output, out);
  }

  void all_to_all(const Tensor& send, std::span<const int64_t> send_rows, const Tensor& recv,
                  std::span<const int64_t> recv_rows) override {
    Call c;
    c.name = "all_to_all";
    set_args(c, all_to_all_args(send, send_rows, recv, recv_rows, size_, placement()));
    if (c.local_error.empty()) {
      c.send_rows.assign(send_rows.begin(), send_rows.end());
      c.recv_rows.assign(recv_rows.begin(), recv_rows.end());
      c.row_bytes = row_bytes(send);
    }
    stage(c, send);
    const std::vector<uint8_t> out = exchange(c);
    unstage(c.name, recv, out);
  }

  void broadcast(const Tensor& t, int root) override {
    Call c;
    c.name = "broadcast";
    set_args(c, broadcast_args(t, root, size_, placement()));
    c.root = root;
    stage(c, t);
    const std::vector<uint8_t> out = exchange(c);
    if (rank_ != root) unstage(c.name, t, out);
  }

  void barrier() override {
    Call c;
    c.name = "barrier";
    sync(c.name);
    exchange(c);
  }

  std::vector<int64_t> all_reduce_host(std::span<const int64_t> values, HostReduceOp op) override {
    return host_reduce_call<int64_t>(values, op, 0, "i64");
  }
  std::vector<uint64_t> all_reduce_host(std::span<const uint64_t> values,
                                        HostReduceOp op) override {
    return host_reduce_call<uint64_t>(values, op, 1, "u64");
  }

  void abort(const std::string& reason) override {
    const std::string full = "rank " + std::to_string(rank_) + " aborted: " + reason;
    if (set_aborted(full)) tell_abort(full);
    wake();
  }

 private:
  template <typename T>
  std::vector<T> host_reduce_call(std::span<const T> values, HostReduceOp op, uint8_t elem,
                                  const char* type) {
    Call c;
    c.name = "all_reduce_host";
    c.signature = std::string(host_reduce_op_name(op)) + " of " + std::to_string(values.size()) +
                  " " + type + " values";
    c.op = static_cast<uint8_t>(op);
    c.elem = elem;
    c.payload = as_bytes(values.data(), values.size() * sizeof(T));
    // No device work, no stream wait: the values are on the host.
    const std::vector<uint8_t> out = exchange(c);
    if (out.size() != values.size() * sizeof(T)) {
      fail(c.name, "rank 0 sent " + std::to_string(out.size()) + " bytes for " +
                       std::to_string(values.size()) + " values");
    }
    std::vector<T> result(values.size());
    if (!out.empty()) std::memcpy(result.data(), out.data(), out.size());
    return result;
  }

  static void set_args(Call& c, const CollectiveArgs& a) {
    c.local_error = a.local_error;
    c.signature = a.signature;
  }
  // Host tensors always; device tensors of the rank's backend, staged through the host.
  PlacementRule placement() const {
    return [this](const char* arg, const Tensor& t) -> std::string {
      const DeviceKind kind = t.device().kind;
      if (backend_ == nullptr && kind != DeviceKind::kCpu) {
        return std::string(arg) + " is " + t.describe() +
               ": a TCP communicator without a backend takes host tensors";
      }
      if (backend_ != nullptr && kind != DeviceKind::kCpu && kind != backend_->device_kind()) {
        return std::string(arg) + " is " + t.describe() + " but the rank's backend is " +
               backend_->name();
      }
      return "";
    };
  }

  // Waits for the rank's stream, so the inputs are final (stream order of the contract).
  void sync(const std::string& name) {
    if (backend_ == nullptr) return;
    try {
      backend_->synchronize();
    } catch (const std::exception& e) {
      abort("its stream failed before " + name + ": " + e.what());
      throw;
    }
  }

  // Waits for the stream and copies `t` into the call's payload (through the host for a device
  // tensor); a tensor with an argument error is not read.
  void stage(Call& c, const Tensor& t) {
    sync(c.name);
    if (!c.local_error.empty()) return;
    try {
      if (t.device().kind == DeviceKind::kCpu) {
        c.payload = as_bytes(t.raw_data(), t.nbytes());
      } else {
        const Tensor h = backend_->to_host(t);
        c.payload = as_bytes(h.raw_data(), h.nbytes());
      }
    } catch (const std::exception& e) {
      abort("copying its input of " + c.name + " to the host failed: " + e.what());
      throw;
    }
  }

  // Writes a result into `t` (uploading it for a device tensor, and waiting, so that work
  // enqueued after the collective sees it).
  void unstage(const std::string& name, const Tensor& t, const std::vector<uint8_t>& bytes) {
    if (bytes.size() != t.nbytes()) {
      fail(name, "rank 0 sent " + std::to_string(bytes.size()) + " bytes for " + t.describe());
    }
    if (bytes.empty()) return;
    if (t.device().kind == DeviceKind::kCpu) {
      std::memcpy(t.raw_data(), bytes.data(), bytes.size());
      return;
    }
    try {
      Tensor h = Tensor::zeros(t.shape(), t.dtype());
      std::memcpy(h.raw_data(), bytes.data(), bytes.size());
      backend_->upload_into(t, h);
      backend_->synchronize();
    } catch (const std::exception& e) {
      abort("writing the result of " + name + " to the device failed: " + e.what());
      throw;
    }
  }

  // --- Abort state -------------------------------------------------------------------------

  // Records the reason; false if the group was aborted already (the first reason stays).
  bool set_aborted(const std::string& reason) {
    std::lock_guard lock(state_mutex_);
    if (aborted_) return false;
    aborted_ = true;
    reason_ = reason;
    return true;
  }
  std::optional<std::string> abort_reason() {
    std::lock_guard lock(state_mutex_);
    if (!aborted_) return std::nullopt;
    return reason_;
  }
  void wake() {
    const uint8_t b = 1;
    // A full pipe already wakes the reader: the result does not matter.
    [[maybe_unused]] const ssize_t k = ::write(wake_write_.get(), &b, 1);
  }
  // Rank 0 tells every other rank; another rank tells rank 0, which forwards it. Best effort: a
  // peer that is gone cannot be told.
  void tell_abort(const std::string& reason) {
    std::lock_guard lock(send_mutex_);
    for (const UniqueFd& fd : peers_) {
      if (fd.valid()) send_frame(fd.get(), kAbort, reason);
    }
  }
  [[noreturn]] void throw_aborted(const std::string& name) {
    throw Error(ErrorCode::kInternal,
                name + " on rank " + std::to_string(rank_) +
                    ": the group was aborted: " + abort_reason().value_or("?"));
  }
  // Aborts the group with `reason` (unless it was aborted already) and throws.
  [[noreturn]] void fail(const std::string& name, const std::string& reason) {
    if (set_aborted(reason)) tell_abort(reason);
    throw_aborted(name);
  }

  // --- The exchange ----------------------------------------------------------------------------

  // Sends this rank's call to rank 0 (or, on rank 0, gathers everyone's), and returns this rank's
  // result; throws the agreed mismatch or the abort.
  std::vector<uint8_t> exchange(const Call& mine) {
    if (abort_reason()) throw_aborted(mine.name);
    return rank_ == 0 ? exchange_root(mine) : exchange_peer(mine);
  }

  std::vector<uint8_t> exchange_peer(const Call& mine) {
    const int fd = peers_[0].get();
    int send_err = 0;
    {
      std::lock_guard lock(send_mutex_);
      send_err = send_frame(fd, kCall, encode(mine));
    }
    // fail() outside the lock: it takes the lock again to tell rank 0.
    if (send_err != 0) fail(mine.name, "rank 0 disconnected (" + errno_text(send_err) + ")");
    for (;;) {
      pollfd p[2] = {{fd, POLLIN, 0}, {wake_read_.get(), POLLIN, 0}};
      if (::poll(p, 2, -1) < 0) {
        if (errno == EINTR) continue;
        fail(mine.name, "poll failed on rank " + std::to_string(rank_) + ": " + errno_text(errno));
      }
      if (abort_reason()) throw_aborted(mine.name);
      if (p[0].revents == 0) continue;
      Frame f;
      int err = 0;
      switch (read_frame(fd, f, std::nullopt, &err)) {
        case ReadStatus::kOk:
          break;
        case ReadStatus::kEof:
          fail(mine.name, "rank 0 disconnected");
        default:
          fail(mine.name, "rank 0 disconnected (" + errno_text(err) + ")");
      }
      switch (f.type) {
        case kResult:
          return std::move(f.body);
        case kMismatch:
          throw Error(ErrorCode::kInvalidArgument,
                      mine.name + " on rank " + std::to_string(rank_) + ": " + text_of(f));
        case kAbort:
          set_aborted(text_of(f));
          throw_aborted(mine.name);
        default:
          fail(mine.name, "rank 0 sent an unexpected message of type " + std::to_string(f.type));
      }
    }
  }

  std::vector<uint8_t> exchange_root(const Call& mine) {
    const auto n = static_cast<size_t>(size_);
    std::vector<Call> calls(n);
    calls[0] = mine;
    std::vector<uint8_t> got(n, 0);
    size_t pending = n - 1;
    // Every peer is watched, not just those still to post: a rank that posted may still abort
    // (from a watchdog thread) or die while the others are awaited.
    std::vector<pollfd> polls(n);
    while (pending > 0) {
      polls[0] = {wake_read_.get(), POLLIN, 0};
      for (size_t r = 1; r < n; ++r) polls[r] = {peers_[r].get(), POLLIN, 0};
      if (::poll(polls.data(), polls.size(), -1) < 0) {
        if (errno == EINTR) continue;
        fail(mine.name, "poll failed on rank 0: " + errno_text(errno));
      }
      if (abort_reason()) throw_aborted(mine.name);
      for (size_t r = 1; r < n; ++r) {
        if (polls[r].revents == 0) continue;
        const std::string who = "rank " + std::to_string(r);
        Frame f;
        int err = 0;
        switch (read_frame(peers_[r].get(), f, std::nullopt, &err)) {
          case ReadStatus::kOk:
            break;
          case ReadStatus::kEof:
            fail(mine.name, who + " disconnected");
          default:
            fail(mine.name, who + " disconnected (" + errno_text(err) + ")");
        }
        if (f.type == kAbort) fail(mine.name, text_of(f));
        if (f.type != kCall || got[r]) {
          fail(mine.name, who + " sent an unexpected message of type " + std::to_string(f.type) +
                              " during " + mine.name);
        }
        try {
          calls[r] = decode(f.body, static_cast<int>(r), size_);
        } catch (const Error& e) {
          fail(mine.name, e.what());
        }
        got[r] = 1;
        --pending;
      }
    }
    std::vector<std::vector<uint8_t>> results;
    std::optional<Mismatch> bad;
    try {
      bad = common_checks(calls);
      if (!bad) bad = compute(calls, results);
    } catch (const std::exception& e) {
      fail(mine.name, "error inside " + mine.name + " on rank 0: " + e.what());
    }
    int send_err = 0;
    size_t failed = 0;
    {
      std::lock_guard lock(send_mutex_);
      for (size_t r = 1; r < n && send_err == 0; ++r) {
        send_err = bad ? send_frame(peers_[r].get(), kMismatch, bad->what)
                       : send_frame(peers_[r].get(), kResult, results[r]);
        failed = r;
      }
    }
    // fail() outside the lock: it takes the lock again to tell the others.
    if (send_err != 0) {
      fail(mine.name,
           "rank " + std::to_string(failed) + " disconnected (" + errno_text(send_err) + ")");
    }
    if (bad) {
      throw Error(ErrorCode::kInvalidArgument, mine.name + " on rank 0: " + bad->what);
    }
    return std::move(results[0]);
  }

  const int rank_;
  const int size_;
  std::vector<UniqueFd> peers_;
  Backend* backend_;
  UniqueFd wake_read_;
  UniqueFd wake_write_;
  std::mutex state_mutex_;  // aborted_, reason_ (abort() may come from another thread)
  bool aborted_ = false;
  std::string reason_;
  std::mutex send_mutex_;  // one frame at a time on the sockets (abort() may interleave)
};

// How long rank 0 waits for a connection's hello before dropping it as a stray.
constexpr std::chrono::seconds kHelloWait(3);

std::vector<uint8_t> hello_body(int rank, int size) {
  Writer w;
  w.u64(kMagic);
  w.i64(rank);
  w.i64(size);
  return w.take();
}

std::string seconds_text(std::chrono::seconds timeout) {
  return std::to_string(timeout.count()) + " s";
}

}  // namespace

TcpListener::TcpListener(const std::string& address, int port) : address_(address) {
  const std::string who = "TcpListener on " + endpoint(address, port);
  const Resolved at = resolve(address, port, true, who);
  fd_ = UniqueFd(::socket(at.family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd_.valid()) throw Error(ErrorCode::kIo, who + ": socket failed: " + errno_text(errno));
  // A restarted rank 0 must be able to take its port back while old connections linger.
  const int one = 1;
  ::setsockopt(fd_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd_.get(), reinterpret_cast<const sockaddr*>(&at.addr), at.len) != 0) {
    throw Error(ErrorCode::kIo, who + ": bind failed: " + errno_text(errno));
  }
  if (::listen(fd_.get(), 128) != 0) {
    throw Error(ErrorCode::kIo, who + ": listen failed: " + errno_text(errno));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    throw Error(ErrorCode::kIo, who + ": getsockname failed: " + errno_text(errno));
  }
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
}

std::unique_ptr<Communicator> make_tcp_rank0(TcpListener&& listener_in, int size, Backend* backend,
                                             std::chrono::seconds timeout) {
  TcpListener listener = std::move(listener_in);  // closed when setup ends: nobody joins later
  const std::string who = "rank 0 listening on " + endpoint(listener.address(), listener.port());
  if (size < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                who + ": a group needs at least one rank, got " + std::to_string(size));
  }
  const auto deadline = Clock::now() + timeout;
  std::vector<UniqueFd> peers(static_cast<size_t>(size));
  int arrived = 1;
  // Tells every connected rank why the group cannot form, then throws it here.
  auto refuse = [&](ErrorCode code, const std::string& what, UniqueFd* extra) {
    if (extra != nullptr) send_frame(extra->get(), kRefused, what);
    for (const UniqueFd& fd : peers) {
      if (fd.valid()) send_frame(fd.get(), kRefused, what);
    }
    throw Error(code, what);
  };
  while (arrived < size) {
    int err = 0;
    const ReadStatus ready = wait_readable(listener.fd(), deadline, &err);
    if (ready == ReadStatus::kError) {
      refuse(ErrorCode::kIo, who + ": poll failed: " + errno_text(err), nullptr);
    }
    if (ready == ReadStatus::kTimeout) {
      std::string missing;
      for (int r = 1; r < size; ++r) {
        if (!peers[static_cast<size_t>(r)].valid()) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
      }
      refuse(ErrorCode::kIo,
             who + ": rank(s) " + missing + " did not connect within " + seconds_text(timeout),
             nullptr);
    }
    UniqueFd conn(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      refuse(ErrorCode::kIo, who + ": accept failed: " + errno_text(errno), nullptr);
    }
    set_nodelay(conn.get());
    // A rank says hello as soon as it connects; a connection that stays silent (a port scan, a
    // health check) is dropped after kHelloWait instead of holding up the whole setup.
    Frame hello;
    const auto hello_deadline = std::min(deadline, Clock::now() + kHelloWait);
    if (read_frame(conn.get(), hello, hello_deadline, &err) != ReadStatus::kOk ||
        hello.type != kHello) {
      continue;  // not a rank of ours (or it gave up): ignore the stray connection
    }
    int64_t rank = -1, their_size = -1;
    try {
      Reader r(hello.body, "a connecting peer");
      if (r.u64() != kMagic) continue;
      rank = r.i64();
      their_size = r.i64();
    } catch (const Error&) {
      continue;
    }
    if (their_size != size) {
      refuse(ErrorCode::kInvalidArgument,
             who + ": rank " + std::to_string(rank) + " joined a group of " +
                 std::to_string(their_size) + " ranks but rank 0's group has " +
                 std::to_string(size),
             &conn);
    }
    if (rank < 1 || rank >= size) {
      refuse(ErrorCode::kInvalidArgument,
             who + ": a peer announced rank " + std::to_string(rank) + ", not in 1.." +
                 std::to_string(size - 1),
             &conn);
    }
    if (peers[static_cast<size_t>(rank)].valid()) {
      refuse(ErrorCode::kInvalidArgument,
             who + ": rank " + std::to_string(rank) + " connected twice", &conn);
    }
    peers[static_cast<size_t>(rank)] = std::move(conn);
    ++arrived;
  }
  for (int r = 1; r < size; ++r) {
    if (const int e = send_frame(peers[static_cast<size_t>(r)].get(), kWelcome, std::string())) {
      refuse(ErrorCode::kIo,
             who + ": rank " + std::to_string(r) + " disconnected during setup (" + errno_text(e) +
                 ")",
             nullptr);
    }
  }
  return std::make_unique<TcpCommunicator>(0, size, std::move(peers), backend);
}

std::unique_ptr<Communicator> make_tcp_rank(int rank, int size, const std::string& master_addr,
                                            int master_port, Backend* backend,
                                            std::chrono::seconds timeout) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error(ErrorCode::kInvalidArgument, "make_tcp_rank: rank " + std::to_string(rank) +
                                                 " is not a rank of a group of " +
                                                 std::to_string(size));
  }
  if (rank == 0) {
    return make_tcp_rank0(TcpListener(master_addr, master_port), size, backend, timeout);
  }
  const std::string at = endpoint(master_addr, master_port);
  const std::string who = "rank " + std::to_string(rank);
  const Resolved to = resolve(master_addr, master_port, false, who);
  const auto deadline = Clock::now() + timeout;
  UniqueFd fd;
  int last_err = 0;
  // Rank 0 may not be listening yet (processes start in any order): retry until the deadline.
  for (;;) {
    fd = try_connect(to, deadline, &last_err);
    if (fd.valid()) break;
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) {
      throw Error(ErrorCode::kIo, who + " could not connect to rank 0 at " + at + " within " +
                                      seconds_text(timeout) + ": " + errno_text(last_err));
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(left, std::chrono::milliseconds(50)));
  }
  if (const int e = send_frame(fd.get(), kHello, hello_body(rank, size))) {
    throw Error(ErrorCode::kIo,
                who + ": sending its rank to rank 0 at " + at + " failed: " + errno_text(e));
  }
  Frame f;
  int err = 0;
  switch (read_frame(fd.get(), f, deadline, &err)) {
    case ReadStatus::kOk:
      break;
    case ReadStatus::kTimeout:
      throw Error(ErrorCode::kIo, who + ": connected to rank 0 at " + at +
                                      " but the group did not form within " +
                                      seconds_text(timeout));
    case ReadStatus::kEof:
      throw Error(ErrorCode::kIo,
                  who + ": rank 0 at " + at + " closed the connection before the group formed");
    case ReadStatus::kError:
      throw Error(ErrorCode::kIo,
                  who + ": reading from rank 0 at " + at + " failed: " + errno_text(err));
  }
  if (f.type == kRefused) {
    throw Error(ErrorCode::kInvalidArgument,
                who + ": rank 0 at " + at + " could not form the group: " + text_of(f));
  }
  if (f.type != kWelcome) {
    throw Error(ErrorCode::kIo, who + ": rank 0 at " + at + " sent an unexpected message of type " +
                                    std::to_string(f.type) + " during setup");
  }
  std::vector<UniqueFd> peers;
  peers.push_back(std::move(fd));
  return std::make_unique<TcpCommunicator>(rank, size, std::move(peers), backend);
}

}  // namespace deepinfer::dist
