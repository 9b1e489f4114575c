// kvcy._C: KV-cache layout and block-copy ops, registered as torch.ops.kvcy.*.
//
// This file holds the op schemas, the argument checks both backends share,
// the CPU kernels and the Python module entry point.  The CUDA kernels live in
// kvcy_ops_cuda.cu (compiled only when torch has CUDA and nvcc is found).
//
// Errors: bad arguments raise before any memory is touched, with the same
// message as the plain-torch reference (kvcy/_ops_reference.py): ValueError
// for shapes, ranges and ids a caller got wrong, TypeError for dtypes.
#include "kvcy_ops.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <Python.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <vector>

namespace kvcy {

namespace {

std::string shape_str(c10::IntArrayRef s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

std::string logical_str(const Logical5& v) { return shape_str(c10::IntArrayRef(v.size.data(), 5)); }

}  // namespace

std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kFloat8_e4m3fn: return "torch.float8_e4m3fn";
    case at::kFloat8_e5m2: return "torch.float8_e5m2";
    case at::kLong: return "torch.int64";
    case at::kInt: return "torch.int32";
    case at::kShort: return "torch.int16";
    case at::kChar: return "torch.int8";
    case at::kByte: return "torch.uint8";
    case at::kBool: return "torch.bool";
    default: return std::string("torch.") + c10::toString(t);
  }
}

void check_stride_order(c10::IntArrayRef order, const char* op, const char* name) {
  bool ok = order.size() == 5;
  if (ok) {
    bool seen[5] = {false, false, false, false, false};
    for (int64_t d : order) {
      if (d < 0 || d > 4 || seen[d]) {
        ok = false;
        break;
      }
      seen[d] = true;
    }
  }
  TORCH_CHECK_VALUE(ok, op, ": ", name, " must be a permutation of (0, 1, 2, 3, 4), got ", shape_str(order));
}

Logical5 logical_of(const at::Tensor& t, c10::IntArrayRef order, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.dim() == 5, op, ": ", name, " must be a 5-D tensor in the layout's physical order, got shape ",
                    shape_str(t.sizes()));
  Logical5 v;
  for (int p = 0; p < 5; ++p) {
    v.size[order[p]] = t.size(p);
    v.stride[order[p]] = t.stride(p);
  }
  return v;
}

Logical5 staging_logical_of(const at::Tensor& t, c10::IntArrayRef order, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.dim() == 5, op, ": ", name,
                    " must be a 5-D tensor [n] + the cache's physical dims without B, got shape ",
                    shape_str(t.sizes()));
  Logical5 v;
  v.size[kB] = t.size(0);
  v.stride[kB] = t.stride(0);
  int p = 1;
  for (int64_t d : order) {
    if (d == kB) continue;
    v.size[d] = t.size(p);
    v.stride[d] = t.stride(p);
    ++p;
  }
  return v;
}

void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* op, const char* an, const char* bn) {
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), op, ": ", an, " and ", bn, " must have the same dtype, got ",
                   dtype_name(a.scalar_type()), " and ", dtype_name(b.scalar_type()));
}

void check_index_tensor(const at::Tensor& t, int64_t dim, const char* op, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kLong, op, ": ", name, " must be an int64 tensor, got ",
                   dtype_name(t.scalar_type()));
  if (dim == 2) {
    TORCH_CHECK_VALUE(t.dim() == 2 && t.size(1) == 2, op, ": ", name, " must have shape [n, 2], got shape ",
                      shape_str(t.sizes()));
  } else {
    TORCH_CHECK_VALUE(t.dim() == dim, op, ": ", name, " must be ", dim, "-D, got shape ", shape_str(t.sizes()));
  }
}

void check_same_logical_shape(const Logical5& a, const Logical5& b, bool except_b, const char* op, const char* an,
                              const char* bn) {
  bool ok = true;
  for (int d = 0; d < 5; ++d) {
    if (except_b && d == kB) continue;
    ok = ok && a.size[d] == b.size[d];
  }
  if (except_b) {
    TORCH_CHECK_VALUE(ok, op, ": ", an, " and ", bn, " must have the same logical L, H, N, C, got ", logical_str(a),
                      " and ", logical_str(b));
  } else {
    TORCH_CHECK_VALUE(ok, op, ": ", an, " and ", bn, " must have the same logical shape [L, B, H, N, C], got ",
                      logical_str(a), " and ", logical_str(b));
  }
}

void check_block_ids(const at::Tensor& ids, int64_t num_blocks, bool unique, const char* op, const char* name) {
  const at::Tensor c = ids.contiguous();
  const int64_t* p = c.const_data_ptr<int64_t>();
  const int64_t n = c.numel();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK_VALUE(p[i] >= 0 && p[i] < num_blocks, op, ": ", name, "[", i, "] = ", p[i],
                      " is out of range for a cache of ", num_blocks, " blocks");
  }
  if (unique && n > 1) {
    std::vector<uint8_t> seen(static_cast<size_t>(num_blocks), 0);
    for (int64_t i = 0; i < n; ++i) {
      TORCH_CHECK_VALUE(!seen[p[i]], op, ": block ", p[i], " appears more than once in ", name);
      seen[p[i]] = 1;
    }
  }
}

void check_block_mapping(const at::Tensor& mapping, int64_t src_blocks, int64_t dst_blocks, bool same_cache,
                         const char* op) {
  const at::Tensor c = mapping.contiguous();
  const int64_t* p = c.const_data_ptr<int64_t>();
  const int64_t n = c.size(0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < 2; ++j) {
      const int64_t v = p[2 * i + j];
      const int64_t limit = j == 0 ? src_blocks : dst_blocks;
      TORCH_CHECK_VALUE(v >= 0 && v < limit, op, ": block_mapping[", i, ", ", j, "] = ", v,
                        " is out of range for a cache of ", limit, " blocks");
    }
  }
  if (n == 0) return;
  std::vector<uint8_t> is_dst(static_cast<size_t>(dst_blocks), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t d = p[2 * i + 1];
    TORCH_CHECK_VALUE(!is_dst[d], op, ": destination block ", d, " appears more than once in block_mapping");
    is_dst[d] = 1;
  }
  if (same_cache) {
    std::vector<uint8_t> is_src(static_cast<size_t>(src_blocks), 0);
    for (int64_t i = 0; i < n; ++i) is_src[p[2 * i]] = 1;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t d = p[2 * i + 1];
      TORCH_CHECK_VALUE(!(d < src_blocks && is_src[d]), op, ": block ", d,
                        " is both a source and a destination in block_mapping");
    }
  }
}

void check_slots(const at::Tensor& slots, int64_t num_blocks, int64_t block_size, const char* op) {
  const at::Tensor c = slots.contiguous();
  const int64_t* p = c.const_data_ptr<int64_t>();
  const int64_t limit = num_blocks * block_size;
  for (int64_t i = 0, n = c.numel(); i < n; ++i) {
    TORCH_CHECK_VALUE(p[i] < limit, op, ": slot_mapping[", i, "] = ", p[i], " is out of range for a cache of ",
                      num_blocks, " blocks x ", block_size, " tokens per block");
  }
}

ReshapeArgs check_reshape_and_cache(const at::Tensor& key, const at::Tensor& value, const at::Tensor& key_cache,
                                    const at::Tensor& value_cache, const at::Tensor& slot_mapping,
                                    c10::IntArrayRef stride_order, int64_t layer,
                                    const std::optional<at::Tensor>& k_scale,
                                    const std::optional<at::Tensor>& v_scale) {
  const char* op = "reshape_and_cache";
  check_stride_order(stride_order, op);
  TORCH_CHECK_VALUE(key.dim() == 3, op, ": key must be 3-D [num_tokens, num_heads, head_size], got shape ",
                    shape_str(key.sizes()));
  TORCH_CHECK_VALUE(value.sizes() == key.sizes(), op, ": value must have the shape of key ", shape_str(key.sizes()),
                    ", got ", shape_str(value.sizes()));
  check_same_dtype(key, value, op, "key", "value");
  const auto kt = key.scalar_type();
  TORCH_CHECK_TYPE(kt == at::kHalf || kt == at::kBFloat16 || kt == at::kFloat, op,
                   ": key must be float16, bfloat16 or float32, got ", dtype_name(kt));
  ReshapeArgs a;
  a.key_cache = logical_of(key_cache, stride_order, op, "key_cache");
  a.value_cache = logical_of(value_cache, stride_order, op, "value_cache");
  check_same_logical_shape(a.key_cache, a.value_cache, false, op, "key_cache", "value_cache");
  check_same_dtype(key_cache, value_cache, op, "key_cache", "value_cache");
  const auto ct = key_cache.scalar_type();
  TORCH_CHECK_TYPE(ct == kt || ct == at::kFloat8_e4m3fn, op, ": key_cache must have the dtype of key (",
                   dtype_name(kt), ") or torch.float8_e4m3fn, got ", dtype_name(ct));
  a.fp8 = ct == at::kFloat8_e4m3fn;
  a.num_tokens = key.size(0);
  a.num_heads = key.size(1);
  a.head_size = key.size(2);
  TORCH_CHECK_VALUE(a.key_cache.size[kH] == a.num_heads && a.key_cache.size[kC] == a.head_size, op, ": key has ",
                    a.num_heads, " heads of size ", a.head_size, " but the cache holds ", a.key_cache.size[kH],
                    " heads of size ", a.key_cache.size[kC]);
  TORCH_CHECK_VALUE(layer >= 0 && layer < a.key_cache.size[kL], op, ": layer ", layer,
                    " is out of range for a cache of ", a.key_cache.size[kL], " layer slots");
  check_index_tensor(slot_mapping, 1, op, "slot_mapping");
  TORCH_CHECK_VALUE(slot_mapping.numel() == a.num_tokens, op, ": slot_mapping must have one entry per token (",
                    a.num_tokens, "), got shape ", shape_str(slot_mapping.sizes()));
  const std::optional<at::Tensor>* scales[2] = {&k_scale, &v_scale};
  const char* names[2] = {"k_scale", "v_scale"};
  for (int i = 0; i < 2; ++i) {
    if (!scales[i]->has_value()) continue;
    const at::Tensor& s = scales[i]->value();
    TORCH_CHECK_TYPE(at::isFloatingType(s.scalar_type()), op, ": ", names[i],
                     " must be a floating-point tensor, got ", dtype_name(s.scalar_type()));
    TORCH_CHECK_VALUE(s.numel() == 1, op, ": ", names[i], " must hold one value, got shape ",
                      shape_str(s.sizes()));
  }
  return a;
}

// Checks shared by gather and scatter; returns (cache view, staging view).
std::pair<Logical5, Logical5> check_staging_args(const at::Tensor& cache, const at::Tensor& block_ids,
                                                 const at::Tensor& staging, c10::IntArrayRef stride_order,
                                                 const char* op) {
  check_stride_order(stride_order, op);
  const Logical5 lc = logical_of(cache, stride_order, op, "cache");
  const Logical5 lst = staging_logical_of(staging, stride_order, op, "staging");
  check_same_logical_shape(lc, lst, true, op, "cache", "staging");
  check_same_dtype(cache, staging, op, "cache", "staging");
  check_index_tensor(block_ids, 1, op, "block_ids");
  TORCH_CHECK_VALUE(lst.size[kB] == block_ids.numel(), op, ": staging has room for ", lst.size[kB],
                    " blocks but block_ids lists ", block_ids.numel());
  return {lc, lst};
}

BlockCopyPlan plan_block_copy(const Logical5& src, const Logical5& dst, int64_t esz) {
  struct Dim {
    int64_t size, ss, ds;
  };
  BlockCopyPlan plan;
  plan.src_block_stride = src.stride[kB] * esz;
  plan.dst_block_stride = dst.stride[kB] * esz;
  std::vector<Dim> dims;
  for (int k : {kL, kH, kN, kC}) {
    if (src.size[k] == 0) {
      plan.rows = 0;
      plan.run_bytes = 0;
      return plan;
    }
    if (src.size[k] == 1) continue;
    dims.push_back({src.size[k], src.stride[k] * esz, dst.stride[k] * esz});
  }
  // Walk the destination in memory order (outermost first) so writes stream.
  std::stable_sort(dims.begin(), dims.end(), [](const Dim& a, const Dim& b) { return a.ds > b.ds; });
  std::vector<Dim> merged;
  for (const Dim& x : dims) {
    if (!merged.empty()) {
      Dim& o = merged.back();
      if (o.ss == x.ss * x.size && o.ds == x.ds * x.size) {
        o.size *= x.size;
        o.ss = x.ss;
        o.ds = x.ds;
        continue;
      }
    }
    merged.push_back(x);
  }
  plan.run_bytes = esz;
  if (!merged.empty() && merged.back().ss == esz && merged.back().ds == esz) {
    plan.run_bytes = esz * merged.back().size;
    merged.pop_back();
  }
  plan.ndim = static_cast<int>(merged.size());
  plan.rows = 1;
  for (int i = 0; i < plan.ndim; ++i) {
    plan.size[i] = merged[i].size;
    plan.src_stride[i] = merged[i].ss;
    plan.dst_stride[i] = merged[i].ds;
    plan.rows *= merged[i].size;
  }
  return plan;
}

void run_block_copy_cpu(const char* src, char* dst, const BlockCopyPlan& plan, IdView src_ids, IdView dst_ids,
                        int64_t n) {
  if (n == 0 || plan.rows == 0 || plan.run_bytes == 0) return;
  const int64_t total = n * plan.rows;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / plan.run_bytes);
  at::parallel_for(0, total, grain, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      const int64_t i = w / plan.rows;
      int64_t r = w - i * plan.rows;
      int64_t so = src_ids[i] * plan.src_block_stride;
      int64_t dof = dst_ids[i] * plan.dst_block_stride;
      for (int k = plan.ndim - 1; k >= 0; --k) {
        const int64_t q = r % plan.size[k];
        r /= plan.size[k];
        so += q * plan.src_stride[k];
        dof += q * plan.dst_stride[k];
      }
      std::memcpy(dst + dof, src + so, static_cast<size_t>(plan.run_bytes));
    }
  });
}

namespace {

// ---------------------------------------------------------------------------
// CPU kernels
// ---------------------------------------------------------------------------

inline float fp8_saturate(float v) { return v < -448.f ? -448.f : (v > 448.f ? 448.f : v); }

template <typename in_t, typename out_t, bool kFp8>
void reshape_one_cpu(const at::Tensor& src, const at::Tensor& cache, const Logical5& lc, int64_t layer,
                     const int64_t* slots, float scale) {
  const int64_t T = src.size(0), H = src.size(1), C = src.size(2);
  const int64_t sT = src.stride(0), sH = src.stride(1), sC = src.stride(2);
  const in_t* in = src.const_data_ptr<in_t>();
  out_t* base = cache.data_ptr<out_t>() + layer * lc.stride[kL];
  const int64_t N = lc.size[kN];
  const bool memcpy_rows = !kFp8 && sC == 1 && lc.stride[kC] == 1;
  at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t slot = slots[t];
      if (slot < 0) continue;
      out_t* dst = base + (slot / N) * lc.stride[kB] + (slot % N) * lc.stride[kN];
      const in_t* row = in + t * sT;
      for (int64_t h = 0; h < H; ++h) {
        out_t* d = dst + h * lc.stride[kH];
        const in_t* s = row + h * sH;
        if (memcpy_rows) {
          std::memcpy(d, s, static_cast<size_t>(C) * sizeof(out_t));
        } else {
          for (int64_t c = 0; c < C; ++c) {
            if constexpr (kFp8) {
              d[c * lc.stride[kC]] = out_t(fp8_saturate(static_cast<float>(s[c * sC]) / scale));
            } else {
              d[c * lc.stride[kC]] = static_cast<out_t>(s[c * sC]);
            }
          }
        }
      }
    }
  });
}

template <typename in_t>
void reshape_dispatch_cache_cpu(const at::Tensor& src, const at::Tensor& cache, const Logical5& lc, int64_t layer,
                                const int64_t* slots, bool fp8, float scale) {
  if (fp8) {
    reshape_one_cpu<in_t, c10::Float8_e4m3fn, true>(src, cache, lc, layer, slots, scale);
  } else {
    reshape_one_cpu<in_t, in_t, false>(src, cache, lc, layer, slots, scale);
  }
}

float scale_value(const std::optional<at::Tensor>& s) {
  return s.has_value() ? s->to(at::kFloat).item<float>() : 1.0f;
}

void reshape_and_cache_cpu(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                           at::Tensor& value_cache, const at::Tensor& slot_mapping, c10::IntArrayRef stride_order,
                           int64_t layer, const std::optional<at::Tensor>& k_scale,
                           const std::optional<at::Tensor>& v_scale) {
  ReshapeArgs a = check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, stride_order, layer,
                                          k_scale, v_scale);
  const at::Tensor slots = slot_mapping.contiguous();
  check_slots(slots, a.key_cache.size[kB], a.key_cache.size[kN], "reshape_and_cache");
  if (a.num_tokens == 0 || a.num_heads == 0 || a.head_size == 0) return;
  const float ks = a.fp8 ? scale_value(k_scale) : 1.0f;
  const float vs = a.fp8 ? scale_value(v_scale) : 1.0f;
  const int64_t* sp = slots.const_data_ptr<int64_t>();
  switch (key.scalar_type()) {
    case at::kHalf:
      reshape_dispatch_cache_cpu<c10::Half>(key, key_cache, a.key_cache, layer, sp, a.fp8, ks);
      reshape_dispatch_cache_cpu<c10::Half>(value, value_cache, a.value_cache, layer, sp, a.fp8, vs);
      break;
    case at::kBFloat16:
      reshape_dispatch_cache_cpu<c10::BFloat16>(key, key_cache, a.key_cache, layer, sp, a.fp8, ks);
      reshape_dispatch_cache_cpu<c10::BFloat16>(value, value_cache, a.value_cache, layer, sp, a.fp8, vs);
      break;
    default:
      reshape_dispatch_cache_cpu<float>(key, key_cache, a.key_cache, layer, sp, a.fp8, ks);
      reshape_dispatch_cache_cpu<float>(value, value_cache, a.value_cache, layer, sp, a.fp8, vs);
      break;
  }
}

const char* cbytes(const at::Tensor& t) { return static_cast<const char*>(t.const_data_ptr()); }
char* mbytes(at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

void convert_layout_cpu(const at::Tensor& src, at::Tensor& dst, c10::IntArrayRef src_order,
                        c10::IntArrayRef dst_order) {
  const char* op = "convert_layout";
  check_stride_order(src_order, op, "src_stride_order");
  check_stride_order(dst_order, op, "dst_stride_order");
  const Logical5 ls = logical_of(src, src_order, op, "src");
  const Logical5 ld = logical_of(dst, dst_order, op, "dst");
  check_same_logical_shape(ls, ld, false, op, "src", "dst");
  check_same_dtype(src, dst, op, "src", "dst");
  const BlockCopyPlan plan = plan_block_copy(ls, ld, src.element_size());
  run_block_copy_cpu(cbytes(src), mbytes(dst), plan, IdView{}, IdView{}, ls.size[kB]);
}

void copy_blocks_cpu(at::Tensor& cache, const at::Tensor& block_mapping, c10::IntArrayRef stride_order) {
  const char* op = "copy_blocks";
  check_stride_order(stride_order, op);
  const Logical5 lc = logical_of(cache, stride_order, op, "cache");
  check_index_tensor(block_mapping, 2, op, "block_mapping");
  const at::Tensor m = block_mapping.contiguous();
  check_block_mapping(m, lc.size[kB], lc.size[kB], true, op);
  const BlockCopyPlan plan = plan_block_copy(lc, lc, cache.element_size());
  const int64_t* p = m.const_data_ptr<int64_t>();
  run_block_copy_cpu(cbytes(cache), mbytes(cache), plan, IdView{p, 2}, IdView{p + 1, 2}, m.size(0));
}

void swap_blocks_cpu(const at::Tensor& src, at::Tensor& dst, const at::Tensor& block_mapping,
                     c10::IntArrayRef stride_order) {
  const char* op = "swap_blocks";
  check_stride_order(stride_order, op);
  const Logical5 ls = logical_of(src, stride_order, op, "src");
  const Logical5 ld = logical_of(dst, stride_order, op, "dst");
  check_same_logical_shape(ls, ld, true, op, "src", "dst");
  check_same_dtype(src, dst, op, "src", "dst");
  check_index_tensor(block_mapping, 2, op, "block_mapping");
  const at::Tensor m = block_mapping.contiguous();
  check_block_mapping(m, ls.size[kB], ld.size[kB], src.is_alias_of(dst), op);
  const BlockCopyPlan plan = plan_block_copy(ls, ld, src.element_size());
  const int64_t* p = m.const_data_ptr<int64_t>();
  run_block_copy_cpu(cbytes(src), mbytes(dst), plan, IdView{p, 2}, IdView{p + 1, 2}, m.size(0));
}

void gather_blocks_cpu(const at::Tensor& cache, const at::Tensor& block_ids, at::Tensor& staging,
                       c10::IntArrayRef stride_order) {
  const char* op = "gather_blocks";
  auto [lc, lst] = check_staging_args(cache, block_ids, staging, stride_order, op);
  const at::Tensor ids = block_ids.contiguous();
  check_block_ids(ids, lc.size[kB], false, op, "block_ids");
  const BlockCopyPlan plan = plan_block_copy(lc, lst, cache.element_size());
  run_block_copy_cpu(cbytes(cache), mbytes(staging), plan, IdView{ids.const_data_ptr<int64_t>(), 1}, IdView{},
                     ids.numel());
}

void scatter_blocks_cpu(const at::Tensor& staging, at::Tensor& cache, const at::Tensor& block_ids,
                        c10::IntArrayRef stride_order) {
  const char* op = "scatter_blocks";
  auto [lc, lst] = check_staging_args(cache, block_ids, staging, stride_order, op);
  const at::Tensor ids = block_ids.contiguous();
  check_block_ids(ids, lc.size[kB], true, op, "block_ids");
  const BlockCopyPlan plan = plan_block_copy(lst, lc, cache.element_size());
  run_block_copy_cpu(cbytes(staging), mbytes(cache), plan, IdView{}, IdView{ids.const_data_ptr<int64_t>(), 1},
                     ids.numel());
}

}  // namespace

TORCH_LIBRARY(kvcy, m) {
  // The fake (meta) kernels for torch.compile live in kvcy/ops.py.
  m.set_python_module("kvcy.ops");
  m.def(
      "reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
      "Tensor slot_mapping, int[] stride_order, int layer=0, Tensor? k_scale=None, Tensor? v_scale=None) -> ()");
  m.def("convert_layout(Tensor src, Tensor(a!) dst, int[] src_stride_order, int[] dst_stride_order) -> ()");
  m.def("copy_blocks(Tensor(a!) cache, Tensor block_mapping, int[] stride_order) -> ()");
  m.def("swap_blocks(Tensor src, Tensor(a!) dst, Tensor block_mapping, int[] stride_order) -> ()");
  m.def("gather_blocks(Tensor cache, Tensor block_ids, Tensor(a!) staging, int[] stride_order) -> ()");
  m.def("scatter_blocks(Tensor staging, Tensor(a!) cache, Tensor block_ids, int[] stride_order) -> ()");
}

TORCH_LIBRARY_IMPL(kvcy, CPU, m) {
  m.impl("reshape_and_cache", &reshape_and_cache_cpu);
  m.impl("convert_layout", &convert_layout_cpu);
  m.impl("copy_blocks", &copy_blocks_cpu);
  m.impl("swap_blocks", &swap_blocks_cpu);
  m.impl("gather_blocks", &gather_blocks_cpu);
  m.impl("scatter_blocks", &scatter_blocks_cpu);
}

}  // namespace kvcy

// `import kvcy._C` loads this library, whose static initializers register the
// ops above; the module itself has no attributes.
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "kvcy torch ops (torch.ops.kvcy)", -1, nullptr};
  return PyModule_Create(&module);
}

// ---------------------------------------------------------------------------
// compute_slot_mapping (schema, shared checks, CPU kernel)
// ---------------------------------------------------------------------------
#include "kvcy_slot_mapping.h"

namespace kvcy {

void check_compute_slot_mapping(const at::Tensor& query_start_loc, const at::Tensor& positions,
                                const at::Tensor& block_table, const at::Tensor& slot_mapping, int64_t num_reqs,
                                int64_t block_size, int64_t cp_world_size, int64_t cp_rank,
                                int64_t cp_kv_cache_interleave_size) {
  const char* op = "compute_slot_mapping";
  TORCH_CHECK_VALUE(block_size >= 1, op, ": block_size must be positive, got ", block_size);
  TORCH_CHECK_VALUE(cp_world_size >= 1, op, ": cp_world_size must be positive, got ", cp_world_size);
  TORCH_CHECK_VALUE(cp_rank >= 0 && cp_rank < cp_world_size, op, ": cp_rank ", cp_rank,
                    " is out of range for a context-parallel world of ", cp_world_size);
  TORCH_CHECK_VALUE(cp_kv_cache_interleave_size >= 1, op, ": cp_kv_cache_interleave_size must be positive, got ",
                    cp_kv_cache_interleave_size);
  const auto qt = query_start_loc.scalar_type();
  TORCH_CHECK_TYPE(qt == at::kInt || qt == at::kLong, op, ": query_start_loc must be an int32 or int64 tensor, got ",
                   dtype_name(qt));
  const at::Tensor* typed[3] = {&positions, &block_table, &slot_mapping};
  const char* typed_names[3] = {"positions", "block_table", "slot_mapping"};
  const c10::ScalarType types[3] = {at::kLong, at::kInt, at::kLong};
  for (int i = 0; i < 3; ++i) {
    TORCH_CHECK_TYPE(typed[i]->scalar_type() == types[i], op, ": ", typed_names[i], " must be an ",
                     types[i] == at::kLong ? "int64" : "int32", " tensor, got ", dtype_name(typed[i]->scalar_type()));
  }
  const at::Tensor* all[4] = {&query_start_loc, &positions, &block_table, &slot_mapping};
  const char* names[4] = {"query_start_loc", "positions", "block_table", "slot_mapping"};
  const int64_t dims[4] = {1, 1, 2, 1};
  for (int i = 0; i < 4; ++i) {
    TORCH_CHECK_VALUE(all[i]->dim() == dims[i], op, ": ", names[i], " must be ", dims[i], "-D, got shape ",
                      all[i]->sizes());
  }
  for (int i = 0; i < 3; ++i) {
    TORCH_CHECK_VALUE(all[i]->device() == slot_mapping.device(), op, ": ", names[i], " is on ", all[i]->device().str(),
                      " but slot_mapping is on ", slot_mapping.device().str());
  }
  TORCH_CHECK_VALUE(num_reqs >= 0 && num_reqs <= block_table.size(0), op, ": num_reqs ", num_reqs,
                    " is out of range for a block table of ", block_table.size(0), " rows");
  TORCH_CHECK_VALUE(num_reqs == 0 || query_start_loc.numel() >= num_reqs + 1, op, ": query_start_loc has ",
                    query_start_loc.numel(), " entries; num_reqs ", num_reqs, " needs ", num_reqs + 1);
  TORCH_CHECK_VALUE(positions.numel() <= slot_mapping.numel(), op, ": ", positions.numel(),
                    " positions do not fit in a slot_mapping of ", slot_mapping.numel());
}

int64_t check_slot_mapping_values(const int64_t* qsl, int64_t num_reqs, const int64_t* pos, int64_t num_tokens,
                                  int64_t width, int64_t virtual_block_size) {
  const char* op = "compute_slot_mapping";
  if (num_reqs == 0 && qsl == nullptr) return 0;
  TORCH_CHECK_VALUE(qsl[0] >= 0, op, ": query_start_loc[0] = ", qsl[0], " is negative");
  for (int64_t r = 0; r < num_reqs; ++r) {
    TORCH_CHECK_VALUE(qsl[r + 1] >= qsl[r], op, ": query_start_loc[", r + 1, "] = ", qsl[r + 1],
                      " is less than query_start_loc[", r, "] = ", qsl[r]);
  }
  const int64_t first = qsl[0], last = qsl[num_reqs];
  TORCH_CHECK_VALUE(last <= num_tokens, op, ": query_start_loc[", num_reqs, "] = ", last, " is beyond the ",
                    num_tokens, " positions");
  const int64_t limit = width * virtual_block_size;
  for (int64_t t = first; t < last; ++t) {
    TORCH_CHECK_VALUE(pos[t] >= 0 && pos[t] < limit, op, ": positions[", t, "] = ", pos[t],
                      " is out of range for a block table row of ", width, " blocks x ", virtual_block_size,
                      " tokens");
  }
  return first;
}

namespace {

void compute_slot_mapping_cpu(const at::Tensor& query_start_loc, const at::Tensor& positions,
                              const at::Tensor& block_table, at::Tensor& slot_mapping, int64_t num_reqs,
                              int64_t block_size, int64_t cp_world_size, int64_t cp_rank,
                              int64_t cp_kv_cache_interleave_size) {
  check_compute_slot_mapping(query_start_loc, positions, block_table, slot_mapping, num_reqs, block_size,
                             cp_world_size, cp_rank, cp_kv_cache_interleave_size);
  const int64_t num_tokens = positions.numel();
  const at::Tensor qsl = num_reqs > 0 ? query_start_loc.slice(0, 0, num_reqs + 1).to(at::kLong).contiguous()
                                      : at::Tensor();
  const int64_t* q = num_reqs > 0 ? qsl.const_data_ptr<int64_t>() : nullptr;
  const at::Tensor pos_c = positions.contiguous();
  const int64_t* pos = pos_c.const_data_ptr<int64_t>();
  check_slot_mapping_values(q, num_reqs, pos, num_tokens, block_table.size(1), block_size * cp_world_size);

  int64_t* out = slot_mapping.data_ptr<int64_t>();
  const int64_t os = slot_mapping.stride(0);
  for (int64_t t = num_tokens, n = slot_mapping.numel(); t < n; ++t) out[t * os] = kPadSlotId;
  if (num_reqs == 0) return;
  // slot_of reads a row as consecutive int32s; vLLM's tables are contiguous.
  const at::Tensor bt = block_table.stride(1) == 1 ? block_table : block_table.contiguous();
  const int32_t* table = bt.const_data_ptr<int32_t>();
  const int64_t row_stride = bt.stride(0);
  // A step's few thousand tokens take microseconds on one core; threads pay
  // off only for much larger batches.
  const int64_t grain = num_tokens < (int64_t{1} << 16) ? std::max<int64_t>(num_reqs, 1) : 64;
  // Without context parallelism a slot is row[p / B] * B + p % B: one
  // division (a shift for the usual power-of-two B) instead of slot_of's five.
  const bool plain = cp_world_size == 1;
  const bool pow2 = (block_size & (block_size - 1)) == 0;
  const int shift = pow2 ? __builtin_ctzll(static_cast<unsigned long long>(block_size)) : 0;
  at::parallel_for(0, num_reqs, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int32_t* row = table + r * row_stride;
      const int64_t stop = q[r + 1];
      if (plain && pow2) {
        const int64_t mask = block_size - 1;
        for (int64_t t = q[r]; t < stop; ++t) {
          const int64_t p = pos[t];
          out[t * os] = static_cast<int64_t>(row[p >> shift]) * block_size + (p & mask);
        }
      } else if (plain) {
        for (int64_t t = q[r]; t < stop; ++t) {
          const int64_t p = pos[t];
          out[t * os] = static_cast<int64_t>(row[p / block_size]) * block_size + p % block_size;
        }
      } else {
        for (int64_t t = q[r]; t < stop; ++t) {
          out[t * os] = slot_of(pos[t], row, block_size, cp_world_size, cp_rank, cp_kv_cache_interleave_size);
        }
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvcy, m) {
  m.def(
      "compute_slot_mapping(Tensor query_start_loc, Tensor positions, Tensor block_table, Tensor(a!) slot_mapping, "
      "int num_reqs, int block_size, int cp_world_size=1, int cp_rank=0, int cp_kv_cache_interleave_size=1) -> ()");
}

TORCH_LIBRARY_IMPL(kvcy, CPU, m) { m.impl("compute_slot_mapping", &compute_slot_mapping_cpu); }

}  // namespace kvcy
