// Unit test of the libcuda test double. It dlopen()s libgpuexec_fakecuda.so
// the way the daemon opens libcuda.so.1 and drives it only through dlsym'd
// entry points (fake_cuda_test_fixture.h). Here: the environment that loads
// it, calls that need no context, and memory and modules in a context.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fake_cuda/fake_cuda_test_fixture.h"

#ifndef GXFAKE_LIBRARY_PATH
#error "GXFAKE_LIBRARY_PATH must name the built libgpuexec_fakecuda.so"
#endif

namespace gxfake::testing {
namespace {

constexpr char kPtxLog[] =
    "ptxas application ptx input; error   : PTX: no .entry (a kernel) in the text";

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

}  // namespace
}  // namespace gxfake::testing
