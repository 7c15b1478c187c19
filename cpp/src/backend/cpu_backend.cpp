#include "backend/cpu_backend.h"

#include <cstring>
#include <utility>

#include "deepinfer/error.h"
#include "sample/counter_rng.h"

namespace deepinfer {

namespace {

// A fresh contiguous host tensor holding `host` converted to `dtype` (a conversion the front
// accepted). Runs on the calling thread: the caller owns `host` and its contents are valid now.
Tensor convert_copy(const char* op, const Tensor& host, DType dtype) {
  const Tensor src = host.contiguous();
  Tensor out = Tensor::zeros(host.shape(), dtype);
  try {
    convert_elements(src.raw_data(), src.dtype(), out.raw_data(), dtype,
                     static_cast<size_t>(src.numel()));
  } catch (const Error& e) {
    throw Error(e.code(), std::string(op) + ": converting " + host.describe() + " to " +
                              dtype_name(dtype) + ": " + e.what());
  }
  return out;
}

}  // namespace

CpuBackend::CpuBackend(int num_threads) : pool_(num_threads) {}

std::string CpuBackend::name() const {
  return "cpu (" + std::to_string(pool_.num_threads()) + " threads)";
}

void CpuBackend::enqueue(std::function<void(ThreadPool&)> task) {
  stream_.enqueue([this, t = std::move(task)] { t(pool_); });
}

Tensor CpuBackend::empty(const Shape& shape, DType dtype) {
  return Tensor::zeros(shape, dtype);
}

Tensor CpuBackend::zeros(const Shape& shape, DType dtype) {
  return Tensor::zeros(shape, dtype);
}

Tensor CpuBackend::upload_impl(const Tensor& host, DType dtype) {
  return convert_copy("upload", host, dtype);
}

Tensor CpuBackend::upload_weight_impl(const Tensor& host, DType dtype) {
  // Host memory is device memory here: a weight already in the right form is used in place, so
  // an mmap-ed checkpoint is not copied.
  if (host.dtype() == dtype && host.is_contiguous()) return host;
  return convert_copy("upload_weight", host, dtype);
}

Tensor CpuBackend::upload_weight_mapped_impl(const Tensor& host) {
  return upload_weight_impl(host, host.dtype());
}

MatrixWeight CpuBackend::upload_matrix_weight_impl(const MatrixWeight& host) {
  // The reference computes in f32: a quantized weight becomes its exact f32 values once, here.
  // act_group stays, so the GEMM still sees the activations the weight's format implies.
  MatrixWeight out;
  out.values = host.quantized() ? dequantize_weight(host, DType::kF32)
                                : upload_weight_impl(host.values, DType::kF32);
  out.act_group = host.act_group;
  return out;
}

Tensor CpuBackend::to_host_impl(const Tensor& device) {
  stream_.synchronize();
  if (!device.is_contiguous()) return device.contiguous();
  // Always a copy: the caller may keep it while later ops overwrite the device tensor.
  Tensor out = Tensor::zeros(device.shape(), device.dtype());
  if (out.nbytes() > 0) std::memcpy(out.raw_data(), device.raw_data(), out.nbytes());
  return out;
}

void CpuBackend::copy_to_host_impl(const Tensor& device, const Tensor& host) {
  enqueue([device, host](ThreadPool&) {
    if (host.nbytes() > 0) std::memcpy(host.raw_data(), device.raw_data(), host.nbytes());
  });
}

void CpuBackend::upload_into_impl(const Tensor& dst, const Tensor& host) {
  // Converted now: the caller may reuse `host` once this returns; the store is stream-ordered.
  Tensor staged = convert_copy("upload_into", host, dst.dtype());
  enqueue([dst, staged](ThreadPool&) {
    if (dst.nbytes() > 0) std::memcpy(dst.raw_data(), staged.raw_data(), dst.nbytes());
  });
}

void CpuBackend::copy_into_impl(const Tensor& dst, const Tensor& src) {
  enqueue([dst, src](ThreadPool&) {
    if (dst.nbytes() > 0) std::memmove(dst.raw_data(), src.raw_data(), dst.nbytes());
  });
}

void CpuBackend::fill_random_normal_impl(const Tensor& t, uint64_t seed, float mean, float std) {
  enqueue([t, seed, mean, std](ThreadPool& pool) {
    const int64_t n = t.numel();
    pool.parallel_for(
        n,
        [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) {
            const float v = mean + std * sample::normal(seed, static_cast<uint64_t>(i));
            if (t.dtype() == DType::kF32) {
              t.data<float>()[i] = v;
            } else {
              t.data<uint16_t>()[i] = f32_to_bf16(v);
            }
          }
        },
        4096);
  });
}

std::unique_ptr<Event> CpuBackend::record_event() {
  return stream_.record_event();
}

void CpuBackend::synchronize_impl() {
  stream_.synchronize();
}

std::unique_ptr<Backend> make_cpu_backend(int num_threads) {
  return std::make_unique<CpuBackend>(num_threads);
}

}  // namespace deepinfer
