// The libcuda test double in fork()ed children: sticky kernel faults that
// poison the process, and fresh copies of the library under its settings.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "tests/fake_cuda/fake_cuda_test_fixture.h"

namespace gxfake::testing {
namespace {

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
}  // namespace gxfake::testing
