// Kernel launches and occupancy. A launch is checked as the driver checks it
// (geometry, dynamic shared memory, clusters, cooperative grids against the
// double's occupancy), takes a copy of its arguments, and runs its model in
// stream order on the stream's SMs (a green context's, else the device's).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tests/fake_cuda/fake_cuda_internal.h"

namespace gxfake::internal {
namespace {

struct LaunchRequest {
  unsigned grid[3];
  unsigned block[3];
  unsigned shared_bytes;
  CUstream stream;
  unsigned cluster[3] = {1, 1, 1};
  bool cooperative = false;
};

// Blocks of `threads` threads and `shared` bytes resident on one
// multiprocessor: the double's occupancy (2048 threads, 32 blocks and
// 228 KiB of shared memory a multiprocessor).
int FakeBlocksPerMultiprocessor(uint64_t threads, uint64_t shared) {
  if (threads == 0 || threads > kMaxThreadsPerBlock) return 0;
  uint64_t n = std::min<uint64_t>(32, 2048 / threads);
  if (shared > 0) n = std::min<uint64_t>(n, (228 * 1024) / shared);
  return static_cast<int>(n);
}

CUresult Launch(CUfunction f, const LaunchRequest& r, void** kernel_params, void** extra) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  if (extra != nullptr) return CUDA_ERROR_INVALID_VALUE;  // Not supported.

  Driver& d = GetDriver();
  const KernelDef* kernel = nullptr;
  int max_dynamic_shared = 0;
  int non_portable_cluster = 0;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    if (f == nullptr || d.functions.count(f) == 0) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    if (f->module->context != ctx) return CUDA_ERROR_INVALID_HANDLE;
    kernel = f->kernel;
    max_dynamic_shared = f->max_dynamic_shared;
    non_portable_cluster = f->non_portable_cluster_size_allowed;
  }

  uint64_t threads = 1;
  for (int i = 0; i < 3; ++i) {
    if (r.grid[i] == 0 || r.grid[i] > kMaxGridDim[i]) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (r.block[i] == 0 || r.block[i] > kMaxBlockDim[i]) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    threads *= r.block[i];
  }
  if (threads > static_cast<uint64_t>(kMaxThreadsPerBlock)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (r.shared_bytes > static_cast<unsigned>(kMaxSharedPerBlockOptin) ||
      r.shared_bytes > static_cast<unsigned>(max_dynamic_shared)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  uint64_t cluster_size = 1;
  for (int i = 0; i < 3; ++i) {
    if (r.cluster[i] == 0) return CUDA_ERROR_INVALID_VALUE;
    cluster_size *= r.cluster[i];
  }
  const unsigned max_cluster =
      non_portable_cluster ? kMaxNonPortableClusterSize : kMaxPortableClusterSize;
  if (cluster_size > max_cluster) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
  for (int i = 0; i < 3; ++i) {
    if (r.grid[i] % r.cluster[i] != 0) return CUDA_ERROR_INVALID_VALUE;
  }
  std::shared_ptr<CUstream_st> stream;
  GX_RETURN_IF_ERROR(ResolveStream(r.stream, ctx, &stream));
  // A green context's stream runs on its SMs.
  const CUgreenCtx_st* green = stream ? stream->green.get() : nullptr;
  const unsigned first_sm = green ? green->first_sm : 0;
  const unsigned sm_count = green ? green->sm_count : kFakeMultiprocessors;
  if (r.cooperative) {
    const uint64_t resident =
        uint64_t{static_cast<unsigned>(FakeBlocksPerMultiprocessor(threads, r.shared_bytes))} *
        sm_count / cluster_size * cluster_size;
    if (uint64_t{r.grid[0]} * r.grid[1] * r.grid[2] > resident) {
      return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    }
  }

  // A kernel the double has no model of loads but cannot run.
  if (kernel == nullptr) return CUDA_ERROR_NOT_SUPPORTED;

  // Copy the argument values now, as the driver does.
  auto launch = std::make_shared<KernelLaunch>();
  launch->device = ctx->device;
  for (int i = 0; i < 3; ++i) {
    launch->grid[i] = r.grid[i];
    launch->block[i] = r.block[i];
    launch->cluster[i] = r.cluster[i];
  }
  launch->shared_bytes = r.shared_bytes;
  launch->cooperative = r.cooperative;
  launch->first_sm = first_sm;
  launch->sm_count = sm_count;
  launch->args.assign(kernel->ArgBytes(), 0);
  if (!kernel->params.empty()) {
    if (kernel_params == nullptr) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < kernel->params.size(); ++i) {
      if (kernel_params[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
      std::memcpy(launch->args.data() + kernel->params[i].offset, kernel_params[i],
                  kernel->params[i].size);
    }
  }

  StreamOp op;
  op.run = [kernel, launch] {
    if (!kernel->body(*launch)) Poison(kernel->name);
  };
  return Enqueue(stream, std::move(op));
}

}  // namespace
}  // namespace gxfake::internal

using namespace gxfake::internal;  // NOLINT(build/namespaces): the entry points are global

// --- Launch ---

GX_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                  unsigned int gridDimZ, unsigned int blockDimX,
                                  unsigned int blockDimY, unsigned int blockDimZ,
                                  unsigned int sharedMemBytes, CUstream hStream,
                                  void** kernelParams, void** extra) {
  LaunchRequest r{
      {gridDimX, gridDimY, gridDimZ}, {blockDimX, blockDimY, blockDimZ}, sharedMemBytes, hStream};
  return Launch(f, r, kernelParams, extra);
}

// Honours the cluster dimension and the cooperative attribute (a grid
// larger than the double's occupancy is refused); checks the cluster
// scheduling policy and programmatic stream serialization values; other
// attributes are accepted and ignored.
GX_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** kernelParams,
                                    void** extra) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (config->numAttrs > 0 && config->attrs == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  LaunchRequest r{{config->gridDimX, config->gridDimY, config->gridDimZ},
                  {config->blockDimX, config->blockDimY, config->blockDimZ},
                  config->sharedMemBytes,
                  config->hStream};
  for (unsigned int i = 0; i < config->numAttrs; ++i) {
    const CUlaunchAttribute& attr = config->attrs[i];
    if (attr.id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
      r.cluster[0] = attr.value.clusterDim.x;
      r.cluster[1] = attr.value.clusterDim.y;
      r.cluster[2] = attr.value.clusterDim.z;
    } else if (attr.id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE) {
      r.cooperative = attr.value.cooperative != 0;
    } else if (attr.id == CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE) {
      if (attr.value.clusterSchedulingPolicyPreference >
          CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING) {
        return CUDA_ERROR_INVALID_VALUE;
      }
    } else if (attr.id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) {
      if (attr.value.programmaticStreamSerializationAllowed > 1) return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return Launch(f, r, kernelParams, extra);
}

// --- Occupancy ---

GX_EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* numBlocks, CUfunction func,
                                                               int blockSize,
                                                               size_t dynamicSMemSize) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (numBlocks == nullptr || func == nullptr || blockSize <= 0) return CUDA_ERROR_INVALID_VALUE;
  *numBlocks = FakeBlocksPerMultiprocessor(static_cast<uint64_t>(blockSize), dynamicSMemSize);
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuOccupancyMaxActiveClusters(int* numClusters, CUfunction func,
                                                const CUlaunchConfig* config) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (numClusters == nullptr || func == nullptr || config == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  uint64_t size = 0;
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    const CUlaunchAttribute& a = config->attrs[i];
    if (a.id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
      size = uint64_t{a.value.clusterDim.x} * a.value.clusterDim.y * a.value.clusterDim.z;
    }
  }
  if (size == 0) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t threads = uint64_t{config->blockDimX} * config->blockDimY * config->blockDimZ;
  const uint64_t blocks = uint64_t{static_cast<unsigned>(
                              FakeBlocksPerMultiprocessor(threads, config->sharedMemBytes))} *
                          kFakeMultiprocessors;
  *numClusters = static_cast<int>(blocks / size);
  return CUDA_SUCCESS;
}

// --- Signatures ---

GX_CHECK_SIGNATURE(cuLaunchKernel, cuLaunchKernel);
GX_CHECK_SIGNATURE(cuLaunchKernelEx, cuLaunchKernelEx);
GX_CHECK_SIGNATURE(cuOccupancyMaxActiveBlocksPerMultiprocessor,
                   cuOccupancyMaxActiveBlocksPerMultiprocessor);
GX_CHECK_SIGNATURE(cuOccupancyMaxActiveClusters, cuOccupancyMaxActiveClusters);
