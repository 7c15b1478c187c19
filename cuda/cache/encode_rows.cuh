// f32 rows encoded into a KV cache format as whole rows, for the ops that need them encoded but
// not stored in a cache: attention's this-call keys when they come in f32, and rms_norm_rope_kv
// where its fused kernel does not take the format.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cache/kv_record.cuh"

namespace deepinfer::cuda {

// rows (tokens x f.row_bytes bytes) = kv [tokens, f.dim] f32, each row encoded as encode_kv_row
// encodes it (kv_record.cuh); one block per row. `pdl`: launched as a programmatic dependent (it
// waits for the previous kernel at its start). Either way the kernel lets a programmatic dependent
// launch after it start early (the attention kernels' _pdl variants); an ordinary launch ignores
// that. `op` names the calling op in a launch error.
void launch_encode_kv_rows(const float* kv, uint8_t* rows, int64_t tokens, const KvRowFormat& f,
                           bool pdl, cudaStream_t stream, const char* op);

}  // namespace deepinfer::cuda
