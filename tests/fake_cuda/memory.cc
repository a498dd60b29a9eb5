// Memory. "Device memory" is host memory: a CUdeviceptr is the address of an
// aligned host block, and every allocation is tracked so that copies and
// kernels can be checked against live allocations of the right device. Here
// are allocation and free (also in stream order), memsets and copies,
// page-locked and registered host memory, and the default memory pools.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "tests/fake_cuda/fake_cuda_internal.h"

namespace gxfake::internal {
namespace {

constexpr size_t kDeviceAlignment = 256;
constexpr size_t kHostAlignment = 4096;

// Requires Driver::mu. The allocation of `device` that contains all of
// [addr, addr + bytes), or null.
const Allocation* FindRangeLocked(Driver& d, uintptr_t addr, size_t bytes, int device,
                                  bool allow_free_pending) {
  auto it = d.allocations.upper_bound(addr);
  if (it == d.allocations.begin()) return nullptr;
  --it;
  const Allocation& a = it->second;
  if (a.device != device) return nullptr;
  if (a.free_pending && !allow_free_pending) return nullptr;
  const uintptr_t offset = addr - it->first;
  if (bytes > a.size || offset > a.size - bytes) return nullptr;
  return &a;
}

CUresult AllocateDevice(CUctx_st* ctx, size_t bytes, CUdeviceptr* out) {
  if (out == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  Device& dev = *d.devices[ctx->device];
  if (bytes > dev.total_bytes - dev.allocated_bytes) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const size_t rounded = (bytes + kDeviceAlignment - 1) / kDeviceAlignment * kDeviceAlignment;
  void* block = std::aligned_alloc(kDeviceAlignment, rounded);
  if (block == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  Allocation a;
  a.size = bytes;
  a.device = ctx->device;
  d.allocations.emplace(reinterpret_cast<uintptr_t>(block), a);
  dev.allocated_bytes += bytes;
  *out = reinterpret_cast<CUdeviceptr>(block);
  return CUDA_SUCCESS;
}

}  // namespace

bool RangeIsLive(uintptr_t addr, size_t bytes, int device, bool allow_free_pending) {
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  return FindRangeLocked(d, addr, bytes, device, allow_free_pending) != nullptr;
}

void FreeAllocationLocked(Driver& d, uintptr_t base) {
  auto it = d.allocations.find(base);
  if (it == d.allocations.end()) return;
  d.devices[it->second.device]->allocated_bytes -= it->second.size;
  std::free(reinterpret_cast<void*>(base));
  d.allocations.erase(it);
}

StreamOp MemsetOp(const MemsetShape& m, int device) {
  StreamOp op;
  op.run = [m, device] {
    if (!RangeIsLive(m.dst, m.Span(), device, true)) {
      Poison("memset");
      return;
    }
    for (size_t row = 0; row < m.height; ++row) {
      uint8_t* at = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(m.dst + row * m.pitch));
      if (m.element_size == 1) {
        std::memset(at, static_cast<uint8_t>(m.value), m.width);
        continue;
      }
      for (size_t i = 0; i < m.width; ++i) {  // The value's low bytes, as the GPU stores them.
        std::memcpy(at + i * m.element_size, &m.value, m.element_size);
      }
    }
  };
  return op;
}

StreamOp CopyOp(CUdeviceptr dst, CUdeviceptr src, size_t bytes, int device) {
  StreamOp op;
  op.run = [dst, src, bytes, device] {
    if (!RangeIsLive(dst, bytes, device, true) || !RangeIsLive(src, bytes, device, true)) {
      Poison("memcpy DtoD");
      return;
    }
    std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
  };
  return op;
}

}  // namespace gxfake::internal

using namespace gxfake::internal;  // NOLINT(build/namespaces): the entry points are global

// --- Memory ---

GX_EXPORT CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  const Device& device = *d.devices[ctx->device];
  *free = device.total_bytes - device.allocated_bytes;
  *total = device.total_bytes;
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  return AllocateDevice(ctx, bytesize, dptr);
}

// Frees at once; the pointer must be the base of a live allocation.
GX_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  GX_RETURN_IF_ERROR(InitStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  if (dptr == 0) return StickyStatus();
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.allocations.find(static_cast<uintptr_t>(dptr));
  if (it == d.allocations.end() || it->second.free_pending) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  FreeAllocationLocked(d, it->first);
  return StickyStatus();
}

// Allocates at once (allowed: the memory is usable earlier than promised).
GX_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  std::shared_ptr<CUstream_st> stream;
  GX_RETURN_IF_ERROR(ResolveStream(hStream, ctx, &stream));
  return AllocateDevice(ctx, bytesize, dptr);
}

// Frees in stream order: the block stays mapped for work queued before it.
GX_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  GX_RETURN_IF_ERROR(InitStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  std::shared_ptr<CUstream_st> stream;
  GX_RETURN_IF_ERROR(ResolveStream(hStream, ctx, &stream));
  const uintptr_t base = static_cast<uintptr_t>(dptr);
  Driver& d = GetDriver();
  {
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.allocations.find(base);
    if (it == d.allocations.end() || it->second.free_pending || it->second.device != ctx->device) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    it->second.free_pending = true;
  }
  StreamOp op;
  op.droppable = false;
  op.run = [base] {
    Driver& d = GetDriver();
    std::lock_guard<std::mutex> lock(d.mu);
    FreeAllocationLocked(d, base);
  };
  if (Enqueue(stream, std::move(op)) != CUDA_SUCCESS) {
    std::lock_guard<std::mutex> lock(d.mu);
    FreeAllocationLocked(d, base);  // The stream is going away: free now.
  }
  return StickyStatus();
}

GX_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                   CUstream hStream) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  std::shared_ptr<CUstream_st> stream;
  GX_RETURN_IF_ERROR(ResolveStream(hStream, ctx, &stream));
  if (N == 0) return CUDA_SUCCESS;
  const int device = ctx->device;
  if (!RangeIsLive(dstDevice, N, device, false)) return CUDA_ERROR_INVALID_VALUE;
  MemsetShape m;
  m.dst = dstDevice;
  m.value = uc;
  m.width = N;
  return Enqueue(stream, MemsetOp(m, device));
}

// A copy between host memory and the device, in stream order: the device
// range must be live when enqueued and still live when the copy runs.
static CUresult EnqueueHostCopy(CUdeviceptr device_ptr, void* host, size_t bytes, bool to_device,
                                CUstream hStream) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  std::shared_ptr<CUstream_st> stream;
  GX_RETURN_IF_ERROR(ResolveStream(hStream, ctx, &stream));
  if (bytes == 0) return CUDA_SUCCESS;
  const int device = ctx->device;
  if (host == nullptr || !RangeIsLive(device_ptr, bytes, device, false)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  StreamOp op;
  op.run = [device_ptr, host, bytes, device, to_device] {
    if (!RangeIsLive(device_ptr, bytes, device, true)) {
      Poison(to_device ? "memcpy HtoD" : "memcpy DtoH");
      return;
    }
    void* dev = reinterpret_cast<void*>(device_ptr);
    if (to_device) {
      std::memcpy(dev, host, bytes);
    } else {
      std::memcpy(host, dev, bytes);
    }
  };
  return Enqueue(stream, std::move(op));
}

GX_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void* srcHost,
                                        size_t ByteCount, CUstream hStream) {
  return EnqueueHostCopy(dstDevice, const_cast<void*>(srcHost), ByteCount, /*to_device=*/true,
                         hStream);
}

GX_EXPORT CUresult cuMemcpyDtoHAsync_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                        CUstream hStream) {
  return EnqueueHostCopy(srcDevice, dstHost, ByteCount, /*to_device=*/false, hStream);
}

GX_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                        size_t ByteCount, CUstream hStream) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  std::shared_ptr<CUstream_st> stream;
  GX_RETURN_IF_ERROR(ResolveStream(hStream, ctx, &stream));
  if (ByteCount == 0) return CUDA_SUCCESS;
  const int device = ctx->device;
  if (!RangeIsLive(dstDevice, ByteCount, device, false) ||
      !RangeIsLive(srcDevice, ByteCount, device, false)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return Enqueue(stream, CopyOp(dstDevice, srcDevice, ByteCount, device));
}

// Page-locked host memory is plain aligned host memory here.
GX_EXPORT CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  constexpr unsigned int kKnownFlags =
      CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if (pp == nullptr || bytesize == 0 || (Flags & ~kKnownFlags) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (bytesize > SIZE_MAX - kHostAlignment) return CUDA_ERROR_OUT_OF_MEMORY;
  const size_t rounded = (bytesize + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  void* block = std::aligned_alloc(kHostAlignment, rounded);
  if (block == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  d.host_allocations.emplace(block, bytesize);
  *pp = block;
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuMemFreeHost(void* p) {
  GX_RETURN_IF_ERROR(InitStatus());
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.host_allocations.find(p);
  if (it == d.host_allocations.end()) return CUDA_ERROR_INVALID_VALUE;
  std::free(p);
  d.host_allocations.erase(it);
  return StickyStatus();
}

// Records the range and does nothing else: all host memory is "pinned" here.
GX_EXPORT CUresult cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  if (p == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  if (bytesize > UINTPTR_MAX - begin) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  auto next = d.host_registrations.lower_bound(begin);
  if (next != d.host_registrations.end() && next->first < begin + bytesize) {
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  if (next != d.host_registrations.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > begin) {
      return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
  }
  d.host_registrations.emplace(begin, bytesize);
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuMemHostUnregister(void* p) {
  GX_RETURN_IF_ERROR(InitStatus());
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.host_registrations.erase(reinterpret_cast<uintptr_t>(p)) == 0) {
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  }
  return StickyStatus();
}

GX_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool_out, CUdevice dev) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (pool_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  Device* device = DeviceLocked(d, dev);
  if (device == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  *pool_out = &device->pool;
  return CUDA_SUCCESS;
}

namespace {

bool IsKnownPool(CUmemoryPool pool) {
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  for (const auto& device : d.devices) {
    if (&device->pool == pool) return true;
  }
  return false;
}

}  // namespace

GX_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (value == nullptr || !IsKnownPool(pool)) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (!IsKnownPool(pool)) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

// --- Test-only exports ---

// Device bytes currently allocated, summed over all devices.
GX_EXPORT uint64_t gxfake_bytes_allocated(void) {
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  uint64_t total = 0;
  for (const auto& device : d.devices) total += device->allocated_bytes;
  return total;
}

// --- Signatures ---

GX_CHECK_SIGNATURE(cuMemGetInfo_v2, cuMemGetInfo);
GX_CHECK_SIGNATURE(cuMemAlloc_v2, cuMemAlloc);
GX_CHECK_SIGNATURE(cuMemFree_v2, cuMemFree);
GX_CHECK_SIGNATURE(cuMemAllocAsync, cuMemAllocAsync);
GX_CHECK_SIGNATURE(cuMemFreeAsync, cuMemFreeAsync);
GX_CHECK_SIGNATURE(cuMemsetD8Async, cuMemsetD8Async);
GX_CHECK_SIGNATURE(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync);
GX_CHECK_SIGNATURE(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync);
GX_CHECK_SIGNATURE(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync);
GX_CHECK_SIGNATURE(cuMemHostAlloc, cuMemHostAlloc);
GX_CHECK_SIGNATURE(cuMemFreeHost, cuMemFreeHost);
GX_CHECK_SIGNATURE(cuMemHostRegister_v2, cuMemHostRegister);
GX_CHECK_SIGNATURE(cuMemHostUnregister, cuMemHostUnregister);
GX_CHECK_SIGNATURE(cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool);
GX_CHECK_SIGNATURE(cuMemPoolSetAttribute, cuMemPoolSetAttribute);
GX_CHECK_SIGNATURE(cuMemPoolTrimTo, cuMemPoolTrimTo);
