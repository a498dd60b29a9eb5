// Unit test of the libcuda test double. It dlopen()s libgpuexec_fakecuda.so
// the way the daemon opens libcuda.so.1 and drives it only through dlsym'd
// entry points. Tests that poison the process (a kernel fault is sticky for
// the whole process) or need a fresh, uninitialized driver run in a fork()ed
// child.

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "server/cuda/cuda_api.h"

#ifndef GXFAKE_LIBRARY_PATH
#error "GXFAKE_LIBRARY_PATH must name the built libgpuexec_fakecuda.so"
#endif

namespace {

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

constexpr int kDeviceCount = 2;
constexpr uint64_t kMemoryBytes = 1ull << 30;
constexpr char kPtxLog[] =
    "ptxas application ptx input; error   : PTX: no .entry (a kernel) in the text";

// The process-wide instance, configured and initialized by the environment.
FakeCuda* g_cuda = nullptr;

class FakeCudaEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    if (g_cuda != nullptr) return;  // --gtest_repeat: already loaded.
    setenv("GXFAKE_DEVICE_COUNT", std::to_string(kDeviceCount).c_str(), 1);
    setenv("GXFAKE_MEMORY_BYTES", std::to_string(kMemoryBytes).c_str(), 1);
    unsetenv("GXFAKE_FAIL_INIT");
    g_cuda = new FakeCuda();
    const std::string error = g_cuda->Load(GXFAKE_LIBRARY_PATH);
    ASSERT_EQ(error, "");
    ASSERT_EQ(g_cuda->cuInit(0), CUDA_SUCCESS);
  }
};

::testing::Environment* const kEnvironment =
    ::testing::AddGlobalTestEnvironment(new FakeCudaEnvironment());

#define ASSERT_CU(expr) ASSERT_EQ((expr), CUDA_SUCCESS)
#define EXPECT_CU(expr) EXPECT_EQ((expr), CUDA_SUCCESS)

void IncrementCounter(void* counter) { static_cast<std::atomic<int>*>(counter)->fetch_add(1); }

void RecordThreadId(void* id) { *static_cast<std::thread::id*>(id) = std::this_thread::get_id(); }

// Runs `body` in a fork()ed child with a watchdog; returns its exit code
// (0 = every check passed), or 128 + signal.
int RunInChild(const std::function<int()>& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(30);
    _exit(body());
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

#define CHILD_CHECK(cond)                                                           \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "child check failed at line %d: %s\n", __LINE__, #cond); \
      return 1;                                                                     \
    }                                                                               \
  } while (0)
#define CHILD_CU(expr) CHILD_CHECK((expr) == CUDA_SUCCESS)

// RunInChild with the primary context of device 0 current in the child and
// a stream of it: body(cu, ctx, stream).
int RunInChildWithContext(const std::function<int(const FakeCuda&, CUcontext, CUstream)>& body) {
  return RunInChild([&body]() -> int {
    const FakeCuda& cu = *g_cuda;
    CUcontext ctx = nullptr;
    CUstream stream = nullptr;
    CHILD_CU(cu.cuDevicePrimaryCtxRetain(&ctx, 0));
    CHILD_CU(cu.cuCtxSetCurrent(ctx));
    CHILD_CU(cu.cuStreamCreate(&stream, 0));
    return body(cu, ctx, stream);
  });
}

// ---------------------------------------------------------------------------
// No context needed.
// ---------------------------------------------------------------------------

TEST(FakeCudaTest, ExportsEveryEntryPoint) {
  // Load() already failed the environment if one was missing; also check
  // the handful of versioned names that are easy to get wrong.
  for (const char* name :
       {"cuMemAlloc_v2", "cuStreamDestroy_v2", "cuEventElapsedTime", "cuEventElapsedTime_v2",
        "cuDevicePrimaryCtxRelease_v2", "cuMemHostRegister_v2", "cuMemcpyHtoDAsync_v2",
        "cuGraphAddKernelNode_v2", "cuGraphExecKernelNodeSetParams_v2"}) {
    EXPECT_NE(dlsym(g_cuda->handle, name), nullptr) << name;
  }
  // Unversioned aliases the real driver also has are not part of the double.
  EXPECT_EQ(dlsym(g_cuda->handle, "cuMemAlloc"), nullptr);
  EXPECT_EQ(dlsym(g_cuda->handle, "cuGraphAddKernelNode"), nullptr);
}

TEST(FakeCudaTest, DevicePropertiesAndVersion) {
  const FakeCuda& cu = *g_cuda;
  EXPECT_CU(cu.cuInit(0));  // Idempotent.
  int version = 0;
  ASSERT_CU(cu.cuDriverGetVersion(&version));
  EXPECT_EQ(version, 13000);
  int count = 0;
  ASSERT_CU(cu.cuDeviceGetCount(&count));
  EXPECT_EQ(count, kDeviceCount);

  CUdevice dev = -1;
  ASSERT_CU(cu.cuDeviceGet(&dev, 1));
  EXPECT_EQ(dev, 1);
  EXPECT_EQ(cu.cuDeviceGet(&dev, kDeviceCount), CUDA_ERROR_INVALID_DEVICE);

  char name[64];
  ASSERT_CU(cu.cuDeviceGetName(name, sizeof(name), 1));
  EXPECT_STREQ(name, "gpuexec fake GPU 1");
  ASSERT_CU(cu.cuDeviceGetName(name, 8, 0));
  EXPECT_STREQ(name, "gpuexec");  // Truncated and NUL-terminated.
  EXPECT_EQ(cu.cuDeviceGetName(name, sizeof(name), 7), CUDA_ERROR_INVALID_DEVICE);

  size_t total = 0;
  ASSERT_CU(cu.cuDeviceTotalMem_v2(&total, 0));
  EXPECT_EQ(total, kMemoryBytes);

  const std::vector<std::pair<CUdevice_attribute, int>> expected = {
      {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024},
      {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024},
      {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024},
      {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64},
      {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 2147483647},
      {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535},
      {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 49152},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 232448},
      {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
      {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
      {CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 1},
      {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1},
      {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
      {CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 0},  // Anything else: 0.
  };
  for (const auto& [attribute, value] : expected) {
    int got = -1;
    ASSERT_CU(cu.cuDeviceGetAttribute(&got, attribute, 0));
    EXPECT_EQ(got, value) << "attribute " << attribute;
  }
  int got = 0;
  EXPECT_EQ(cu.cuDeviceGetAttribute(&got, CU_DEVICE_ATTRIBUTE_WARP_SIZE, -1),
            CUDA_ERROR_INVALID_DEVICE);

  CUmemoryPool pool0 = nullptr, pool1 = nullptr;
  ASSERT_CU(cu.cuDeviceGetDefaultMemPool(&pool0, 0));
  ASSERT_CU(cu.cuDeviceGetDefaultMemPool(&pool1, 1));
  EXPECT_NE(pool0, pool1);
  uint64_t threshold = UINT64_MAX;
  EXPECT_CU(cu.cuMemPoolSetAttribute(pool0, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
  EXPECT_CU(cu.cuMemPoolTrimTo(pool0, 0));
}

TEST(FakeCudaTest, ErrorNamesAndStrings) {
  const FakeCuda& cu = *g_cuda;
  const char* str = nullptr;
  ASSERT_CU(cu.cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &str));
  EXPECT_STREQ(str, "CUDA_ERROR_OUT_OF_MEMORY");
  ASSERT_CU(cu.cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &str));
  EXPECT_STREQ(str, "out of memory");
  ASSERT_CU(cu.cuGetErrorName(CUDA_ERROR_ILLEGAL_ADDRESS, &str));
  EXPECT_STREQ(str, "CUDA_ERROR_ILLEGAL_ADDRESS");
  ASSERT_CU(cu.cuGetErrorString(CUDA_ERROR_INVALID_PTX, &str));
  EXPECT_STREQ(str, "a PTX JIT compilation failed");
  for (CUresult code :
       {CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_INITIALIZED,
        CUDA_ERROR_DEINITIALIZED, CUDA_ERROR_NO_DEVICE, CUDA_ERROR_INVALID_DEVICE,
        CUDA_ERROR_INVALID_IMAGE, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE,
        CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_READY, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
        CUDA_ERROR_LAUNCH_TIMEOUT, CUDA_ERROR_LAUNCH_FAILED, CUDA_ERROR_INVALID_SOURCE,
        CUDA_ERROR_INVALID_CLUSTER_SIZE, CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_UNKNOWN}) {
    EXPECT_CU(cu.cuGetErrorName(code, &str)) << code;
    EXPECT_CU(cu.cuGetErrorString(code, &str)) << code;
  }
  str = "not touched";
  EXPECT_EQ(cu.cuGetErrorName(static_cast<CUresult>(12345), &str), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(str, nullptr);
  str = "not touched";
  EXPECT_EQ(cu.cuGetErrorString(static_cast<CUresult>(12345), &str), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(str, nullptr);
}

TEST(FakeCudaTest, CallsThatNeedAContextFailWithoutOne) {
  const FakeCuda& cu = *g_cuda;
  std::thread([&cu] {  // A fresh thread has no current context.
    CUdeviceptr ptr = 0;
    EXPECT_EQ(cu.cuMemAlloc_v2(&ptr, 16), CUDA_ERROR_INVALID_CONTEXT);
    CUstream stream = nullptr;
    EXPECT_EQ(cu.cuStreamCreate(&stream, 0), CUDA_ERROR_INVALID_CONTEXT);
    CUmodule mod = nullptr;
    EXPECT_EQ(cu.cuModuleLoadDataEx(&mod, "GXFAKE1\n", 0, nullptr, nullptr),
              CUDA_ERROR_INVALID_CONTEXT);
    size_t free = 0, total = 0;
    EXPECT_EQ(cu.cuMemGetInfo_v2(&free, &total), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cu.cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
    CUcontext current = reinterpret_cast<CUcontext>(uintptr_t{1});
    EXPECT_CU(cu.cuCtxGetCurrent(&current));  // None, as the driver says it.
    EXPECT_EQ(current, nullptr);
    EXPECT_EQ(cu.cuCtxGetCurrent(nullptr), CUDA_ERROR_INVALID_VALUE);
  })
      .join();
}

// ---------------------------------------------------------------------------
// With the primary context of device 0 current and one stream.
// ---------------------------------------------------------------------------

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

TEST_F(FakeCudaContextTest, AllocCopyFreeAccounting) {
  size_t free = 0, total = 0;
  ASSERT_CU(cu_.cuMemGetInfo_v2(&free, &total));
  EXPECT_EQ(total, kMemoryBytes);
  EXPECT_EQ(free, kMemoryBytes);

  const CUdeviceptr a = Alloc(1000);
  EXPECT_EQ(a % 256, 0u);
  EXPECT_EQ(cu_.gxfake_bytes_allocated(), 1000u);
  ASSERT_CU(cu_.cuMemGetInfo_v2(&free, &total));
  EXPECT_EQ(free, kMemoryBytes - 1000);

  CUdeviceptr too_big = 0;
  EXPECT_EQ(cu_.cuMemAlloc_v2(&too_big, kMemoryBytes), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(cu_.cuMemAlloc_v2(&too_big, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.gxfake_bytes_allocated(), 1000u);

  const CUdeviceptr b = Alloc(2000);
  EXPECT_EQ(cu_.gxfake_bytes_allocated(), 3000u);

  std::vector<uint8_t> pattern(1000);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = uint8_t(i * 7 + 1);
  ASSERT_CU(cu_.cuMemsetD8Async(b, 0xEE, 2000, stream_));
  ASSERT_CU(cu_.cuMemcpyHtoDAsync_v2(a, pattern.data(), 1000, stream_));
  ASSERT_CU(cu_.cuMemcpyDtoDAsync_v2(b + 500, a, 1000, stream_));
  const std::vector<uint8_t> back = Download<uint8_t>(b, 2000);
  for (size_t i = 0; i < 2000; ++i) {
    const uint8_t want = (i >= 500 && i < 1500) ? pattern[i - 500] : 0xEE;
    ASSERT_EQ(back[i], want) << i;
  }

  // Ranges must lie inside one live allocation.
  EXPECT_EQ(cu_.cuMemcpyHtoDAsync_v2(a + 900, pattern.data(), 200, stream_),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuMemcpyDtoHAsync_v2(pattern.data(), 0x1000, 4, stream_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuMemcpyDtoDAsync_v2(b + 1500, a, 1000, stream_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuMemsetD8Async(a, 0, 1001, stream_), CUDA_ERROR_INVALID_VALUE);

  EXPECT_CU(cu_.cuMemFree_v2(a));
  EXPECT_EQ(cu_.cuMemFree_v2(a), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuMemFree_v2(b + 8), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.gxfake_bytes_allocated(), 2000u);
  EXPECT_EQ(cu_.cuMemcpyHtoDAsync_v2(a, pattern.data(), 4, stream_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_CU(cu_.cuMemFree_v2(b));
  EXPECT_EQ(cu_.gxfake_bytes_allocated(), 0u);

  // Host memory.
  void* host = nullptr;
  ASSERT_CU(cu_.cuMemHostAlloc(&host, 4096, CU_MEMHOSTALLOC_PORTABLE));
  ASSERT_NE(host, nullptr);
  EXPECT_CU(cu_.cuMemFreeHost(host));
  std::vector<char> pageable(8192);
  EXPECT_CU(cu_.cuMemHostRegister_v2(pageable.data(), pageable.size(), 0));
  EXPECT_EQ(cu_.cuMemHostRegister_v2(pageable.data() + 100, 10, 0),
            CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_CU(cu_.cuMemHostUnregister(pageable.data()));
  EXPECT_EQ(cu_.cuMemHostUnregister(pageable.data()), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
}

TEST_F(FakeCudaContextTest, MemFreeAsyncFreesInStreamOrder) {
  const CUfunction spin = LoadKernel("gx_spin");
  CUdeviceptr ptr = 0;
  ASSERT_CU(cu_.cuMemAllocAsync(&ptr, 4096, stream_));
  EXPECT_EQ(cu_.gxfake_bytes_allocated(), 4096u);
  uint64_t ns = 200'000'000;
  void* params[] = {&ns};
  ASSERT_CU(cu_.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream_, params, nullptr));
  ASSERT_CU(cu_.cuMemFreeAsync(ptr, stream_));
  // Still mapped until the stream reaches the free, but unusable for new work.
  EXPECT_EQ(cu_.gxfake_bytes_allocated(), 4096u);
  EXPECT_EQ(cu_.cuMemsetD8Async(ptr, 0, 16, stream_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuMemFreeAsync(ptr, stream_), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cu_.cuStreamSynchronize(stream_));
  EXPECT_EQ(cu_.gxfake_bytes_allocated(), 0u);
}

TEST_F(FakeCudaContextTest, SaxpyThroughModule) {
  const uint64_t loads_before = cu_.gxfake_module_loads();
  CUmodule mod = nullptr;
  ASSERT_CU(cu_.cuModuleLoadDataEx(&mod, "GXFAKE1\ngx_saxpy\n", 0, nullptr, nullptr));
  EXPECT_EQ(cu_.gxfake_module_loads(), loads_before + 1);
  CUfunction saxpy = nullptr;
  ASSERT_CU(cu_.cuModuleGetFunction(&saxpy, mod, "gx_saxpy"));
  CUfunction other = nullptr;
  EXPECT_EQ(cu_.cuModuleGetFunction(&other, mod, "gx_fill_u32"), CUDA_ERROR_NOT_FOUND);

  constexpr uint64_t kN = 1000;
  std::vector<float> x(kN), y(kN);
  for (uint64_t i = 0; i < kN; ++i) {
    x[i] = float(i);
    y[i] = 0.5f * float(i);
  }
  CUdeviceptr dx = 0, dy = 0;
  ASSERT_CU(cu_.cuMemAllocAsync(&dx, kN * sizeof(float), stream_));
  ASSERT_CU(cu_.cuMemAllocAsync(&dy, kN * sizeof(float), stream_));
  ASSERT_CU(cu_.cuMemcpyHtoDAsync_v2(dx, x.data(), kN * 4, stream_));
  ASSERT_CU(cu_.cuMemcpyHtoDAsync_v2(dy, y.data(), kN * 4, stream_));
  float a = 3.0f;
  uint64_t n = kN;
  void* params[] = {&a, &dx, &dy, &n};
  ASSERT_CU(cu_.cuLaunchKernel(saxpy, 4, 1, 1, 256, 1, 1, 0, stream_, params, nullptr));
  const std::vector<float> out = Download<float>(dy, kN);
  for (uint64_t i = 0; i < kN; ++i) {
    ASSERT_EQ(out[i], 3.0f * x[i] + y[i]) << i;
  }
  ASSERT_CU(cu_.cuMemFreeAsync(dx, stream_));
  ASSERT_CU(cu_.cuMemFreeAsync(dy, stream_));
  ASSERT_CU(cu_.cuStreamSynchronize(stream_));
  EXPECT_EQ(cu_.gxfake_bytes_allocated(), 0u);
  EXPECT_CU(cu_.cuModuleUnload(mod));
  EXPECT_EQ(cu_.cuModuleGetFunction(&other, mod, "gx_saxpy"), CUDA_ERROR_INVALID_HANDLE);
}

TEST_F(FakeCudaContextTest, ParamInfoAndBitsOfGxTypes) {
  const CUfunction types = LoadKernel("gx_types");
  const std::vector<std::pair<size_t, size_t>> layout = {{0, 1},  {2, 2},  {4, 4},  {8, 8}, {16, 2},
                                                         {18, 2}, {20, 4}, {24, 8}, {32, 8}};
  for (size_t i = 0; i < layout.size(); ++i) {
    size_t offset = 99, size = 99;
    ASSERT_CU(cu_.cuFuncGetParamInfo(types, i, &offset, &size));
    EXPECT_EQ(offset, layout[i].first) << i;
    EXPECT_EQ(size, layout[i].second) << i;
  }
  size_t offset = 0, size = 0;
  EXPECT_EQ(cu_.cuFuncGetParamInfo(types, layout.size(), &offset, &size), CUDA_ERROR_INVALID_VALUE);

  int8_t a = -5;
  int16_t b = -2;
  uint32_t c = 0xDEADBEEF;
  int64_t d = -3;
  uint16_t e = 0x3C00;  // half 1.0
  uint16_t f = 0x3F80;  // bf16 1.0
  float g = 1.5f;
  double h = 2.5;
  CUdeviceptr out = Alloc(64);
  void* params[] = {&a, &b, &c, &d, &e, &f, &g, &h, &out};
  ASSERT_CU(cu_.cuLaunchKernel(types, 1, 1, 1, 32, 1, 1, 0, stream_, params, nullptr));
  const std::vector<uint64_t> bits = Download<uint64_t>(out, 8);
  uint32_t g_bits = 0;
  std::memcpy(&g_bits, &g, 4);
  uint64_t h_bits = 0;
  std::memcpy(&h_bits, &h, 8);
  EXPECT_EQ(bits[0], 0xFBu);
  EXPECT_EQ(bits[1], 0xFFFEu);
  EXPECT_EQ(bits[2], 0xDEADBEEFu);
  EXPECT_EQ(bits[3], 0xFFFFFFFFFFFFFFFDull);
  EXPECT_EQ(bits[4], 0x3C00u);
  EXPECT_EQ(bits[5], 0x3F80u);
  EXPECT_EQ(bits[6], g_bits);
  EXPECT_EQ(bits[7], h_bits);
}

TEST_F(FakeCudaContextTest, StructArgument) {
  const CUfunction kernel = LoadKernel("gx_struct");
  struct {
    uint32_t a, b;
    float c;
    uint32_t d;
  } q = {1, 2, 3.5f, 4};
  CUdeviceptr out = Alloc(16);
  void* params[] = {&q, &out};
  ASSERT_CU(cu_.cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, stream_, params, nullptr));
  const std::vector<uint32_t> words = Download<uint32_t>(out, 4);
  uint32_t c_bits = 0;
  std::memcpy(&c_bits, &q.c, 4);
  EXPECT_EQ(words, (std::vector<uint32_t>{1, 2, c_bits, 4}));
}

TEST_F(FakeCudaContextTest, InvalidPtxWritesTheErrorLog) {
  const uint64_t loads_before = cu_.gxfake_module_loads();
  char log[256] = "untouched";
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {log, reinterpret_cast<void*>(uintptr_t{sizeof(log)})};
  CUmodule mod = nullptr;
  EXPECT_EQ(cu_.cuModuleLoadDataEx(&mod, "//\n// Generated\n.version 8.0\n", 2, options, values),
            CUDA_ERROR_INVALID_PTX);
  EXPECT_STREQ(log, kPtxLog);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(values[1]), std::strlen(kPtxLog));

  char small[10];
  void* small_values[] = {small, reinterpret_cast<void*>(uintptr_t{10})};
  EXPECT_EQ(cu_.cuModuleLoadDataEx(&mod, ".version 8.0\n", 2, options, small_values),
            CUDA_ERROR_INVALID_PTX);
  EXPECT_STREQ(small, "ptxas app");  // Truncated to the size, NUL included.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small_values[1]), 9u);

  EXPECT_EQ(cu_.cuModuleLoadDataEx(&mod,
                                   "\x7f"
                                   "ELF garbage",
                                   0, nullptr, nullptr),
            CUDA_ERROR_INVALID_IMAGE);
  EXPECT_EQ(cu_.gxfake_module_loads(), loads_before);

  // Unknown kernel names in a GXFAKE1 image are ignored.
  ASSERT_CU(cu_.cuModuleLoadDataEx(&mod, "GXFAKE1\nno_such_kernel\ngx_empty", 0, nullptr, nullptr));
  CUfunction f = nullptr;
  EXPECT_CU(cu_.cuModuleGetFunction(&f, mod, "gx_empty"));
  EXPECT_EQ(cu_.cuModuleGetFunction(&f, mod, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
  EXPECT_CU(cu_.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream_, nullptr, nullptr));
  EXPECT_CU(cu_.cuStreamSynchronize(stream_));
}

std::string ReadExample(const char* name) {
  std::ifstream in(std::string(GXFAKE_EXAMPLES_DIR) + "/" + name, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// The shipped nvcc-built saxpy modules load with their own layout and run
// the saxpy model; a kernel the double has no model of (or a model's name
// with another layout) loads, reports its layout, and cannot be launched.
TEST_F(FakeCudaContextTest, RealImagesRunOnlyTheExampleKernels) {
  constexpr uint64_t kN = 300;
  std::vector<float> x(kN), y(kN, 1.0f);
  for (uint64_t i = 0; i < kN; ++i) x[i] = float(i);
  CUdeviceptr dx = Alloc(kN * 4), dy = Alloc(kN * 4);
  ASSERT_CU(cu_.cuMemcpyHtoDAsync_v2(dx, x.data(), kN * 4, stream_));
  for (const char* file : {"saxpy.cubin", "saxpy.ptx"}) {
    SCOPED_TRACE(file);
    const std::string image = ReadExample(file);
    ASSERT_FALSE(image.empty());
    ASSERT_CU(cu_.cuMemcpyHtoDAsync_v2(dy, y.data(), kN * 4, stream_));
    CUmodule mod = nullptr;
    ASSERT_CU(cu_.cuModuleLoadDataEx(&mod, image.c_str(), 0, nullptr, nullptr));
    CUfunction saxpy = nullptr;
    ASSERT_CU(cu_.cuModuleGetFunction(&saxpy, mod, "saxpy"));
    const size_t offsets[] = {0, 8, 16, 24}, sizes[] = {4, 8, 8, 8};
    for (size_t i = 0; i < 4; ++i) {
      size_t offset = 0, size = 0;
      ASSERT_CU(cu_.cuFuncGetParamInfo(saxpy, i, &offset, &size));
      EXPECT_EQ(offset, offsets[i]);
      EXPECT_EQ(size, sizes[i]);
    }
    EXPECT_EQ(cu_.cuFuncGetParamInfo(saxpy, 4, nullptr, nullptr), CUDA_ERROR_INVALID_VALUE);
    float a = 2.0f;
    uint64_t n = kN;
    void* params[] = {&a, &dx, &dy, &n};
    ASSERT_CU(cu_.cuLaunchKernel(saxpy, 2, 1, 1, 256, 1, 1, 0, stream_, params, nullptr));
    const std::vector<float> out = Download<float>(dy, kN);
    for (uint64_t i = 0; i < kN; ++i) ASSERT_EQ(out[i], 2.0f * x[i] + 1.0f) << i;
    EXPECT_CU(cu_.cuModuleUnload(mod));
  }

  // The Triton tutorial's add_kernel as Triton 3.x emits its PTX: x, y,
  // out, n and two scratch pointers.
  const char* triton =
      "//\n// Generated by LLVM NVPTX Back-End\n//\n.version 8.7\n.target sm_90a\n"
      ".address_size 64\n.visible .entry add_kernel(\n"
      "\t.param .u64 .ptr .global .align 1 add_kernel_param_0,\n"
      "\t.param .u64 .ptr .global .align 1 add_kernel_param_1,\n"
      "\t.param .u64 .ptr .global .align 1 add_kernel_param_2,\n"
      "\t.param .u32 add_kernel_param_3,\n"
      "\t.param .u64 .ptr .global .align 1 add_kernel_param_4,\n"
      "\t.param .u64 .ptr .global .align 1 add_kernel_param_5\n)\n.reqntid 128\n{\n\tret;\n}\n";
  CUmodule triton_mod = nullptr;
  ASSERT_CU(cu_.cuModuleLoadDataEx(&triton_mod, triton, 0, nullptr, nullptr));
  CUfunction add = nullptr;
  ASSERT_CU(cu_.cuModuleGetFunction(&add, triton_mod, "add_kernel"));
  size_t scratch_offset = 0;
  ASSERT_CU(cu_.cuFuncGetParamInfo(add, 5, &scratch_offset, nullptr));
  EXPECT_EQ(scratch_offset, 40u);
  CUdeviceptr dout = Alloc(kN * 4), null_scratch = 0;
  int32_t count = static_cast<int32_t>(kN);
  void* add_params[] = {&dx, &dy, &dout, &count, &null_scratch, &null_scratch};
  ASSERT_CU(cu_.cuLaunchKernel(add, 3, 1, 1, 128, 1, 1, 0, stream_, add_params, nullptr));
  const std::vector<float> sums = Download<float>(dout, kN);
  const std::vector<float> ys = Download<float>(dy, kN);
  for (uint64_t i = 0; i < kN; ++i) ASSERT_EQ(sums[i], x[i] + ys[i]) << i;
  EXPECT_CU(cu_.cuModuleUnload(triton_mod));
  ASSERT_CU(cu_.cuMemFree_v2(dout));

  auto examples = reinterpret_cast<const char* (*)()>(dlsym(cu_.handle, "gxfake_example_kernels"));
  ASSERT_NE(examples, nullptr);
  EXPECT_STREQ(examples(), "saxpy, add_kernel");
  const char* other =
      ".version 8.0\n.target sm_90\n.visible .entry mine(.param .u64 p)\n{ ret; }\n"
      ".entry saxpy(.param .u32 a)\n{ ret; }\n";
  CUmodule mod = nullptr;
  ASSERT_CU(cu_.cuModuleLoadDataEx(&mod, other, 0, nullptr, nullptr));
  for (const char* name : {"mine", "saxpy"}) {
    SCOPED_TRACE(name);
    CUfunction f = nullptr;
    ASSERT_CU(cu_.cuModuleGetFunction(&f, mod, name));
    size_t offset = 1, size = 0;
    ASSERT_CU(cu_.cuFuncGetParamInfo(f, 0, &offset, &size));
    EXPECT_EQ(offset, 0u);
    EXPECT_EQ(size, name[0] == 'm' ? 8u : 4u);
    uint64_t p = 0;
    void* params[] = {&p};
    EXPECT_EQ(cu_.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream_, params, nullptr),
              CUDA_ERROR_NOT_SUPPORTED);
  }
  EXPECT_CU(cu_.cuModuleUnload(mod));

  // A malformed cubin: INVALID_IMAGE with the reason in the error log.
  std::string cubin = ReadExample("saxpy.cubin");
  const uint64_t far = uint64_t{1} << 41;
  std::memcpy(&cubin[0x28], &far, 8);  // the section table far past the end
  char log[256] = "untouched";
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {log, reinterpret_cast<void*>(uintptr_t{sizeof(log)})};
  EXPECT_EQ(cu_.cuModuleLoadDataEx(&mod, cubin.data(), 2, options, values),
            CUDA_ERROR_INVALID_IMAGE);
  EXPECT_THAT(std::string(log), ::testing::HasSubstr("gpuexec driver double: cubin: "));
  ASSERT_CU(cu_.cuMemFree_v2(dx));
  ASSERT_CU(cu_.cuMemFree_v2(dy));
}

TEST_F(FakeCudaContextTest, BigSharedNeedsTheAttribute) {
  const CUfunction kernel = LoadKernel("gx_bigshared");
  constexpr uint32_t kWords = 20000;  // 80000 bytes > 48 KiB.
  constexpr unsigned kBlocks = 3;
  CUdeviceptr out = Alloc(kBlocks * 4);
  uint32_t n = kWords;
  void* params[] = {&out, &n};

  int value = 0;
  ASSERT_CU(
      cu_.cuFuncGetAttribute(&value, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, kernel));
  EXPECT_EQ(value, 49152);
  EXPECT_EQ(
      cu_.cuLaunchKernel(kernel, kBlocks, 1, 1, 256, 1, 1, kWords * 4, stream_, params, nullptr),
      CUDA_ERROR_INVALID_VALUE);

  EXPECT_EQ(cu_.cuFuncSetAttribute(kernel, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 232449),
            CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(
      cu_.cuFuncSetAttribute(kernel, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, kWords * 4));
  ASSERT_CU(
      cu_.cuFuncGetAttribute(&value, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, kernel));
  EXPECT_EQ(value, int(kWords * 4));
  ASSERT_CU(
      cu_.cuLaunchKernel(kernel, kBlocks, 1, 1, 256, 1, 1, kWords * 4, stream_, params, nullptr));
  const std::vector<uint32_t> sums = Download<uint32_t>(out, kBlocks);
  for (uint32_t block = 0; block < kBlocks; ++block) {
    uint32_t want = 0;
    for (uint32_t k = 0; k < kWords; ++k) want += k ^ block;
    EXPECT_EQ(sums[block], want) << block;
  }
  EXPECT_EQ(cu_.cuLaunchKernel(kernel, kBlocks, 1, 1, 256, 1, 1, 232452, stream_, params, nullptr),
            CUDA_ERROR_INVALID_VALUE);

  int regs = 0;
  ASSERT_CU(cu_.cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, kernel));
  EXPECT_EQ(regs, 16);
  EXPECT_EQ(cu_.cuFuncSetAttribute(kernel, CU_FUNC_ATTRIBUTE_NUM_REGS, 8),
            CUDA_ERROR_INVALID_VALUE);
}

TEST_F(FakeCudaContextTest, LaunchValidationAndArgumentCapture) {
  CUmodule mod = nullptr;
  ASSERT_CU(cu_.cuModuleLoadDataEx(&mod, "GXFAKE1\ngx_fill_u32\ngx_spin\n", 0, nullptr, nullptr));
  CUfunction fill = nullptr, spin = nullptr;
  ASSERT_CU(cu_.cuModuleGetFunction(&fill, mod, "gx_fill_u32"));
  ASSERT_CU(cu_.cuModuleGetFunction(&spin, mod, "gx_spin"));
  constexpr uint64_t kN = 100;
  CUdeviceptr out = Alloc(kN * 4);
  uint32_t value = 7;
  uint64_t n = kN;
  void* params[] = {&out, &value, &n};

  const auto launch = [&](unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                          unsigned bz, void** p, void** extra) {
    return cu_.cuLaunchKernel(fill, gx, gy, gz, bx, by, bz, 0, stream_, p, extra);
  };
  EXPECT_EQ(launch(1, 1, 1, 1025, 1, 1, params, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(launch(1, 1, 1, 32, 32, 2, params, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(launch(1, 1, 1, 1, 1, 65, params, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(launch(0, 1, 1, 32, 1, 1, params, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(launch(1, 65536, 1, 32, 1, 1, params, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(launch(1, 1, 1, 32, 1, 1, nullptr, nullptr), CUDA_ERROR_INVALID_VALUE);
  void* extra[] = {CU_LAUNCH_PARAM_END};
  EXPECT_EQ(launch(1, 1, 1, 32, 1, 1, params, extra), CUDA_ERROR_INVALID_VALUE);

  // Argument values are read at launch time, not when the kernel runs.
  uint64_t ns = 100'000'000;
  void* spin_params[] = {&ns};
  ASSERT_CU(cu_.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream_, spin_params, nullptr));
  ASSERT_CU(launch(2, 1, 1, 32, 1, 1, params, nullptr));
  value = 9;
  const std::vector<uint32_t> got = Download<uint32_t>(out, kN);
  EXPECT_EQ(got, std::vector<uint32_t>(kN, 7));
}

TEST_F(FakeCudaContextTest, ClusterRanks) {
  const CUfunction kernel = LoadKernel("gx_cluster_rank");
  CUdeviceptr out = Alloc(8 * 4);
  void* params[] = {&out};
  CUlaunchAttribute attr{};
  attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attr.value.clusterDim.x = 2;
  attr.value.clusterDim.y = 2;
  attr.value.clusterDim.z = 1;
  CUlaunchConfig config{};
  config.gridDimX = 4;
  config.gridDimY = 2;
  config.gridDimZ = 1;
  config.blockDimX = 32;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.hStream = stream_;
  config.attrs = &attr;
  config.numAttrs = 1;
  ASSERT_CU(cu_.cuLaunchKernelEx(&config, kernel, params, nullptr));
  std::vector<uint32_t> ranks = Download<uint32_t>(out, 8);
  for (uint32_t y = 0; y < 2; ++y) {
    for (uint32_t x = 0; x < 4; ++x) {
      EXPECT_EQ(ranks[x + 4 * y], (x % 2) + 2 * (y % 2)) << x << "," << y;
    }
  }

  config.gridDimX = 3;  // Not a multiple of the cluster width.
  EXPECT_EQ(cu_.cuLaunchKernelEx(&config, kernel, params, nullptr), CUDA_ERROR_INVALID_VALUE);
  config.gridDimX = 4;
  config.gridDimY = 4;
  attr.value.clusterDim.x = 4;
  attr.value.clusterDim.y = 4;  // 16 blocks: over the portable limit of 8.
  EXPECT_EQ(cu_.cuLaunchKernelEx(&config, kernel, params, nullptr),
            CUDA_ERROR_INVALID_CLUSTER_SIZE);

  // Without a cluster every block is rank 0.
  ASSERT_CU(cu_.cuLaunchKernel(kernel, 4, 2, 1, 32, 1, 1, 0, stream_, params, nullptr));
  ranks = Download<uint32_t>(out, 8);
  EXPECT_EQ(ranks, std::vector<uint32_t>(8, 0));
}

TEST_F(FakeCudaContextTest, EventsHostFuncsAndStreamOrder) {
  const CUfunction spin = LoadKernel("gx_spin");
  CUevent start = nullptr, end = nullptr, untimed = nullptr;
  ASSERT_CU(cu_.cuEventCreate(&start, CU_EVENT_DEFAULT));
  ASSERT_CU(cu_.cuEventCreate(&end, CU_EVENT_DEFAULT));
  ASSERT_CU(cu_.cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING));
  float ms = -1;
  EXPECT_CU(cu_.cuEventQuery(start));  // Never recorded: complete.
  EXPECT_EQ(cu_.cuEventElapsedTime_v2(&ms, start, end), CUDA_ERROR_INVALID_HANDLE);

  uint64_t ns = 200'000'000;
  void* params[] = {&ns};
  std::atomic<int> calls{0};
  std::thread::id callback_thread;
  ASSERT_CU(cu_.cuEventRecord(start, stream_));
  ASSERT_CU(cu_.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream_, params, nullptr));
  ASSERT_CU(cu_.cuEventRecord(end, stream_));
  ASSERT_CU(cu_.cuEventRecord(untimed, stream_));
  ASSERT_CU(cu_.cuLaunchHostFunc(stream_, IncrementCounter, &calls));
  ASSERT_CU(cu_.cuLaunchHostFunc(stream_, RecordThreadId, &callback_thread));
  EXPECT_EQ(cu_.cuEventQuery(end), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(cu_.cuEventElapsedTime_v2(&ms, start, end), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(calls.load(), 0);

  ASSERT_CU(cu_.cuStreamSynchronize(stream_));
  EXPECT_EQ(calls.load(), 1);
  EXPECT_NE(callback_thread, std::this_thread::get_id());
  EXPECT_CU(cu_.cuEventQuery(end));
  ASSERT_CU(cu_.cuEventElapsedTime_v2(&ms, start, end));
  EXPECT_GE(ms, 199.0f);
  EXPECT_LT(ms, 10000.0f);
  float ms_v1 = -1;
  ASSERT_CU(cu_.cuEventElapsedTime_v1(&ms_v1, start, end));
  EXPECT_EQ(ms_v1, ms);
  EXPECT_EQ(cu_.cuEventElapsedTime_v2(&ms, start, untimed), CUDA_ERROR_INVALID_HANDLE);

  EXPECT_CU(cu_.cuEventDestroy_v2(start));
  EXPECT_EQ(cu_.cuEventQuery(start), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_CU(cu_.cuEventDestroy_v2(end));
  EXPECT_CU(cu_.cuEventDestroy_v2(untimed));
  EXPECT_CU(cu_.cuCtxSynchronize());
}

TEST_F(FakeCudaContextTest, ConcurrentStreamsOnManyThreads) {
  const CUfunction fill = LoadKernel("gx_fill_u32");
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (uint32_t t = 0; t < 4; ++t) {
    threads.emplace_back([this, fill, t, &failures] {
      if (cu_.cuCtxSetCurrent(ctx_) != CUDA_SUCCESS) return failures.fetch_add(1);
      CUstream s = nullptr;
      if (cu_.cuStreamCreate(&s, 0) != CUDA_SUCCESS) return failures.fetch_add(1);
      for (uint32_t i = 0; i < 50; ++i) {
        CUdeviceptr p = 0;
        uint64_t n = 256 + i;
        uint32_t value = t * 1000 + i;
        void* params[] = {&p, &value, &n};
        std::vector<uint32_t> host(n);
        bool ok =
            cu_.cuMemAllocAsync(&p, n * 4, s) == CUDA_SUCCESS &&
            cu_.cuLaunchKernel(fill, 1, 1, 1, 64, 1, 1, 0, s, params, nullptr) == CUDA_SUCCESS &&
            cu_.cuMemcpyDtoHAsync_v2(host.data(), p, n * 4, s) == CUDA_SUCCESS &&
            cu_.cuMemFreeAsync(p, s) == CUDA_SUCCESS &&
            cu_.cuStreamSynchronize(s) == CUDA_SUCCESS && host == std::vector<uint32_t>(n, value);
        if (!ok) failures.fetch_add(1);
      }
      if (cu_.cuStreamDestroy_v2(s) != CUDA_SUCCESS) failures.fetch_add(1);
      return 0;
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(cu_.gxfake_bytes_allocated(), 0u);
}

// ---------------------------------------------------------------------------
// Green contexts: parts of device 0's 132 SMs.
// ---------------------------------------------------------------------------

CUdevResource DeviceSms(const FakeCuda& cu) {
  CUdevResource r{};
  EXPECT_CU(cu.cuDeviceGetDevResource(0, &r, CU_DEV_RESOURCE_TYPE_SM));
  return r;
}

// A green context of device 0 made of `r`.
CUgreenCtx MakeGreen(const FakeCuda& cu, CUdevResource* r) {
  CUdevResourceDesc desc = nullptr;
  EXPECT_CU(cu.cuDevResourceGenerateDesc(&desc, r, 1));
  CUgreenCtx g = nullptr;
  EXPECT_CU(cu.cuGreenCtxCreate(&g, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM));
  return g;
}

TEST(FakeCudaTest, GreenDeviceResource) {
  const FakeCuda& cu = *g_cuda;
  const CUdevResource r = DeviceSms(cu);
  EXPECT_EQ(r.type, CU_DEV_RESOURCE_TYPE_SM);
  EXPECT_EQ(r.sm.smCount, 132u);
  EXPECT_EQ(r.sm.minSmPartitionSize, 8u);
  EXPECT_EQ(r.sm.smCoscheduledAlignment, 8u);
  CUdevResource other{};
  EXPECT_EQ(cu.cuDeviceGetDevResource(0, &other, CU_DEV_RESOURCE_TYPE_INVALID),
            CUDA_ERROR_INVALID_RESOURCE_TYPE);
  EXPECT_EQ(cu.cuDeviceGetDevResource(kDeviceCount, &other, CU_DEV_RESOURCE_TYPE_SM),
            CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cu.cuDeviceGetDevResource(0, nullptr, CU_DEV_RESOURCE_TYPE_SM),
            CUDA_ERROR_INVALID_VALUE);
  const char* name = nullptr;
  EXPECT_CU(cu.cuGetErrorName(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, &name));
}

TEST(FakeCudaTest, GreenSplitByCount) {
  const FakeCuda& cu = *g_cuda;
  const CUdevResource device = DeviceSms(cu);
  CUdevResource parts[4]{}, rest{};
  unsigned int groups = 1;
  ASSERT_CU(cu.cuDevSmResourceSplitByCount(parts, &groups, &device, &rest, 0, 16));
  EXPECT_EQ(groups, 1u);
  EXPECT_EQ(parts[0].sm.smCount, 16u);
  EXPECT_EQ(rest.sm.smCount, 116u);
  // Rounded up to a multiple of 8; no more groups than fit.
  groups = 4;
  ASSERT_CU(cu.cuDevSmResourceSplitByCount(parts, &groups, &device, &rest, 0, 33));
  EXPECT_EQ(groups, 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(parts[i].sm.smCount, 40u);
  EXPECT_EQ(rest.sm.smCount, 12u);
  // A query: how many groups fit (at least 8 SMs each).
  ASSERT_CU(cu.cuDevSmResourceSplitByCount(nullptr, &groups, &device, nullptr, 0, 16));
  EXPECT_EQ(groups, 8u);
  ASSERT_CU(cu.cuDevSmResourceSplitByCount(nullptr, &groups, &device, nullptr, 1, 0));
  EXPECT_EQ(groups, 16u);

  // Refused: more than the input has, unknown flags, resources the double
  // did not make, and the parts of a split (split a green context's SMs).
  groups = 1;
  EXPECT_EQ(cu.cuDevSmResourceSplitByCount(parts, &groups, &device, &rest, 0, 129),
            CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  EXPECT_EQ(cu.cuDevSmResourceSplitByCount(parts, &groups, &device, &rest, 3, 16),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu.cuDevSmResourceSplitByCount(parts, nullptr, &device, &rest, 0, 16),
            CUDA_ERROR_INVALID_VALUE);
  CUdevResource forged{};
  forged.type = CU_DEV_RESOURCE_TYPE_SM;
  forged.sm.smCount = 132;
  EXPECT_EQ(cu.cuDevSmResourceSplitByCount(parts, &groups, &forged, &rest, 0, 16),
            CUDA_ERROR_INVALID_VALUE);
  forged.type = CU_DEV_RESOURCE_TYPE_INVALID;
  EXPECT_EQ(cu.cuDevSmResourceSplitByCount(parts, &groups, &forged, &rest, 0, 16),
            CUDA_ERROR_INVALID_RESOURCE_TYPE);
  const CUdevResource first = parts[0];
  EXPECT_EQ(cu.cuDevSmResourceSplitByCount(parts, &groups, &first, &rest, 0, 8),
            CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
}

TEST_F(FakeCudaContextTest, GreenContextsCountAndDescriptors) {
  const uint64_t before = cu_.gxfake_green_contexts();
  const CUdevResource device = DeviceSms(cu_);
  CUdevResource both[2]{};
  unsigned int groups = 1;
  ASSERT_CU(cu_.cuDevSmResourceSplitByCount(&both[0], &groups, &device, &both[1], 0, 16));
  const CUgreenCtx part = MakeGreen(cu_, &both[0]);
  EXPECT_EQ(cu_.gxfake_green_contexts(), before + 1);
  // It retains the primary context: the fixture's release leaves the
  // context's memory alone while the green context lives.
  Alloc(64);
  ASSERT_CU(cu_.cuDevicePrimaryCtxRelease_v2(0));
  EXPECT_EQ(cu_.gxfake_bytes_allocated(), 64u);
  CUcontext again = nullptr;
  ASSERT_CU(cu_.cuDevicePrimaryCtxRetain(&again, 0));
  CUdevResource r{};
  ASSERT_CU(cu_.cuGreenCtxGetDevResource(part, &r, CU_DEV_RESOURCE_TYPE_SM));
  EXPECT_EQ(r.sm.smCount, 16u);
  EXPECT_EQ(cu_.cuGreenCtxGetDevResource(part, &r, CU_DEV_RESOURCE_TYPE_INVALID),
            CUDA_ERROR_INVALID_RESOURCE_TYPE);

  // Part and rest together: the whole device, in either order.
  std::swap(both[0], both[1]);
  CUdevResourceDesc desc = nullptr;
  ASSERT_CU(cu_.cuDevResourceGenerateDesc(&desc, both, 2));
  CUgreenCtx whole = nullptr;
  EXPECT_EQ(cu_.cuGreenCtxCreate(&whole, desc, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGreenCtxCreate(&whole, desc, 1, CU_GREEN_CTX_DEFAULT_STREAM),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGreenCtxCreate(&whole, reinterpret_cast<CUdevResourceDesc>(&r), 0,
                                 CU_GREEN_CTX_DEFAULT_STREAM),
            CUDA_ERROR_INVALID_HANDLE);
  ASSERT_CU(cu_.cuGreenCtxCreate(&whole, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM));
  EXPECT_EQ(cu_.gxfake_green_contexts(), before + 2);
  ASSERT_CU(cu_.cuGreenCtxGetDevResource(whole, &r, CU_DEV_RESOURCE_TYPE_SM));
  EXPECT_EQ(r.sm.smCount, 132u);
  // SMs with a gap between them make no descriptor.
  CUdevResource gap[3]{};
  groups = 3;
  ASSERT_CU(cu_.cuDevSmResourceSplitByCount(gap, &groups, &device, nullptr, 0, 8));
  std::swap(gap[1], gap[2]);
  EXPECT_EQ(cu_.cuDevResourceGenerateDesc(&desc, gap, 2),
            CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  EXPECT_EQ(cu_.cuDevResourceGenerateDesc(&desc, gap, 0), CUDA_ERROR_INVALID_VALUE);

  CUstream s = nullptr;
  EXPECT_EQ(cu_.cuGreenCtxStreamCreate(&s, part, CU_STREAM_DEFAULT, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_CU(cu_.cuGreenCtxDestroy(part));
  EXPECT_CU(cu_.cuGreenCtxDestroy(whole));
  EXPECT_EQ(cu_.gxfake_green_contexts(), before);
  EXPECT_EQ(cu_.cuGreenCtxDestroy(part), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu_.cuGreenCtxGetDevResource(part, &r, CU_DEV_RESOURCE_TYPE_SM),
            CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu_.cuGreenCtxStreamCreate(&s, part, CU_STREAM_NON_BLOCKING, 0),
            CUDA_ERROR_INVALID_HANDLE);
}

TEST_F(FakeCudaContextTest, GreenStreamRunsOnItsSms) {
  CUmodule mod = nullptr;
  ASSERT_CU(cu_.cuModuleLoadDataEx(&mod, "GXFAKE1\ngx_fill_u32\ngx_sm_ids\n", 0, nullptr, nullptr));
  CUfunction fill = nullptr, sm_ids = nullptr;
  ASSERT_CU(cu_.cuModuleGetFunction(&fill, mod, "gx_fill_u32"));
  ASSERT_CU(cu_.cuModuleGetFunction(&sm_ids, mod, "gx_sm_ids"));
  // A part of 16 SMs, then a part of 16 split from the rest's green context
  // (as the daemon splits: SMs 16..31).
  const CUdevResource device = DeviceSms(cu_);
  CUdevResource part{}, rest{}, second{};
  unsigned int groups = 1;
  ASSERT_CU(cu_.cuDevSmResourceSplitByCount(&part, &groups, &device, &rest, 0, 16));
  const CUgreenCtx green = MakeGreen(cu_, &part);
  const CUgreenCtx rest_green = MakeGreen(cu_, &rest);
  ASSERT_CU(cu_.cuGreenCtxGetDevResource(rest_green, &rest, CU_DEV_RESOURCE_TYPE_SM));
  ASSERT_CU(cu_.cuDevSmResourceSplitByCount(&second, &groups, &rest, nullptr, 0, 16));
  const CUgreenCtx second_green = MakeGreen(cu_, &second);
  CUstream gs = nullptr, gs2 = nullptr;
  ASSERT_CU(cu_.cuGreenCtxStreamCreate(&gs, green, CU_STREAM_NON_BLOCKING, -5));
  ASSERT_CU(cu_.cuGreenCtxStreamCreate(&gs2, second_green, CU_STREAM_NON_BLOCKING, 0));

  // Primary-context memory and modules work on a green context's stream.
  constexpr uint64_t kN = 64;
  CUdeviceptr buf = Alloc(kN * 4);
  uint32_t value = 42;
  uint64_t n = kN;
  void* fill_params[] = {&buf, &value, &n};
  ASSERT_CU(cu_.cuLaunchKernel(fill, 1, 1, 1, 64, 1, 1, 0, gs, fill_params, nullptr));
  ASSERT_CU(cu_.cuStreamSynchronize(gs));
  EXPECT_EQ(Download<uint32_t>(buf, kN), std::vector<uint32_t>(kN, 42));

  // The SMs the blocks of gx_sm_ids report, on each stream.
  constexpr unsigned kBlocks = 528;
  CUdeviceptr ids = Alloc(kBlocks * 4);
  const auto sms_of = [&](CUstream s) {
    uint64_t ns = 0;
    void* params[] = {&ids, &ns};
    EXPECT_CU(cu_.cuLaunchKernel(sm_ids, kBlocks, 1, 1, 32, 1, 1, 0, s, params, nullptr));
    EXPECT_CU(cu_.cuStreamSynchronize(s));
    const std::vector<uint32_t> got = Download<uint32_t>(ids, kBlocks);
    return std::set<uint32_t>(got.begin(), got.end());
  };
  const std::set<uint32_t> on_part = sms_of(gs);
  EXPECT_EQ(on_part.size(), 16u);
  EXPECT_EQ(*on_part.begin(), 0u);
  EXPECT_EQ(*on_part.rbegin(), 15u);
  const std::set<uint32_t> on_second = sms_of(gs2);
  EXPECT_EQ(on_second.size(), 16u);
  EXPECT_EQ(*on_second.begin(), 16u);
  const std::set<uint32_t> on_device = sms_of(stream_);
  EXPECT_EQ(on_device.size(), 132u);
  EXPECT_EQ(*on_device.rbegin(), 131u);

  EXPECT_CU(cu_.cuStreamDestroy_v2(gs));
  EXPECT_CU(cu_.cuStreamDestroy_v2(gs2));
  for (CUgreenCtx g : {green, rest_green, second_green}) EXPECT_CU(cu_.cuGreenCtxDestroy(g));
}

// A lifetime bug: the green context goes before its stream. Calls with the
// stream fail; the process stays usable.
TEST_F(FakeCudaContextTest, DestroyedGreenContextRefusesItsStreams) {
  const CUfunction fill = LoadKernel("gx_fill_u32");
  CUdevResource device = DeviceSms(cu_);
  const CUgreenCtx green = MakeGreen(cu_, &device);
  CUstream gs = nullptr;
  ASSERT_CU(cu_.cuGreenCtxStreamCreate(&gs, green, CU_STREAM_NON_BLOCKING, 0));
  CUdeviceptr buf = Alloc(16);
  uint32_t value = 7;
  uint64_t n = 4;
  void* params[] = {&buf, &value, &n};
  ASSERT_CU(cu_.cuLaunchKernel(fill, 1, 1, 1, 32, 1, 1, 0, gs, params, nullptr));
  // Done before the context goes: nothing orders it against the fill of 9
  // on another stream below, which it could otherwise overwrite.
  ASSERT_CU(cu_.cuStreamSynchronize(gs));
  ASSERT_CU(cu_.cuGreenCtxDestroy(green));
  EXPECT_EQ(cu_.cuLaunchKernel(fill, 1, 1, 1, 32, 1, 1, 0, gs, params, nullptr),
            CUDA_ERROR_CONTEXT_IS_DESTROYED);
  EXPECT_EQ(cu_.cuStreamSynchronize(gs), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  // Not sticky: other streams work.
  value = 9;
  ASSERT_CU(cu_.cuLaunchKernel(fill, 1, 1, 1, 32, 1, 1, 0, stream_, params, nullptr));
  EXPECT_EQ(Download<uint32_t>(buf, 4), std::vector<uint32_t>(4, 9));
  EXPECT_EQ(cu_.cuStreamDestroy_v2(gs), CUDA_ERROR_CONTEXT_IS_DESTROYED);  // Destroyed anyway.
  EXPECT_EQ(cu_.cuStreamDestroy_v2(gs), CUDA_ERROR_INVALID_HANDLE);
}

// ---------------------------------------------------------------------------
// Graphs: nodes, instantiation, replays and patches.
// ---------------------------------------------------------------------------

CUDA_KERNEL_NODE_PARAMS_v2 KernelNode(CUfunction f, unsigned grid, unsigned block, void** params) {
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

CUDA_MEMSET_NODE_PARAMS MemsetNode(CUdeviceptr dst, uint8_t value, size_t bytes) {
  CUDA_MEMSET_NODE_PARAMS p{};
  p.dst = dst;
  p.value = value;
  p.elementSize = 1;
  p.width = bytes;
  p.height = 1;
  return p;
}

CUDA_MEMCPY3D CopyNode(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
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

uint32_t Bits(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  return u;
}

// The same pipeline as a graph and as direct work, on two sets of buffers:
// a memset, a fill, a saxpy that accumulates into y, and a copy of y.
TEST_F(FakeCudaContextTest, GraphReplaysAsTheSameWorkLaunchedDirectly) {
  const CUfunction fill = LoadKernel("gx_fill_u32");
  const CUfunction saxpy = LoadKernel("gx_saxpy");
  constexpr uint64_t kN = 256;
  struct Buffers {
    CUdeviceptr x, y, z;
  };
  const Buffers g{Alloc(kN * 4), Alloc(kN * 4), Alloc(kN * 4)};
  const Buffers d{Alloc(kN * 4), Alloc(kN * 4), Alloc(kN * 4)};
  for (const Buffers& b : {g, d}) ASSERT_CU(cu_.cuMemsetD8Async(b.y, 0, kN * 4, stream_));
  uint32_t x_bits = Bits(1.5f);
  float a = 2.0f;
  uint64_t n = kN;
  void* g_fill[] = {const_cast<CUdeviceptr*>(&g.x), &x_bits, &n};
  void* g_saxpy[] = {&a, const_cast<CUdeviceptr*>(&g.x), const_cast<CUdeviceptr*>(&g.y), &n};

  CUgraph graph = nullptr;
  ASSERT_CU(cu_.cuGraphCreate(&graph, 0));
  CUgraphNode memset = nullptr, fill_node = nullptr, saxpy_node = nullptr, copy = nullptr;
  const CUDA_MEMSET_NODE_PARAMS reset = MemsetNode(g.y, 0, 16);  // y[0..3] start again
  ASSERT_CU(cu_.cuGraphAddMemsetNode(&memset, graph, nullptr, 0, &reset, ctx_));
  const CUDA_KERNEL_NODE_PARAMS_v2 fill_params = KernelNode(fill, 1, 256, g_fill);
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&fill_node, graph, &memset, 1, &fill_params));
  const CUDA_KERNEL_NODE_PARAMS_v2 saxpy_params = KernelNode(saxpy, 1, 256, g_saxpy);
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&saxpy_node, graph, &fill_node, 1, &saxpy_params));
  const CUDA_MEMCPY3D copy_params = CopyNode(g.z, g.y, kN * 4);
  ASSERT_CU(cu_.cuGraphAddMemcpyNode(&copy, graph, &saxpy_node, 1, &copy_params, ctx_));
  // The arguments were copied when the nodes were added.
  a = -100.0f;
  x_bits = 0;
  CUgraphExec exec = nullptr;
  ASSERT_CU(cu_.cuGraphInstantiateWithFlags(&exec, graph, 0));
  ASSERT_CU(cu_.cuGraphUpload(exec, stream_));
  // The instantiated graph lives on without its graph.
  EXPECT_EQ(cu_.gxfake_graphs(), 2u);
  ASSERT_CU(cu_.cuGraphDestroy(graph));
  EXPECT_EQ(cu_.gxfake_graphs(), 1u);
  a = 2.0f;
  x_bits = Bits(1.5f);

  void* d_fill[] = {const_cast<CUdeviceptr*>(&d.x), &x_bits, &n};
  void* d_saxpy[] = {&a, const_cast<CUdeviceptr*>(&d.x), const_cast<CUdeviceptr*>(&d.y), &n};
  for (int replay = 1; replay <= 3; ++replay) {
    ASSERT_CU(cu_.cuGraphLaunch(exec, stream_));
    ASSERT_CU(cu_.cuMemsetD8Async(d.y, 0, 16, stream_));
    ASSERT_CU(cu_.cuLaunchKernel(fill, 1, 1, 1, 256, 1, 1, 0, stream_, d_fill, nullptr));
    ASSERT_CU(cu_.cuLaunchKernel(saxpy, 1, 1, 1, 256, 1, 1, 0, stream_, d_saxpy, nullptr));
    ASSERT_CU(cu_.cuMemcpyDtoDAsync_v2(d.z, d.y, kN * 4, stream_));
    const std::vector<float> y = Download<float>(g.y, kN);
    EXPECT_EQ(y, Download<float>(d.y, kN)) << "replay " << replay;
    EXPECT_EQ(Download<float>(g.z, kN), y) << "replay " << replay;
    EXPECT_EQ(Download<float>(g.x, kN), std::vector<float>(kN, 1.5f));
    EXPECT_EQ(y[0], 3.0f);
    EXPECT_EQ(y[kN - 1], 3.0f * replay);
  }
  EXPECT_CU(cu_.cuGraphExecDestroy(exec));
  EXPECT_EQ(cu_.gxfake_graphs(), 0u);
}

// A memset node of 4-byte elements, and a kernel node of a green context's
// stream runs on its SMs.
TEST_F(FakeCudaContextTest, GraphNodesRunAsTheirKindsRun) {
  const CUfunction sm_ids = LoadKernel("gx_sm_ids");
  constexpr unsigned kBlocks = 264;
  CUdeviceptr ids = Alloc(kBlocks * 4);
  CUdeviceptr words = Alloc(64);
  uint64_t ns = 0;
  void* params[] = {&ids, &ns};
  CUgraph graph = nullptr;
  ASSERT_CU(cu_.cuGraphCreate(&graph, 0));
  CUgraphNode kernel = nullptr, memset = nullptr;
  const CUDA_KERNEL_NODE_PARAMS_v2 p = KernelNode(sm_ids, kBlocks, 32, params);
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&kernel, graph, nullptr, 0, &p));
  CUDA_MEMSET_NODE_PARAMS words_params = MemsetNode(words + 8, 0, 4);
  words_params.elementSize = 4;
  words_params.value = 0x01020304;
  ASSERT_CU(cu_.cuGraphAddMemsetNode(&memset, graph, &kernel, 1, &words_params, ctx_));
  CUgraphExec exec = nullptr;
  ASSERT_CU(cu_.cuGraphInstantiateWithFlags(&exec, graph, 0));

  CUdevResource device = DeviceSms(cu_);
  CUdevResource part{}, rest{};
  unsigned int groups = 1;
  ASSERT_CU(cu_.cuDevSmResourceSplitByCount(&part, &groups, &device, &rest, 0, 16));
  const CUgreenCtx green = MakeGreen(cu_, &part);
  CUstream gs = nullptr;
  ASSERT_CU(cu_.cuGreenCtxStreamCreate(&gs, green, CU_STREAM_NON_BLOCKING, 0));
  ASSERT_CU(cu_.cuMemsetD8Async(words, 0xFF, 64, stream_));
  ASSERT_CU(cu_.cuStreamSynchronize(stream_));
  ASSERT_CU(cu_.cuGraphLaunch(exec, gs));
  ASSERT_CU(cu_.cuStreamSynchronize(gs));
  const std::vector<uint32_t> got = Download<uint32_t>(ids, kBlocks);
  const std::set<uint32_t> sms(got.begin(), got.end());
  EXPECT_EQ(sms.size(), 16u);
  EXPECT_EQ(*sms.rbegin(), 15u);
  std::vector<uint32_t> want(16, 0xFFFFFFFFu);
  for (int i = 2; i < 6; ++i) want[i] = 0x01020304;
  EXPECT_EQ(Download<uint32_t>(words, 16), want);
  ASSERT_CU(cu_.cuGraphLaunch(exec, stream_));
  const std::vector<uint32_t> on_device = Download<uint32_t>(ids, kBlocks);
  EXPECT_EQ(std::set<uint32_t>(on_device.begin(), on_device.end()).size(), 132u);

  EXPECT_CU(cu_.cuStreamDestroy_v2(gs));
  EXPECT_CU(cu_.cuGreenCtxDestroy(green));
  EXPECT_CU(cu_.cuGraphExecDestroy(exec));
  EXPECT_CU(cu_.cuGraphDestroy(graph));
}

// A patch replaces the node's arguments in the instantiated graph for the
// replays after it: not a replay already enqueued, not the graph.
TEST_F(FakeCudaContextTest, GraphPatchChangesTheNextReplaysOnly) {
  const CUfunction fill = LoadKernel("gx_fill_u32");
  const CUfunction spin = LoadKernel("gx_spin");
  constexpr uint64_t kN = 64;
  CUdeviceptr out = Alloc(kN * 4);
  CUdeviceptr other = Alloc(kN * 4);
  uint64_t ns = 100'000'000;
  uint32_t value = 1;
  uint64_t n = kN;
  void* spin_params[] = {&ns};
  void* fill_params[] = {&out, &value, &n};
  CUgraph graph = nullptr;
  ASSERT_CU(cu_.cuGraphCreate(&graph, 0));
  CUgraphNode spin_node = nullptr, fill_node = nullptr, memset = nullptr;
  const CUDA_KERNEL_NODE_PARAMS_v2 spin_p = KernelNode(spin, 1, 1, spin_params);
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&spin_node, graph, nullptr, 0, &spin_p));
  const CUDA_KERNEL_NODE_PARAMS_v2 fill_p = KernelNode(fill, 1, 64, fill_params);
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&fill_node, graph, &spin_node, 1, &fill_p));
  const CUDA_MEMSET_NODE_PARAMS memset_p = MemsetNode(other, 0, 4);
  ASSERT_CU(cu_.cuGraphAddMemsetNode(&memset, graph, &fill_node, 1, &memset_p, ctx_));
  CUgraphExec exec = nullptr;
  ASSERT_CU(cu_.cuGraphInstantiateWithFlags(&exec, graph, 0));

  std::vector<uint32_t> first(kN), second(kN), third(kN);
  ASSERT_CU(cu_.cuGraphLaunch(exec, stream_));  // still spinning when patched
  ASSERT_CU(cu_.cuMemcpyDtoHAsync_v2(first.data(), out, kN * 4, stream_));
  value = 2;
  const CUDA_KERNEL_NODE_PARAMS_v2 patch = KernelNode(fill, 1, 64, fill_params);
  ASSERT_CU(cu_.cuGraphExecKernelNodeSetParams_v2(exec, fill_node, &patch));
  value = 3;  // copied by the patch
  ASSERT_CU(cu_.cuGraphLaunch(exec, stream_));
  ASSERT_CU(cu_.cuMemcpyDtoHAsync_v2(second.data(), out, kN * 4, stream_));
  ASSERT_CU(cu_.cuGraphLaunch(exec, stream_));  // the patch lasts
  ASSERT_CU(cu_.cuMemcpyDtoHAsync_v2(third.data(), out, kN * 4, stream_));
  ASSERT_CU(cu_.cuStreamSynchronize(stream_));
  EXPECT_EQ(first, std::vector<uint32_t>(kN, 1));
  EXPECT_EQ(second, std::vector<uint32_t>(kN, 2));
  EXPECT_EQ(third, std::vector<uint32_t>(kN, 2));
  // The graph keeps the arguments it was built with.
  CUgraphExec again = nullptr;
  ASSERT_CU(cu_.cuGraphInstantiateWithFlags(&again, graph, 0));
  ASSERT_CU(cu_.cuGraphLaunch(again, stream_));
  EXPECT_EQ(Download<uint32_t>(out, kN), std::vector<uint32_t>(kN, 1));

  // Refused: another function, a node that is not a kernel node, a node of
  // no instantiated graph, a geometry the function cannot launch with.
  const CUDA_KERNEL_NODE_PARAMS_v2 other_function = KernelNode(spin, 1, 64, spin_params);
  EXPECT_EQ(cu_.cuGraphExecKernelNodeSetParams_v2(exec, fill_node, &other_function),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphExecKernelNodeSetParams_v2(exec, memset, &patch), CUDA_ERROR_INVALID_VALUE);
  CUgraph lone = nullptr;
  CUgraphNode stranger = nullptr;
  ASSERT_CU(cu_.cuGraphCreate(&lone, 0));
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&stranger, lone, nullptr, 0, &fill_p));
  EXPECT_EQ(cu_.cuGraphExecKernelNodeSetParams_v2(exec, stranger, &patch),
            CUDA_ERROR_INVALID_VALUE);
  CUDA_KERNEL_NODE_PARAMS_v2 too_wide = patch;
  too_wide.blockDimX = 2048;
  EXPECT_EQ(cu_.cuGraphExecKernelNodeSetParams_v2(exec, fill_node, &too_wide),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphExecKernelNodeSetParams_v2(nullptr, fill_node, &patch),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphExecKernelNodeSetParams_v2(exec, fill_node, nullptr),
            CUDA_ERROR_INVALID_VALUE);
  // A refused patch leaves the node as it was.
  ASSERT_CU(cu_.cuGraphLaunch(exec, stream_));
  EXPECT_EQ(Download<uint32_t>(out, kN), std::vector<uint32_t>(kN, 2));

  EXPECT_CU(cu_.cuGraphExecDestroy(again));
  EXPECT_CU(cu_.cuGraphExecDestroy(exec));
  EXPECT_EQ(cu_.cuGraphExecKernelNodeSetParams_v2(exec, fill_node, &patch),
            CUDA_ERROR_INVALID_HANDLE);
  EXPECT_CU(cu_.cuGraphDestroy(lone));
  EXPECT_CU(cu_.cuGraphDestroy(graph));
}

// Kernel node attributes, honoured and checked as cuLaunchKernelEx's.
TEST_F(FakeCudaContextTest, GraphKernelNodeAttributes) {
  const CUfunction rank = LoadKernel("gx_cluster_rank");
  const CUfunction coop = LoadKernel("gx_coop_count");
  CUdeviceptr out = Alloc(16 * 4);
  void* params[] = {&out};
  CUgraph graph = nullptr;
  ASSERT_CU(cu_.cuGraphCreate(&graph, 0));
  CUDA_KERNEL_NODE_PARAMS_v2 p = KernelNode(rank, 4, 32, params);
  p.gridDimY = 2;
  CUgraphNode node = nullptr;
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&node, graph, nullptr, 0, &p));
  CUkernelNodeAttrValue value{};
  value.clusterDim.x = 2;
  value.clusterDim.y = 2;
  value.clusterDim.z = 1;
  ASSERT_CU(cu_.cuGraphKernelNodeSetAttribute(node, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &value));
  CUkernelNodeAttrValue policy{};
  policy.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING;
  ASSERT_CU(cu_.cuGraphKernelNodeSetAttribute(
      node, CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE, &policy));
  CUgraphExec exec = nullptr;
  ASSERT_CU(cu_.cuGraphInstantiateWithFlags(&exec, graph, 0));
  ASSERT_CU(cu_.cuGraphLaunch(exec, stream_));
  const std::vector<uint32_t> ranks = Download<uint32_t>(out, 8);
  for (uint32_t y = 0; y < 2; ++y) {
    for (uint32_t x = 0; x < 4; ++x) {
      EXPECT_EQ(ranks[x + 4 * y], (x % 2) + 2 * (y % 2)) << x << "," << y;
    }
  }
  EXPECT_CU(cu_.cuGraphExecDestroy(exec));

  // Checked when set: a zero dimension, a policy out of range, programmatic
  // stream serialization (a graph's are its edges), a node of another kind.
  CUkernelNodeAttrValue bad = value;
  bad.clusterDim.z = 0;
  EXPECT_EQ(cu_.cuGraphKernelNodeSetAttribute(node, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &bad),
            CUDA_ERROR_INVALID_VALUE);
  CUkernelNodeAttrValue bad_policy{};
  bad_policy.clusterSchedulingPolicyPreference = static_cast<CUclusterSchedulingPolicy>(3);
  EXPECT_EQ(cu_.cuGraphKernelNodeSetAttribute(
                node, CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE, &bad_policy),
            CUDA_ERROR_INVALID_VALUE);
  CUkernelNodeAttrValue serialize{};
  serialize.programmaticStreamSerializationAllowed = 1;
  EXPECT_EQ(cu_.cuGraphKernelNodeSetAttribute(
                node, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, &serialize),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphKernelNodeSetAttribute(node, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, nullptr),
            CUDA_ERROR_INVALID_VALUE);
  CUgraphNode memset = nullptr;
  const CUDA_MEMSET_NODE_PARAMS m = MemsetNode(out, 0, 4);
  ASSERT_CU(cu_.cuGraphAddMemsetNode(&memset, graph, &node, 1, &m, ctx_));
  EXPECT_EQ(
      cu_.cuGraphKernelNodeSetAttribute(memset, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &value),
      CUDA_ERROR_INVALID_VALUE);

  // Checked when instantiated, as a launch: a cluster over the portable
  // limit, one that does not divide the grid.
  value.clusterDim.x = 4;
  value.clusterDim.y = 4;
  ASSERT_CU(cu_.cuGraphKernelNodeSetAttribute(node, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &value));
  EXPECT_EQ(cu_.cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_ERROR_INVALID_CLUSTER_SIZE);
  value.clusterDim.x = 3;
  value.clusterDim.y = 1;
  ASSERT_CU(cu_.cuGraphKernelNodeSetAttribute(node, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &value));
  EXPECT_EQ(cu_.cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_CU(cu_.cuGraphDestroy(graph));

  // A cooperative node: its grid against the double's occupancy (32 blocks
  // of 32 threads on each of 132 SMs).
  CUdeviceptr counter = Alloc(8);
  ASSERT_CU(cu_.cuMemsetD8Async(counter, 0, 8, stream_));
  CUdeviceptr blocks = counter + 4;
  void* coop_params[] = {&counter, &blocks};
  ASSERT_CU(cu_.cuGraphCreate(&graph, 0));
  const CUDA_KERNEL_NODE_PARAMS_v2 fits = KernelNode(coop, 4224, 32, coop_params);
  const CUDA_KERNEL_NODE_PARAMS_v2 too_many = KernelNode(coop, 4225, 32, coop_params);
  CUgraphNode a = nullptr, b = nullptr;
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&a, graph, nullptr, 0, &fits));
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&b, graph, &a, 1, &too_many));
  CUkernelNodeAttrValue cooperative{};
  cooperative.cooperative = 1;
  ASSERT_CU(cu_.cuGraphKernelNodeSetAttribute(a, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &cooperative));
  ASSERT_CU(cu_.cuGraphKernelNodeSetAttribute(b, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &cooperative));
  EXPECT_EQ(cu_.cuGraphInstantiateWithFlags(&exec, graph, 0),
            CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
  cooperative.cooperative = 0;
  ASSERT_CU(cu_.cuGraphKernelNodeSetAttribute(b, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &cooperative));
  ASSERT_CU(cu_.cuGraphInstantiateWithFlags(&exec, graph, 0));
  ASSERT_CU(cu_.cuGraphLaunch(exec, stream_));
  EXPECT_EQ(Download<uint32_t>(counter, 2), (std::vector<uint32_t>{4224 + 4225, 4225}));
  EXPECT_CU(cu_.cuGraphExecDestroy(exec));
  EXPECT_CU(cu_.cuGraphDestroy(graph));
}

// The entry checks, and the codes of the refusals.
TEST_F(FakeCudaContextTest, GraphRefusals) {
  const CUfunction fill = LoadKernel("gx_fill_u32");
  CUdeviceptr buf = Alloc(64);
  CUdeviceptr other_buf = Alloc(64);
  uint32_t value = 5;
  uint64_t n = 16;
  void* params[] = {&buf, &value, &n};
  CUgraph graph = nullptr;
  EXPECT_EQ(cu_.cuGraphCreate(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphCreate(&graph, 1), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cu_.cuGraphCreate(&graph, 0));
  CUgraph other = nullptr;
  ASSERT_CU(cu_.cuGraphCreate(&other, 0));
  CUgraphNode node = nullptr, first = nullptr, theirs = nullptr;
  const CUDA_MEMSET_NODE_PARAMS m = MemsetNode(buf, 1, 64);
  ASSERT_CU(cu_.cuGraphAddMemsetNode(&first, graph, nullptr, 0, &m, ctx_));
  ASSERT_CU(cu_.cuGraphAddMemsetNode(&theirs, other, nullptr, 0, &m, ctx_));

  // The graph and the dependencies.
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(nullptr, graph, nullptr, 0, &m, ctx_),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, nullptr, nullptr, 0, &m, ctx_),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, graph, &theirs, 1, &m, ctx_),
            CUDA_ERROR_INVALID_VALUE);  // a node of another graph
  const CUgraphNode twice[] = {first, first};
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, graph, twice, 2, &m, ctx_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, graph, nullptr, 1, &m, ctx_), CUDA_ERROR_INVALID_VALUE);
  const CUgraphNode none[] = {nullptr};
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, graph, none, 1, &m, ctx_), CUDA_ERROR_INVALID_VALUE);

  // Memset nodes.
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, graph, &first, 1, nullptr, ctx_),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, graph, &first, 1, &m, nullptr),
            CUDA_ERROR_INVALID_CONTEXT);
  CUctx_st* const not_a_context = reinterpret_cast<CUctx_st*>(&value);
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, graph, &first, 1, &m, not_a_context),
            CUDA_ERROR_INVALID_CONTEXT);
  CUcontext released = nullptr;  // device 1's, never retained here
  ASSERT_CU(cu_.cuDevicePrimaryCtxRetain(&released, 1));
  ASSERT_CU(cu_.cuDevicePrimaryCtxRelease_v2(1));
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, graph, &first, 1, &m, released),
            CUDA_ERROR_INVALID_CONTEXT);
  for (const auto& change : std::vector<std::function<void(CUDA_MEMSET_NODE_PARAMS&)>>{
           [](CUDA_MEMSET_NODE_PARAMS& p) { p.elementSize = 3; },
           [](CUDA_MEMSET_NODE_PARAMS& p) { p.width = 0; },
           [](CUDA_MEMSET_NODE_PARAMS& p) { p.height = 0; },
           [](CUDA_MEMSET_NODE_PARAMS& p) { p.width = 65; },  // past the allocation
           [](CUDA_MEMSET_NODE_PARAMS& p) { p.dst = 0x1000; },
           [](CUDA_MEMSET_NODE_PARAMS& p) { p.dst += 2, p.elementSize = 4, p.width = 2; },
           [](CUDA_MEMSET_NODE_PARAMS& p) { p.width = 8, p.height = 2, p.pitch = 4; },
       }) {
    CUDA_MEMSET_NODE_PARAMS bad = m;
    change(bad);
    EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, graph, &first, 1, &bad, ctx_),
              CUDA_ERROR_INVALID_VALUE);
  }

  // Copy nodes: device memory, one row, inside allocations.
  const CUDA_MEMCPY3D c = CopyNode(other_buf, buf, 64);
  EXPECT_EQ(cu_.cuGraphAddMemcpyNode(&node, graph, &first, 1, nullptr, ctx_),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphAddMemcpyNode(&node, graph, &first, 1, &c, nullptr),
            CUDA_ERROR_INVALID_CONTEXT);
  for (const auto& change : std::vector<std::function<void(CUDA_MEMCPY3D&)>>{
           [](CUDA_MEMCPY3D& p) { p.WidthInBytes = 0; },
           [](CUDA_MEMCPY3D& p) { p.WidthInBytes = 65; },
           [](CUDA_MEMCPY3D& p) { p.srcXInBytes = 1; },
           [](CUDA_MEMCPY3D& p) { p.srcDevice = 0x1000; },
           [](CUDA_MEMCPY3D& p) { p.dstMemoryType = static_cast<CUmemorytype>(0); },
           [](CUDA_MEMCPY3D& p) { p.reserved0 = &p; },
           [](CUDA_MEMCPY3D& p) { p.dstLOD = 1; },
       }) {
    CUDA_MEMCPY3D bad = c;
    change(bad);
    EXPECT_EQ(cu_.cuGraphAddMemcpyNode(&node, graph, &first, 1, &bad, ctx_),
              CUDA_ERROR_INVALID_VALUE);
  }
  for (const auto& change : std::vector<std::function<void(CUDA_MEMCPY3D&)>>{
           [](CUDA_MEMCPY3D& p) { p.srcMemoryType = CU_MEMORYTYPE_HOST; },
           [](CUDA_MEMCPY3D& p) { p.dstMemoryType = CU_MEMORYTYPE_ARRAY; },
           [](CUDA_MEMCPY3D& p) { p.WidthInBytes = 16, p.Height = 2, p.srcPitch = 16; },
       }) {
    CUDA_MEMCPY3D unmodelled = c;
    change(unmodelled);
    EXPECT_EQ(cu_.cuGraphAddMemcpyNode(&node, graph, &first, 1, &unmodelled, ctx_),
              CUDA_ERROR_NOT_SUPPORTED);
  }

  // Kernel nodes: as a launch of them.
  const CUDA_KERNEL_NODE_PARAMS_v2 k = KernelNode(fill, 1, 32, params);
  EXPECT_EQ(cu_.cuGraphAddKernelNode_v2(&node, graph, &first, 1, nullptr),
            CUDA_ERROR_INVALID_VALUE);
  CUDA_KERNEL_NODE_PARAMS_v2 bad = k;
  bad.gridDimX = 0;
  EXPECT_EQ(cu_.cuGraphAddKernelNode_v2(&node, graph, &first, 1, &bad), CUDA_ERROR_INVALID_VALUE);
  bad = k;
  bad.kernelParams = nullptr;
  EXPECT_EQ(cu_.cuGraphAddKernelNode_v2(&node, graph, &first, 1, &bad), CUDA_ERROR_INVALID_VALUE);
  void* extra[] = {CU_LAUNCH_PARAM_END};
  bad = k;
  bad.extra = extra;
  EXPECT_EQ(cu_.cuGraphAddKernelNode_v2(&node, graph, &first, 1, &bad), CUDA_ERROR_INVALID_VALUE);
  bad = k;
  bad.func = nullptr;
  EXPECT_EQ(cu_.cuGraphAddKernelNode_v2(&node, graph, &first, 1, &bad), CUDA_ERROR_INVALID_VALUE);
  bad.kern = reinterpret_cast<CUkernel>(&value);  // library kernels: not modelled
  EXPECT_EQ(cu_.cuGraphAddKernelNode_v2(&node, graph, &first, 1, &bad), CUDA_ERROR_NOT_SUPPORTED);
  bad = k;
  bad.func = reinterpret_cast<CUfunction>(&value);
  EXPECT_EQ(cu_.cuGraphAddKernelNode_v2(&node, graph, &first, 1, &bad), CUDA_ERROR_INVALID_HANDLE);
  CUgraphNode kernel = nullptr;
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&kernel, graph, &first, 1, &k));

  // Instantiation and launches.
  CUgraphExec exec = nullptr;
  EXPECT_EQ(cu_.cuGraphInstantiateWithFlags(nullptr, graph, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphInstantiateWithFlags(&exec, nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphInstantiateWithFlags(&exec, graph, 1), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cu_.cuGraphInstantiateWithFlags(&exec, graph, 0));
  EXPECT_EQ(cu_.cuGraphLaunch(nullptr, stream_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphUpload(nullptr, stream_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphLaunch(exec, reinterpret_cast<CUstream>(&value)), CUDA_ERROR_INVALID_HANDLE);
  std::thread([&] {  // no current context
    EXPECT_EQ(cu_.cuGraphLaunch(exec, stream_), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cu_.cuGraphUpload(exec, stream_), CUDA_ERROR_INVALID_CONTEXT);
  })
      .join();
  ASSERT_CU(cu_.cuGraphLaunch(exec, nullptr));  // the NULL stream runs it at once
  EXPECT_EQ(Download<uint32_t>(buf, 16), std::vector<uint32_t>(16, 5));

  // Destroyed handles.
  ASSERT_CU(cu_.cuGraphDestroy(other));
  EXPECT_EQ(cu_.cuGraphDestroy(other), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu_.cuGraphDestroy(nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, other, nullptr, 0, &m, ctx_),
            CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu_.cuGraphInstantiateWithFlags(&exec, other, 0), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu_.cuGraphKernelNodeSetAttribute(theirs, CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
                                              reinterpret_cast<CUkernelNodeAttrValue*>(&n)),
            CUDA_ERROR_INVALID_HANDLE);
  ASSERT_CU(cu_.cuGraphExecDestroy(exec));
  EXPECT_EQ(cu_.cuGraphExecDestroy(exec), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu_.cuGraphLaunch(exec, stream_), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu_.cuGraphUpload(exec, stream_), CUDA_ERROR_INVALID_HANDLE);

  // A kernel node whose module is gone cannot be instantiated or launched.
  ASSERT_CU(cu_.cuGraphInstantiateWithFlags(&exec, graph, 0));
  CUmodule mod = nullptr;
  ASSERT_CU(cu_.cuModuleLoadDataEx(&mod, "GXFAKE1\ngx_fill_u32\n", 0, nullptr, nullptr));
  CUfunction own_fill = nullptr;
  ASSERT_CU(cu_.cuModuleGetFunction(&own_fill, mod, "gx_fill_u32"));
  CUgraph doomed = nullptr;
  CUgraphExec doomed_exec = nullptr;
  ASSERT_CU(cu_.cuGraphCreate(&doomed, 0));
  const CUDA_KERNEL_NODE_PARAMS_v2 own = KernelNode(own_fill, 1, 32, params);
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&node, doomed, nullptr, 0, &own));
  ASSERT_CU(cu_.cuGraphInstantiateWithFlags(&doomed_exec, doomed, 0));
  ASSERT_CU(cu_.cuModuleUnload(mod));
  EXPECT_EQ(cu_.cuGraphInstantiateWithFlags(&exec, doomed, 0), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu_.cuGraphLaunch(doomed_exec, stream_), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_CU(cu_.cuGraphExecDestroy(doomed_exec));
  EXPECT_CU(cu_.cuGraphDestroy(doomed));
  EXPECT_CU(cu_.cuGraphExecDestroy(exec));
  EXPECT_CU(cu_.cuGraphDestroy(graph));
  EXPECT_EQ(cu_.gxfake_graphs(), 0u);
}

// ---------------------------------------------------------------------------
// Forked children.
// ---------------------------------------------------------------------------

// A kernel fault poisons the process: every later call fails, queued work is
// dropped, host functions still run.
TEST(FakeCudaForkTest, KernelFaultIsStickyForTheWholeProcess) {
  const int rc = RunInChildWithContext([](const FakeCuda& cu, CUcontext ctx, CUstream stream) {
    CUmodule mod = nullptr;
    CHILD_CU(cu.cuModuleLoadDataEx(&mod, "GXFAKE1\ngx_spin\ngx_fault\ngx_fill_u32\n", 0, nullptr,
                                   nullptr));
    CUfunction spin = nullptr, fault = nullptr, fill = nullptr;
    CHILD_CU(cu.cuModuleGetFunction(&spin, mod, "gx_spin"));
    CHILD_CU(cu.cuModuleGetFunction(&fault, mod, "gx_fault"));
    CHILD_CU(cu.cuModuleGetFunction(&fill, mod, "gx_fill_u32"));
    CUdeviceptr buf = 0;
    CHILD_CU(cu.cuMemAlloc_v2(&buf, 64));
    CHILD_CU(cu.cuMemsetD8Async(buf, 0xAB, 64, stream));
    CHILD_CU(cu.cuStreamSynchronize(stream));

    uint64_t ns = 100'000'000;
    void* spin_params[] = {&ns};
    uint64_t bad_address = 0x10;
    void* fault_params[] = {&bad_address};
    uint32_t value = 7;
    uint64_t n = 16;
    void* fill_params[] = {&buf, &value, &n};
    std::atomic<int> calls{0};
    CHILD_CU(cu.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, spin_params, nullptr));
    // The launch itself succeeds: the fault is found asynchronously.
    CHILD_CU(cu.cuLaunchKernel(fault, 1, 1, 1, 1, 1, 1, 0, stream, fault_params, nullptr));
    CHILD_CU(cu.cuLaunchKernel(fill, 1, 1, 1, 32, 1, 1, 0, stream, fill_params, nullptr));
    CHILD_CU(cu.cuLaunchHostFunc(stream, IncrementCounter, &calls));
    CHILD_CHECK(cu.cuStreamSynchronize(stream) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHILD_CHECK(calls.load() == 1);  // Host functions still run.
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(buf);
    for (int i = 0; i < 64; ++i) CHILD_CHECK(bytes[i] == 0xAB);  // Dropped.

    CUdeviceptr other = 0;
    CHILD_CHECK(cu.cuMemAlloc_v2(&other, 16) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CUevent event = nullptr;
    CHILD_CHECK(cu.cuEventCreate(&event, 0) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHILD_CHECK(cu.cuCtxSynchronize() == CUDA_ERROR_ILLEGAL_ADDRESS);
    CUresult other_thread = CUDA_SUCCESS;
    std::thread([&] {
      int count = 0;
      other_thread = cu.cuDeviceGetCount(&count);
    }).join();
    CHILD_CHECK(other_thread == CUDA_ERROR_ILLEGAL_ADDRESS);
    const char* name = nullptr;
    CHILD_CU(cu.cuGetErrorName(CUDA_ERROR_ILLEGAL_ADDRESS, &name));
    CHILD_CHECK(std::strcmp(name, "CUDA_ERROR_ILLEGAL_ADDRESS") == 0);
    CHILD_CHECK(cu.gxfake_bytes_allocated() == 64);
    // Release calls still release (and report the sticky error).
    CHILD_CHECK(cu.cuStreamDestroy_v2(stream) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHILD_CHECK(cu.cuMemFree_v2(buf) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHILD_CHECK(cu.gxfake_bytes_allocated() == 0);
    return 0;
  });
  EXPECT_EQ(rc, 0);
}

// Every pointer a kernel dereferences is checked over its whole range.
TEST(FakeCudaForkTest, OutOfBoundsKernelWriteFaults) {
  const int rc = RunInChildWithContext([](const FakeCuda& cu, CUcontext ctx, CUstream stream) {
    CUmodule mod = nullptr;
    CHILD_CU(cu.cuModuleLoadDataEx(&mod, "GXFAKE1\ngx_fill_u32\n", 0, nullptr, nullptr));
    CUfunction fill = nullptr;
    CHILD_CU(cu.cuModuleGetFunction(&fill, mod, "gx_fill_u32"));
    CUdeviceptr buf = 0;
    CHILD_CU(cu.cuMemAlloc_v2(&buf, 64));
    uint32_t value = 1;
    uint64_t n = 17;  // One word past the end.
    void* params[] = {&buf, &value, &n};
    CHILD_CU(cu.cuLaunchKernel(fill, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr));
    CHILD_CHECK(cu.cuStreamSynchronize(stream) == CUDA_ERROR_ILLEGAL_ADDRESS);
    return 0;
  });
  EXPECT_EQ(rc, 0);
}

// A faulting kernel node faults the process as a launched kernel does: the
// replay's later nodes are dropped, every later call fails.
TEST(FakeCudaForkTest, GraphKernelFaultIsSticky) {
  const int rc = RunInChildWithContext([](const FakeCuda& cu, CUcontext ctx, CUstream stream) {
    CUmodule mod = nullptr;
    CHILD_CU(cu.cuModuleLoadDataEx(&mod, "GXFAKE1\ngx_fault\n", 0, nullptr, nullptr));
    CUfunction fault = nullptr;
    CHILD_CU(cu.cuModuleGetFunction(&fault, mod, "gx_fault"));
    CUdeviceptr buf = 0;
    CHILD_CU(cu.cuMemAlloc_v2(&buf, 64));
    CHILD_CU(cu.cuMemsetD8Async(buf, 0xAB, 64, stream));
    uint64_t bad_address = 0x10;
    void* params[] = {&bad_address};
    CUgraph graph = nullptr;
    CHILD_CU(cu.cuGraphCreate(&graph, 0));
    CUgraphNode kernel = nullptr, memset = nullptr;
    const CUDA_KERNEL_NODE_PARAMS_v2 p = KernelNode(fault, 1, 1, params);
    CHILD_CU(cu.cuGraphAddKernelNode_v2(&kernel, graph, nullptr, 0, &p));
    const CUDA_MEMSET_NODE_PARAMS m = MemsetNode(buf, 0, 64);
    CHILD_CU(cu.cuGraphAddMemsetNode(&memset, graph, &kernel, 1, &m, ctx));
    CUgraphExec exec = nullptr;
    CHILD_CU(cu.cuGraphInstantiateWithFlags(&exec, graph, 0));
    CHILD_CU(cu.cuGraphLaunch(exec, stream));  // found when it runs
    CHILD_CHECK(cu.cuStreamSynchronize(stream) == CUDA_ERROR_ILLEGAL_ADDRESS);
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(buf);
    for (int i = 0; i < 64; ++i) CHILD_CHECK(bytes[i] == 0xAB);  // dropped
    CHILD_CHECK(cu.cuGraphLaunch(exec, stream) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHILD_CHECK(cu.cuGraphCreate(&graph, 0) == CUDA_ERROR_ILLEGAL_ADDRESS);
    // Destroying still destroys, and reports the fault.
    CHILD_CHECK(cu.cuGraphExecDestroy(exec) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHILD_CHECK(cu.gxfake_graphs() == 1);
    return 0;
  });
  EXPECT_EQ(rc, 0);
}

// A graph does not keep its memory alive: a copy node whose buffer is freed
// before the replay faults when it runs, as a queued copy would.
TEST(FakeCudaForkTest, GraphNodeOfFreedMemoryFaults) {
  const int rc = RunInChildWithContext([](const FakeCuda& cu, CUcontext ctx, CUstream stream) {
    CUdeviceptr a = 0, b = 0;
    CHILD_CU(cu.cuMemAlloc_v2(&a, 64));
    CHILD_CU(cu.cuMemAlloc_v2(&b, 64));
    CUgraph graph = nullptr;
    CHILD_CU(cu.cuGraphCreate(&graph, 0));
    CUgraphNode copy = nullptr;
    const CUDA_MEMCPY3D c = CopyNode(b, a, 64);
    CHILD_CU(cu.cuGraphAddMemcpyNode(&copy, graph, nullptr, 0, &c, ctx));
    CUgraphExec exec = nullptr;
    CHILD_CU(cu.cuGraphInstantiateWithFlags(&exec, graph, 0));
    CHILD_CU(cu.cuGraphLaunch(exec, stream));
    CHILD_CU(cu.cuStreamSynchronize(stream));
    CHILD_CU(cu.cuMemFree_v2(a));
    CHILD_CU(cu.cuGraphLaunch(exec, stream));
    CHILD_CHECK(cu.cuStreamSynchronize(stream) == CUDA_ERROR_ILLEGAL_ADDRESS);
    return 0;
  });
  EXPECT_EQ(rc, 0);
}

// A second, fresh copy of the library: not initialized, then GXFAKE_FAIL_INIT
// and the configuration variables.
// GXFAKE_SIMULATOR=1 (gpuexecd --simulator): one device named as
// simulated, H200-like, with 16 GiB that are only counted, never taken.
TEST(FakeCudaForkTest, SimulatorProfile) {
  const int rc = RunInChild([]() -> int {
    unsetenv("GXFAKE_DEVICE_COUNT");
    unsetenv("GXFAKE_MEMORY_BYTES");
    setenv("GXFAKE_SIMULATOR", "1", 1);
    char dir_template[] = "/tmp/gxfake_sim.XXXXXX";
    CHILD_CHECK(mkdtemp(dir_template) != nullptr);
    const std::string copy = std::string(dir_template) + "/libsim.so";
    CHILD_CHECK(
        std::system((std::string("cp '") + GXFAKE_LIBRARY_PATH + "' '" + copy + "'").c_str()) == 0);
    FakeCuda cu;
    const std::string error = cu.Load(copy.c_str());
    std::remove(copy.c_str());
    rmdir(dir_template);
    CHILD_CHECK(error.empty());
    CHILD_CU(cu.cuInit(0));
    int count = 0, major = 0, sms = 0;
    CHILD_CU(cu.cuDeviceGetCount(&count));
    CHILD_CHECK(count == 1);
    char name[128] = {0};
    CHILD_CU(cu.cuDeviceGetName(name, sizeof(name), 0));
    CHILD_CHECK(std::strstr(name, "simulated") != nullptr);
    CHILD_CU(cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0));
    CHILD_CU(cu.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0));
    CHILD_CHECK(major == 9 && sms == 132);
    size_t total = 0;
    CHILD_CU(cu.cuDeviceTotalMem_v2(&total, 0));
    CHILD_CHECK(total == (size_t{16} << 30));
    // Nothing of the 16 GiB is resident: the process stays small.
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("VmRSS:", 0) == 0) CHILD_CHECK(std::stoull(line.substr(6)) < (1u << 20));
    }
    return 0;
  });
  EXPECT_EQ(rc, 0);
}

TEST(FakeCudaForkTest, FreshLibraryHonoursTheEnvironment) {
  char dir_template[] = "/tmp/gxfake_test.XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string copy = std::string(dir_template) + "/libcopy.so";
  const std::string command = std::string("cp '") + GXFAKE_LIBRARY_PATH + "' '" + copy + "'";
  ASSERT_EQ(std::system(command.c_str()), 0);

  const int rc = RunInChild([&copy]() -> int {
    FakeCuda cu;
    const std::string error = cu.Load(copy.c_str());
    if (!error.empty()) {
      std::fprintf(stderr, "%s\n", error.c_str());
      return 1;
    }
    CHILD_CHECK(cu.handle != g_cuda->handle);
    int count = 0;
    CHILD_CHECK(cu.cuDeviceGetCount(&count) == CUDA_ERROR_NOT_INITIALIZED);
    CUdeviceptr ptr = 0;
    CHILD_CHECK(cu.cuMemAlloc_v2(&ptr, 16) == CUDA_ERROR_NOT_INITIALIZED);
    const char* name = nullptr;
    CHILD_CU(cu.cuGetErrorName(CUDA_ERROR_NOT_INITIALIZED, &name));

    setenv("GXFAKE_FAIL_INIT", "1", 1);
    CHILD_CHECK(cu.cuInit(0) == CUDA_ERROR_NO_DEVICE);
    CHILD_CHECK(cu.cuDeviceGetCount(&count) == CUDA_ERROR_NOT_INITIALIZED);

    unsetenv("GXFAKE_FAIL_INIT");
    setenv("GXFAKE_DEVICE_COUNT", "3", 1);
    setenv("GXFAKE_MEMORY_BYTES", "4096", 1);
    CHILD_CU(cu.cuInit(0));
    CHILD_CU(cu.cuDeviceGetCount(&count));
    CHILD_CHECK(count == 3);
    CUcontext ctx = nullptr;
    CHILD_CU(cu.cuDevicePrimaryCtxRetain(&ctx, 2));
    CHILD_CU(cu.cuCtxSetCurrent(ctx));
    CHILD_CHECK(cu.cuMemAlloc_v2(&ptr, 4097) == CUDA_ERROR_OUT_OF_MEMORY);
    CHILD_CU(cu.cuMemAlloc_v2(&ptr, 4096));
    CHILD_CHECK(cu.gxfake_bytes_allocated() == 4096);
    CHILD_CHECK(g_cuda->gxfake_bytes_allocated() == 0);  // Separate state.
    CHILD_CU(cu.cuDevicePrimaryCtxRelease_v2(2));
    CHILD_CHECK(cu.gxfake_bytes_allocated() == 0);
    return 0;
  });
  EXPECT_EQ(rc, 0);
  std::remove(copy.c_str());
  rmdir(dir_template);
}

}  // namespace
