// Loading NCCL at run time. libdeepinfer has no link-time dependency on NCCL (CI builds the CUDA
// backend on machines without it): the first NCCL communicator dlopens libnccl.so.2 and resolves
// the few functions below with dlsym. Compiles without CUDA, so the CPU tests check the errors.
//
// The declarations are our own subset of NCCL's C ABI, checked against nccl.h of NCCL 2.32.3 (the
// nvidia-nccl-cu13 wheel): an opaque communicator handle, the 128-byte unique id, the result,
// data type and reduction enum values we use (plain C enums: passed as int), and the signatures.
// The ABI of these has been stable since NCCL 2.x began; ncclCommSplit needs 2.18 or newer.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

// The CUDA runtime's stream handle is `struct CUstream_st*` (cudaStream_t); declared here so this
// header needs no CUDA include.
struct CUstream_st;

namespace deepinfer::dist::nccl {

struct CommHandle;  // NCCL's `struct ncclComm`, never dereferenced
using Comm = CommHandle*;
using Stream = CUstream_st*;

inline constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
struct UniqueId {
  char internal[kUniqueIdBytes];
};

// ncclResult_t
enum Result : int { kSuccess = 0, kInProgress = 7 };
// ncclDataType_t
enum DataType : int { kUint8 = 1, kUint64 = 5, kFloat32 = 7 };
// ncclRedOp_t
enum RedOp : int { kSum = 0 };

// The NCCL functions deepinfer calls. Filled by load_nccl; never null once loaded.
struct Api {
  std::string path;  // what was loaded (a file path, or the soname the default loader found)
  int version = 0;   // ncclGetVersion: major * 10000 + minor * 100 + patch

  Result (*get_version)(int* version) = nullptr;
  const char* (*get_error_string)(Result result) = nullptr;
  const char* (*get_last_error)(Comm comm) = nullptr;
  Result (*get_unique_id)(UniqueId* id) = nullptr;
  Result (*comm_init_rank)(Comm* comm, int nranks, UniqueId id, int rank) = nullptr;
  Result (*comm_split)(Comm comm, int color, int key, Comm* newcomm, void* config) = nullptr;
  Result (*comm_destroy)(Comm comm) = nullptr;
  Result (*comm_abort)(Comm comm) = nullptr;
  Result (*comm_get_async_error)(Comm comm, Result* async_error) = nullptr;
  Result (*all_reduce)(const void* send, void* recv, size_t count, DataType type, RedOp op,
                       Comm comm, Stream stream) = nullptr;
  Result (*all_gather)(const void* send, void* recv, size_t send_count, DataType type, Comm comm,
                       Stream stream) = nullptr;
  Result (*reduce_scatter)(const void* send, void* recv, size_t recv_count, DataType type, RedOp op,
                           Comm comm, Stream stream) = nullptr;
  Result (*broadcast)(const void* send, void* recv, size_t count, DataType type, int root,
                      Comm comm, Stream stream) = nullptr;
  Result (*send)(const void* buf, size_t count, DataType type, int peer, Comm comm,
                 Stream stream) = nullptr;
  Result (*recv)(void* buf, size_t count, DataType type, int peer, Comm comm,
                 Stream stream) = nullptr;
  Result (*group_start)() = nullptr;
  Result (*group_end)() = nullptr;
};

// Where libnccl.so.2 is looked for, in order: $DEEPINFER_NCCL_LIBRARY (a file) when set; the
// lib folders of the nvidia-nccl-cu13 wheel (nvidia/nccl/lib, nvidia/cu13/lib) of the Python
// environment the build was configured with; then the bare soname, which the default loader
// path resolves (LD_LIBRARY_PATH, the executable's rpath, ld.so.cache).
std::vector<std::string> default_search_paths();

// Loads the first candidate that dlopens and resolves every function of Api. Throws
// Error(kUnsupported) naming every candidate tried (with the loader's reason) and how to get
// NCCL when none loads, or naming the missing functions of a library that loads but lacks some.
// A loaded library is never closed (NCCL's threads and the process's communicators outlive any
// point where closing it would be safe).
Api load_nccl(const std::vector<std::string>& candidates);

// The process's NCCL, loaded from default_search_paths() on first use (thread-safe). A failed
// load throws the same error on every call.
const Api& api();

// What a failed NCCL call says: "unhandled cuda error (run with NCCL_DEBUG=INFO for details):
// <NCCL's last error on comm> (NCCL 23203)". `comm` may be null.
std::string error_text(Result result, Comm comm = nullptr);

// Throws Error(kInternal) "<call> on rank <rank> failed: <error_text>" unless `result` is success.
void check(Result result, const char* call, int rank, Comm comm = nullptr);

}  // namespace deepinfer::dist::nccl
