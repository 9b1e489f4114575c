// Shared declarations of the kvcy._C ops: logical cache views, the block-copy
// plan, and the argument checks that the CPU and CUDA kernels both run before
// touching memory.
//
// Vocabulary.  A KV cache is logically [L, B, H, N, C] (layer slots, blocks,
// kv heads, tokens per block, content).  The ops receive a *physical* tensor:
// a 5-D tensor whose dims are the logical dims in the layout's stride order
// (outermost first), with any strides (padding and views are fine).  The
// layout travels as `stride_order`, a permutation of (0, 1, 2, 3, 4), so the
// C++ side is generic over layouts: it reads each logical dim's size and
// stride off the physical tensor and never assumes a particular order.
//
// Keys and values are two such tensors of one shape (two allocations, or the
// two halves of the C axis of one packed allocation); block ops move whatever
// tensor they are given.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/macros/Macros.h>
#include <c10/util/ArrayRef.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace kvcy {

enum LogicalDim : int { kL = 0, kB = 1, kH = 2, kN = 3, kC = 4 };

// Sizes and strides (in elements) of the logical [L, B, H, N, C] view.
struct Logical5 {
  std::array<int64_t, 5> size{};
  std::array<int64_t, 5> stride{};
};

// Name of a dtype the way Python prints it ("torch.float16"), so the C++ and
// the plain-torch reference raise the same messages.
std::string dtype_name(c10::ScalarType t);

// TORCH_CHECK_VALUE (-> ValueError) unless `order` is a permutation of 0..4.
void check_stride_order(c10::IntArrayRef order, const char* op, const char* name = "stride_order");

// Logical view of a 5-D physical cache tensor.
Logical5 logical_of(const at::Tensor& physical, c10::IntArrayRef order, const char* op, const char* name);

// Logical view of a staging buffer: physical dims [n] + the cache's physical
// dims without B, so its stride order is [B] + (order without B).
Logical5 staging_logical_of(const at::Tensor& staging, c10::IntArrayRef order, const char* op, const char* name);

// Copying whole blocks between two logical views of one element size.  The
// four non-B dims are reduced to at most four "row" dims (size-1 dims
// dropped, walked in destination memory order, adjacent dims merged when both
// sides are contiguous across them) and one contiguous run of `run_bytes`.
constexpr int kMaxRowDims = 4;
struct BlockCopyPlan {
  int ndim = 0;
  int64_t size[kMaxRowDims] = {1, 1, 1, 1};
  int64_t src_stride[kMaxRowDims] = {0, 0, 0, 0};  // bytes
  int64_t dst_stride[kMaxRowDims] = {0, 0, 0, 0};  // bytes
  int64_t rows = 1;
  int64_t run_bytes = 0;
  int64_t src_block_stride = 0;  // bytes
  int64_t dst_block_stride = 0;  // bytes
};
BlockCopyPlan plan_block_copy(const Logical5& src, const Logical5& dst, int64_t elem_size);

// A list of block ids read with a stride; a null pointer is the identity
// (entry i is i).  Used for the src and dst side of every block copy.
struct IdView {
  const int64_t* ptr = nullptr;
  int64_t stride = 1;
  C10_HOST_DEVICE inline int64_t operator[](int64_t i) const { return ptr ? ptr[i * stride] : i; }
};

// Value checks on CPU int64 tensors (the CUDA side copies the ids to the host
// first).  Each raises ValueError with the message the reference raises.
//
// `ids`: 1-D, entries in [0, num_blocks); with `unique`, no repeats.
void check_block_ids(const at::Tensor& ids, int64_t num_blocks, bool unique, const char* op, const char* name);
// `mapping`: [n, 2] (src, dst); src in [0, src_blocks), dst in [0, dst_blocks),
// dst ids distinct; with `same_cache`, no dst id is also a src id.
void check_block_mapping(const at::Tensor& mapping, int64_t src_blocks, int64_t dst_blocks, bool same_cache,
                         const char* op);
// `slots`: 1-D; each slot < num_blocks * block_size (negative = skipped).
void check_slots(const at::Tensor& slots, int64_t num_blocks, int64_t block_size, const char* op);

// Metadata checks shared by both backends (shapes and dtypes, never data).
struct ReshapeArgs {
  Logical5 key_cache, value_cache;
  int64_t num_tokens = 0, num_heads = 0, head_size = 0;
  bool fp8 = false;
};
ReshapeArgs check_reshape_and_cache(const at::Tensor& key, const at::Tensor& value, const at::Tensor& key_cache,
                                    const at::Tensor& value_cache, const at::Tensor& slot_mapping,
                                    c10::IntArrayRef stride_order, int64_t layer,
                                    const std::optional<at::Tensor>& k_scale,
                                    const std::optional<at::Tensor>& v_scale);
void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* op, const char* an, const char* bn);
void check_index_tensor(const at::Tensor& t, int64_t dim, const char* op, const char* name);
// gather/scatter: returns the (cache, staging) logical views.
std::pair<Logical5, Logical5> check_staging_args(const at::Tensor& cache, const at::Tensor& block_ids,
                                                 const at::Tensor& staging, c10::IntArrayRef stride_order,
                                                 const char* op);
// Memory checks of the tensors an op writes (ValueError, the reference's
// messages).  A tensor may overlap itself when two of its elements can share
// an address: its dims of size > 1, from the smallest stride up, must each
// step past all the smaller dims reach (a stride-0 or overlapping view fails,
// padding passes).  Two tensors may share memory when they view one storage
// and the byte ranges from their first to their last element intersect.
bool may_overlap_itself(const at::Tensor& t);
bool may_share_memory(const at::Tensor& a, const at::Tensor& b);
void check_writable(const at::Tensor& t, const char* op, const char* name);
void check_apart(const at::Tensor& a, const at::Tensor& b, const char* op, const char* an, const char* bn);
// src/dst logical views equal in every dim except (when `except_b`) B.
void check_same_logical_shape(const Logical5& a, const Logical5& b, bool except_b, const char* op, const char* an,
                              const char* bn);

// CPU executor of a plan: for i in [0, n), copy block src_ids[i] of `src` to
// block dst_ids[i] of `dst` (base pointers of the two tensors).
void run_block_copy_cpu(const char* src, char* dst, const BlockCopyPlan& plan, IdView src_ids, IdView dst_ids,
                        int64_t n);

}  // namespace kvcy
