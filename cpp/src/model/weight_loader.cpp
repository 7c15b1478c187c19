#include "model/weight_loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "deepinfer/error.h"

namespace deepinfer {

Tensor WeightLoader::load(const std::string& name, const Shape& shape) {
  if (ckpt_ == nullptr) return random(name, shape, DType::kF32);
  return backend_.upload_weight(host(name, shape, /*integer=*/false), DType::kF32);
}

// A matrix weight (GEMM operand or embedding table) in the backend's dtype for it.
Tensor WeightLoader::load_matrix(const std::string& name, const Shape& shape) {
  if (ckpt_ == nullptr) return random(name, shape, backend_.weight_dtype(random_stored_));
  Tensor h = host(name, shape, /*integer=*/false);
  return backend_.upload_weight(h, backend_.weight_dtype(h.dtype()));
}

// A GEMM weight DeepSeek may quantize: `name` ("<base>.weight") is dense (f32/bf16/f16), or
// FP8 e4m3 / packed MXFP4 (a routed expert of an expert_dtype "fp4" checkpoint) with its scale
// sibling "<base>.scale" (docs/model.md#quantized-checkpoints), checked against each other and
// against config.json before anything reaches the backend.
MatrixWeight WeightLoader::load_linear(const std::string& name, const Shape& shape,
                                       bool routed_expert) {
  if (ckpt_ == nullptr) {
    return config_.quantization.fp8
               ? random_quantized(name, shape, routed_expert)
               : MatrixWeight(random(name, shape, backend_.weight_dtype(random_stored_)));
  }
  require_present(name, shape);
  const SafetensorsEntry& e = ckpt_->entry(name);
  const std::string& file = ckpt_->file_of(name).path();
  const std::string base = name.substr(0, name.size() - std::string_view(".weight").size());
  const std::string scale_name = base + ".scale";
  const bool packed = e.dtype_name == "I8" || e.dtype_name == "U8";
  const bool fp8 = e.dtype_name == "F8_E4M3";
  if (!packed && !fp8) {
    if (ckpt_->contains(scale_name)) {
      throw Error(ErrorCode::kCorruptFile,
                  file + ": tensor '" + name + "' has dtype " + e.dtype_name +
                      " but a scale tensor '" + scale_name +
                      "' (scales belong to F8_E4M3 or packed fp4 weights)");
    }
    Tensor h = host(name, shape, /*integer=*/false);
    return backend_.upload_matrix_weight(MatrixWeight(h));
  }
  const QuantConfig& q = config_.quantization;
  const std::string what = "tensor '" + name + "' (" + e.dtype_name + shape_str(e.shape) + ")";
  if (!q.fp8) {
    throw Error(ErrorCode::kInvalidConfig,
                file + ": " + what +
                    " is quantized but config.json has no quantization_config with "
                    "quant_method \"fp8\"");
  }
  const bool want_fp4 = routed_expert && q.experts_fp4;
  if (packed != want_fp4) {
    throw Error(
        ErrorCode::kInvalidConfig,
        file + ": " + what + " does not match config.json: expected " +
            (want_fp4 ? "I8 packed e2m1 pairs (expert_dtype \"fp4\")"
                      : "F8_E4M3 (quant_method \"fp8\"" +
                            std::string(routed_expert ? ", no expert_dtype \"fp4\")" : ")")));
  }
  const int64_t n = shape[0];
  const int64_t k = shape[1];
  MatrixWeight w;
  if (want_fp4) {
    w.format = WeightFormat::kMxfp4;
    w.block_rows = 1;
    w.block_cols = 32;
    if (k % 32 != 0) {
      throw Error(ErrorCode::kInvalidConfig,
                  file + ": " + what + ": config.json implies " + std::to_string(k) +
                      " input columns, not a multiple of the mxfp4 block 32");
    }
  } else {
    w.format = WeightFormat::kFp8Block;
    w.block_rows = q.weight_block_rows;
    w.block_cols = q.weight_block_cols;
  }
  const Shape stored = want_fp4 ? Shape{n, k / 2} : shape;
  if (e.shape != stored) {
    throw Error(
        ErrorCode::kInvalidConfig,
        file + ": " + what + " has shape " + shape_str(e.shape) + " but config.json implies " +
            shape_str(stored) +
            (want_fp4 ? " (two e2m1 values per byte for the logical " + shape_str(shape) + ")"
                      : std::string()));
  }
  if (!ckpt_->contains(scale_name)) {
    throw Error(ErrorCode::kNotFound,
                file + ": " + what + " has no scale tensor '" + scale_name + "' (expected " +
                    shape_str(weight_scale_shape(n, k, w.block_rows, w.block_cols)) + ")");
  }
  Tensor raw = ckpt_->tensor(name);
  w.values = Tensor(raw.storage(), want_fp4 ? DType::kE2M1x2 : DType::kF8E4M3, raw.shape(),
                    raw.strides(), raw.offset_bytes());
  w.scales = scales(scale_name, name, n, k, w, want_fp4 || q.ue8m0_scales);
  if (options_.quantize_activations) w.act_group = want_fp4 ? 32 : w.block_cols;
  return backend_.upload_matrix_weight(w);
}

// The scale grid of `weight_name` as the backend takes it: f32 for FP8, e8m0 for MXFP4. Checks
// dtype, shape (one per block of the weight) and values (finite, positive, and a power of two
// where the format says so).
Tensor WeightLoader::scales(const std::string& name, const std::string& weight_name, int64_t n,
                            int64_t k, const MatrixWeight& w, bool powers_of_two) {
  const SafetensorsEntry& e = ckpt_->entry(name);
  const std::string& file = ckpt_->file_of(name).path();
  const Shape grid = weight_scale_shape(n, k, w.block_rows, w.block_cols);
  if (!e.dtype_supported ||
      (e.dtype != DType::kE8M0 && e.dtype != DType::kF32 && e.dtype != DType::kBF16)) {
    throw Error(ErrorCode::kUnsupported, file + ": scale tensor '" + name + "' has dtype " +
                                             e.dtype_name + ", expected F8_E8M0, F32 or BF16");
  }
  if (e.shape != grid) {
    throw Error(ErrorCode::kInvalidConfig,
                file + ": scale tensor '" + name + "' has shape " + shape_str(e.shape) + " but '" +
                    weight_name + "' (logical " + shape_str({n, k}) + ", blocks " +
                    std::to_string(w.block_rows) + "x" + std::to_string(w.block_cols) + ") needs " +
                    shape_str(grid));
  }
  Tensor raw = ckpt_->tensor(name);
  Tensor values = raw.to(DType::kF32);
  const float* v = values.data<float>();
  Tensor bits = Tensor::zeros(grid, DType::kE8M0);
  auto* out_bits = bits.data<uint8_t>();
  for (int64_t i = 0; i < values.numel(); ++i) {
    const bool finite_positive = std::isfinite(v[i]) && v[i] > 0.0f;
    const bool ok = finite_positive && (!powers_of_two || f32_to_e8m0_exact(v[i], &out_bits[i]));
    if (!ok) {
      const int64_t cols = grid[1];
      throw Error(ErrorCode::kCorruptFile,
                  file + ": scale tensor '" + name + "' holds " + std::to_string(v[i]) + " at [" +
                      std::to_string(i / cols) + ", " + std::to_string(i % cols) + "]" +
                      (raw.dtype() == DType::kE8M0 && !finite_positive
                           ? " (e8m0 0xff is NaN)"
                           : std::string(", expected a finite positive ") +
                                 (powers_of_two ? "power of two" : "value")));
    }
  }
  return w.format == WeightFormat::kMxfp4 ? bits : values;
}

void WeightLoader::report_progress(int done) const {
  if (options_.progress) options_.progress(done, config_.num_hidden_layers + 1);
}

void WeightLoader::require_present(const std::string& name, const Shape& shape) const {
  if (!ckpt_->contains(name)) {
    throw Error(ErrorCode::kNotFound, ckpt_->dir() + ": checkpoint has no tensor '" + name +
                                          "' (expected shape " + shape_str(shape) +
                                          ") required by config.json");
  }
}

// Random weights in the format config.json's quantization_config gives (for benchmarks of the
// real formats without a checkpoint): every weight's bytes are a slice of one random pool per
// format, so making a V4-Flash-sized model costs the upload, not the random draws. Values are
// e4m3 codes of N(0, 1) draws (MXFP4: uniform nibbles) with a power-of-two scale near
// 1 / sqrt(K), so activations keep their size through the layers.
MatrixWeight WeightLoader::random_quantized(const std::string& name, const Shape& shape,
                                            bool routed_expert) {
  const QuantConfig& q = config_.quantization;
  const bool fp4 = routed_expert && q.experts_fp4;
  const int64_t n = shape[0];
  const int64_t k = shape[1];
  MatrixWeight w;
  w.format = fp4 ? WeightFormat::kMxfp4 : WeightFormat::kFp8Block;
  w.block_rows = fp4 ? 1 : q.weight_block_rows;
  w.block_cols = fp4 ? 32 : q.weight_block_cols;
  const int64_t bytes = fp4 ? n * k / 2 : n * k;
  std::vector<uint8_t>& pool = fp4 ? fp4_pool_ : fp8_pool_;
  if (pool.empty()) fill_pool(pool, fp4);
  const int64_t pool_size = static_cast<int64_t>(pool.size());
  Tensor values =
      Tensor::zeros(fp4 ? Shape{n, k / 2} : Shape{n, k}, fp4 ? DType::kE2M1x2 : DType::kF8E4M3);
  uint64_t h = seed_;
  for (char c : name) h = h * 1099511628211ULL + static_cast<unsigned char>(c);
  auto* dst = values.data<uint8_t>();
  for (int64_t done = 0; done < bytes;) {
    h = h * 6364136223846793005ULL + 1442695040888963407ULL;
    const int64_t start = static_cast<int64_t>((h >> 20) % static_cast<uint64_t>(pool_size / 2));
    const int64_t len = std::min(bytes - done, pool_size - start);
    std::memcpy(dst + done, pool.data() + start, static_cast<size_t>(len));
    done += len;
  }
  // e4m3 N(0,1) draws have |x| ~ 1; e2m1 uniform codes ~ 3: scale to about 1 / sqrt(K).
  const float target = 1.0f / std::sqrt(static_cast<float>(k)) / (fp4 ? 3.0f : 1.0f);
  const float scale = std::ldexp(1.0f, static_cast<int>(std::lround(std::log2(target))));
  const Shape grid = weight_scale_shape(n, k, w.block_rows, w.block_cols);
  Tensor scales = Tensor::zeros(grid, fp4 ? DType::kE8M0 : DType::kF32);
  for (int64_t i = 0; i < scales.numel(); ++i) {
    if (fp4) {
      f32_to_e8m0_exact(scale, &scales.data<uint8_t>()[i]);
    } else {
      scales.data<float>()[i] = scale;
    }
  }
  w.values = values;
  w.scales = scales;
  if (options_.quantize_activations) w.act_group = fp4 ? 32 : w.block_cols;
  return backend_.upload_matrix_weight(w);
}

void WeightLoader::fill_pool(std::vector<uint8_t>& pool, bool fp4) const {
  constexpr size_t kPoolBytes = size_t{16} << 20;
  pool.resize(kPoolBytes);
  uint64_t h = seed_ ^ (fp4 ? 0x9e3779b97f4a7c15ULL : 0xbf58476d1ce4e5b9ULL);
  auto next = [&h] {
    h ^= h << 13;
    h ^= h >> 7;
    h ^= h << 17;
    return h;
  };
  if (fp4) {
    for (uint8_t& b : pool) b = static_cast<uint8_t>(next());
    return;
  }
  // 256 e4m3 codes of N(0, 1) draws (Box-Muller), indexed by random bytes.
  uint8_t codes[256];
  for (int i = 0; i < 256; i += 2) {
    const double u1 = (static_cast<double>(next() >> 11) + 1.0) / 9007199254740993.0;
    const double u2 = static_cast<double>(next() >> 11) / 9007199254740992.0;
    const double r = std::sqrt(-2.0 * std::log(u1));
    codes[i] = f32_to_f8e4m3(static_cast<float>(r * std::cos(6.283185307179586 * u2)));
    codes[i + 1] = f32_to_f8e4m3(static_cast<float>(r * std::sin(6.283185307179586 * u2)));
  }
  for (uint8_t& b : pool) b = codes[next() & 0xffu];
}

// Random init by parameter kind: norms near 1, mHC scales near 1, biases and position terms
// small, matrices N(0, 1/fan_in) so every sub-layer moves the residual by O(1).
Tensor WeightLoader::random(const std::string& name, const Shape& shape, DType dtype) {
  Tensor t = backend_.empty(shape, dtype);
  auto ends_with = [&](const char* suffix) {
    const std::string s(suffix);
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  float mean = 0.0f;
  float std = 1.0f / std::sqrt(static_cast<float>(shape.back()));
  if (name == "embed.weight") {
    std = 1.0f;
  } else if (ends_with("norm.weight")) {
    mean = 1.0f;
    std = 0.1f;
  } else if (ends_with("scale")) {
    mean = 1.0f;
    std = 0.25f;
  } else if (ends_with("attn_sink") || ends_with("ape") || ends_with("base")) {
    std = 0.5f;
  } else if (ends_with("bias")) {
    std = 0.1f;
  }
  uint64_t h = seed_;
  for (char c : name) h = h * 1099511628211ULL + static_cast<unsigned char>(c);
  backend_.fill_random_normal(t, h, mean, std);
  return t;
}

// Reads the host view and checks name, dtype family and shape.
Tensor WeightLoader::host(const std::string& name, const Shape& shape, bool integer) {
  require_present(name, shape);
  const SafetensorsEntry& e = ckpt_->entry(name);
  const std::string& file = ckpt_->file_of(name).path();
  const std::string base =
      name.ends_with(".weight") ? name.substr(0, name.size() - 7) + ".scale" : name + ".scale";
  if (ckpt_->contains(base) || e.dtype_name == "F8_E4M3" || e.dtype_name == "I8" ||
      e.dtype_name == "U8") {
    throw Error(ErrorCode::kUnsupported,
                file + ": tensor '" + name + "' is quantized (" + e.dtype_name +
                    shape_str(e.shape) +
                    "); DeepSeek ships it in bf16 and the loader reads it only as F32, BF16 or "
                    "F16");
  }
  bool ok_dtype = e.dtype_supported && (integer ? (e.dtype == DType::kI64 || e.dtype == DType::kI32)
                                                : is_floating(e.dtype));
  if (!ok_dtype) {
    throw Error(ErrorCode::kUnsupported, file + ": tensor '" + name + "' has dtype " +
                                             e.dtype_name + ", expected " +
                                             (integer ? "I64 or I32" : "F32, BF16 or F16"));
  }
  if (e.shape != shape) {
    throw Error(ErrorCode::kInvalidConfig, file + ": tensor '" + name + "' has shape " +
                                               shape_str(e.shape) + " but config.json implies " +
                                               shape_str(shape));
  }
  return ckpt_->tensor(name);
}

// Random weights use the stacked expert layout, except in a quantized format (one weight per
// expert, as DeepSeek ships them).
bool WeightLoader::contains(const std::string& name) const {
  if (ckpt_ != nullptr) return ckpt_->contains(name);
  return !config_.quantization.fp8 &&
         (name.ends_with("gate_up_proj") || name.ends_with("down_proj"));
}

const std::string& WeightLoader::file_of(const std::string& name) const {
  return ckpt_->file_of(name).path();
}

HcWeights WeightLoader::hc(const std::string& prefix, int64_t rows) {
  const int64_t nh = static_cast<int64_t>(config_.hc_mult) * config_.hidden_size;
  bool head = rows == config_.hc_mult;
  return HcWeights{load(prefix + "fn", {rows, nh}), load(prefix + "base", {rows}),
                   load(prefix + "scale", {head ? 1 : 3})};
}

// kv and gate projections stacked into one [2C, H] f32 matrix.
CompressorWeights WeightLoader::compressor(const std::string& prefix, int64_t d, int64_t ratio,
                                           bool overlap) {
  const int64_t c = overlap ? 2 * d : d;
  const int64_t h = config_.hidden_size;
  if (ckpt_ == nullptr) {
    return CompressorWeights{load_matrix(prefix + "wkv_gate.weight", {2 * c, h}),
                             load(prefix + "ape", {ratio, c}), load(prefix + "norm.weight", {d})};
  }
  Tensor kv_stored = host(prefix + "wkv.weight", {c, h}, false);
  const DType stored = kv_stored.dtype();
  Tensor kv = kv_stored.to(stored);
  Tensor gate = host(prefix + "wgate.weight", {c, h}, false).to(stored);
  Tensor stacked = Tensor::zeros({2 * c, h}, stored);
  std::memcpy(stacked.raw_data(), kv.raw_data(), kv.nbytes());
  std::memcpy(static_cast<char*>(stacked.raw_data()) + kv.nbytes(), gate.raw_data(), gate.nbytes());
  return CompressorWeights{backend_.upload_weight(stacked, backend_.weight_dtype(stored)),
                           load(prefix + "ape", {ratio, c}), load(prefix + "norm.weight", {d})};
}

Tensor WeightLoader::tid2eid(const std::string& name) {
  const int64_t k = config_.num_experts_per_tok;
  if (ckpt_ == nullptr) return random_tid2eid(name);
  Tensor t = host(name, {config_.vocab_size, k}, true).to(DType::kI64);
  const int64_t* v = t.data<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (v[i] < 0 || v[i] >= config_.n_routed_experts) {
      throw Error(ErrorCode::kCorruptFile,
                  file_of(name) + ": tensor '" + name + "' maps token " + std::to_string(i / k) +
                      " to expert " + std::to_string(v[i]) + ", outside [0, n_routed_experts = " +
                      std::to_string(config_.n_routed_experts) + ")");
    }
  }
  return backend_.upload(t, DType::kI32);
}

// Each token maps to k distinct experts.
Tensor WeightLoader::random_tid2eid(const std::string& name) {
  const int64_t k = config_.num_experts_per_tok;
  const int64_t e = config_.n_routed_experts;
  Tensor t = Tensor::zeros({config_.vocab_size, k}, DType::kI32);
  int32_t* out = t.data<int32_t>();
  uint64_t h = seed_ ^ std::hash<std::string>{}(name);
  for (int64_t row = 0; row < config_.vocab_size; ++row) {
    for (int64_t j = 0; j < k; ++j) {
      int32_t pick = 0;
      bool fresh = false;
      while (!fresh) {
        h = h * 6364136223846793005ULL + 1442695040888963407ULL;
        pick = static_cast<int32_t>((h >> 33) % static_cast<uint64_t>(e));
        fresh = std::find(out + row * k, out + row * k + j, pick) == out + row * k + j;
      }
      out[row * k + j] = pick;
    }
  }
  return backend_.upload(t, DType::kI32);
}

ExpertWeights WeightLoader::experts(const std::string& prefix) {
  const int64_t e_count = config_.n_routed_experts;
  const int64_t i_size = config_.moe_intermediate_size;
  const int64_t h = config_.hidden_size;
  // The experts this rank holds, in slot order (all of them without expert parallelism).
  std::vector<int64_t> held;
  if (options_.expert_slots.empty()) {
    for (int64_t e = 0; e < e_count; ++e) held.push_back(e);
  }
  for (int32_t e : options_.expert_slots) {
    if (e < 0 || e >= e_count) {
      throw Error(ErrorCode::kInvalidArgument,
                  "expert placement names expert " + std::to_string(e) +
                      ", outside [0, n_routed_experts = " + std::to_string(e_count) + ")");
    }
    held.push_back(e);
  }
  ExpertWeights ex;
  if (contains(prefix + "gate_up_proj")) {
    if (ckpt_ != nullptr && config_.quantization.fp8) {
      throw Error(ErrorCode::kUnsupported,
                  file_of(prefix + "gate_up_proj") + ": tensor '" + prefix +
                      "gate_up_proj' stacks the experts; a quantized checkpoint must store them "
                      "one per expert (" +
                      prefix +
                      "E.w1.weight with its scale), as DeepSeek and "
                      "transformers' save_pretrained write them");
    }
    // transformers' in-memory layout: gate_up_proj [E, 2I, H] (gate rows first), down [E, H, I].
    const Shape gate_up_shape{e_count, 2 * i_size, h};
    const Shape down_shape{e_count, h, i_size};
    if (ckpt_ != nullptr && !options_.expert_slots.empty()) {
      // Expert parallelism: upload only the held experts' slices of the (mapped) host tensors,
      // so a rank reads the bytes of its own experts only.
      const Tensor gate_up = host(prefix + "gate_up_proj", gate_up_shape, /*integer=*/false);
      const Tensor down = host(prefix + "down_proj", down_shape, /*integer=*/false);
      const DType dt = backend_.weight_dtype(gate_up.dtype());
      for (int64_t e : held) {
        const Tensor gu = gate_up.select(0, e);
        ex.w1.push_back(backend_.upload_weight(gu.narrow(0, 0, i_size), dt));
        ex.w3.push_back(backend_.upload_weight(gu.narrow(0, i_size, i_size), dt));
        ex.w2.push_back(
            backend_.upload_weight(down.select(0, e), backend_.weight_dtype(down.dtype())));
      }
      return ex;
    }
    Tensor gate_up = load_matrix(prefix + "gate_up_proj", gate_up_shape);
    Tensor down = load_matrix(prefix + "down_proj", down_shape);
    // own_expert_copies: the weight shuffle keeps its gained experts in their own tensors, so
    // the whole stacked random tensor is not kept alive by one slice of it.
    auto keep = [&](const Tensor& view) {
      if (!own_expert_copies_) return view;
      Tensor copy = backend_.empty(view.shape(), view.dtype());
      backend_.copy_into(copy, view);
      return copy;
    };
    for (int64_t e : held) {
      Tensor gu = gate_up.select(0, e);
      ex.w1.push_back(keep(gu.narrow(0, 0, i_size)));
      ex.w3.push_back(keep(gu.narrow(0, i_size, i_size)));
      ex.w2.push_back(keep(down.select(0, e)));
    }
    return ex;
  }
  for (int64_t e : held) {
    std::string p = prefix + std::to_string(e) + ".";
    ex.w1.push_back(load_linear(p + "w1.weight", {i_size, h}, /*routed_expert=*/true));
    ex.w3.push_back(load_linear(p + "w3.weight", {i_size, h}, /*routed_expert=*/true));
    ex.w2.push_back(load_linear(p + "w2.weight", {h, i_size}, /*routed_expert=*/true));
  }
  return ex;
}

Tensor WeightLoader::inv_freq(const RopeConfig& rope) {
  std::vector<float> v = config_.rope_inv_freq(rope);
  return backend_.upload(Tensor::from_vector(v, {static_cast<int64_t>(v.size())}), DType::kF32);
}

}  // namespace deepinfer
