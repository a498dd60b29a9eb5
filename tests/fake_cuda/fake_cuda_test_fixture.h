#ifndef GPUEXEC_TESTS_FAKE_CUDA_FAKE_CUDA_TEST_FIXTURE_H_
#define GPUEXEC_TESTS_FAKE_CUDA_FAKE_CUDA_TEST_FIXTURE_H_

// The fixture of the libcuda test double's unit test: the double's entry
// points dlsym'd from one loaded copy, the process-wide instance the
// environment (fake_cuda_test.cc) loads, the primary context fixture, and
// the green context and graph node helpers.

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "server/cuda/cuda_api.h"

namespace gxfake::testing {

// Every driver entry point the daemon resolves: X(exported name, API name,
// whose type is PFN_<API name> in cuda_api.h).
// clang-format off
#define GX_FOR_EACH_DRIVER_API(X)                                                           \
  X(cuInit, cuInit) X(cuDriverGetVersion, cuDriverGetVersion)                               \
  X(cuGetErrorName, cuGetErrorName) X(cuGetErrorString, cuGetErrorString)                   \
  X(cuDeviceGetCount, cuDeviceGetCount) X(cuDeviceGet, cuDeviceGet)                         \
  X(cuDeviceGetName, cuDeviceGetName) X(cuDeviceGetAttribute, cuDeviceGetAttribute)         \
  X(cuDeviceTotalMem_v2, cuDeviceTotalMem)                                                  \
  X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain)                                     \
  X(cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease)                                \
  X(cuCtxSetCurrent, cuCtxSetCurrent) X(cuCtxSynchronize, cuCtxSynchronize)                 \
  X(cuMemGetInfo_v2, cuMemGetInfo) X(cuModuleLoadDataEx, cuModuleLoadDataEx)                \
  X(cuModuleUnload, cuModuleUnload) X(cuModuleGetFunction, cuModuleGetFunction)             \
  X(cuFuncGetParamInfo, cuFuncGetParamInfo) X(cuFuncGetAttribute, cuFuncGetAttribute)       \
  X(cuFuncSetAttribute, cuFuncSetAttribute) X(cuStreamCreate, cuStreamCreate) \
  X(cuStreamCreateWithPriority, cuStreamCreateWithPriority)                               \
  X(cuCtxGetStreamPriorityRange, cuCtxGetStreamPriorityRange)               \
  X(cuStreamDestroy_v2, cuStreamDestroy) X(cuStreamSynchronize, cuStreamSynchronize)        \
  X(cuLaunchHostFunc, cuLaunchHostFunc) X(cuEventCreate, cuEventCreate)                     \
  X(cuEventRecord, cuEventRecord) X(cuEventQuery, cuEventQuery)                             \
  X(cuEventElapsedTime_v2, cuEventElapsedTime) X(cuEventDestroy_v2, cuEventDestroy)         \
  X(cuMemAllocAsync, cuMemAllocAsync) X(cuMemFreeAsync, cuMemFreeAsync)                     \
  X(cuMemAlloc_v2, cuMemAlloc) X(cuMemFree_v2, cuMemFree)                                   \
  X(cuMemsetD8Async, cuMemsetD8Async) X(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync)            \
  X(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync)     \
  X(cuMemHostAlloc, cuMemHostAlloc) X(cuMemFreeHost, cuMemFreeHost)                         \
  X(cuMemHostRegister_v2, cuMemHostRegister) X(cuMemHostUnregister, cuMemHostUnregister)    \
  X(cuLaunchKernelEx, cuLaunchKernelEx) X(cuLaunchKernel, cuLaunchKernel)                   \
  X(cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool)                                   \
  X(cuMemPoolSetAttribute, cuMemPoolSetAttribute) X(cuMemPoolTrimTo, cuMemPoolTrimTo)        \
  X(cuDeviceGetDevResource, cuDeviceGetDevResource)                                         \
  X(cuDevSmResourceSplitByCount, cuDevSmResourceSplitByCount)                               \
  X(cuDevResourceGenerateDesc, cuDevResourceGenerateDesc)                                   \
  X(cuGreenCtxCreate, cuGreenCtxCreate) X(cuGreenCtxDestroy, cuGreenCtxDestroy)             \
  X(cuGreenCtxGetDevResource, cuGreenCtxGetDevResource)                                     \
  X(cuGreenCtxStreamCreate, cuGreenCtxStreamCreate) X(cuCtxGetCurrent, cuCtxGetCurrent)      \
  X(cuGraphCreate, cuGraphCreate) X(cuGraphDestroy, cuGraphDestroy)                         \
  X(cuGraphAddKernelNode_v2, cuGraphAddKernelNode)                                          \
  X(cuGraphAddMemsetNode, cuGraphAddMemsetNode) X(cuGraphAddMemcpyNode, cuGraphAddMemcpyNode) \
  X(cuGraphKernelNodeSetAttribute, cuGraphKernelNodeSetAttribute)                           \
  X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags)                               \
  X(cuGraphExecDestroy, cuGraphExecDestroy) X(cuGraphUpload, cuGraphUpload)                 \
  X(cuGraphLaunch, cuGraphLaunch)                                                           \
  X(cuGraphExecKernelNodeSetParams_v2, cuGraphExecKernelNodeSetParams)
// clang-format on

// The entry points of one loaded copy of the library. The handle is never
// closed: worker threads of the double may outlive any test.
struct FakeCuda {
  void* handle = nullptr;
#define GX_DECLARE(name, api) PFN_##api name = nullptr;
  GX_FOR_EACH_DRIVER_API(GX_DECLARE)
#undef GX_DECLARE
  // The version-1 symbol, with the same signature as cuEventElapsedTime_v2.
  PFN_cuEventElapsedTime cuEventElapsedTime_v1 = nullptr;
  uint64_t (*gxfake_module_loads)() = nullptr;
  uint64_t (*gxfake_bytes_allocated)() = nullptr;
  uint64_t (*gxfake_green_contexts)() = nullptr;
  uint64_t (*gxfake_graphs)() = nullptr;

  // Returns an empty string on success, else what went wrong.
  std::string Load(const char* path) {
    handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) return std::string("dlopen: ") + dlerror();
    std::string missing;
#define GX_RESOLVE(name, api)                                    \
  name = reinterpret_cast<decltype(name)>(dlsym(handle, #name)); \
  if (name == nullptr) missing += " " #name;
    GX_FOR_EACH_DRIVER_API(GX_RESOLVE)
#undef GX_RESOLVE
    cuEventElapsedTime_v1 =
        reinterpret_cast<decltype(cuEventElapsedTime_v1)>(dlsym(handle, "cuEventElapsedTime"));
    gxfake_module_loads =
        reinterpret_cast<decltype(gxfake_module_loads)>(dlsym(handle, "gxfake_module_loads"));
    gxfake_bytes_allocated =
        reinterpret_cast<decltype(gxfake_bytes_allocated)>(dlsym(handle, "gxfake_bytes_allocated"));
    gxfake_green_contexts =
        reinterpret_cast<decltype(gxfake_green_contexts)>(dlsym(handle, "gxfake_green_contexts"));
    if (gxfake_green_contexts == nullptr) missing += " gxfake_green_contexts";
    gxfake_graphs = reinterpret_cast<decltype(gxfake_graphs)>(dlsym(handle, "gxfake_graphs"));
    if (gxfake_graphs == nullptr) missing += " gxfake_graphs";
    if (cuEventElapsedTime_v1 == nullptr) missing += " cuEventElapsedTime";
    if (gxfake_module_loads == nullptr) missing += " gxfake_module_loads";
    if (gxfake_bytes_allocated == nullptr) missing += " gxfake_bytes_allocated";
    return missing.empty() ? "" : "missing symbols:" + missing;
  }
};

inline constexpr int kDeviceCount = 2;
inline constexpr uint64_t kMemoryBytes = 1ull << 30;

// The process-wide instance, configured and initialized by the environment.
inline FakeCuda* g_cuda = nullptr;

#define ASSERT_CU(expr) ASSERT_EQ((expr), CUDA_SUCCESS)
#define EXPECT_CU(expr) EXPECT_EQ((expr), CUDA_SUCCESS)

inline void IncrementCounter(void* counter) {
  static_cast<std::atomic<int>*>(counter)->fetch_add(1);
}

inline void RecordThreadId(void* id) {
  *static_cast<std::thread::id*>(id) = std::this_thread::get_id();
}

// With the primary context of device 0 current and one stream.
class FakeCudaContextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cu_.cuDevicePrimaryCtxRetain(&ctx_, 0));
    ASSERT_CU(cu_.cuCtxSetCurrent(ctx_));
    CUcontext current = nullptr;
    ASSERT_CU(cu_.cuCtxGetCurrent(&current));
    ASSERT_EQ(current, ctx_);
    ASSERT_CU(cu_.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
  }

  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_CU(cu_.cuStreamDestroy_v2(stream_));
    }
    EXPECT_CU(cu_.cuCtxSetCurrent(nullptr));
    // The last release destroys whatever the test left behind (graphs
    // belong to no context: each test destroys its own).
    EXPECT_CU(cu_.cuDevicePrimaryCtxRelease_v2(0));
    EXPECT_EQ(cu_.gxfake_bytes_allocated(), 0u);
    EXPECT_EQ(cu_.gxfake_graphs(), 0u);
  }

  // Loads "GXFAKE1\n<kernel>\n" and returns the kernel's function.
  CUfunction LoadKernel(const char* kernel) {
    const std::string image = std::string("GXFAKE1\n") + kernel + "\n";
    CUmodule mod = nullptr;
    EXPECT_CU(cu_.cuModuleLoadDataEx(&mod, image.c_str(), 0, nullptr, nullptr));
    CUfunction f = nullptr;
    EXPECT_CU(cu_.cuModuleGetFunction(&f, mod, kernel));
    return f;
  }

  CUdeviceptr Alloc(size_t bytes) {
    CUdeviceptr ptr = 0;
    EXPECT_CU(cu_.cuMemAlloc_v2(&ptr, bytes));
    return ptr;
  }

  template <typename T>
  std::vector<T> Download(CUdeviceptr src, size_t count) {
    std::vector<T> out(count);
    EXPECT_CU(cu_.cuMemcpyDtoHAsync_v2(out.data(), src, count * sizeof(T), stream_));
    EXPECT_CU(cu_.cuStreamSynchronize(stream_));
    return out;
  }

  const FakeCuda& cu_ = *g_cuda;
  CUcontext ctx_ = nullptr;
  CUstream stream_ = nullptr;
};

// Green contexts: parts of device 0's 132 SMs.
inline CUdevResource DeviceSms(const FakeCuda& cu) {
  CUdevResource r{};
  EXPECT_CU(cu.cuDeviceGetDevResource(0, &r, CU_DEV_RESOURCE_TYPE_SM));
  return r;
}

// A green context of device 0 made of `r`.
inline CUgreenCtx MakeGreen(const FakeCuda& cu, CUdevResource* r) {
  CUdevResourceDesc desc = nullptr;
  EXPECT_CU(cu.cuDevResourceGenerateDesc(&desc, r, 1));
  CUgreenCtx g = nullptr;
  EXPECT_CU(cu.cuGreenCtxCreate(&g, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM));
  return g;
}

// Graph nodes.
inline CUDA_KERNEL_NODE_PARAMS_v2 KernelNode(CUfunction f, unsigned grid, unsigned block,
                                             void** params) {
  CUDA_KERNEL_NODE_PARAMS_v2 p{};
  p.func = f;
  p.gridDimX = grid;
  p.gridDimY = 1;
  p.gridDimZ = 1;
  p.blockDimX = block;
  p.blockDimY = 1;
  p.blockDimZ = 1;
  p.kernelParams = params;
  return p;
}

inline CUDA_MEMSET_NODE_PARAMS MemsetNode(CUdeviceptr dst, uint8_t value, size_t bytes) {
  CUDA_MEMSET_NODE_PARAMS p{};
  p.dst = dst;
  p.value = value;
  p.elementSize = 1;
  p.width = bytes;
  p.height = 1;
  return p;
}

inline CUDA_MEMCPY3D CopyNode(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  CUDA_MEMCPY3D p{};
  p.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  p.srcDevice = src;
  p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  p.dstDevice = dst;
  p.WidthInBytes = bytes;
  p.Height = 1;
  p.Depth = 1;
  return p;
}

}  // namespace gxfake::testing

#endif  // GPUEXEC_TESTS_FAKE_CUDA_FAKE_CUDA_TEST_FIXTURE_H_
