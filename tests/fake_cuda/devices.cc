// Devices and their primary contexts: the device queries, the retain and
// release of a primary context (its last release tears down all that it
// owns), and the context current on each thread.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "tests/fake_cuda/fake_cuda_internal.h"

namespace gxfake::internal {
namespace {

// The context made current on this thread by cuCtxSetCurrent (not owned).
thread_local CUctx_st* t_current_context = nullptr;

}  // namespace

CUresult CurrentContext(CUctx_st** out) {
  CUctx_st* ctx = t_current_context;
  if (ctx == nullptr || !ctx->active.load(std::memory_order_acquire)) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  *out = ctx;
  return CUDA_SUCCESS;
}

void RetainLocked(CUctx_st& ctx) {
  ++ctx.retain_count;
  ctx.active.store(true, std::memory_order_release);
}

bool ReleaseLocked(CUctx_st& ctx) {
  if (--ctx.retain_count != 0) return false;
  ctx.active.store(false, std::memory_order_release);
  return true;
}

void TearDownContext(CUctx_st* ctx) {
  Driver& d = GetDriver();
  std::vector<std::shared_ptr<CUstream_st>> streams;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    for (auto it = d.streams.begin(); it != d.streams.end();) {
      if (it->second->context == ctx) {
        streams.push_back(std::move(it->second));
        it = d.streams.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = d.events.begin(); it != d.events.end();) {
      it = it->second->context == ctx ? d.events.erase(it) : std::next(it);
    }
    for (auto it = d.modules.begin(); it != d.modules.end();) {
      if (it->second->context == ctx) {
        for (auto& f : it->second->functions) d.functions.erase(f.get());
        it = d.modules.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& s : streams) StopStream(s.get());
  std::lock_guard<std::mutex> lock(d.mu);
  std::vector<uintptr_t> bases;
  for (const auto& [base, a] : d.allocations) {
    if (a.device == ctx->device) bases.push_back(base);
  }
  for (uintptr_t base : bases) FreeAllocationLocked(d, base);
}

}  // namespace gxfake::internal

using namespace gxfake::internal;  // NOLINT(build/namespaces): the entry points are global

// --- Devices ---

GX_EXPORT CUresult cuDeviceGetCount(int* count) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  *count = static_cast<int>(d.devices.size());
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GX_RETURN_IF_ERROR(CheckDevice(ordinal));
  *device = ordinal;
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  const Device* device = DeviceLocked(d, dev);
  if (device == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  const size_t n = std::min(device->name.size(), static_cast<size_t>(len) - 1);
  std::memcpy(name, device->name.data(), n);
  name[n] = '\0';
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GX_RETURN_IF_ERROR(CheckDevice(dev));
  // An H100-like sm_90 part. Unlisted attributes read as 0.
  static const std::pair<CUdevice_attribute, int> kAttributes[] = {
      {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, kMaxThreadsPerBlock},
      {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, static_cast<int>(kMaxBlockDim[0])},
      {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, static_cast<int>(kMaxBlockDim[1])},
      {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, static_cast<int>(kMaxBlockDim[2])},
      {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, static_cast<int>(kMaxGridDim[0])},
      {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, static_cast<int>(kMaxGridDim[1])},
      {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, static_cast<int>(kMaxGridDim[2])},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, kMaxSharedPerBlock},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, kMaxSharedPerBlockOptin},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 233472},
      {CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 65536},
      {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65536},
      {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, 65536},
      {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048},
      {CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32},
      {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
      {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
      {CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 1},
      {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1},
      {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
      {CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1},
      {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1},
      {CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 1},
  };
  *pi = 0;
  for (const auto& [attribute, value] : kAttributes) {
    if (attribute == attrib) *pi = value;
  }
  if (attrib == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) *pi = dev + 1;
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  const Device* device = DeviceLocked(d, dev);
  if (device == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = device->total_bytes;
  return CUDA_SUCCESS;
}

// --- Primary contexts ---

GX_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  Device* device = DeviceLocked(d, dev);
  if (device == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  RetainLocked(device->context);
  *pctx = &device->context;
  return CUDA_SUCCESS;
}

// The last release destroys everything the context owns: streams (after
// their queued work), events, modules and device allocations.
GX_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  GX_RETURN_IF_ERROR(InitStatus());
  Driver& d = GetDriver();
  CUctx_st* to_tear_down = nullptr;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    Device* device = DeviceLocked(d, dev);
    if (device == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    if (device->context.retain_count == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (ReleaseLocked(device->context)) to_tear_down = &device->context;
  }
  if (to_tear_down != nullptr) TearDownContext(to_tear_down);
  return StickyStatus();
}

GX_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (ctx != nullptr) {
    Driver& d = GetDriver();
    std::lock_guard<std::mutex> lock(d.mu);
    bool known = false;
    for (const auto& device : d.devices) known |= (&device->context == ctx);
    if (!known) return CUDA_ERROR_INVALID_CONTEXT;
  }
  t_current_context = ctx;
  return CUDA_SUCCESS;
}

// The context cuCtxSetCurrent made current on this thread (null when
// none), as the driver answers, whether or not it is still retained.
GX_EXPORT CUresult cuCtxGetCurrent(CUcontext* pctx) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = t_current_context;
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuCtxSynchronize(void) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  std::vector<std::shared_ptr<CUstream_st>> streams;
  {
    Driver& d = GetDriver();
    std::lock_guard<std::mutex> lock(d.mu);
    for (const auto& [handle, s] : d.streams) {
      if (s->context == ctx) streams.push_back(s);
    }
  }
  for (const auto& s : streams) DrainStream(s.get());
  return StickyStatus();
}

// --- Signatures ---

GX_CHECK_SIGNATURE(cuDeviceGetCount, cuDeviceGetCount);
GX_CHECK_SIGNATURE(cuDeviceGet, cuDeviceGet);
GX_CHECK_SIGNATURE(cuDeviceGetName, cuDeviceGetName);
GX_CHECK_SIGNATURE(cuDeviceGetAttribute, cuDeviceGetAttribute);
GX_CHECK_SIGNATURE(cuDeviceTotalMem_v2, cuDeviceTotalMem);
GX_CHECK_SIGNATURE(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain);
GX_CHECK_SIGNATURE(cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease);
GX_CHECK_SIGNATURE(cuCtxSetCurrent, cuCtxSetCurrent);
GX_CHECK_SIGNATURE(cuCtxGetCurrent, cuCtxGetCurrent);
GX_CHECK_SIGNATURE(cuCtxSynchronize, cuCtxSynchronize);
