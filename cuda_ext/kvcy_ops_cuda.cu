// CUDA kernels of the kvcy._C ops (registered for the CUDA dispatch key).
//
// Same semantics, checks and messages as the CPU kernels in kvcy_ops.cpp.
// Checks that read ids or slots need them on the host: ids given on the
// device are copied back first, and a device slot_mapping is checked with one
// max() - both synchronise the stream, which is the price of never writing
// out of bounds.
//
// Block moves (copy/swap/gather/scatter/convert) run one generic kernel: one
// CTA row per block pair, threads striding over the pair's bytes in the
// widest vector the alignment allows.  A CPU tensor on the other side is used
// in place when it is pinned (its device alias comes from
// cudaPointerGetAttributes, so the copy is one kernel over PCIe/NVLink on the
// current stream, asynchronous to the host); pageable memory is staged
// through a packed buffer and synchronises.
#include "kvcy_ops.h"

#include <ATen/ATen.h>
#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <cstdint>

namespace kvcy {
namespace {

// ---------------------------------------------------------------------------
// Generic block copy
// ---------------------------------------------------------------------------

struct DevicePlan {
  int ndim;
  uint32_t size[kMaxRowDims];
  int64_t src_stride[kMaxRowDims];
  int64_t dst_stride[kMaxRowDims];
  int64_t src_block_stride;
  int64_t dst_block_stride;
  uint32_t run_vecs;  // vectors of V per row
  uint32_t work;      // rows * run_vecs, < 2^31
};

constexpr int kUnroll = 4;

template <typename V>
__global__ void block_copy_kernel(const char* src, char* dst, DevicePlan p, IdView src_ids, IdView dst_ids) {
  const int64_t pair = blockIdx.x;
  const char* s_base = src + src_ids[pair] * p.src_block_stride;
  char* d_base = dst + dst_ids[pair] * p.dst_block_stride;
  const uint32_t chunk = blockDim.x * kUnroll;
  for (uint32_t c0 = blockIdx.y * chunk; c0 < p.work; c0 += gridDim.y * chunk) {
    V v[kUnroll];
    int64_t doff[kUnroll];
    // All loads first, then all stores: kUnroll independent requests in flight.
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const uint32_t w = c0 + threadIdx.x + k * blockDim.x;
      if (w < p.work) {
        uint32_t row = w / p.run_vecs;
        const uint32_t col = w - row * p.run_vecs;
        int64_t so = static_cast<int64_t>(col) * sizeof(V);
        int64_t dof = so;
#pragma unroll
        for (int d = kMaxRowDims - 1; d >= 0; --d) {
          if (d < p.ndim) {
            const uint32_t q = row % p.size[d];
            row /= p.size[d];
            so += q * p.src_stride[d];
            dof += q * p.dst_stride[d];
          }
        }
        v[k] = *reinterpret_cast<const V*>(s_base + so);
        doff[k] = dof;
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const uint32_t w = c0 + threadIdx.x + k * blockDim.x;
      if (w < p.work) *reinterpret_cast<V*>(d_base + doff[k]) = v[k];
    }
  }
}

template <typename V>
void launch_block_copy(const char* src, char* dst, const BlockCopyPlan& plan, IdView s, IdView d, int64_t n,
                       cudaStream_t stream) {
  DevicePlan p;
  p.ndim = plan.ndim;
  for (int i = 0; i < kMaxRowDims; ++i) {
    p.size[i] = static_cast<uint32_t>(plan.size[i]);
    p.src_stride[i] = plan.src_stride[i];
    p.dst_stride[i] = plan.dst_stride[i];
  }
  p.src_block_stride = plan.src_block_stride;
  p.dst_block_stride = plan.dst_block_stride;
  const int64_t run_vecs = plan.run_bytes / static_cast<int64_t>(sizeof(V));
  const int64_t work = plan.rows * run_vecs;
  TORCH_CHECK(work < (int64_t{1} << 31), "kvcy: one block holds too many bytes for the CUDA block-copy kernel");
  TORCH_CHECK(n < (int64_t{1} << 31), "kvcy: too many blocks for one CUDA block-copy launch");
  p.run_vecs = static_cast<uint32_t>(run_vecs);
  p.work = static_cast<uint32_t>(work);
  const int64_t per_thread = (work + kUnroll - 1) / kUnroll;
  const int threads = static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, (per_thread + 31) / 32 * 32)));
  const int64_t chunks = (work + int64_t{threads} * kUnroll - 1) / (int64_t{threads} * kUnroll);
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(std::min<int64_t>(chunks, 65535)));
  block_copy_kernel<V><<<grid, threads, 0, stream>>>(src, dst, p, s, d);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void dispatch_block_copy(const char* src, char* dst, const BlockCopyPlan& plan, IdView s, IdView d, int64_t n,
                         cudaStream_t stream) {
  if (n == 0 || plan.rows == 0 || plan.run_bytes == 0) return;
  uint64_t bits = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) |
                  static_cast<uint64_t>(plan.run_bytes) | static_cast<uint64_t>(plan.src_block_stride) |
                  static_cast<uint64_t>(plan.dst_block_stride);
  for (int i = 0; i < plan.ndim; ++i) {
    bits |= static_cast<uint64_t>(plan.src_stride[i]) | static_cast<uint64_t>(plan.dst_stride[i]);
  }
  if (bits % 16 == 0) {
    launch_block_copy<uint4>(src, dst, plan, s, d, n, stream);
  } else if (bits % 8 == 0) {
    launch_block_copy<uint2>(src, dst, plan, s, d, n, stream);
  } else if (bits % 4 == 0) {
    launch_block_copy<uint32_t>(src, dst, plan, s, d, n, stream);
  } else if (bits % 2 == 0) {
    launch_block_copy<uint16_t>(src, dst, plan, s, d, n, stream);
  } else {
    launch_block_copy<uint8_t>(src, dst, plan, s, d, n, stream);
  }
}

// Address through which the current device reaches `t`'s data: the data
// pointer of a CUDA tensor, the device alias of pinned (page-locked, mapped)
// host memory, or nullptr for pageable host memory.
const void* device_address(const at::Tensor& t) {
  const void* p = t.const_data_ptr();
  if (t.is_cuda() || p == nullptr) return p;
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error state
    return nullptr;
  }
  if (attr.type == cudaMemoryTypeHost && attr.devicePointer != nullptr) return attr.devicePointer;
  return nullptr;
}

// Tell torch's pinned-memory allocator that the current stream uses `t`, so a
// pinned buffer freed right after an asynchronous op is not handed out again
// before the op is done (what torch's own non_blocking copies do).
void record_host_use(const at::Tensor& t) {
  if (!t.is_cpu()) return;
  (void)at::getHostAllocator(at::kCUDA)->record_event(const_cast<void*>(t.const_data_ptr()),
                                                      t.storage().data_ptr().get_context(),
                                                      c10::cuda::getCurrentCUDAStream().unwrap());
}

// A host int64 tensor on the device without blocking the host: staged through
// pinned memory (torch's allocator keeps the staging buffer alive until the
// stream has read it), so a host mapping does not force a stream sync.
at::Tensor host_ids_to_device(const at::Tensor& ids, const at::Device& device) {
  at::Tensor pinned = ids;
  if (!ids.is_pinned()) {
    pinned = at::empty(ids.sizes(), ids.options().pinned_memory(true));
    pinned.copy_(ids);
  }
  return pinned.to(at::TensorOptions().device(device), /*non_blocking=*/true);
}

// A packed [n, L, H, N, C] buffer shaped like `like`'s blocks, and its logical view.
at::Tensor packed_blocks(const Logical5& like, int64_t n, const at::TensorOptions& opts, Logical5& view) {
  at::Tensor t = at::empty({n, like.size[kL], like.size[kH], like.size[kN], like.size[kC]}, opts);
  view.size = {like.size[kL], n, like.size[kH], like.size[kN], like.size[kC]};
  view.stride = {t.stride(1), t.stride(0), t.stride(2), t.stride(3), t.stride(4)};
  return t;
}

// Copy n blocks src[src_ids[i]] -> dst[dst_ids[i]].  At least one side is on
// CUDA; the other may be on the CPU.  `*_ids_host` are contiguous 1-D int64
// CPU tensors already checked, or undefined for the identity.
void block_copy_cuda(const at::Tensor& src, const Logical5& ls, const at::Tensor& dst, const Logical5& ld,
                     const at::Tensor& src_ids_host, const at::Tensor& dst_ids_host, int64_t n, const char* op) {
  if (src.is_cuda() && dst.is_cuda()) {
    TORCH_CHECK_VALUE(src.device() == dst.device(), op, ": tensors on two CUDA devices (", src.device(), ", ",
                      dst.device(), ") are not supported");
  }
  TORCH_CHECK_VALUE((src.is_cuda() || src.is_cpu()) && (dst.is_cuda() || dst.is_cpu()), op,
                    ": only CUDA and CPU tensors are supported, got ", src.device(), " and ", dst.device());
  TORCH_CHECK_VALUE(src.is_cuda() || dst.is_cuda(), op,
                    ": an index tensor is on CUDA but the caches are on the CPU; pass the ids on the CPU");
  const at::Device device = src.is_cuda() ? src.device() : dst.device();
  const c10::cuda::CUDAGuard guard(device);
  const BlockCopyPlan plan = plan_block_copy(ls, ld, src.element_size());
  if (n == 0 || plan.rows == 0 || plan.run_bytes == 0) return;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  auto to_device = [&](const at::Tensor& ids) -> at::Tensor {
    return ids.defined() ? host_ids_to_device(ids, device) : ids;
  };
  auto view_of = [](const at::Tensor& ids) -> IdView {
    return ids.defined() ? IdView{ids.const_data_ptr<int64_t>(), 1} : IdView{};
  };

  const void* sp = device_address(src);
  const void* dp = device_address(dst);
  if (sp != nullptr && dp != nullptr) {
    const at::Tensor s_dev = to_device(src_ids_host);
    const at::Tensor d_dev = to_device(dst_ids_host);
    dispatch_block_copy(static_cast<const char*>(sp), static_cast<char*>(const_cast<void*>(dp)), plan,
                        view_of(s_dev), view_of(d_dev), n, stream);
    record_host_use(src);
    record_host_use(dst);
    return;
  }
  // Pageable host memory on one side: pack on that side, one copy across, unpack.
  const int64_t esz = src.element_size();
  Logical5 lp;
  if (sp == nullptr) {
    // src is pageable CPU memory, dst is on the device.
    at::Tensor packed = packed_blocks(ls, n, src.options(), lp);
    run_block_copy_cpu(static_cast<const char*>(src.const_data_ptr()), static_cast<char*>(packed.data_ptr()),
                       plan_block_copy(ls, lp, esz), view_of(src_ids_host), IdView{}, n);
    const at::Tensor packed_dev = packed.to(device);
    const at::Tensor d_dev = to_device(dst_ids_host);
    dispatch_block_copy(static_cast<const char*>(packed_dev.const_data_ptr()),
                        static_cast<char*>(const_cast<void*>(dp)), plan_block_copy(lp, ld, esz), IdView{},
                        view_of(d_dev), n, stream);
  } else {
    // dst is pageable CPU memory, src is on the device.
    at::Tensor packed_dev = packed_blocks(ls, n, src.options(), lp);
    const at::Tensor s_dev = to_device(src_ids_host);
    dispatch_block_copy(static_cast<const char*>(sp), static_cast<char*>(packed_dev.data_ptr()),
                        plan_block_copy(ls, lp, esz), view_of(s_dev), IdView{}, n, stream);
    const at::Tensor packed = packed_dev.cpu();  // synchronises the stream
    run_block_copy_cpu(static_cast<const char*>(packed.const_data_ptr()),
                       static_cast<char*>(dst.data_ptr()), plan_block_copy(lp, ld, esz),
                       IdView{}, view_of(dst_ids_host), n);
  }
}

// ---------------------------------------------------------------------------
// reshape_and_cache
// ---------------------------------------------------------------------------

struct ReshapeSide {
  const char* src;  // key or value
  char* cache;      // key_cache or value_cache, already offset to the layer slot
  int64_t s_t, s_h, s_c;       // source strides, elements
  int64_t c_b, c_h, c_n, c_c;  // cache strides, elements
  const float* scale_ptr;      // fp8 scale on the device, or nullptr
  float scale;                 // fp8 scale read on the host
};

__device__ __forceinline__ float fp8_saturate(float v) { return v < -448.f ? -448.f : (v > 448.f ? 448.f : v); }

// The side this CTA writes (blockIdx.y: 0 key, 1 value), field by field so it
// stays in registers (a runtime-selected reference to a kernel parameter
// would be copied to the stack).
__device__ __forceinline__ ReshapeSide pick_side(const ReshapeSide& k, const ReshapeSide& v) {
  const bool second = blockIdx.y != 0;
  ReshapeSide s;
  s.src = second ? v.src : k.src;
  s.cache = second ? v.cache : k.cache;
  s.s_t = second ? v.s_t : k.s_t;
  s.s_h = second ? v.s_h : k.s_h;
  s.s_c = second ? v.s_c : k.s_c;
  s.c_b = second ? v.c_b : k.c_b;
  s.c_h = second ? v.c_h : k.c_h;
  s.c_n = second ? v.c_n : k.c_n;
  s.c_c = second ? v.c_c : k.c_c;
  s.scale_ptr = second ? v.scale_ptr : k.scale_ptr;
  s.scale = second ? v.scale : k.scale;
  return s;
}

// One CTA per (token, key|value); element-wise, with the fp8 conversion.
template <typename in_t, typename out_t, bool kFp8>
__global__ void reshape_and_cache_kernel(ReshapeSide k, ReshapeSide v, const int64_t* slots, uint32_t H, uint32_t C,
                                         int64_t N, int64_t num_slots) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= num_slots) return;  // negative: skipped; too large: rejected on the host already
  const ReshapeSide s = pick_side(k, v);
  const in_t* src = reinterpret_cast<const in_t*>(s.src) + t * s.s_t;
  out_t* dst = reinterpret_cast<out_t*>(s.cache) + (slot / N) * s.c_b + (slot % N) * s.c_n;
  float scale = 1.f;
  if constexpr (kFp8) scale = s.scale_ptr != nullptr ? *s.scale_ptr : s.scale;
  const uint32_t total = H * C;
  for (uint32_t i = threadIdx.x; i < total; i += blockDim.x) {
    const int64_t h = i / C;
    const int64_t c = i - static_cast<uint32_t>(h) * C;
    const in_t x = src[h * s.s_h + c * s.s_c];
    if constexpr (kFp8) {
      dst[h * s.c_h + c * s.c_c] = out_t(fp8_saturate(static_cast<float>(x) / scale));
    } else {
      dst[h * s.c_h + c * s.c_c] = x;
    }
  }
}

// Same dtype, C contiguous on both sides: each head is a run of bytes copied
// in vectors of V.  Strides here are in bytes.
template <typename V>
__global__ void reshape_and_cache_copy_kernel(ReshapeSide k, ReshapeSide v, const int64_t* slots, uint32_t H,
                                              uint32_t run_vecs, int64_t N, int64_t num_slots) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= num_slots) return;
  const ReshapeSide s = pick_side(k, v);
  const char* src = s.src + t * s.s_t;
  char* dst = s.cache + (slot / N) * s.c_b + (slot % N) * s.c_n;
  const uint32_t total = H * run_vecs;
  for (uint32_t i = threadIdx.x; i < total; i += blockDim.x) {
    const uint32_t h = i / run_vecs;
    const uint32_t c = i - h * run_vecs;
    *reinterpret_cast<V*>(dst + h * s.c_h + c * sizeof(V)) =
        *reinterpret_cast<const V*>(src + h * s.s_h + c * sizeof(V));
  }
}

int threads_for(int64_t items) {
  return static_cast<int>(std::min<int64_t>(512, std::max<int64_t>(32, (items + 31) / 32 * 32)));
}

template <typename V>
void launch_reshape_copy(ReshapeSide k, ReshapeSide v, const int64_t* slots, int64_t T, int64_t H, int64_t run_bytes,
                         int64_t N, int64_t num_slots, cudaStream_t stream) {
  const uint32_t run_vecs = static_cast<uint32_t>(run_bytes / static_cast<int64_t>(sizeof(V)));
  TORCH_CHECK(int64_t{run_vecs} * H < (int64_t{1} << 31), "reshape_and_cache: too many heads x head_size");
  const dim3 grid(static_cast<unsigned>(T), 2);
  reshape_and_cache_copy_kernel<V>
      <<<grid, threads_for(run_vecs * H), 0, stream>>>(k, v, slots, static_cast<uint32_t>(H), run_vecs, N, num_slots);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename in_t>
void launch_reshape_elementwise(const ReshapeSide& k, const ReshapeSide& v, bool fp8, const int64_t* slots, int64_t T,
                                int64_t H, int64_t C, int64_t N, int64_t num_slots, cudaStream_t stream) {
  TORCH_CHECK(H * C < (int64_t{1} << 31), "reshape_and_cache: too many heads x head_size");
  const dim3 grid(static_cast<unsigned>(T), 2);
  const int threads = threads_for(H * C);
  const auto h = static_cast<uint32_t>(H), c = static_cast<uint32_t>(C);
  if (fp8) {
    reshape_and_cache_kernel<in_t, c10::Float8_e4m3fn, true><<<grid, threads, 0, stream>>>(k, v, slots, h, c, N, num_slots);
  } else {
    reshape_and_cache_kernel<in_t, in_t, false><<<grid, threads, 0, stream>>>(k, v, slots, h, c, N, num_slots);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void check_on(const at::Tensor& t, const at::Device& device, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.device() == device, op, ": ", name, " is on ", t.device(), " but the cache is on ", device);
}

void reshape_and_cache_cuda(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                            at::Tensor& value_cache, const at::Tensor& slot_mapping, c10::IntArrayRef stride_order,
                            int64_t layer, const std::optional<at::Tensor>& k_scale,
                            const std::optional<at::Tensor>& v_scale) {
  const char* op = "reshape_and_cache";
  ReshapeArgs a = check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, stride_order, layer,
                                          k_scale, v_scale);
  const at::Device device = key_cache.device();
  TORCH_CHECK_VALUE(device.is_cuda(), op, ": key_cache must be on a CUDA device, got ", device);
  check_on(value_cache, device, op, "value_cache");
  check_on(key, device, op, "key");
  check_on(value, device, op, "value");
  const c10::cuda::CUDAGuard guard(device);
  const int64_t B = a.key_cache.size[kB], N = a.key_cache.size[kN];
  at::Tensor slots;
  if (slot_mapping.is_cuda()) {
    check_on(slot_mapping, device, op, "slot_mapping");
    if (slot_mapping.numel() > 0 && slot_mapping.max().item<int64_t>() >= B * N) {
      check_slots(slot_mapping.cpu(), B, N, op);  // raises the reference's message
    }
    slots = slot_mapping.contiguous();
  } else {
    check_slots(slot_mapping, B, N, op);
    slots = host_ids_to_device(slot_mapping.contiguous(), device);
  }
  const int64_t T = a.num_tokens, H = a.num_heads, C = a.head_size;
  if (T == 0 || H == 0 || C == 0) return;
  TORCH_CHECK(T < (int64_t{1} << 31), "reshape_and_cache: too many tokens for one launch");
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  // fp8 scales: a device scale is read by the kernel, a host one passed by value.
  at::Tensor scale_dev[2];
  const std::optional<at::Tensor>* scales[2] = {&k_scale, &v_scale};
  ReshapeSide side[2];
  const at::Tensor* srcs[2] = {&key, &value};
  at::Tensor* caches[2] = {&key_cache, &value_cache};
  const Logical5* views[2] = {&a.key_cache, &a.value_cache};
  for (int i = 0; i < 2; ++i) {
    ReshapeSide& s = side[i];
    s.src = static_cast<const char*>(srcs[i]->const_data_ptr());
    s.cache = static_cast<char*>(caches[i]->data_ptr()) + layer * views[i]->stride[kL] * caches[i]->element_size();
    s.s_t = srcs[i]->stride(0);
    s.s_h = srcs[i]->stride(1);
    s.s_c = srcs[i]->stride(2);
    s.c_b = views[i]->stride[kB];
    s.c_h = views[i]->stride[kH];
    s.c_n = views[i]->stride[kN];
    s.c_c = views[i]->stride[kC];
    s.scale_ptr = nullptr;
    s.scale = 1.f;
    if (a.fp8 && scales[i]->has_value()) {
      const at::Tensor& sc = scales[i]->value();
      if (sc.is_cuda()) {
        check_on(sc, device, op, i == 0 ? "k_scale" : "v_scale");
        scale_dev[i] = sc.to(at::kFloat).contiguous();
        s.scale_ptr = scale_dev[i].const_data_ptr<float>();
      } else {
        s.scale = sc.to(at::kFloat).item<float>();
      }
    }
  }

  const int64_t* sp = slots.const_data_ptr<int64_t>();
  const int64_t esz = key.element_size();
  const bool rows_contiguous = !a.fp8 && side[0].s_c == 1 && side[1].s_c == 1 && side[0].c_c == 1 && side[1].c_c == 1;
  if (rows_contiguous) {
    // Byte strides for the vector kernel.
    uint64_t bits = static_cast<uint64_t>(C * esz);
    for (ReshapeSide& s : side) {
      s.s_t *= esz;
      s.s_h *= esz;
      s.c_b *= esz;
      s.c_h *= esz;
      s.c_n *= esz;
      bits |= reinterpret_cast<uintptr_t>(s.src) | reinterpret_cast<uintptr_t>(s.cache) |
              static_cast<uint64_t>(s.s_t) | static_cast<uint64_t>(s.s_h) | static_cast<uint64_t>(s.c_b) |
              static_cast<uint64_t>(s.c_h) | static_cast<uint64_t>(s.c_n);
    }
    if (bits % 16 == 0) {
      launch_reshape_copy<uint4>(side[0], side[1], sp, T, H, C * esz, N, B * N, stream);
    } else if (bits % 8 == 0) {
      launch_reshape_copy<uint2>(side[0], side[1], sp, T, H, C * esz, N, B * N, stream);
    } else if (bits % 4 == 0) {
      launch_reshape_copy<uint32_t>(side[0], side[1], sp, T, H, C * esz, N, B * N, stream);
    } else {
      launch_reshape_copy<uint16_t>(side[0], side[1], sp, T, H, C * esz, N, B * N, stream);
    }
    return;
  }
  switch (key.scalar_type()) {
    case at::kHalf:
      launch_reshape_elementwise<c10::Half>(side[0], side[1], a.fp8, sp, T, H, C, N, B * N, stream);
      break;
    case at::kBFloat16:
      launch_reshape_elementwise<c10::BFloat16>(side[0], side[1], a.fp8, sp, T, H, C, N, B * N, stream);
      break;
    default:
      launch_reshape_elementwise<float>(side[0], side[1], a.fp8, sp, T, H, C, N, B * N, stream);
      break;
  }
}

// ---------------------------------------------------------------------------
// Block ops
// ---------------------------------------------------------------------------

// Host copy of ids for the checks (synchronises when they live on the device).
at::Tensor host_ids(const at::Tensor& ids) { return ids.is_cpu() ? ids.contiguous() : ids.cpu().contiguous(); }

void convert_layout_cuda(const at::Tensor& src, at::Tensor& dst, c10::IntArrayRef src_order,
                         c10::IntArrayRef dst_order) {
  const char* op = "convert_layout";
  check_stride_order(src_order, op, "src_stride_order");
  check_stride_order(dst_order, op, "dst_stride_order");
  const Logical5 ls = logical_of(src, src_order, op, "src");
  const Logical5 ld = logical_of(dst, dst_order, op, "dst");
  check_same_logical_shape(ls, ld, false, op, "src", "dst");
  check_same_dtype(src, dst, op, "src", "dst");
  block_copy_cuda(src, ls, dst, ld, at::Tensor(), at::Tensor(), ls.size[kB], op);
}

void copy_blocks_cuda(at::Tensor& cache, const at::Tensor& block_mapping, c10::IntArrayRef stride_order) {
  const char* op = "copy_blocks";
  check_stride_order(stride_order, op);
  const Logical5 lc = logical_of(cache, stride_order, op, "cache");
  check_index_tensor(block_mapping, 2, op, "block_mapping");
  TORCH_CHECK_VALUE(cache.is_cuda(), op, ": cache must be on a CUDA device, got ", cache.device());
  const at::Tensor m = host_ids(block_mapping);
  check_block_mapping(m, lc.size[kB], lc.size[kB], true, op);
  block_copy_cuda(cache, lc, cache, lc, m.select(1, 0).contiguous(), m.select(1, 1).contiguous(), m.size(0), op);
}

void swap_blocks_cuda(const at::Tensor& src, at::Tensor& dst, const at::Tensor& block_mapping,
                      c10::IntArrayRef stride_order) {
  const char* op = "swap_blocks";
  check_stride_order(stride_order, op);
  const Logical5 ls = logical_of(src, stride_order, op, "src");
  const Logical5 ld = logical_of(dst, stride_order, op, "dst");
  check_same_logical_shape(ls, ld, true, op, "src", "dst");
  check_same_dtype(src, dst, op, "src", "dst");
  check_index_tensor(block_mapping, 2, op, "block_mapping");
  const at::Tensor m = host_ids(block_mapping);
  check_block_mapping(m, ls.size[kB], ld.size[kB], src.is_alias_of(dst), op);
  block_copy_cuda(src, ls, dst, ld, m.select(1, 0).contiguous(), m.select(1, 1).contiguous(), m.size(0), op);
}

void gather_blocks_cuda(const at::Tensor& cache, const at::Tensor& block_ids, at::Tensor& staging,
                        c10::IntArrayRef stride_order) {
  const char* op = "gather_blocks";
  auto [lc, lst] = check_staging_args(cache, block_ids, staging, stride_order, op);
  const at::Tensor ids = host_ids(block_ids);
  check_block_ids(ids, lc.size[kB], false, op, "block_ids");
  block_copy_cuda(cache, lc, staging, lst, ids, at::Tensor(), ids.numel(), op);
}

void scatter_blocks_cuda(const at::Tensor& staging, at::Tensor& cache, const at::Tensor& block_ids,
                         c10::IntArrayRef stride_order) {
  const char* op = "scatter_blocks";
  auto [lc, lst] = check_staging_args(cache, block_ids, staging, stride_order, op);
  const at::Tensor ids = host_ids(block_ids);
  check_block_ids(ids, lc.size[kB], true, op, "block_ids");
  block_copy_cuda(staging, lst, cache, lc, at::Tensor(), ids, ids.numel(), op);
}

}  // namespace

TORCH_LIBRARY_IMPL(kvcy, CUDA, m) {
  m.impl("reshape_and_cache", &reshape_and_cache_cuda);
  m.impl("convert_layout", &convert_layout_cuda);
  m.impl("copy_blocks", &copy_blocks_cuda);
  m.impl("swap_blocks", &swap_blocks_cuda);
  m.impl("gather_blocks", &gather_blocks_cuda);
  m.impl("scatter_blocks", &scatter_blocks_cuda);
}

}  // namespace kvcy

// ---------------------------------------------------------------------------
// compute_slot_mapping: one CTA per request, and one more for the padding.
// The value checks (offsets ordered, positions inside their rows) read the
// offsets and positions back to the host first, which synchronises: the
// price of never reading a block table out of bounds.
// ---------------------------------------------------------------------------
#include "kvcy_slot_mapping.h"

namespace kvcy {
namespace {

__global__ void compute_slot_mapping_kernel(const int64_t* qsl, const int64_t* pos, const int32_t* table,
                                            int64_t row_stride, int64_t* out, int64_t out_stride, int64_t num_reqs,
                                            int64_t num_tokens, int64_t max_tokens, int64_t block_size,
                                            int64_t cp_world_size, int64_t cp_rank, int64_t interleave) {
  const int64_t r = blockIdx.x;
  if (r == num_reqs) {
    for (int64_t t = num_tokens + threadIdx.x; t < max_tokens; t += blockDim.x) out[t * out_stride] = kPadSlotId;
    return;
  }
  const int32_t* row = table + r * row_stride;
  const int64_t end = qsl[r + 1];
  for (int64_t t = qsl[r] + threadIdx.x; t < end; t += blockDim.x) {
    out[t * out_stride] = slot_of(pos[t], row, block_size, cp_world_size, cp_rank, interleave);
  }
}

void compute_slot_mapping_cuda(const at::Tensor& query_start_loc, const at::Tensor& positions,
                               const at::Tensor& block_table, at::Tensor& slot_mapping, int64_t num_reqs,
                               int64_t block_size, int64_t cp_world_size, int64_t cp_rank,
                               int64_t cp_kv_cache_interleave_size) {
  check_compute_slot_mapping(query_start_loc, positions, block_table, slot_mapping, num_reqs, block_size,
                             cp_world_size, cp_rank, cp_kv_cache_interleave_size);
  const c10::cuda::CUDAGuard guard(slot_mapping.device());
  const int64_t num_tokens = positions.numel();
  const at::Tensor qsl =
      num_reqs > 0 ? query_start_loc.slice(0, 0, num_reqs + 1).to(at::kLong).contiguous() : at::Tensor();
  const at::Tensor pos = positions.contiguous();
  {
    const at::Tensor qsl_host = num_reqs > 0 ? qsl.cpu() : at::Tensor();
    const at::Tensor pos_host = pos.cpu();
    check_slot_mapping_values(num_reqs > 0 ? qsl_host.const_data_ptr<int64_t>() : nullptr, num_reqs,
                              pos_host.const_data_ptr<int64_t>(), num_tokens, block_table.size(1),
                              block_size * cp_world_size);
  }
  const int64_t max_tokens = slot_mapping.numel();
  if (num_reqs == 0 && num_tokens >= max_tokens) return;
  const at::Tensor bt = block_table.stride(1) == 1 ? block_table : block_table.contiguous();
  const int threads = 256;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  compute_slot_mapping_kernel<<<static_cast<unsigned>(num_reqs + 1), threads, 0, stream>>>(
      num_reqs > 0 ? qsl.const_data_ptr<int64_t>() : nullptr, pos.const_data_ptr<int64_t>(),
      bt.const_data_ptr<int32_t>(), bt.stride(0), slot_mapping.data_ptr<int64_t>(), slot_mapping.stride(0),
      num_reqs, num_tokens, max_tokens, block_size, cp_world_size, cp_rank, cp_kv_cache_interleave_size);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

TORCH_LIBRARY_IMPL(kvcy, CUDA, m) { m.impl("compute_slot_mapping", &compute_slot_mapping_cuda); }

}  // namespace kvcy
