// Green contexts.
//
// A device is SMs 0..131. A CUdevResource of the double is a range of them:
// smCount from its first SM, which _internal_padding holds with the device,
// a marker and whether it may be split (only the API writes a resource, so
// the padding is the driver's own). Parts follow compute capability 9.0
// whatever the flags: at least 8 SMs, multiples of 8. As the driver
// documents, a green context retains its device's primary context, and
// the parts a split makes cannot be split again (only a device's or a
// green context's SMs can).

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tests/fake_cuda/fake_cuda_internal.h"

namespace gxfake::internal {
namespace {

constexpr unsigned kDeviceSms = kFakeMultiprocessors;
// minSmPartitionSize and smCoscheduledAlignment of compute capability 9.0.
constexpr unsigned kSmPartStep = 8;
constexpr uint64_t kFakeSmMagic = 0x47585245534d3100;  // "GXRESM1"

struct FakeSmResource {
  uint64_t magic;
  int32_t device;
  uint32_t first_sm;
  uint32_t splittable;  // From cuDeviceGetDevResource or cuGreenCtxGetDevResource.
};
static_assert(sizeof(FakeSmResource) <= sizeof(CUdevResource::_internal_padding));

// A descriptor is exactly an SM range.
using SmRange = CUdevResourceDesc_st;

void WriteSmResource(CUdevResource* r, const SmRange& range, bool splittable) {
  std::memset(r, 0, sizeof(*r));
  r->type = CU_DEV_RESOURCE_TYPE_SM;
  const FakeSmResource f{kFakeSmMagic, range.device, range.first_sm, splittable};
  std::memcpy(r->_internal_padding, &f, sizeof(f));
  r->sm.smCount = range.sm_count;
  r->sm.minSmPartitionSize = kSmPartStep;
  r->sm.smCoscheduledAlignment = kSmPartStep;
}

// The range of an SM resource the double made.
CUresult ReadSmResource(const CUdevResource* r, SmRange* out, bool* splittable = nullptr) {
  if (r == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (r->type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
  FakeSmResource f;
  std::memcpy(&f, r->_internal_padding, sizeof(f));
  if (f.magic != kFakeSmMagic || uint64_t{f.first_sm} + r->sm.smCount > kDeviceSms ||
      CheckDevice(f.device) != CUDA_SUCCESS) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *out = {f.device, f.first_sm, r->sm.smCount};
  if (splittable != nullptr) *splittable = f.splittable != 0;
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace gxfake::internal

using namespace gxfake::internal;  // NOLINT(build/namespaces): the entry points are global

GX_EXPORT CUresult cuDeviceGetDevResource(CUdevice device, CUdevResource* resource,
                                          CUdevResourceType type) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (resource == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GX_RETURN_IF_ERROR(CheckDevice(device));
  if (type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
  WriteSmResource(resource, {device, 0, kDeviceSms}, /*splittable=*/true);
  return CUDA_SUCCESS;
}

// Groups of minCount SMs (rounded up to a multiple of 8) in order from the
// input's first SM; with result null, only counts the groups that fit.
GX_EXPORT CUresult cuDevSmResourceSplitByCount(CUdevResource* result, unsigned int* nbGroups,
                                               const CUdevResource* input, CUdevResource* remaining,
                                               unsigned int useFlags, unsigned int minCount) {
  GX_RETURN_IF_ERROR(EntryStatus());
  // 1: IGNORE_SM_COSCHEDULING, 2: MAX_POTENTIAL_CLUSTER_SIZE (no effect here).
  if (nbGroups == nullptr || useFlags > 2 || (result != nullptr && *nbGroups == 0)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  SmRange in;
  bool splittable = false;
  GX_RETURN_IF_ERROR(ReadSmResource(input, &in, &splittable));
  if (!splittable) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
  const uint64_t size = std::max<uint64_t>(
      kSmPartStep, (uint64_t{minCount} + kSmPartStep - 1) / kSmPartStep * kSmPartStep);
  if (size > in.sm_count) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
  const unsigned fit = static_cast<unsigned>(in.sm_count / size);
  if (result == nullptr) {
    *nbGroups = fit;
    return CUDA_SUCCESS;
  }
  const unsigned made = std::min(*nbGroups, fit);
  const unsigned used = made * static_cast<unsigned>(size);
  for (unsigned i = 0; i < made; ++i) {
    WriteSmResource(
        &result[i],
        {in.device, in.first_sm + i * static_cast<unsigned>(size), static_cast<unsigned>(size)},
        /*splittable=*/false);
  }
  *nbGroups = made;
  if (remaining != nullptr) {
    WriteSmResource(remaining, {in.device, in.first_sm + used, in.sm_count - used},
                    /*splittable=*/false);
  }
  return CUDA_SUCCESS;
}

// SM resources of one device whose SMs, in order of their first SM, follow
// each other without a gap (else INVALID_RESOURCE_CONFIGURATION; the driver
// asks for the outputs of one split, which the double does not track): the
// descriptor is their union.
GX_EXPORT CUresult cuDevResourceGenerateDesc(CUdevResourceDesc* phDesc, CUdevResource* resources,
                                             unsigned int nbResources) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (phDesc == nullptr || resources == nullptr || nbResources == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::vector<SmRange> ranges(nbResources);
  for (unsigned int i = 0; i < nbResources; ++i) {
    GX_RETURN_IF_ERROR(ReadSmResource(&resources[i], &ranges[i]));
    if (ranges[i].sm_count == 0) return CUDA_ERROR_INVALID_VALUE;
    if (ranges[i].device != ranges[0].device) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const SmRange& a, const SmRange& b) { return a.first_sm < b.first_sm; });
  auto desc = std::make_unique<CUdevResourceDesc_st>(ranges[0]);
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first_sm != desc->first_sm + desc->sm_count) {
      return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
    }
    desc->sm_count += ranges[i].sm_count;
  }
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  *phDesc = desc.get();
  d.resource_descs.emplace(desc.get(), std::move(desc));
  return CUDA_SUCCESS;
}

// Retains the device's primary context until cuGreenCtxDestroy.
GX_EXPORT CUresult cuGreenCtxCreate(CUgreenCtx* phCtx, CUdevResourceDesc desc, CUdevice dev,
                                    unsigned int flags) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (phCtx == nullptr || flags != CU_GREEN_CTX_DEFAULT_STREAM) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  Device* device = DeviceLocked(d, dev);
  if (device == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  auto it = d.resource_descs.find(desc);
  if (it == d.resource_descs.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (it->second->device != dev) return CUDA_ERROR_INVALID_VALUE;
  RetainLocked(device->context);
  auto g = std::make_shared<CUgreenCtx_st>();
  g->device = dev;
  g->first_sm = it->second->first_sm;
  g->sm_count = it->second->sm_count;
  *phCtx = g.get();
  d.green_contexts.emplace(g.get(), std::move(g));
  return CUDA_SUCCESS;
}

// Releases the primary context (the last release tears it down). Streams
// made in it live on, but every later call with one fails with
// CONTEXT_IS_DESTROYED (cuStreamDestroy still destroys it).
GX_EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx hCtx) {
  GX_RETURN_IF_ERROR(InitStatus());
  Driver& d = GetDriver();
  CUctx_st* to_tear_down = nullptr;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.green_contexts.find(hCtx);
    if (it == d.green_contexts.end()) return CUDA_ERROR_INVALID_HANDLE;
    it->second->destroyed.store(true);
    CUctx_st& ctx = d.devices[hCtx->device]->context;
    d.green_contexts.erase(it);
    if (ReleaseLocked(ctx)) to_tear_down = &ctx;
  }
  if (to_tear_down != nullptr) TearDownContext(to_tear_down);
  return StickyStatus();
}

GX_EXPORT CUresult cuGreenCtxGetDevResource(CUgreenCtx hCtx, CUdevResource* resource,
                                            CUdevResourceType type) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (resource == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.green_contexts.find(hCtx);
  if (it == d.green_contexts.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
  WriteSmResource(resource, {hCtx->device, hCtx->first_sm, hCtx->sm_count},
                  /*splittable=*/true);
  return CUDA_SUCCESS;
}

// The stream belongs to the primary context of the green context's device
// (which the green context retains), so that its memory and modules work
// with it. The priority is clamped into the range, as cuStreamCreateWithPriority's.
GX_EXPORT CUresult cuGreenCtxStreamCreate(CUstream* phStream, CUgreenCtx greenCtx,
                                          unsigned int flags, int priority) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (phStream == nullptr || flags != CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.green_contexts.find(greenCtx);
  if (it == d.green_contexts.end()) return CUDA_ERROR_INVALID_HANDLE;
  *phStream =
      AddStreamLocked(d, &d.devices[greenCtx->device]->context, flags, priority, it->second);
  return CUDA_SUCCESS;
}

// --- Test-only exports ---

// Live green contexts (made and not yet destroyed).
GX_EXPORT uint64_t gxfake_green_contexts(void) {
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  return d.green_contexts.size();
}

// --- Signatures ---

GX_CHECK_SIGNATURE(cuDeviceGetDevResource, cuDeviceGetDevResource);
GX_CHECK_SIGNATURE(cuDevSmResourceSplitByCount, cuDevSmResourceSplitByCount);
GX_CHECK_SIGNATURE(cuDevResourceGenerateDesc, cuDevResourceGenerateDesc);
GX_CHECK_SIGNATURE(cuGreenCtxCreate, cuGreenCtxCreate);
GX_CHECK_SIGNATURE(cuGreenCtxDestroy, cuGreenCtxDestroy);
GX_CHECK_SIGNATURE(cuGreenCtxGetDevResource, cuGreenCtxGetDevResource);
GX_CHECK_SIGNATURE(cuGreenCtxStreamCreate, cuGreenCtxStreamCreate);
