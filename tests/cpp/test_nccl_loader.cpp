// The NCCL loader's errors, which CI (no GPU, no NCCL) can check: a library that does not load
// names every path tried and how to get NCCL; a library without NCCL's functions names them. The
// collectives themselves run on the GPU machine (tests/gpu/cpp/test_nccl_communicator.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "deepinfer/build_info.h"
#include "deepinfer/error.h"
#include "dist/nccl_group.h"
#include "dist/nccl_loader.h"
#include "error_message.h"

namespace deepinfer {
namespace {

using testing::error_message;

TEST(NcclLoader, MissingLibraryNamesEveryPathAndHowToInstall) {
  const std::vector<std::string> paths = {"/nonexistent/nvidia/nccl/lib/libnccl.so.2",
                                          "/also/missing/libnccl.so.2"};
  const std::string message =
      error_message([&] { dist::nccl::load_nccl(paths); }, ErrorCode::kUnsupported);
  for (const auto& p : paths) EXPECT_NE(message.find(p), std::string::npos) << message;
  EXPECT_NE(message.find("pip install nvidia-nccl-cu13"), std::string::npos) << message;
  EXPECT_NE(message.find("DEEPINFER_NCCL_LIBRARY"), std::string::npos) << message;
}

TEST(NcclLoader, NoCandidatesSaysSo) {
  const std::string message =
      error_message([] { dist::nccl::load_nccl({}); }, ErrorCode::kUnsupported);
  EXPECT_NE(message.find("no paths"), std::string::npos) << message;
}

// The C library loads but has none of NCCL's functions: each missing one is named.
TEST(NcclLoader, LibraryWithoutNcclNamesTheMissingFunctions) {
  const std::string message =
      error_message([] { dist::nccl::load_nccl({"libc.so.6"}); }, ErrorCode::kUnsupported);
  EXPECT_NE(message.find("libc.so.6 loads but lacks"), std::string::npos) << message;
  for (const char* fn :
       {"ncclGetUniqueId", "ncclCommSplit", "ncclAllReduce", "ncclSend", "ncclGroupEnd"}) {
    EXPECT_NE(message.find(fn), std::string::npos) << fn << ": " << message;
  }
}

TEST(NcclLoader, DefaultSearchEndsWithTheLoaderPath) {
  const std::vector<std::string> paths = dist::nccl::default_search_paths();
  ASSERT_FALSE(paths.empty());
  EXPECT_EQ(paths.back(), "libnccl.so.2");
  for (size_t i = 0; i + 1 < paths.size(); ++i) {
    EXPECT_NE(paths[i].find("libnccl.so.2"), std::string::npos) << paths[i];
  }
}

// The factories refuse what they cannot run, naming why: a build without the CUDA backend has
// no NCCL communicator; a CUDA build refuses a CPU backend (checked before NCCL or a device is
// touched, so this runs in CI too).
TEST(NcclLoader, FactoriesRefuseWhatTheyCannotRun) {
  const auto backends = build_info().backends;
  const bool cuda = std::find(backends.begin(), backends.end(), "cuda") != backends.end();
  auto cpu = make_cpu_backend(1);
  if (cuda) {
    std::string m = error_message([&] { dist::make_nccl_group({cpu.get()}); });
    EXPECT_NE(m.find("make_nccl_group: rank 0's backend is"), std::string::npos) << m;
    EXPECT_NE(m.find("needs a CUDA backend"), std::string::npos) << m;
    m = error_message([&] { dist::make_nccl_rank(0, 1, {}, *cpu); });
    EXPECT_NE(m.find("needs a CUDA backend"), std::string::npos) << m;
    m = error_message([&] { dist::make_nccl_rank(2, 2, {}, *cpu); });
    EXPECT_NE(m.find("rank 2 is not a rank of a group of 2"), std::string::npos) << m;
    return;
  }
  EXPECT_NE(error_message([] { dist::nccl_unique_id(); }, ErrorCode::kUnsupported)
                .find("no CUDA backend"),
            std::string::npos);
  EXPECT_NE(error_message([&] { dist::make_nccl_group({cpu.get()}); }, ErrorCode::kUnsupported)
                .find("make_nccl_group"),
            std::string::npos);
  EXPECT_NE(error_message([&] { dist::make_nccl_rank(0, 1, {}, *cpu); }, ErrorCode::kUnsupported)
                .find("make_nccl_rank"),
            std::string::npos);
}

}  // namespace
}  // namespace deepinfer
