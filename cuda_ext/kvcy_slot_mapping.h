// compute_slot_mapping: the checks its CPU and CUDA kernels share.
//
// The op fills one cache slot per scheduled token from a worker's block
// table (kvcy/block_table.py): request r is row r and owns tokens
// query_start_loc[r] .. query_start_loc[r + 1]; token t at position p goes to
// block_table[r, p / block_size] * block_size + p % block_size, or, with
// decode context parallelism over W ranks, to this rank's share of a virtual
// block of W * block_size positions (PAD_SLOT_ID where another rank stores
// it).  Entries past the tokens are PAD_SLOT_ID.  Messages match the
// plain-torch reference (kvcy/_ops_reference.py).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace kvcy {

constexpr int64_t kPadSlotId = -1;

// Arguments, dtypes, dims, devices (never tensor values); ValueError/TypeError.
void check_compute_slot_mapping(const at::Tensor& query_start_loc, const at::Tensor& positions,
                                const at::Tensor& block_table, const at::Tensor& slot_mapping, int64_t num_reqs,
                                int64_t block_size, int64_t cp_world_size, int64_t cp_rank,
                                int64_t cp_kv_cache_interleave_size);

// Value checks on host int64 data: `qsl` holds num_reqs + 1 offsets (none when
// num_reqs is 0), `pos` the num_tokens positions.  Returns the first token
// covered by a request; the last is qsl[num_reqs].
int64_t check_slot_mapping_values(const int64_t* qsl, int64_t num_reqs, const int64_t* pos, int64_t num_tokens,
                                  int64_t width, int64_t virtual_block_size);

// Per-token slot; the CPU and CUDA kernels both call it.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline int64_t slot_of(int64_t pos, const int32_t* row, int64_t block_size, int64_t cp_world_size, int64_t cp_rank,
                       int64_t interleave) {
  const int64_t vbs = block_size * cp_world_size;
  const int64_t vblock = pos / vbs;
  const int64_t voffset = pos - vblock * vbs;
  if ((voffset / interleave) % cp_world_size != cp_rank) return kPadSlotId;
  const int64_t offset = (voffset / (cp_world_size * interleave)) * interleave + voffset % interleave;
  return static_cast<int64_t>(row[vblock]) * block_size + offset;
}

}  // namespace kvcy
