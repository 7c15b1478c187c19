#include "dist/nccl_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <optional>
#include <string_view>

#include "deepinfer/error.h"

// The wheel folders the build's Python environment holds, ':'-separated (cpp/CMakeLists.txt).
#ifndef DEEPINFER_NCCL_WHEEL_DIRS
#define DEEPINFER_NCCL_WHEEL_DIRS ""
#endif

namespace deepinfer::dist::nccl {

namespace {

constexpr const char* kSoname = "libnccl.so.2";

template <typename Fn>
void resolve(void* handle, const char* name, Fn*& out, std::vector<std::string>& missing) {
  void* symbol = dlsym(handle, name);
  if (symbol == nullptr) {
    missing.emplace_back(name);
    return;
  }
  out = reinterpret_cast<Fn*>(symbol);
}

// Resolves every function of Api from `handle`; returns the names that are missing.
std::vector<std::string> resolve_all(void* handle, Api& api) {
  std::vector<std::string> missing;
  resolve(handle, "ncclGetVersion", api.get_version, missing);
  resolve(handle, "ncclGetErrorString", api.get_error_string, missing);
  resolve(handle, "ncclGetLastError", api.get_last_error, missing);
  resolve(handle, "ncclGetUniqueId", api.get_unique_id, missing);
  resolve(handle, "ncclCommInitRank", api.comm_init_rank, missing);
  resolve(handle, "ncclCommSplit", api.comm_split, missing);
  resolve(handle, "ncclCommDestroy", api.comm_destroy, missing);
  resolve(handle, "ncclCommAbort", api.comm_abort, missing);
  resolve(handle, "ncclCommGetAsyncError", api.comm_get_async_error, missing);
  resolve(handle, "ncclAllReduce", api.all_reduce, missing);
  resolve(handle, "ncclAllGather", api.all_gather, missing);
  resolve(handle, "ncclReduceScatter", api.reduce_scatter, missing);
  resolve(handle, "ncclBroadcast", api.broadcast, missing);
  resolve(handle, "ncclSend", api.send, missing);
  resolve(handle, "ncclRecv", api.recv, missing);
  resolve(handle, "ncclGroupStart", api.group_start, missing);
  resolve(handle, "ncclGroupEnd", api.group_end, missing);
  return missing;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (const auto& p : parts) {
    if (!out.empty()) out += sep;
    out += p;
  }
  return out;
}

}  // namespace

std::vector<std::string> default_search_paths() {
  std::vector<std::string> paths;
  if (const char* explicit_file = std::getenv("DEEPINFER_NCCL_LIBRARY");
      explicit_file != nullptr && *explicit_file != '\0') {
    paths.emplace_back(explicit_file);
  }
  const std::string_view dirs = DEEPINFER_NCCL_WHEEL_DIRS;
  size_t at = 0;
  while (at < dirs.size()) {
    size_t end = dirs.find(':', at);
    if (end == std::string_view::npos) end = dirs.size();
    if (end > at) paths.push_back(std::string(dirs.substr(at, end - at)) + "/" + kSoname);
    at = end + 1;
  }
  paths.emplace_back(kSoname);
  return paths;
}

Api load_nccl(const std::vector<std::string>& candidates) {
  std::vector<std::string> tried;
  for (const std::string& path : candidates) {
    // RTLD_LOCAL: NCCL's symbols stay out of the global namespace, so another NCCL the process
    // loads (PyTorch's) is not bound to ours.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      tried.push_back(path + " (" + (why != nullptr ? why : "not loadable") + ")");
      continue;
    }
    Api api;
    api.path = path;
    const std::vector<std::string> missing = resolve_all(handle, api);
    if (!missing.empty()) {
      dlclose(handle);
      throw Error(ErrorCode::kUnsupported,
                  "NCCL: " + path + " loads but lacks " + join(missing, ", ") +
                      " (deepinfer needs NCCL 2.18 or newer: python -m pip install "
                      "nvidia-nccl-cu13)");
    }
    const Result r = api.get_version(&api.version);
    if (r != kSuccess) {
      throw Error(ErrorCode::kUnsupported,
                  "NCCL: ncclGetVersion of " + path + " failed: " + api.get_error_string(r));
    }
    return api;
  }
  throw Error(ErrorCode::kUnsupported,
              std::string("NCCL (") + kSoname +
                  ") could not be loaded; install it with: python -m pip install nvidia-nccl-cu13 "
                  "(or set DEEPINFER_NCCL_LIBRARY to the library file). Tried: " +
                  (tried.empty() ? std::string("no paths") : join(tried, "; ")));
}

const Api& api() {
  static std::once_flag once;
  static std::optional<Api> loaded;
  static std::string failure;
  std::call_once(once, [] {
    try {
      loaded = load_nccl(default_search_paths());
    } catch (const Error& e) {
      failure = e.what();
    }
  });
  if (!loaded) throw Error(ErrorCode::kUnsupported, failure);
  return *loaded;
}

std::string error_text(Result result, Comm comm) {
  const Api& nccl = api();
  std::string text = nccl.get_error_string(result);
  if (comm != nullptr) {
    const char* last = nccl.get_last_error(comm);
    if (last != nullptr && *last != '\0') text += ": " + std::string(last);
  }
  return text + " (NCCL " + std::to_string(nccl.version) + ")";
}

void check(Result result, const char* call, int rank, Comm comm) {
  if (result == kSuccess) return;
  throw Error(ErrorCode::kInternal, std::string(call) + " on rank " + std::to_string(rank) +
                                        " failed: " + error_text(result, comm));
}

}  // namespace deepinfer::dist::nccl
