// Kernel launches and occupancy. A launch is checked as the driver checks it
// (geometry, dynamic shared memory, clusters, cooperative grids against the
// double's occupancy), takes a copy of its arguments, and runs its model in
// stream order on the stream's SMs (a green context's, else the device's).

#include <algorithm>
#include <atomic>
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

// What gxfake_kernels_run reports.
std::atomic<uint64_t> g_kernels_run{0};

// A launch: its shape and the stream it goes to.
struct LaunchRequest {
  LaunchShape shape;
  CUstream stream = nullptr;
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
  const KernelDef* kernel = nullptr;
  GX_RETURN_IF_ERROR(CheckShape(f, ctx, r.shape, &kernel));
  std::shared_ptr<CUstream_st> stream;
  GX_RETURN_IF_ERROR(ResolveStream(r.stream, ctx, &stream));
  const StreamSms sms = SmsOf(stream.get());
  GX_RETURN_IF_ERROR(CheckCooperative(r.shape, sms.count));

  // A kernel the double has no model of loads but cannot run.
  if (kernel == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  std::vector<uint8_t> args;
  GX_RETURN_IF_ERROR(CopyArgs(*kernel, kernel_params, &args));
  return Enqueue(stream, KernelOp(kernel, ctx->device, r.shape, sms, std::move(args)));
}

}  // namespace

CUresult CheckShape(CUfunction f, CUctx_st* ctx, const LaunchShape& shape,
                    const KernelDef** kernel) {
  int max_dynamic_shared = 0;
  int non_portable_cluster = 0;
  {
    Driver& d = GetDriver();
    std::lock_guard<std::mutex> lock(d.mu);
    if (f == nullptr || d.functions.count(f) == 0) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    if (f->module->context != ctx) return CUDA_ERROR_INVALID_HANDLE;
    *kernel = f->kernel;
    max_dynamic_shared = f->max_dynamic_shared;
    non_portable_cluster = f->non_portable_cluster_size_allowed;
  }
  uint64_t threads = 1;
  for (int i = 0; i < 3; ++i) {
    if (shape.grid[i] == 0 || shape.grid[i] > kMaxGridDim[i]) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (shape.block[i] == 0 || shape.block[i] > kMaxBlockDim[i]) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    threads *= shape.block[i];
  }
  if (threads > static_cast<uint64_t>(kMaxThreadsPerBlock)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (shape.shared_bytes > static_cast<unsigned>(kMaxSharedPerBlockOptin) ||
      shape.shared_bytes > static_cast<unsigned>(max_dynamic_shared)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  uint64_t cluster_size = 1;
  for (int i = 0; i < 3; ++i) {
    if (shape.cluster[i] == 0) return CUDA_ERROR_INVALID_VALUE;
    cluster_size *= shape.cluster[i];
  }
  const unsigned max_cluster =
      non_portable_cluster ? kMaxNonPortableClusterSize : kMaxPortableClusterSize;
  if (cluster_size > max_cluster) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
  for (int i = 0; i < 3; ++i) {
    if (shape.grid[i] % shape.cluster[i] != 0) return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

StreamSms SmsOf(const CUstream_st* stream) {
  const CUgreenCtx_st* green = stream != nullptr ? stream->green.get() : nullptr;
  if (green == nullptr) return StreamSms{0, static_cast<unsigned>(kFakeMultiprocessors)};
  return StreamSms{green->first_sm, green->sm_count};
}

CUresult CheckCooperative(const LaunchShape& shape, unsigned sm_count) {
  if (!shape.cooperative) return CUDA_SUCCESS;
  const uint64_t threads = uint64_t{shape.block[0]} * shape.block[1] * shape.block[2];
  const uint64_t cluster_size = uint64_t{shape.cluster[0]} * shape.cluster[1] * shape.cluster[2];
  const uint64_t resident =
      uint64_t{static_cast<unsigned>(FakeBlocksPerMultiprocessor(threads, shape.shared_bytes))} *
      sm_count / cluster_size * cluster_size;
  if (uint64_t{shape.grid[0]} * shape.grid[1] * shape.grid[2] > resident) {
    return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
  }
  return CUDA_SUCCESS;
}

CUresult CopyArgs(const KernelDef& kernel, void** kernel_params, std::vector<uint8_t>* args) {
  args->assign(kernel.ArgBytes(), 0);
  if (kernel.params.empty()) return CUDA_SUCCESS;
  if (kernel_params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < kernel.params.size(); ++i) {
    if (kernel_params[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::memcpy(args->data() + kernel.params[i].offset, kernel_params[i], kernel.params[i].size);
  }
  return CUDA_SUCCESS;
}

StreamOp KernelOp(const KernelDef* kernel, int device, const LaunchShape& shape, StreamSms sms,
                  std::vector<uint8_t> args) {
  auto launch = std::make_shared<KernelLaunch>();
  launch->device = device;
  for (int i = 0; i < 3; ++i) {
    launch->grid[i] = shape.grid[i];
    launch->block[i] = shape.block[i];
    launch->cluster[i] = shape.cluster[i];
  }
  launch->shared_bytes = shape.shared_bytes;
  launch->cooperative = shape.cooperative;
  launch->first_sm = sms.first;
  launch->sm_count = sms.count;
  launch->args = std::move(args);
  StreamOp op;
  op.run = [kernel, launch] {
    g_kernels_run.fetch_add(1);
    if (!kernel->body(*launch)) Poison(kernel->name);
  };
  return op;
}

}  // namespace gxfake::internal

using namespace gxfake::internal;  // NOLINT(build/namespaces): the entry points are global

// --- Test-only exports ---

// Kernels the double has run (each a launch's, or a graph node's, taken off
// its stream), since the library was loaded.
GX_EXPORT uint64_t gxfake_kernels_run(void) { return g_kernels_run.load(); }

// --- Launch ---

GX_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                  unsigned int gridDimZ, unsigned int blockDimX,
                                  unsigned int blockDimY, unsigned int blockDimZ,
                                  unsigned int sharedMemBytes, CUstream hStream,
                                  void** kernelParams, void** extra) {
  LaunchRequest r;
  r.shape = LaunchShape{
      {gridDimX, gridDimY, gridDimZ}, {blockDimX, blockDimY, blockDimZ}, sharedMemBytes};
  r.stream = hStream;
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
  LaunchRequest r;
  r.shape = LaunchShape{{config->gridDimX, config->gridDimY, config->gridDimZ},
                        {config->blockDimX, config->blockDimY, config->blockDimZ},
                        config->sharedMemBytes};
  r.stream = config->hStream;
  for (unsigned int i = 0; i < config->numAttrs; ++i) {
    const CUlaunchAttribute& attr = config->attrs[i];
    if (attr.id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
      r.shape.cluster[0] = attr.value.clusterDim.x;
      r.shape.cluster[1] = attr.value.clusterDim.y;
      r.shape.cluster[2] = attr.value.clusterDim.z;
    } else if (attr.id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE) {
      r.shape.cooperative = attr.value.cooperative != 0;
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
