// Throwaway link stubs for a FlashMLA peer build that compiles only the SM90 kernels we benchmark.
// csrc/api/*.h dispatch (at run time) to kernels we deliberately do not compile (SM100, V3.2/d576,
// dense decode). The API only sees their declarations, so each referenced instantiation gets a
// body here that throws (pybind11 turns std::runtime_error into a Python RuntimeError).
#include <ATen/Tensor.h>
#include <cutlass/half.h>

#include <stdexcept>
#include <string>

#include "params.h"
#include "sm100/decode/head64/kernel.h"
#include "sm100/prefill/dense/interface.h"
#include "sm100/prefill/sparse/fwd/head128/phase1.h"
#include "sm100/prefill/sparse/fwd/head64/phase1.h"
#include "sm100/prefill/sparse/fwd_for_small_topk/head128/phase1.h"
#include "sm90/decode/dense/splitkv_mla.h"
#include "sm90/decode/sparse_fp8/splitkv_mla.h"
#include "sm90/prefill/sparse/phase1.h"

namespace {
[[noreturn]] void not_built(const char* what) {
  throw std::runtime_error(std::string("[flashmla sm90-only peer build] not compiled: ") + what);
}
}  // namespace

namespace sm90::decode::sparse_fp8 {
template <>
void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32, 64>(const SparseAttnDecodeParams&) {
  not_built("sm90 sparse decode V32 h64");
}
template <>
void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32, 128>(const SparseAttnDecodeParams&) {
  not_built("sm90 sparse decode V32 h128");
}
}  // namespace sm90::decode::sparse_fp8

namespace sm90 {
template <>
void run_flash_splitkv_mla_kernel<cutlass::bfloat16_t>(DenseAttnDecodeParams&) {
  not_built("sm90 dense decode bf16");
}
template <>
void run_flash_splitkv_mla_kernel<cutlass::half_t>(DenseAttnDecodeParams&) {
  not_built("sm90 dense decode fp16");
}
}  // namespace sm90

namespace sm90::fwd {
template <>
void run_fwd_phase1_kernel<576, false>(const SparseAttnFwdParams&) {
  not_built("sm90 sparse prefill d_qk 576");
}
template <>
void run_fwd_phase1_kernel<576, true>(const SparseAttnFwdParams&) {
  not_built("sm90 sparse prefill d_qk 576 + topk_length");
}
}  // namespace sm90::fwd

namespace sm100::decode::head64 {
template <>
void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32>(const SparseAttnDecodeParams&) {
  not_built("sm100 decode head64 V32");
}
template <>
void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::MODEL1>(const SparseAttnDecodeParams&) {
  not_built("sm100 decode head64 MODEL1");
}
}  // namespace sm100::decode::head64

namespace sm100::fwd::head64 {
template <>
void run_fwd_phase1_kernel<512>(const SparseAttnFwdParams&) {
  not_built("sm100 sparse prefill head64 d512");
}
template <>
void run_fwd_phase1_kernel<576>(const SparseAttnFwdParams&) {
  not_built("sm100 sparse prefill head64 d576");
}
}  // namespace sm100::fwd::head64

namespace sm100::fwd::head128 {
template <>
void run_fwd_phase1_kernel<512>(const SparseAttnFwdParams&) {
  not_built("sm100 sparse prefill head128 d512");
}
template <>
void run_fwd_phase1_kernel<576>(const SparseAttnFwdParams&) {
  not_built("sm100 sparse prefill head128 d576");
}
}  // namespace sm100::fwd::head128

namespace sm100::fwd_for_small_topk::head128 {
template <>
void run_fwd_for_small_topk_phase1_kernel<SparseAttnFwdMode::Prefill, 512>(
    const SparseAttnFwdParams&) {
  not_built("sm100 small-topk prefill head128");
}
template <>
void run_fwd_for_small_topk_phase1_kernel<SparseAttnFwdMode::DecodeWithSplitKV, 512>(
    const SparseAttnDecodeParams&) {
  not_built("sm100 small-topk decode head128");
}
}  // namespace sm100::fwd_for_small_topk::head128

void FMHACutlassSM100FwdRun(at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                            at::Tensor, at::Tensor, int, float, int, int, bool) {
  not_built("sm100 dense prefill fwd");
}

void FMHACutlassSM100BwdRun(at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                            at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                            int, float, int, int, bool) {
  not_built("sm100 dense prefill bwd");
}
