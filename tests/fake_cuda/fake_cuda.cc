// A test double of the CUDA driver (libcuda) at its C ABI.
//
// The daemon opens this library with dlopen() exactly as it opens the real
// "libcuda.so.1" and resolves the same entry points with dlsym(), so the
// test suites exercise every production line except the driver itself.
//
// Model:
//   * Devices are configured from the environment at the first successful
//     cuInit: GXFAKE_DEVICE_COUNT (default 1), GXFAKE_MEMORY_BYTES per device
//     (default 8 GiB), GXFAKE_FAIL_INIT=1 (cuInit fails with NO_DEVICE),
//     GXFAKE_DRIVER_VERSION (what cuDriverGetVersion says; default 13000),
//     GXFAKE_INIT_DELAY_MS (cuInit takes that long), GXFAKE_INIT_NOT_READY_FILE
//     (while that file exists, cuInit fails with MPS_SERVER_NOT_READY, as
//     under MPS while the server takes down the clients of a fatal fault),
//     GXFAKE_REACHED_FILE (once that file exists, the next process to call
//     removes it and is poisoned, as another MPS client's fatal fault
//     reaches it).
//   * "Device memory" is host memory: a CUdeviceptr is the address of an
//     aligned host block. Every allocation is tracked so that copies and
//     kernels can be checked against live allocations of the right device.
//   * Each CUstream owns a worker thread that runs its operations in order.
//     Like the driver's launch queue, a stream holds at most
//     GXFAKE_STREAM_QUEUE operations (default 1024) not yet finished; an
//     enqueue past that blocks the caller until one finishes.
//   * Kernels are host functions ("models") that mirror
//     tests/kernels/gx_kernels.cu, plus the examples' kernels (`saxpy` of
//     client/cpp/examples/saxpy.cu, the Triton tutorial's `add_kernel`).
//     A module image "GXFAKE1\n<kernel name>\n..." names the kernels it
//     holds (names without a model are left out). A real cubin, PTX or
//     fatbin is read by image_reader.h: every kernel in it loads with the
//     image's own parameter layout; a kernel runs when a model of that name
//     has that layout, else its launch fails with CUDA_ERROR_NOT_SUPPORTED
//     (the daemon says the simulator runs only its example kernels).
//   * GXFAKE_SIMULATOR=1 (set by `gpuexecd --simulator`) names the devices
//     as simulated H200-like GPUs with 16 GiB each by default. Device memory
//     is only a number to count against: host memory is taken per
//     allocation, never for the whole device.
//   * Green contexts: a device is SMs 0..131; cuDevSmResourceSplitByCount
//     cuts ranges of consecutive SMs (at least 8, multiples of 8, as on
//     compute capability 9.0). A green context's stream belongs to the
//     device's primary context (which the green context retains) and
//     carries the range to its kernels (KernelLaunch; gx_sm_ids reports
//     it); once the green context is destroyed, every call with the stream
//     fails with CUDA_ERROR_CONTEXT_IS_DESTROYED (not sticky).
//   * Graphs: a graph is its nodes (kernel, memset, 1-D device copy) with
//     their dependencies; instantiating copies them in dependency order, and
//     a launch enqueues them on the stream as the launches, memsets and
//     copies above (graphs.cc says what is modelled).
//   * A kernel fault poisons the whole process: every later driver call
//     returns CUDA_ERROR_ILLEGAL_ADDRESS, as on real hardware.
//
// The double's files, by responsibility (fake_cuda_internal.h holds what
// they share, with the rules of ownership and locking):
//   fake_cuda.cc       process-wide state, the checks every entry point
//                      makes, cuInit, the driver version, error names
//   devices.cc         devices and their primary contexts
//   memory.cc          device and host memory, memsets and copies, pools
//   streams.cc         streams (a worker thread each) and events
//   modules.cc         modules and their functions
//   launch.cc          kernel launches and occupancy
//   kernel_models.cc   the host models of the kernels, and tensor maps
//   green_contexts.cc  SM resources and green contexts
//   graphs.cc          graphs, their nodes, instantiated graphs and their
//                      launches

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "tests/fake_cuda/fake_cuda_internal.h"

namespace gxfake::internal {

// ---------------------------------------------------------------------------
// Process-wide state.
// ---------------------------------------------------------------------------

std::atomic<bool> g_initialized{false};
std::atomic<bool> g_poisoned{false};

Driver& GetDriver() {
  static Driver* const driver = new Driver();
  return *driver;
}

// ---------------------------------------------------------------------------
// The checks of every entry point.
// ---------------------------------------------------------------------------

CUresult InitStatus() {
  if (!g_initialized.load(std::memory_order_acquire)) {
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  if (InDriverCallback()) return CUDA_ERROR_NOT_PERMITTED;
  return CUDA_SUCCESS;
}

namespace {

// GXFAKE_REACHED_FILE: once that file exists, the next call of one process
// (the one that removes it) finds it poisoned, as an MPS client finds
// another client's fatal fault.
void CheckReached() {
  static const char* const reached = std::getenv("GXFAKE_REACHED_FILE");
  if (reached != nullptr && *reached != '\0' && !g_poisoned.load(std::memory_order_acquire) &&
      unlink(reached) == 0) {
    Poison("another client's fault reached this process (GXFAKE_REACHED_FILE)");
  }
}

}  // namespace

CUresult EntryStatus() {
  GX_RETURN_IF_ERROR(InitStatus());
  CheckReached();
  if (g_poisoned.load(std::memory_order_acquire)) {
    return CUDA_ERROR_ILLEGAL_ADDRESS;
  }
  return CUDA_SUCCESS;
}

CUresult StickyStatus() {
  return g_poisoned.load(std::memory_order_acquire) ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}

void Poison(const char* what) {
  if (!g_poisoned.exchange(true)) {
    std::fprintf(stderr,
                 "gxfake: %s: illegal memory access; every later driver call "
                 "returns CUDA_ERROR_ILLEGAL_ADDRESS\n",
                 what);
  }
}

Device* DeviceLocked(Driver& d, CUdevice ordinal) {
  if (ordinal < 0 || static_cast<size_t>(ordinal) >= d.devices.size()) {
    return nullptr;
  }
  return d.devices[ordinal].get();
}

CUresult CheckDevice(CUdevice ordinal) {
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  return DeviceLocked(d, ordinal) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

uint64_t EnvU64(const char* name, uint64_t fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long parsed = std::strtoull(value, &end, 0);
  if (end == value || *end != '\0') return fallback;
  return parsed;
}

namespace {

// cuDriverGetVersion's answer, and each device's memory by default.
constexpr int kDriverVersion = 13000;
constexpr uint64_t kDefaultMemoryBytes = 8ull << 30;
constexpr uint64_t kSimulatorMemoryBytes = 16ull << 30;

// ---------------------------------------------------------------------------
// Error names.
// ---------------------------------------------------------------------------

struct ErrorInfo {
  CUresult code;
  const char* name;
  const char* text;
};

#define GX_ERROR(code, text) \
  { code, #code, text }

constexpr ErrorInfo kErrors[] = {
    GX_ERROR(CUDA_SUCCESS, "no error"),
    GX_ERROR(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    GX_ERROR(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    GX_ERROR(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    GX_ERROR(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    GX_ERROR(CUDA_ERROR_PROFILER_DISABLED, "profiler disabled while using external profiling tool"),
    GX_ERROR(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library"),
    GX_ERROR(CUDA_ERROR_DEVICE_UNAVAILABLE, "device unavailable"),
    GX_ERROR(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    GX_ERROR(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    GX_ERROR(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"),
    GX_ERROR(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    GX_ERROR(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context is already current"),
    GX_ERROR(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed"),
    GX_ERROR(CUDA_ERROR_UNMAP_FAILED, "unmapping of buffer object failed"),
    GX_ERROR(CUDA_ERROR_NO_BINARY_FOR_GPU,
             "no kernel image is available for execution on the device"),
    GX_ERROR(CUDA_ERROR_ECC_UNCORRECTABLE, "uncorrectable ECC error encountered"),
    GX_ERROR(CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed"),
    GX_ERROR(CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
             "the provided PTX was compiled with an unsupported toolchain."),
    GX_ERROR(CUDA_ERROR_INVALID_SOURCE, "device kernel source is invalid"),
    GX_ERROR(CUDA_ERROR_FILE_NOT_FOUND, "file not found"),
    GX_ERROR(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS"),
    GX_ERROR(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    GX_ERROR(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state"),
    GX_ERROR(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    GX_ERROR(CUDA_ERROR_NOT_READY, "device not ready"),
    GX_ERROR(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
    GX_ERROR(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch"),
    GX_ERROR(CUDA_ERROR_LAUNCH_TIMEOUT, "the launch timed out and was terminated"),
    GX_ERROR(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled"),
    GX_ERROR(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access has not been enabled"),
    GX_ERROR(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE,
             "the primary context for the device is already active"),
    GX_ERROR(CUDA_ERROR_CONTEXT_IS_DESTROYED, "the context is no longer usable"),
    GX_ERROR(CUDA_ERROR_ASSERT, "device-side assert triggered"),
    GX_ERROR(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
             "part or all of the requested memory range is already mapped"),
    GX_ERROR(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
             "pointer does not correspond to a registered memory region"),
    GX_ERROR(CUDA_ERROR_HARDWARE_STACK_ERROR, "hardware stack error"),
    GX_ERROR(CUDA_ERROR_ILLEGAL_INSTRUCTION, "an illegal instruction was encountered"),
    GX_ERROR(CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned address"),
    GX_ERROR(CUDA_ERROR_INVALID_ADDRESS_SPACE,
             "operation not supported on global/shared address space"),
    GX_ERROR(CUDA_ERROR_INVALID_PC, "invalid program counter"),
    GX_ERROR(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
    GX_ERROR(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "too many blocks in cooperative launch"),
    GX_ERROR(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
    GX_ERROR(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    GX_ERROR(CUDA_ERROR_SYSTEM_NOT_READY, "system not yet initialized"),
    GX_ERROR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
             "operation not permitted when stream is capturing"),
    GX_ERROR(CUDA_ERROR_TIMEOUT, "the wait operation has timed out"),
    GX_ERROR(CUDA_ERROR_INVALID_CLUSTER_SIZE, "invalid cluster size"),
    GX_ERROR(CUDA_ERROR_INVALID_RESOURCE_TYPE, "invalid resource type"),
    GX_ERROR(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, "invalid resource configuration"),
    GX_ERROR(CUDA_ERROR_UNKNOWN, "unknown error"),
};

#undef GX_ERROR

const ErrorInfo* FindError(CUresult code) {
  for (const ErrorInfo& e : kErrors) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

}  // namespace
}  // namespace gxfake::internal

using namespace gxfake::internal;  // NOLINT(build/namespaces): the entry points are global

// --- Initialization, version, errors ---

GX_EXPORT CUresult cuInit(unsigned int Flags) {
  if (InDriverCallback()) return CUDA_ERROR_NOT_PERMITTED;
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  if (g_initialized.load(std::memory_order_acquire)) return StickyStatus();
  if (EnvU64("GXFAKE_FAIL_INIT", 0) == 1) return CUDA_ERROR_NO_DEVICE;
  if (const char* f = std::getenv("GXFAKE_INIT_NOT_READY_FILE"); f != nullptr && *f != '\0') {
    if (access(f, F_OK) == 0) return CUDA_ERROR_MPS_SERVER_NOT_READY;
  }
  // A slow driver start, as a real one takes a few hundred milliseconds.
  std::this_thread::sleep_for(std::chrono::milliseconds(EnvU64("GXFAKE_INIT_DELAY_MS", 0)));
  const uint64_t count = EnvU64("GXFAKE_DEVICE_COUNT", 1);
  if (count == 0 || count > 64) return CUDA_ERROR_NO_DEVICE;
  const bool simulator = EnvU64("GXFAKE_SIMULATOR", 0) == 1;
  const uint64_t memory =
      EnvU64("GXFAKE_MEMORY_BYTES", simulator ? kSimulatorMemoryBytes : kDefaultMemoryBytes);
  for (uint64_t i = 0; i < count; ++i) {
    auto dev = std::make_unique<Device>();
    dev->name = simulator ? "simulated H200 (gpuexec)" : "gpuexec fake GPU " + std::to_string(i);
    dev->total_bytes = memory;
    dev->context.device = static_cast<int>(i);
    dev->pool.device = static_cast<int>(i);
    d.devices.push_back(std::move(dev));
  }
  g_initialized.store(true, std::memory_order_release);
  return CUDA_SUCCESS;
}

// Like the driver, answers before cuInit.
GX_EXPORT CUresult cuDriverGetVersion(int* driverVersion) {
  if (InDriverCallback()) return CUDA_ERROR_NOT_PERMITTED;
  if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GX_RETURN_IF_ERROR(StickyStatus());
  // GXFAKE_DRIVER_VERSION: an older driver's number (what the daemon
  // refuses on it; the entry points stay).
  *driverVersion = static_cast<int>(EnvU64("GXFAKE_DRIVER_VERSION", kDriverVersion));
  return CUDA_SUCCESS;
}

// Never fails for a known code, even before cuInit or after a fault.
GX_EXPORT CUresult cuGetErrorName(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorInfo* e = FindError(error);
  *pStr = e ? e->name : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

GX_EXPORT CUresult cuGetErrorString(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorInfo* e = FindError(error);
  *pStr = e ? e->text : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// --- Signatures ---

GX_CHECK_SIGNATURE(cuInit, cuInit);
GX_CHECK_SIGNATURE(cuDriverGetVersion, cuDriverGetVersion);
GX_CHECK_SIGNATURE(cuGetErrorName, cuGetErrorName);
GX_CHECK_SIGNATURE(cuGetErrorString, cuGetErrorString);
