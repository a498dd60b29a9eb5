// The libcuda test double's launches, events, host functions and streams
// on many threads, and its green contexts: parts of device 0's SMs.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/fake_cuda/fake_cuda_test_fixture.h"

namespace gxfake::testing {
namespace {

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

}  // namespace
}  // namespace gxfake::testing
