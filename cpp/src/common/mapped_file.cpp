#include "common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "deepinfer/error.h"

namespace deepinfer {

namespace {

std::string os_reason(int err) {
  return std::generic_category().message(err);
}

[[noreturn]] void throw_os_error(const std::string& path, const char* what, int err) {
  ErrorCode code = err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo;
  throw Error(code, path + ": cannot " + what + ": " + os_reason(err));
}

// Closes the descriptor on every path out of open(); the mapping outlives it.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path) {
  int raw_fd;
  do {
    // O_NONBLOCK so that opening a FIFO by mistake fails below instead of hanging here.
    raw_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  } while (raw_fd < 0 && errno == EINTR);
  if (raw_fd < 0) throw_os_error(path, "open", errno);
  FileDescriptor fd(raw_fd);

  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_os_error(path, "stat", errno);
  if (S_ISDIR(st.st_mode)) {
    throw Error(ErrorCode::kIo, path + ": cannot map: is a directory, expected a regular file");
  }
  if (!S_ISREG(st.st_mode)) {
    throw Error(ErrorCode::kIo, path + ": cannot map: not a regular file");
  }
  auto size = static_cast<size_t>(st.st_size);
  if (size == 0) return std::shared_ptr<const MappedFile>(new MappedFile(path, nullptr, 0));

  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (addr == MAP_FAILED) throw_os_error(path, "mmap", errno);
  std::unique_ptr<MappedFile> owner;
  try {
    owner.reset(new MappedFile(path, static_cast<const uint8_t*>(addr), size));
  } catch (...) {
    ::munmap(addr, size);
    throw;
  }
  // If this throws, `owner` still holds the mapping and releases it.
  return std::shared_ptr<const MappedFile>(std::move(owner));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace deepinfer
