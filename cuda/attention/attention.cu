// The attention op of the CUDA backend: sliding + compressed attention with sinks
// (docs/model.md#attention) over the paged layout (docs/model.md#kv-and-state-layout). It
// matches the CPU reference op in cpp/src/backend/cpu_ops_attention.cpp on the same inputs.
// This file checks the kernels' limits, chooses a kernel and its config (attention_heuristics.h)
// and launches it:
//  - AttentionSpec::bf16_math and a supported shape: the tensor-core kernel
//    (sm80/attention_mma.cu: bf16 operands, f32 accumulation), with the plan of attention_plan.h
//    (heads per block, key splits; with DEEPINFER_ATTENTION_COMBINE=fused the splits merged by the
//    kernel's last block, opt-in: it measured slower than the separate combine on the H200);
//  - for V4's MQA shape (64 heads or a multiple, D = 512, bf16 or fp8 KV) on an sm_90 device, the
//    Hopper kernels of sm90/ instead (same numerics and split format; their own split count over
//    64-key tiles), by DEEPINFER_ATTENTION_KERNEL: auto (the default: mma.sync's 16-head blocks
//    for small batches (small_batch_mma_takes), wgmma_overlap_pair over fp8 records at 128 heads
//    or a multiple, wgmma_keysplit over bf16 rows for prefill-like calls of 16 or more rows per
//    sequence, wgmma_overlap_ilp otherwise; attention_plan.h has the measurements),
//    wgmma_keysplit (bf16 rows: the two consumer warpgroups each score half of every 128 keys,
//    sm90/attention_wgmma_keysplit.cu; other records run auto),
//    wgmma_prefetch_sw128 (the key loads a tile ahead, 128-byte swizzled tiles; fp8 only for V4's
//    record, other records run the plain kernel), wgmma (the plain kernel), wgmma_prefetch (no
//    swizzle), the _pdl values (the kernel a programmatic dependent launch of the encoding of f32
//    kv, and the combine one of it), wgmma_overlap (the warp-specialised variant, same records as
//    the prefetching one), wgmma_overlap_pdl (that kernel as a programmatic dependent launch of the
//    encoding, the combine one of it), wgmma_overlap_fused (the same launch, a token's splits one
//    cluster that merges them: no combine kernel), wgmma_overlap_pair (at 128 heads or a multiple:
//    a token's two 64-head blocks one cluster sharing the decoded key tiles, the ilp variant; over
//    fp8 records with bf16 q and bf16 output of one split persistent clusters where there are more
//    units than clusters fit at once; other head counts as wgmma_overlap_ilp),
//    wgmma_overlap_pair_blocks (the same pairs, a cluster per unit), wgmma_overlap_ilp
//    (wgmma_overlap with a branch-free decode, its softmax in the key-split kernel's arithmetic and
//    the output staged through shared memory: bf16-close), or mma_sync (the kernel above
//    everywhere);
//  - otherwise the f32 kernel (attention_f32.cu);
// and, when the keys are split (flash-decoding: few tokens then still spread over the SMs) and the
// kernel does not merge them itself, the combine kernel (attention_combine.cu), which serves both.
// The output is f32, except with AttentionSpec::bf16_output on the wgmma_overlap_ilp kernel, in
// pairs or not, and the key-split kernel (the defaults on sm_90): there its epilogue (one split) or
// the combine rounds it to bf16, half the bytes written and read by the inverse RoPE after it. q
// may come in bf16 (the engine's, from rms_norm_rope under bf16_output): the warp-specialised
// kernels copy it into their bf16 tile as it is (cp.async, half the bytes of f32 q, no registers);
// the launch widens it to f32 for the others. This call's keys kv come in f32, which a kernel
// before the attention kernel encodes in the ring's format (cache/encode_rows.cuh; the _pdl
// kernels are its programmatic dependent launches), or encoded already (the engine's, from
// rms_norm_rope_kv), which the kernels read as they are: one launch fewer.
//
// Every per-token quantity (sequence, position, context length, visible entries, which keys) is
// computed in the kernels from the device BatchLayout; the host only sizes grids and scratch from
// metadata it knows (shapes, layout.max_blocks_per_seq), so no op waits for the stream. The key
// list of token t at position p (attention_keys.cuh, docs/model.md#keys-a-query-sees) is: the
// sliding keys max(0, p-W+1, spec.swa_start[b]) .. p (this call's kv rows from ctx_len on, the ring
// before), then the compressed entries (dense: j < (p+1)/ratio; sparse: the K columns of topk[t],
// -1 masked).
//
// Content errors cannot be raised without a host sync. Where the CPU op throws, these kernels
// stay inside their buffers and do the following instead:
//  - entries past the block table's columns (j >= max_blocks_per_seq * epb) are not visible.
//  - an entry whose block is negative or maps past the cache: attention masks it.
//  - a sparse topk index >= the visible count: masked (the CPU throws "not visible").
//  - a sliding key in the ring whose slot is outside the ring: masked. A position that fell out
//    of the ring (the CPU's kInternal error) reads whatever its ring slot holds.
#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/attention/attention_args.h"
#include "cuda/attention/attention_heuristics.h"
#include "cuda/attention/attention_launch.h"
#include "cuda/attention/sm90/attention_wgmma_config.h"
#include "cuda/attention/sm90/attention_wgmma_keysplit.h"
#include "cuda/backend/cuda_backend.h"
#include "cuda/cache/encode_rows.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/layout.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/elementwise/widen_bf16.h"

namespace deepinfer::cuda {

bool CudaBackend::attention_rounds_query(int64_t head_dim, DType kv_dtype,
                                         const AttentionSpec& spec) const {
  if (!spec.bf16_math || !supports_kv_cache_dtype(kv_dtype) || head_dim <= 0) return false;
  const KvRowFormat kvf = kv_row_format(kv_dtype, head_dim, spec.rope_dim);
  // As attention_impl chooses: the tensor-core kernels (the Hopper ones take a subset of these
  // shapes) for one format of theirs where their shared memory fits; V4.1's records and other
  // head dims run the f32 kernel, which reads q as it is.
  const size_t smem = mma_smem_bytes(head_dim);
  return !is_v41_format(kvf.format) && smem > 0 && smem <= max_shared_memory_per_block();
}

Tensor CudaBackend::attention_impl(const Tensor& q, const Tensor& kv, const Tensor& swa_ring,
                                   const Tensor& entries, const Tensor& topk, const Tensor& sinks,
                                   const BatchLayout& layout, const AttentionSpec& spec) {
  const char* op = "attention";
  const bool compressed = spec.ratio > 0;
  const int64_t tokens = layout.num_tokens;
  const int64_t heads = q.size(1);
  const int64_t dim = q.size(2);
  Tensor out = empty({tokens, heads, dim}, DType::kF32);
  if (tokens == 0 || heads == 0 || dim == 0) return out;
  // The output's inverse RoPE (AttentionSpec::output_rope_inv_freq): in the split combine's store
  // where a call has one and the RoPE channels are whole quads, else a rope launch after. Against
  // the rope launch after every call: the V4-Flash B = 64 decode step 0.5% faster, B = 1 and 8
  // unchanged (H100, session 63).
  const Tensor& rope_freq = spec.output_rope_inv_freq;
  const int64_t rope_pairs = rope_freq.defined() ? rope_freq.size(0) : 0;
  const bool rope_quads = rope_freq.defined() && (dim - 2 * rope_pairs) % 4 == 0;
  auto combine_rope = [&](bool round_bf16) {
    AttentionOutputRope r;
    r.positions = layout.positions.data<int32_t>();
    r.inv_freq = rope_freq.data<float>();
    r.pairs = static_cast<int>(rope_pairs);
    r.round_bf16 = round_bf16;
    return r;
  };
  // The output as the call returns it: rotated here unless the combine did.
  auto finish = [&](const Tensor& result, bool rotated) {
    if (!rope_freq.defined() || rotated) return result;
    return rope_impl(result, layout.positions, rope_freq, /*inverse=*/true);
  };
  if (dim % 4 != 0 || dim > kAttnMaxDim) {
    throw Error(ErrorCode::kUnsupported, std::string(op) +
                                             ": the head dim must be a multiple of 4 up to " +
                                             std::to_string(kAttnMaxDim) + ", got " + q.describe());
  }
  check_vec4(op, "q", q);
  check_vec4(op, "kv", kv);
  check_vec4(op, "swa_ring", swa_ring);
  if (compressed) check_vec4(op, "entries", entries);
  check_vec4(op, "out", out);
  const KvRowFormat kvf = kv_row_format(swa_ring.dtype(), dim, spec.rope_dim);
  if (kvf.format == KvFormat::kFp8 &&
      (kvf.rope_dim == 0 || kvf.rope_dim % 8 != 0 || kvf.nope() % 8 != 0)) {
    // The fp8 decoders take whole groups of 8 channels (4 in the f32 kernel) of one kind (e4m3
    // or the bf16 RoPE channels) of the main record (rope_dim 0 would be the index-key record);
    // bf16 rows need only the head dim's multiple of 4 above.
    throw Error(ErrorCode::kUnsupported,
                std::string(op) + ": a " + dtype_name(swa_ring.dtype()) +
                    " KV cache needs RoPE channels and RoPE and non-RoPE channel counts that are "
                    "multiples of 8, got rope_dim " +
                    std::to_string(kvf.rope_dim) + " of head dim " + std::to_string(dim));
  }

  // With a bf16 or fp8 cache this call's keys go through the cache format first, as the CPU op
  // does, so that a key reads the same from kv now as from the ring in later steps; keys that
  // come in that format already (rms_norm_rope_kv's rows, the model's) are read as they are.
  Tensor kv_rows;
  const void* kv_bytes = kv.raw_data();
  if (kvf.format != KvFormat::kF32 && kv.dtype() == DType::kF32) {
    kv_rows = scratch(static_cast<size_t>(tokens * kvf.row_bytes));
    launch_encode_kv_rows(kv.data<float>(), static_cast<uint8_t*>(kv_rows.raw_data()), tokens, kvf,
                          pdl(), stream(), op);
    kv_bytes = kv_rows.raw_data();
  }
  AttentionArgs a = attention_args(q, kv_bytes, swa_ring, entries, topk, sinks, layout, spec, out);
  a.sms = static_cast<int>(num_sms());
  // bf16 q goes as it is to the warp-specialised Hopper kernels and mma.sync; the others read
  // f32 q, widened exactly first.
  Tensor q_wide;
  auto f32_query = [&]() {
    if (a.q != nullptr) return;
    q_wide = scratch(static_cast<size_t>(q.numel()) * sizeof(float));
    launch_widen_bf16(a.q_bf16, static_cast<float*>(q_wide.raw_data()), q.numel(), pdl(), stream(),
                      op);
    a.q = static_cast<const float*>(q_wide.raw_data());
    a.q_bf16 = nullptr;
  };
  const AttentionProblem problem{tokens, heads, dim, max_attention_keys(a)};
  const DeviceLayout dl = device_layout(layout);
  // Scratch of the split outputs, in the format both kernels write and the combine reads.
  Tensor partials;
  auto split_outputs = [&](int64_t splits) {
    if (splits == 1) return;
    const int64_t rows = splits * tokens * heads;
    partials = scratch(static_cast<size_t>(rows * (dim + 2)) * sizeof(float));
    a.part_acc = reinterpret_cast<float*>(partials.raw_data());
    a.part_md = a.part_acc + rows * dim;
  };
  // Merges the splits; true when it rotated the output (rope_quads, out in f32).
  auto combine = [&](int64_t splits, bool pdl, bool round_bf16) {
    if (splits == 1) return false;
    launch_attention_combine(stream(), a.part_acc, a.part_md, a.sinks, a.out, a.out_bf16, tokens,
                             heads, dim, splits, pdl, {},
                             rope_quads ? combine_rope(round_bf16) : AttentionOutputRope{});
    return rope_quads;
  };

  // The tensor-core kernel stages one format for every key, f32, bf16 or V4's fp8; V4.1's records
  // (and its FP8-keys / FP4-entries pair) go through the f32 kernel's decode_kv4.
  const bool mma_format = a.entf.format == a.kvf.format && !is_v41_format(a.kvf.format);
  // The Hopper kernel where it is chosen (DEEPINFER_ATTENTION_KERNEL other than mma_sync) and
  // takes the shape: 64 heads or a multiple of D = 512 over bf16 rows or fp8 records on an
  // sm_90 device; its splits always go through the separate combine.
  last_attention_wgmma_ = false;
  // The key-split kernel takes bf16 rows only; asked for over other records, auto runs. Auto
  // takes it for prefill-like calls and where the plan has one split (keysplit_auto_takes).
  const bool keysplit_asked = attention_kernel_ == AttentionKernelChoice::kWgmmaKeySplit;
  const bool keysplit_auto = attention_kernel_ == AttentionKernelChoice::kWgmmaOverlapAuto;
  const bool keysplit_rows = a.kvf.format == KvFormat::kBf16 &&
                             attention_wgmma_keysplit_smem_bytes() <= max_shared_memory_per_block();
  const AttentionKernelChoice kernel_choice =
      keysplit_asked ? AttentionKernelChoice::kWgmmaOverlapAuto : attention_kernel_;
  const WgmmaPrefetchChoice prefetch_asked = wgmma_prefetch_choice(kernel_choice);
  const WgmmaOverlapChoice overlap_choice = wgmma_overlap_choice(kernel_choice);
  const bool overlap_asked = overlap_choice.overlap;
  const bool overlap_pair_asked = overlap_choice.pair;
  const bool wgmma_asked =
      kernel_choice == AttentionKernelChoice::kWgmma || prefetch_asked.prefetch || overlap_asked;
  // Auto at small batches: mma.sync's 16-head blocks, over the shapes the Hopper kernels take
  // (small_batch_mma_takes). The key-split choice over records it does not take runs auto, so
  // it takes the route too.
  const bool auto_runs = attention_kernel_ == AttentionKernelChoice::kWgmmaOverlapAuto ||
                         (keysplit_asked && !keysplit_rows);
  const bool small_batch_route =
      auto_runs && wgmma_device_ && spec.bf16_math && mma_format &&
      (a.kvf.format == KvFormat::kBf16 || a.kvf.format == KvFormat::kFp8) &&
      wgmma_attention_shape(heads, dim, a.kvf.format == KvFormat::kFp8, a.kvf.row_bytes) &&
      small_batch_mma_takes(tokens, heads, dim);
  if (!small_batch_route && spec.bf16_math && mma_format && wgmma_asked && wgmma_device_ &&
      (a.kvf.format == KvFormat::kBf16 || a.kvf.format == KvFormat::kFp8) &&
      a.entf.row_bytes == a.kvf.row_bytes &&
      wgmma_attention_shape(heads, dim, a.kvf.format == KvFormat::kFp8, a.kvf.row_bytes) &&
      WgmmaAttnLayout::kBytes <= max_shared_memory_per_block()) {
    // The in-kernel merge takes a token's splits as one cluster: at most a portable cluster's.
    const int64_t max_splits =
        overlap_choice.cluster_merge ? kWgmmaClusterMergeMaxSplits : int64_t{kAttnMaxSplits};
    AttentionMmaPlan p = wgmma_attention_plan(tokens, heads, problem.max_keys, num_sms(),
                                              max_splits, attention_mma_choice_.splits);
    // The prefetching or the warp-specialised variant where asked for and it takes the record
    // (V4's, or bf16 rows).
    const bool variant_takes = wgmma_prefetch_takes(a.kvf.format == KvFormat::kFp8, a.kvf.dim,
                                                    a.kvf.rope_dim, a.kvf.row_bytes);
    p.prefetch = prefetch_asked.prefetch && variant_takes;
    p.overlap = overlap_asked && variant_takes;
    p.pdl = (p.prefetch && prefetch_asked.pdl) || (p.overlap && overlap_choice.pdl);
    // A programmatic dependent launch follows the encoding of this call's keys above. Keys that
    // came encoded leave another op's grid before it, whose writes (top-k, the keys) the kernel
    // must not read early: an ordinary launch then.
    if (!kv_rows.defined()) p.pdl = false;
    p.cluster_merge = p.overlap && overlap_choice.cluster_merge && p.splits > 1;
    p.swizzle = p.prefetch && prefetch_asked.swizzle;
    p.pair = p.overlap &&
             (overlap_pair_asked || (overlap_choice.pair_fp8 && a.kvf.format == KvFormat::kFp8)) &&
             wgmma_pair_takes(heads);
    p.ilp = p.overlap && overlap_choice.ilp && !p.pdl && !p.cluster_merge;
    p.persistent = p.pair && overlap_choice.persistent;
    if (keysplit_rows &&
        (keysplit_asked ||
         (keysplit_auto && keysplit_auto_takes(tokens, layout.num_seqs, p.splits)))) {
      // Its splits are whole 128-key steps: the plan's count (sized for 64-key tiles) capped by
      // the steps of the longest list.
      p.splits = std::min(p.splits, std::max<int64_t>(1, (problem.max_keys + 127) / 128));
      p.keysplit = true;
      p.overlap = p.prefetch = p.pdl = p.cluster_merge = p.swizzle = p.pair = p.persistent = false;
      p.ilp = false;
    }
    if (p.head_groups <= 65535) {
      const bool separate_combine = !p.cluster_merge && p.splits > 1;
      const bool bf16_out = spec.bf16_output && (p.ilp || p.keysplit);
      if (bf16_out && !(separate_combine && rope_quads)) {
        // The ilp variant's epilogue (one split) or the combine writes the output in bf16 (one
        // that rotates it writes f32, rounded to bf16 first).
        out = empty({tokens, heads, dim}, DType::kBF16);
        a.out = nullptr;
        a.out_bf16 = static_cast<__nv_bfloat16*>(out.raw_data());
      }
      if (!p.overlap && !p.keysplit) f32_query();
      last_attention_plan_ = p;
      last_attention_wgmma_ = true;
      split_outputs(p.splits);
      launch_attention_wgmma(a, dl, p, tokens, smem_limits(), stream(), attention_trace_);
      const bool rotated = separate_combine && combine(p.splits, p.pdl, bf16_out);
      return finish(out, rotated);
    }
  }
  if (spec.bf16_math && mma_format) {
    // mma.sync reads q in bf16 as it is. Auto's small batches take its 16-head blocks
    // (small_batch_mma_choice).
    const AttentionMmaConfig c = choose_attention_mma(
        problem, num_sms(), max_shared_memory_per_block(), kAttnMaxSplits, kAttentionCounterSlots,
        small_batch_route ? small_batch_mma_choice(tokens, heads, problem.max_keys, num_sms(),
                                                   attention_mma_choice_.splits)
                          : attention_mma_choice());
    if (c.supported) {
      last_attention_plan_ = c.plan;
      const bool separate_combine = c.plan.splits > 1 && !c.plan.fused;
      if (spec.bf16_output && separate_combine && !rope_quads) {
        // The separate combine writes the output in bf16 (one that rotates it writes f32, rounded
        // to bf16 first).
        out = empty({tokens, heads, dim}, DType::kBF16);
        a.out = nullptr;
        a.out_bf16 = static_cast<__nv_bfloat16*>(out.raw_data());
      }
      split_outputs(c.plan.splits);
      if (c.plan.fused) a.counters = attention_counters();
      a.mma_trace = attention_mma_trace_;
      launch_attention_mma(a, dl, c, tokens, pdl(), stream());
      // The separate combine starts while the splits run (their kernel lets it launch), which
      // took 0.3-0.4 us off B = 1, 2 and s_q = 2 on an H100 (session 34); an ordinary launch
      // before sm_90, where programmatic launches are not supported.
      if (separate_combine) {
        launch_attention_combine(
            stream(), a.part_acc, a.part_md, a.sinks, a.out, a.out_bf16, tokens, heads, dim,
            c.plan.splits, programmatic_launch_device_, attention_mma_trace_,
            rope_quads ? combine_rope(spec.bf16_output) : AttentionOutputRope{});
      }
      return finish(out, separate_combine && rope_quads);
    }
  }
  f32_query();

  const AttentionF32Config c = choose_attention_f32(problem, num_sms());
  if (c.smem > max_shared_memory_per_block() || c.head_groups > 65535) {
    throw Error(ErrorCode::kUnsupported, std::string(op) + ": " + std::to_string(heads) +
                                             " heads of " + std::to_string(dim) +
                                             " channels do not fit the kernel's blocks");
  }
  split_outputs(c.splits);
  launch_attention_f32(a, dl, c, tokens, stream());
  const bool rotated = combine(c.splits, /*pdl=*/false, /*round_bf16=*/false);
  return finish(out, rotated);
}

}  // namespace deepinfer::cuda
