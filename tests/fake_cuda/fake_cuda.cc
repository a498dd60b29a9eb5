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
//   * A kernel fault poisons the whole process: every later driver call
//     returns CUDA_ERROR_ILLEGAL_ADDRESS, as on real hardware.
//
// Ownership: all driver state lives in one Driver object that is created on
// first use and intentionally never destroyed (worker threads may still be
// parked on it at exit). Handles given to callers are raw pointers to objects
// owned by the Driver's tables; a handle is valid from its create call until
// its destroy call (or the teardown of its primary context).
//
// Locking: Driver::mu guards every table and every event's state. It is never
// held while waiting for a stream. Each stream has its own mutex for its
// queue. Lock order: Driver::mu may be taken while no stream mutex is held;
// a stream mutex is never held while taking Driver::mu.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "server/cuda/cuda_api.h"
#include "tests/fake_cuda/image_reader.h"

#define GX_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

struct KernelDef;

// One queued stream operation. `droppable` operations (copies, memsets,
// kernels) are skipped once the process is poisoned; the others (host
// functions, event records, stream-ordered frees) always run so that no
// waiter hangs and no memory leaks.
struct StreamOp {
  std::function<void()> run;
  bool droppable = true;
};

}  // namespace

// The handle types below are the opaque structs that cuda_api.h declares;
// they must live in the global namespace to match its typedefs.

// A primary context. One per device, created at cuInit and never freed, so
// the handle stays stable across release/retain cycles like the driver's.
struct CUctx_st {
  int device = 0;
  int retain_count = 0;             // Guarded by Driver::mu.
  std::atomic<bool> active{false};  // True while retain_count > 0.
};

// The default memory pool of a device. Owned by its Device; never freed.
struct CUmemPoolHandle_st {
  int device = 0;
};

// A kernel inside a loaded module. Owned by its CUmod_st; dies with it.
struct CUfunc_st {
  std::string name;
  std::vector<gxfake::ParamSlot> params;  // As the image declares them.
  int registers = 16;                     // Per thread: the image's, where it says.
  // The host model that runs it (static, never freed); null when the
  // double has none for this name and layout: launches are refused.
  const KernelDef* kernel = nullptr;
  CUmod_st* module = nullptr;
  // Settable attributes (guarded by Driver::mu).
  int max_dynamic_shared = 49152;
  int preferred_carveout = -1;
  int non_portable_cluster_size_allowed = 0;
  int cluster_scheduling_policy = 0;
};

// A loaded module. Owned by Driver::modules from cuModuleLoadDataEx until
// cuModuleUnload (or the teardown of its context).
struct CUmod_st {
  CUctx_st* context = nullptr;
  std::vector<std::unique_ptr<CUfunc_st>> functions;
};

// An event. Shared between Driver::events (until cuEventDestroy) and the
// pending record operations that will complete it.
struct CUevent_st {
  CUctx_st* context = nullptr;
  unsigned int flags = 0;
  // Guarded by Driver::mu. `records` counts cuEventRecord calls; `reached`
  // is the sequence number of the latest record the stream has executed.
  uint64_t records = 0;
  uint64_t reached = 0;
  std::chrono::steady_clock::time_point time;
};

// A green context: SMs [first_sm, first_sm + sm_count) of a device. Shared
// between Driver::green_contexts (until cuGreenCtxDestroy) and the streams
// made in it, which refuse every call once `destroyed` is set.
struct CUgreenCtx_st {
  int device = 0;
  unsigned first_sm = 0;
  unsigned sm_count = 0;
  std::atomic<bool> destroyed{false};
};

// A resource descriptor (cuDevResourceGenerateDesc): the same SM range.
// Owned by Driver::resource_descs and never freed (the driver has no call
// to destroy one).
struct CUdevResourceDesc_st {
  int device = 0;
  unsigned first_sm = 0;
  unsigned sm_count = 0;
};

// A stream with its worker thread. Shared between Driver::streams (until
// cuStreamDestroy) and callers that are waiting on it; the worker thread is
// joined by whoever removes the stream from the table.
struct CUstream_st {
  CUctx_st* context = nullptr;
  unsigned int flags = 0;
  // Set for cuGreenCtxStreamCreate: its kernels run on the green context's
  // SMs (the others on the whole device).
  std::shared_ptr<const CUgreenCtx_st> green;
  int priority = 0;  // in [kGreatestPriority, 0]; lower is served first
  std::mutex mu;
  std::condition_variable cv;  // Signals both new work and completed work.
  std::deque<StreamOp> queue;  // Guarded by mu.
  uint64_t enqueued = 0;       // Guarded by mu.
  uint64_t completed = 0;      // Guarded by mu.
  bool stopping = false;       // Guarded by mu.
  std::thread worker;
};

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kDriverVersion = 13000;
// cuCtxGetStreamPriorityRange, as an H100's: least 0, greatest -5.
constexpr int kGreatestPriority = -5;
constexpr uint64_t kDefaultMemoryBytes = 8ull << 30;
constexpr uint64_t kSimulatorMemoryBytes = 16ull << 30;
// The kernels `gpuexecd --simulator` runs, as its refusal lists them.
constexpr char kExampleKernels[] = "saxpy, add_kernel";
constexpr int kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlockDim[3] = {1024, 1024, 64};
constexpr unsigned kMaxGridDim[3] = {2147483647u, 65535u, 65535u};
constexpr int kMaxSharedPerBlock = 49152;
constexpr int kMaxSharedPerBlockOptin = 232448;
constexpr unsigned kMaxPortableClusterSize = 8;
constexpr unsigned kMaxNonPortableClusterSize = 16;
constexpr size_t kDeviceAlignment = 256;
constexpr size_t kHostAlignment = 4096;
constexpr char kModuleMagic[] = "GXFAKE1\n";
// A failed load's JIT error log leads with this, then says what the double
// could not read.
constexpr char kPtxErrorLog[] = "ptxas application ptx input; error   : ";

// ---------------------------------------------------------------------------
// Process-wide state.
// ---------------------------------------------------------------------------

std::atomic<bool> g_initialized{false};
std::atomic<bool> g_poisoned{false};
std::atomic<uint64_t> g_module_loads{0};

// The context made current on this thread by cuCtxSetCurrent (not owned).
thread_local CUctx_st* t_current_context = nullptr;
// True on stream worker threads and while a host function runs inline: the
// driver must not be called from there (CUDA_ERROR_NOT_PERMITTED).
thread_local bool t_in_driver_callback = false;

struct Allocation {
  size_t size = 0;
  int device = 0;
  // cuMemFreeAsync was enqueued: new work may not use the block, work that
  // is already queued ahead of the free may.
  bool free_pending = false;
};

struct Device {
  std::string name;
  uint64_t total_bytes = 0;
  uint64_t allocated_bytes = 0;  // Guarded by Driver::mu.
  CUctx_st context;
  CUmemPoolHandle_st pool;
};

struct Driver {
  std::mutex mu;
  // Fixed by the first successful cuInit; never shrinks afterwards.
  std::vector<std::unique_ptr<Device>> devices;
  // Device allocations by base address; each block came from aligned_alloc.
  std::map<uintptr_t, Allocation> allocations;
  // cuMemHostAlloc blocks (base -> size) and cuMemHostRegister ranges.
  std::unordered_map<void*, size_t> host_allocations;
  std::map<uintptr_t, size_t> host_registrations;
  std::unordered_map<CUstream_st*, std::shared_ptr<CUstream_st>> streams;
  std::unordered_map<CUevent_st*, std::shared_ptr<CUevent_st>> events;
  std::unordered_map<CUmod_st*, std::unique_ptr<CUmod_st>> modules;
  std::unordered_set<CUfunc_st*> functions;
  std::unordered_map<CUgreenCtx_st*, std::shared_ptr<CUgreenCtx_st>> green_contexts;
  std::unordered_map<CUdevResourceDesc_st*, std::unique_ptr<CUdevResourceDesc_st>> resource_descs;
};

// Leaked on purpose: see the file comment.
Driver& GetDriver() {
  static Driver* const driver = new Driver();
  return *driver;
}

#define GX_RETURN_IF_ERROR(expr)                       \
  do {                                                 \
    const CUresult gx_status_ = (expr);                \
    if (gx_status_ != CUDA_SUCCESS) return gx_status_; \
  } while (0)

// The state every entry point checks first.
CUresult InitStatus() {
  if (!g_initialized.load(std::memory_order_acquire)) {
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  if (t_in_driver_callback) return CUDA_ERROR_NOT_PERMITTED;
  return CUDA_SUCCESS;
}

// InitStatus plus the sticky fault.
void Poison(const char* what);

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

CUresult EntryStatus() {
  GX_RETURN_IF_ERROR(InitStatus());
  CheckReached();
  if (g_poisoned.load(std::memory_order_acquire)) {
    return CUDA_ERROR_ILLEGAL_ADDRESS;
  }
  return CUDA_SUCCESS;
}

// What calls that release resources return: they do their work even after a
// fault (so that tests leak nothing) but still report the sticky error.
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

CUresult CurrentContext(CUctx_st** out) {
  CUctx_st* ctx = t_current_context;
  if (ctx == nullptr || !ctx->active.load(std::memory_order_acquire)) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  *out = ctx;
  return CUDA_SUCCESS;
}

// Requires Driver::mu. Null when `ordinal` names no device.
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

// ---------------------------------------------------------------------------
// Device memory bookkeeping.
// ---------------------------------------------------------------------------

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

bool RangeIsLive(uintptr_t addr, size_t bytes, int device, bool allow_free_pending) {
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  return FindRangeLocked(d, addr, bytes, device, allow_free_pending) != nullptr;
}

// Requires Driver::mu. Frees the block at `base` if it is still tracked.
void FreeAllocationLocked(Driver& d, uintptr_t base) {
  auto it = d.allocations.find(base);
  if (it == d.allocations.end()) return;
  d.devices[it->second.device]->allocated_bytes -= it->second.size;
  std::free(reinterpret_cast<void*>(base));
  d.allocations.erase(it);
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

// ---------------------------------------------------------------------------
// Streams.
// ---------------------------------------------------------------------------

bool IsNullStream(CUstream h) {
  return h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD;
}

void StreamWorkerMain(CUstream_st* s) {
  t_in_driver_callback = true;
  for (;;) {
    StreamOp op;
    {
      std::unique_lock<std::mutex> lock(s->mu);
      s->cv.wait(lock, [s] { return !s->queue.empty() || s->stopping; });
      if (s->queue.empty()) return;  // Stopping and drained.
      op = std::move(s->queue.front());
      s->queue.pop_front();
    }
    if (!(op.droppable && g_poisoned.load(std::memory_order_acquire))) {
      op.run();
    }
    op = StreamOp();  // Drop captures (e.g. event references) before counting.
    {
      std::lock_guard<std::mutex> lock(s->mu);
      ++s->completed;
    }
    s->cv.notify_all();
  }
}

// Runs `op` on the calling thread (the NULL stream is synchronous here).
void RunInline(StreamOp& op) {
  if (op.droppable && g_poisoned.load(std::memory_order_acquire)) return;
  const bool saved = t_in_driver_callback;
  t_in_driver_callback = true;
  op.run();
  t_in_driver_callback = saved;
}

uint64_t EnvU64(const char* name, uint64_t fallback);

// Null `s` means the NULL stream. Fails only for a stream being destroyed.
CUresult Enqueue(const std::shared_ptr<CUstream_st>& s, StreamOp op) {
  if (!s) {
    RunInline(op);
    return CUDA_SUCCESS;
  }
  static const uint64_t limit = std::max<uint64_t>(1, EnvU64("GXFAKE_STREAM_QUEUE", 1024));
  {
    std::unique_lock<std::mutex> lock(s->mu);
    s->cv.wait(lock, [&] { return s->stopping || s->enqueued - s->completed < limit; });
    if (s->stopping) return CUDA_ERROR_INVALID_HANDLE;
    s->queue.push_back(std::move(op));
    ++s->enqueued;
  }
  s->cv.notify_all();
  return CUDA_SUCCESS;
}

// Waits until everything enqueued before the call has run. Must not be
// called on the stream's own worker (entry points refuse that thread).
void DrainStream(CUstream_st* s) {
  std::unique_lock<std::mutex> lock(s->mu);
  const uint64_t target = s->enqueued;
  s->cv.wait(lock, [s, target] { return s->completed >= target; });
}

// Lets queued work finish, then joins the worker. Called once, by whoever
// removed the stream from Driver::streams.
void StopStream(CUstream_st* s) {
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->stopping = true;
  }
  s->cv.notify_all();
  if (s->worker.joinable()) s->worker.join();
}

// Resolves a stream handle. The NULL stream resolves to an empty pointer.
// `ctx` (when not null) must own the stream.
CUresult ResolveStream(CUstream h, CUctx_st* ctx, std::shared_ptr<CUstream_st>* out) {
  out->reset();
  if (IsNullStream(h)) return CUDA_SUCCESS;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.streams.find(h);
  if (it == d.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (ctx != nullptr && it->second->context != ctx) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  // A stream whose green context is gone refuses work (not sticky).
  const auto& green = it->second->green;
  if (green != nullptr && green->destroyed.load()) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *out = it->second;
  return CUDA_SUCCESS;
}

// Destroys everything a primary context owns when its last retain goes.
void TearDownContext(CUctx_st* ctx) {
  Driver& d = GetDriver();
  std::vector<std::shared_ptr<CUstream_st>> streams;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    for (auto it = d.streams.begin(); it != d.streams.end();) {
      if (it->second->context == ctx) {
        streams.push_back(std::move(it->second));
        it = d.streams.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = d.events.begin(); it != d.events.end();) {
      it = it->second->context == ctx ? d.events.erase(it) : std::next(it);
    }
    for (auto it = d.modules.begin(); it != d.modules.end();) {
      if (it->second->context == ctx) {
        for (auto& f : it->second->functions) d.functions.erase(f.get());
        it = d.modules.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& s : streams) StopStream(s.get());
  std::lock_guard<std::mutex> lock(d.mu);
  std::vector<uintptr_t> bases;
  for (const auto& [base, a] : d.allocations) {
    if (a.device == ctx->device) bases.push_back(base);
  }
  for (uintptr_t base : bases) FreeAllocationLocked(d, base);
}

// ---------------------------------------------------------------------------
// Kernels: host implementations of tests/kernels/gx_kernels.cu.
// ---------------------------------------------------------------------------

using gxfake::ParamSlot;

// Everything a kernel body sees: the geometry and a copy of the argument
// bytes taken at launch time.
struct KernelLaunch {
  int device = 0;
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned shared_bytes = 0;
  unsigned cluster[3] = {1, 1, 1};
  bool cooperative = false;
  // The SMs the stream's kernels run on: [first_sm, first_sm + sm_count).
  unsigned first_sm = 0;
  unsigned sm_count = 0;
  std::vector<uint8_t> args;

  template <typename T>
  T Arg(size_t offset) const {
    T value;
    std::memcpy(&value, args.data() + offset, sizeof(T));
    return value;
  }
};

// Returns false when the kernel faulted (illegal address).
using KernelBody = bool (*)(const KernelLaunch&);

struct KernelDef {
  const char* name;
  std::vector<ParamSlot> params;
  KernelBody body;

  size_t ArgBytes() const {
    size_t end = 0;
    for (const ParamSlot& p : params) end = std::max(end, p.offset + p.size);
    return end;
  }
};

// The device memory behind [addr, addr + count * sizeof(T)), or null when
// the range is not inside one allocation of the launch's device.
template <typename T>
T* DeviceSpan(const KernelLaunch& launch, uint64_t addr, uint64_t count) {
  if (count > SIZE_MAX / sizeof(T)) return nullptr;
  if (!RangeIsLive(addr, count * sizeof(T), launch.device,
                   /*allow_free_pending=*/true)) {
    return nullptr;
  }
  return reinterpret_cast<T*>(static_cast<uintptr_t>(addr));
}

bool RunEmpty(const KernelLaunch&) { return true; }

bool RunFillU32(const KernelLaunch& l) {
  const uint64_t n = l.Arg<uint64_t>(16);
  if (n == 0) return true;
  uint32_t* out = DeviceSpan<uint32_t>(l, l.Arg<uint64_t>(0), n);
  if (out == nullptr) return false;
  std::fill_n(out, n, l.Arg<uint32_t>(8));
  return true;
}

bool RunSaxpy(const KernelLaunch& l) {
  const float a = l.Arg<float>(0);
  const uint64_t n = l.Arg<uint64_t>(24);
  if (n == 0) return true;
  const float* x = DeviceSpan<const float>(l, l.Arg<uint64_t>(8), n);
  float* y = DeviceSpan<float>(l, l.Arg<uint64_t>(16), n);
  if (x == nullptr || y == nullptr) return false;
  // nvcc contracts a * x + y into one FFMA; so does the double.
  for (uint64_t i = 0; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
  return true;
}

bool RunSpin(const KernelLaunch& l) {
  std::this_thread::sleep_for(std::chrono::nanoseconds(l.Arg<uint64_t>(0)));
  return true;
}

// Like the CUDA kernel, a store through an address that is in fact mapped
// succeeds; anything else faults.
bool RunFault(const KernelLaunch& l) {
  uint32_t* p = DeviceSpan<uint32_t>(l, l.Arg<uint64_t>(0), 1);
  if (p == nullptr) return false;
  *reinterpret_cast<volatile uint32_t*>(p) = 1;
  return true;
}

bool RunBigShared(const KernelLaunch& l) {
  const uint32_t n = l.Arg<uint32_t>(8);
  // The kernel touches smem[0, n): less dynamic shared memory is a fault.
  if (static_cast<uint64_t>(n) * 4 > l.shared_bytes) return false;
  const unsigned blocks = l.grid[0];  // Blocks along y/z repeat out[x].
  uint32_t* out = DeviceSpan<uint32_t>(l, l.Arg<uint64_t>(0), blocks);
  if (out == nullptr) return false;
  for (uint32_t b = 0; b < blocks; ++b) {
    uint32_t sum = 0;
    for (uint32_t k = 0; k < n; ++k) sum += k ^ b;
    out[b] = sum;
  }
  return true;
}

bool RunStruct(const KernelLaunch& l) {
  uint32_t* out = DeviceSpan<uint32_t>(l, l.Arg<uint64_t>(16), 4);
  if (out == nullptr) return false;
  std::memcpy(out, l.args.data(), 16);  // {a, b, bits(c), d}
  return true;
}

bool RunTypes(const KernelLaunch& l);  // Needs the slot table; see below.

bool RunClusterRank(const KernelLaunch& l) {
  const uint64_t gx = l.grid[0], gy = l.grid[1], gz = l.grid[2];
  uint32_t* out = DeviceSpan<uint32_t>(l, l.Arg<uint64_t>(0), gx * gy * gz);
  if (out == nullptr) return false;
  const unsigned cx = l.cluster[0], cy = l.cluster[1], cz = l.cluster[2];
  for (uint64_t z = 0; z < gz; ++z) {
    for (uint64_t y = 0; y < gy; ++y) {
      for (uint64_t x = 0; x < gx; ++x) {
        out[x + gx * (y + gy * z)] =
            static_cast<uint32_t>((x % cx) + cx * ((y % cy) + cy * (z % cz)));
      }
    }
  }
  return true;
}

// The double's encoding of a tensor map (cuTensorMapEncodeTiled): what
// gx_tensormap_copy needs, in the 128 bytes of a CUtensorMap.
struct FakeTensorMap {
  uint64_t magic;
  uint64_t address;
  uint32_t data_type;
  uint32_t rank;
  uint64_t dims[5];
  uint64_t strides[4];
  uint32_t box[5];
  uint32_t oob_fill;
};
static_assert(sizeof(FakeTensorMap) <= sizeof(CUtensorMap));
constexpr uint64_t kFakeTensorMapMagic = 0x47584d4150763100;  // "GXMAPv1"

// gx_tensormap_copy(map, out, x, y, count): the FLOAT32 box of a rank 1 or
// 2 map at (x, y), innermost fastest; outside the tensor 0 (NaN with NaN
// fill). `count` must be the box's elements (the GPU's kernel needs it);
// x a multiple of 4.
bool RunTensorMapCopy(const KernelLaunch& l) {
  FakeTensorMap m;
  std::memcpy(&m, l.args.data(), sizeof(m));
  if (m.magic != kFakeTensorMapMagic || m.data_type != CU_TENSOR_MAP_DATA_TYPE_FLOAT32 ||
      m.rank < 1 || m.rank > 2) {
    return false;  // as a TMA fault
  }
  const int32_t x = l.Arg<int32_t>(136);
  const int32_t y = l.Arg<int32_t>(140);
  // A box's inner start off a 16-byte boundary: an illegal instruction on
  // the H200.
  if ((int64_t{x} * 4) % 16 != 0) return false;
  const uint64_t bx = m.box[0];
  const uint64_t by = m.rank == 2 ? m.box[1] : 1;
  if (l.Arg<uint32_t>(144) != bx * by) return false;
  float* out = DeviceSpan<float>(l, l.Arg<uint64_t>(128), bx * by);
  if (out == nullptr) return false;
  const float fill = m.oob_fill != 0 ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
  for (uint64_t j = 0; j < by; ++j) {
    for (uint64_t i = 0; i < bx; ++i) {
      const int64_t gx = int64_t{x} + static_cast<int64_t>(i);
      const int64_t gy = m.rank == 2 ? int64_t{y} + static_cast<int64_t>(j) : 0;
      const bool inside = gx >= 0 && static_cast<uint64_t>(gx) < m.dims[0] && gy >= 0 &&
                          (m.rank == 1 || static_cast<uint64_t>(gy) < m.dims[1]);
      float v = fill;
      if (inside) {
        const uint64_t addr = m.address + static_cast<uint64_t>(gx) * 4 +
                              (m.rank == 2 ? static_cast<uint64_t>(gy) * m.strides[0] : 0);
        const float* src = DeviceSpan<const float>(l, addr, 1);
        if (src == nullptr) return false;
        v = *src;
      }
      out[j * bx + i] = v;
    }
  }
  return true;
}

// gx_coop_count(counter, out): every block adds one to *counter and meets
// the others at a grid-wide barrier; out[0] = the blocks that met.
bool RunCoopCount(const KernelLaunch& l) {
  uint32_t* counter = DeviceSpan<uint32_t>(l, l.Arg<uint64_t>(0), 1);
  uint32_t* out = DeviceSpan<uint32_t>(l, l.Arg<uint64_t>(8), 1);
  if (counter == nullptr || out == nullptr) return false;
  const uint64_t blocks = uint64_t{l.grid[0]} * l.grid[1] * l.grid[2];
  *counter += static_cast<uint32_t>(blocks);
  *out = static_cast<uint32_t>(blocks);
  return true;
}

// gx_pdl_produce(data, n): data[i] = i + 1. gx_pdl_consume(data, out, n):
// out[i] = 2 * data[i] (stream order gives the double what the GPU's
// dependency wait does).
bool RunPdlProduce(const KernelLaunch& l) {
  const uint32_t n = l.Arg<uint32_t>(8);
  uint32_t* data = DeviceSpan<uint32_t>(l, l.Arg<uint64_t>(0), n);
  if (n > 0 && data == nullptr) return false;
  for (uint32_t i = 0; i < n; ++i) data[i] = i + 1;
  return true;
}
bool RunPdlConsume(const KernelLaunch& l) {
  const uint32_t n = l.Arg<uint32_t>(16);
  const uint32_t* data = DeviceSpan<const uint32_t>(l, l.Arg<uint64_t>(0), n);
  uint32_t* out = DeviceSpan<uint32_t>(l, l.Arg<uint64_t>(8), n);
  if (n > 0 && (data == nullptr || out == nullptr)) return false;
  for (uint32_t i = 0; i < n; ++i) out[i] = 2 * data[i];
  return true;
}

// Word b (linear block id) of each non-null scratch buffer = b + 1.
bool RunAddScratch(const KernelLaunch& l) {
  const int32_t n = l.Arg<int32_t>(24);
  if (n > 0) {
    const float* x = DeviceSpan<const float>(l, l.Arg<uint64_t>(0), n);
    const float* y = DeviceSpan<const float>(l, l.Arg<uint64_t>(8), n);
    float* out = DeviceSpan<float>(l, l.Arg<uint64_t>(16), n);
    if (x == nullptr || y == nullptr || out == nullptr) return false;
    for (int32_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
  }
  const uint64_t blocks = uint64_t{l.grid[0]} * l.grid[1] * l.grid[2];
  for (size_t offset : {size_t{32}, size_t{40}}) {
    const uint64_t addr = l.Arg<uint64_t>(offset);
    if (addr == 0) continue;
    uint32_t* words = DeviceSpan<uint32_t>(l, addr, blocks);
    if (words == nullptr) return false;
    for (uint64_t b = 0; b < blocks; ++b) words[b] = static_cast<uint32_t>(b + 1);
  }
  return true;
}

// The Triton tutorial's add_kernel(x, y, out, n), with or without the
// scratch pointers Triton 3.x appends (unused: it needs none).
bool RunTritonAdd(const KernelLaunch& l) {
  const int32_t n = l.Arg<int32_t>(24);
  if (n <= 0) return true;
  const float* x = DeviceSpan<const float>(l, l.Arg<uint64_t>(0), n);
  const float* y = DeviceSpan<const float>(l, l.Arg<uint64_t>(8), n);
  float* out = DeviceSpan<float>(l, l.Arg<uint64_t>(16), n);
  if (x == nullptr || y == nullptr || out == nullptr) return false;
  for (int32_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
  return true;
}

// gx_sm_ids(out, ns): block b writes the SM it ran on; the blocks go round
// the stream's SMs in order. The blocks spin side by side: one `ns` in all.
bool RunSmIds(const KernelLaunch& l) {
  const uint64_t blocks = uint64_t{l.grid[0]} * l.grid[1] * l.grid[2];
  uint32_t* out = DeviceSpan<uint32_t>(l, l.Arg<uint64_t>(0), blocks);
  if (out == nullptr) return false;
  std::this_thread::sleep_for(std::chrono::nanoseconds(l.Arg<uint64_t>(8)));
  for (uint64_t b = 0; b < blocks; ++b) out[b] = l.first_sm + b % l.sm_count;
  return true;
}

const std::vector<KernelDef>& Kernels() {
  static const std::vector<KernelDef>* const kernels = new std::vector<KernelDef>{
      {"gx_empty", {}, RunEmpty},
      {"gx_fill_u32", {{0, 8}, {8, 4}, {16, 8}}, RunFillU32},
      {"gx_saxpy", {{0, 4}, {8, 8}, {16, 8}, {24, 8}}, RunSaxpy},
      {"gx_spin", {{0, 8}}, RunSpin},
      {"gx_fault", {{0, 8}}, RunFault},
      {"gx_bigshared", {{0, 8}, {8, 4}}, RunBigShared},
      {"gx_struct", {{0, 16}, {16, 8}}, RunStruct},
      {"gx_types",
       {{0, 1}, {2, 2}, {4, 4}, {8, 8}, {16, 2}, {18, 2}, {20, 4}, {24, 8}, {32, 8}},
       RunTypes},
      {"gx_cluster_rank", {{0, 8}}, RunClusterRank},
      {"gx_add_scratch", {{0, 8}, {8, 8}, {16, 8}, {24, 4}, {32, 8}, {40, 8}}, RunAddScratch},
      {"gx_tensormap_copy", {{0, 128}, {128, 8}, {136, 4}, {140, 4}, {144, 4}}, RunTensorMapCopy},
      {"gx_coop_count", {{0, 8}, {8, 8}}, RunCoopCount},
      {"gx_pdl_produce", {{0, 8}, {8, 4}}, RunPdlProduce},
      {"gx_pdl_consume", {{0, 8}, {8, 8}, {16, 4}}, RunPdlConsume},
      {"gx_sm_ids", {{0, 8}, {8, 8}}, RunSmIds},
      // The examples' kernels, by the names and layouts nvcc and Triton
      // give them.
      {"saxpy", {{0, 4}, {8, 8}, {16, 8}, {24, 8}}, RunSaxpy},
      {"add_kernel", {{0, 8}, {8, 8}, {16, 8}, {24, 4}}, RunTritonAdd},
      {"add_kernel", {{0, 8}, {8, 8}, {16, 8}, {24, 4}, {32, 8}}, RunTritonAdd},
      {"add_kernel", {{0, 8}, {8, 8}, {16, 8}, {24, 4}, {32, 8}, {40, 8}}, RunTritonAdd},
  };
  return *kernels;
}

const KernelDef* FindKernel(const std::string& name) {
  for (const KernelDef& k : Kernels()) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

// The model of `name` whose layout is `params`, or null.
const KernelDef* FindModel(const std::string& name, const std::vector<ParamSlot>& params) {
  for (const KernelDef& k : Kernels()) {
    if (name == k.name && params == k.params) return &k;
  }
  return nullptr;
}

// out[k] = raw bits of argument k, zero-extended to 64 bits.
bool RunTypes(const KernelLaunch& l) {
  uint64_t* out = DeviceSpan<uint64_t>(l, l.Arg<uint64_t>(32), 8);
  if (out == nullptr) return false;
  const std::vector<ParamSlot>& params = FindKernel("gx_types")->params;
  for (size_t k = 0; k < 8; ++k) {
    uint64_t bits = 0;  // Little-endian: copying the low bytes zero-extends.
    std::memcpy(&bits, l.args.data() + params[k].offset, params[k].size);
    out[k] = bits;
  }
  return true;
}

// ---------------------------------------------------------------------------
// Modules.
// ---------------------------------------------------------------------------

// Writes `message` into the log buffer named by `buffer_option` (capped by
// the size named by `size_option`, NUL included) and stores the length
// written (without the NUL) back into the size option's value slot.
void WriteJitLog(unsigned int num_options, const CUjit_option* options, void** values,
                 CUjit_option buffer_option, CUjit_option size_option, const char* message) {
  char* buffer = nullptr;
  void** size_slot = nullptr;
  for (unsigned int i = 0; i < num_options; ++i) {
    if (options[i] == buffer_option) buffer = static_cast<char*>(values[i]);
    if (options[i] == size_option) size_slot = &values[i];
  }
  if (buffer == nullptr || size_slot == nullptr) return;
  const size_t capacity = reinterpret_cast<uintptr_t>(*size_slot);
  if (capacity == 0) return;
  const size_t length = std::min(std::strlen(message), capacity - 1);
  std::memcpy(buffer, message, length);
  buffer[length] = '\0';
  *size_slot = reinterpret_cast<void*>(static_cast<uintptr_t>(length));
}

// Kernel names listed after the magic line, one per line.
std::vector<std::string> ModuleKernelNames(const char* text) {
  std::vector<std::string> names;
  const char* p = text + std::strlen(kModuleMagic);
  while (*p != '\0') {
    const char* end = std::strchr(p, '\n');
    if (end == nullptr) end = p + std::strlen(p);
    std::string line(p, end);
    const size_t first = line.find_first_not_of(" \t\r");
    const size_t last = line.find_last_not_of(" \t\r");
    if (first != std::string::npos) {
      names.push_back(line.substr(first, last - first + 1));
    }
    p = *end == '\0' ? end : end + 1;
  }
  return names;
}

// ---------------------------------------------------------------------------
// Launch.
// ---------------------------------------------------------------------------

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
constexpr int kFakeMultiprocessors = 132;

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

// ---------------------------------------------------------------------------
// Events.
// ---------------------------------------------------------------------------

CUresult ElapsedTime(float* ms, CUevent start, CUevent end) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (ms == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.events.count(start) == 0 || d.events.count(end) == 0) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  for (const CUevent_st* e : {start, end}) {
    if ((e->flags & CU_EVENT_DISABLE_TIMING) != 0 || e->records == 0) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
  }
  for (const CUevent_st* e : {start, end}) {
    if (e->reached != e->records) return CUDA_ERROR_NOT_READY;
  }
  *ms = std::chrono::duration<float, std::milli>(end->time - start->time).count();
  return CUDA_SUCCESS;
}

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

// Positive integer from the environment, or `fallback`.
uint64_t EnvU64(const char* name, uint64_t fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long parsed = std::strtoull(value, &end, 0);
  if (end == value || *end != '\0') return fallback;
  return parsed;
}

}  // namespace

// ===========================================================================
// Exported entry points. Signatures are cuda_api.h's PFN_* types (checked at
// the end of this file); versioned names are spelled out (cuMemAlloc_v2, ...)
// because that is what the driver exports.
// ===========================================================================

// --- Initialization, version, errors ---

GX_EXPORT CUresult cuInit(unsigned int Flags) {
  if (t_in_driver_callback) return CUDA_ERROR_NOT_PERMITTED;
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
  if (t_in_driver_callback) return CUDA_ERROR_NOT_PERMITTED;
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

// --- Devices ---

GX_EXPORT CUresult cuDeviceGetCount(int* count) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  *count = static_cast<int>(d.devices.size());
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GX_RETURN_IF_ERROR(CheckDevice(ordinal));
  *device = ordinal;
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  const Device* device = DeviceLocked(d, dev);
  if (device == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  const size_t n = std::min(device->name.size(), static_cast<size_t>(len) - 1);
  std::memcpy(name, device->name.data(), n);
  name[n] = '\0';
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GX_RETURN_IF_ERROR(CheckDevice(dev));
  // An H100-like sm_90 part. Unlisted attributes read as 0.
  static const std::pair<CUdevice_attribute, int> kAttributes[] = {
      {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, kMaxThreadsPerBlock},
      {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, static_cast<int>(kMaxBlockDim[0])},
      {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, static_cast<int>(kMaxBlockDim[1])},
      {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, static_cast<int>(kMaxBlockDim[2])},
      {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, static_cast<int>(kMaxGridDim[0])},
      {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, static_cast<int>(kMaxGridDim[1])},
      {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, static_cast<int>(kMaxGridDim[2])},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, kMaxSharedPerBlock},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, kMaxSharedPerBlockOptin},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 233472},
      {CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 65536},
      {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65536},
      {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, 65536},
      {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048},
      {CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32},
      {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
      {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
      {CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 1},
      {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1},
      {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
      {CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1},
      {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1},
      {CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 1},
  };
  *pi = 0;
  for (const auto& [attribute, value] : kAttributes) {
    if (attribute == attrib) *pi = value;
  }
  if (attrib == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) *pi = dev + 1;
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  const Device* device = DeviceLocked(d, dev);
  if (device == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = device->total_bytes;
  return CUDA_SUCCESS;
}

// --- Primary contexts ---

namespace {

// A retain of a primary context (by cuDevicePrimaryCtxRetain or a green
// context). Driver::mu held.
void RetainLocked(CUctx_st& ctx) {
  ++ctx.retain_count;
  ctx.active.store(true, std::memory_order_release);
}

// A release; true when it was the last, and the caller tears the context
// down (TearDownContext, without Driver::mu). Driver::mu held.
bool ReleaseLocked(CUctx_st& ctx) {
  if (--ctx.retain_count != 0) return false;
  ctx.active.store(false, std::memory_order_release);
  return true;
}

}  // namespace

GX_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  Device* device = DeviceLocked(d, dev);
  if (device == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  RetainLocked(device->context);
  *pctx = &device->context;
  return CUDA_SUCCESS;
}

// The last release destroys everything the context owns: streams (after
// their queued work), events, modules and device allocations.
GX_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  GX_RETURN_IF_ERROR(InitStatus());
  Driver& d = GetDriver();
  CUctx_st* to_tear_down = nullptr;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    Device* device = DeviceLocked(d, dev);
    if (device == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    if (device->context.retain_count == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (ReleaseLocked(device->context)) to_tear_down = &device->context;
  }
  if (to_tear_down != nullptr) TearDownContext(to_tear_down);
  return StickyStatus();
}

GX_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (ctx != nullptr) {
    Driver& d = GetDriver();
    std::lock_guard<std::mutex> lock(d.mu);
    bool known = false;
    for (const auto& device : d.devices) known |= (&device->context == ctx);
    if (!known) return CUDA_ERROR_INVALID_CONTEXT;
  }
  t_current_context = ctx;
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuCtxSynchronize(void) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  std::vector<std::shared_ptr<CUstream_st>> streams;
  {
    Driver& d = GetDriver();
    std::lock_guard<std::mutex> lock(d.mu);
    for (const auto& [handle, s] : d.streams) {
      if (s->context == ctx) streams.push_back(s);
    }
  }
  for (const auto& s : streams) DrainStream(s.get());
  return StickyStatus();
}

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
  StreamOp op;
  op.run = [dstDevice, uc, N, device] {
    if (!RangeIsLive(dstDevice, N, device, true)) {
      Poison("memset");
      return;
    }
    std::memset(reinterpret_cast<void*>(dstDevice), uc, N);
  };
  return Enqueue(stream, std::move(op));
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
  StreamOp op;
  op.run = [dstDevice, srcDevice, ByteCount, device] {
    if (!RangeIsLive(dstDevice, ByteCount, device, true) ||
        !RangeIsLive(srcDevice, ByteCount, device, true)) {
      Poison("memcpy DtoD");
      return;
    }
    std::memmove(reinterpret_cast<void*>(dstDevice), reinterpret_cast<const void*>(srcDevice),
                 ByteCount);
  };
  return Enqueue(stream, std::move(op));
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

// --- Modules and functions ---

GX_EXPORT CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int numOptions,
                                      CUjit_option* options, void** optionValues) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (numOptions > 0 && (options == nullptr || optionValues == nullptr)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const char* text = static_cast<const char*>(image);
  auto mod = std::make_unique<CUmod_st>();
  mod->context = ctx;
  auto add = [&mod](std::string name, std::vector<ParamSlot> params, const KernelDef* kernel,
                    int registers = -1) {
    for (const auto& f : mod->functions) {
      if (f->name == name) return;  // The first of a name wins.
    }
    auto f = std::make_unique<CUfunc_st>();
    f->name = std::move(name);
    f->params = std::move(params);
    f->kernel = kernel;
    if (registers >= 0) f->registers = registers;
    f->module = mod.get();
    mod->functions.push_back(std::move(f));
  };
  if (std::strncmp(text, kModuleMagic, std::strlen(kModuleMagic)) == 0) {
    for (const std::string& name : ModuleKernelNames(text)) {
      const KernelDef* kernel = FindKernel(name);
      if (kernel != nullptr) add(name, kernel->params, kernel);  // Unknown names are ignored.
    }
  } else {
    const gxfake::ImageFormat format = gxfake::SniffImage(image);
    const bool ptx = format == gxfake::ImageFormat::kPtx;
    const size_t size =
        format == gxfake::ImageFormat::kUnknown ? 0 : gxfake::DeclaredImageSize(image);
    std::vector<gxfake::ImageKernel> kernels;
    std::string error = format == gxfake::ImageFormat::kCubin
                            ? "cubin: not a 64-bit little-endian ELF, or its headers place a "
                              "table or section past 1 TiB"
                        : format == gxfake::ImageFormat::kFatbin
                            ? "fatbin: its header declares more than 1 TiB"
                            : "not a cubin, PTX or fatbin";
    if (size == 0 ||
        !gxfake::ReadImage(static_cast<const uint8_t*>(image), size, &kernels, &error)) {
      const std::string log = std::string(ptx ? kPtxErrorLog : "gpuexec driver double: ") + error;
      WriteJitLog(numOptions, options, optionValues, CU_JIT_ERROR_LOG_BUFFER,
                  CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, log.c_str());
      return ptx ? CUDA_ERROR_INVALID_PTX : CUDA_ERROR_INVALID_IMAGE;
    }
    for (gxfake::ImageKernel& k : kernels) {
      const KernelDef* model = FindModel(k.name, k.params);
      add(std::move(k.name), std::move(k.params), model, k.registers);
    }
  }
  WriteJitLog(numOptions, options, optionValues, CU_JIT_ERROR_LOG_BUFFER,
              CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, "");
  WriteJitLog(numOptions, options, optionValues, CU_JIT_INFO_LOG_BUFFER,
              CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, "");

  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  for (const auto& f : mod->functions) d.functions.insert(f.get());
  CUmod_st* handle = mod.get();
  d.modules.emplace(handle, std::move(mod));
  g_module_loads.fetch_add(1);
  *module = handle;
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuModuleUnload(CUmodule hmod) {
  GX_RETURN_IF_ERROR(InitStatus());
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.modules.find(hmod);
  if (it == d.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
  for (const auto& f : it->second->functions) d.functions.erase(f.get());
  d.modules.erase(it);
  return StickyStatus();
}

GX_EXPORT CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (hfunc == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.modules.find(hmod);
  if (it == d.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
  for (const auto& f : it->second->functions) {
    if (f->name == name) {
      *hfunc = f.get();
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_NOT_FOUND;
}

GX_EXPORT CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t* paramOffset,
                                      size_t* paramSize) {
  GX_RETURN_IF_ERROR(EntryStatus());
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.functions.count(func) == 0) return CUDA_ERROR_INVALID_HANDLE;
  const std::vector<ParamSlot>& params = func->params;
  if (paramIndex >= params.size()) return CUDA_ERROR_INVALID_VALUE;
  if (paramOffset != nullptr) *paramOffset = params[paramIndex].offset;
  if (paramSize != nullptr) *paramSize = params[paramIndex].size;
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuFuncGetAttribute(int* pi, CUfunction_attribute attrib, CUfunction hfunc) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.functions.count(hfunc) == 0) return CUDA_ERROR_INVALID_HANDLE;
  switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      *pi = kMaxThreadsPerBlock;
      break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS:
      *pi = hfunc->registers;
      break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION:
      *pi = 90;
      break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
      *pi = hfunc->max_dynamic_shared;
      break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      *pi = hfunc->preferred_carveout;
      break;
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
      *pi = hfunc->non_portable_cluster_size_allowed;
      break;
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
      *pi = hfunc->cluster_scheduling_policy;
      break;
    default:  // SHARED/CONST/LOCAL_SIZE_BYTES, CACHE_MODE_CA, cluster dims...
      *pi = 0;
      break;
  }
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value) {
  GX_RETURN_IF_ERROR(EntryStatus());
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.functions.count(hfunc) == 0) return CUDA_ERROR_INVALID_HANDLE;
  switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
      // Static shared memory is 0 for every fake kernel.
      if (value < 0 || value > kMaxSharedPerBlockOptin) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      hfunc->max_dynamic_shared = value;
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      if (value < -1 || value > 100) return CUDA_ERROR_INVALID_VALUE;
      hfunc->preferred_carveout = value;
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
      if (value != 0 && value != 1) return CUDA_ERROR_INVALID_VALUE;
      hfunc->non_portable_cluster_size_allowed = value;
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
      hfunc->cluster_scheduling_policy = value;
      return CUDA_SUCCESS;
    default:  // Read-only attributes.
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// --- Streams ---

GX_EXPORT CUresult cuCtxGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  if (leastPriority != nullptr) *leastPriority = 0;
  if (greatestPriority != nullptr) *greatestPriority = kGreatestPriority;
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority);

GX_EXPORT CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  return cuStreamCreateWithPriority(phStream, Flags, 0);
}

// Like the driver, a priority outside the range is clamped into it.
namespace {

// A new stream of `ctx` (on `green`'s SMs where set), its priority clamped
// into the range as the driver does, its worker started, in the stream
// table. Driver::mu held.
CUstream AddStreamLocked(Driver& d, CUctx_st* ctx, unsigned int flags, int priority,
                         std::shared_ptr<const CUgreenCtx_st> green) {
  auto s = std::make_shared<CUstream_st>();
  s->context = ctx;
  s->flags = flags;
  s->green = std::move(green);
  s->priority = std::clamp(priority, kGreatestPriority, 0);
  s->worker = std::thread(StreamWorkerMain, s.get());
  CUstream handle = s.get();
  d.streams.emplace(handle, std::move(s));
  return handle;
}

}  // namespace

GX_EXPORT CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int Flags,
                                              int priority) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  if (phStream == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (Flags != CU_STREAM_DEFAULT && Flags != CU_STREAM_NON_BLOCKING) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  *phStream = AddStreamLocked(d, ctx, Flags, priority, nullptr);
  return CUDA_SUCCESS;
}

// Lets the queued work finish and joins the worker before returning (the
// driver returns at once; joining is observably the same, only slower).
GX_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
  GX_RETURN_IF_ERROR(InitStatus());
  std::shared_ptr<CUstream_st> s;
  {
    Driver& d = GetDriver();
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.streams.find(hStream);
    if (it == d.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
    s = std::move(it->second);
    d.streams.erase(it);
  }
  StopStream(s.get());
  if (s->green != nullptr && s->green->destroyed.load()) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  return StickyStatus();
}

GX_EXPORT CUresult cuStreamSynchronize(CUstream hStream) {
  GX_RETURN_IF_ERROR(EntryStatus());
  std::shared_ptr<CUstream_st> s;
  if (IsNullStream(hStream)) {
    CUctx_st* ctx = nullptr;
    GX_RETURN_IF_ERROR(CurrentContext(&ctx));
    return CUDA_SUCCESS;  // NULL-stream work ran synchronously.
  }
  GX_RETURN_IF_ERROR(ResolveStream(hStream, nullptr, &s));
  DrainStream(s.get());
  return StickyStatus();
}

// Runs fn(userData) on the stream's worker after prior work, even once the
// process is poisoned, so that whoever waits on it is woken.
GX_EXPORT CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<CUstream_st> stream;
  GX_RETURN_IF_ERROR(ResolveStream(hStream, ctx, &stream));
  StreamOp op;
  op.droppable = false;
  op.run = [fn, userData] { fn(userData); };
  return Enqueue(stream, std::move(op));
}

// --- Events ---

GX_EXPORT CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  constexpr unsigned int kKnownFlags =
      CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (phEvent == nullptr || (Flags & ~kKnownFlags) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if ((Flags & CU_EVENT_INTERPROCESS) != 0 && (Flags & CU_EVENT_DISABLE_TIMING) == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto e = std::make_shared<CUevent_st>();
  e->context = ctx;
  e->flags = Flags;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  *phEvent = e.get();
  d.events.emplace(e.get(), std::move(e));
  return CUDA_SUCCESS;
}

GX_EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  std::shared_ptr<CUstream_st> stream;
  GX_RETURN_IF_ERROR(ResolveStream(hStream, ctx, &stream));
  std::shared_ptr<CUevent_st> event;
  uint64_t sequence = 0;
  {
    Driver& d = GetDriver();
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.events.find(hEvent);
    if (it == d.events.end()) return CUDA_ERROR_INVALID_HANDLE;
    event = it->second;
    sequence = ++event->records;
  }
  StreamOp op;
  op.droppable = false;
  op.run = [event, sequence] {
    const Clock::time_point now = Clock::now();
    Driver& d = GetDriver();
    std::lock_guard<std::mutex> lock(d.mu);
    if (sequence > event->reached) {
      event->reached = sequence;
      event->time = now;
    }
  };
  const CUresult status = Enqueue(stream, std::move(op));
  if (status != CUDA_SUCCESS) {
    Driver& d = GetDriver();
    std::lock_guard<std::mutex> lock(d.mu);
    if (event->records == sequence) --event->records;  // Never enqueued.
  }
  return status;
}

GX_EXPORT CUresult cuEventQuery(CUevent hEvent) {
  GX_RETURN_IF_ERROR(EntryStatus());
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.events.find(hEvent);
  if (it == d.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  return it->second->reached == it->second->records ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

GX_EXPORT CUresult cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  return ElapsedTime(pMilliseconds, hStart, hEnd);
}

// The version-1 name; the driver exports both with the same signature.
GX_EXPORT CUresult cuEventElapsedTime(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  return ElapsedTime(pMilliseconds, hStart, hEnd);
}

// Pending records still complete; the handle is invalid from now on.
GX_EXPORT CUresult cuEventDestroy_v2(CUevent hEvent) {
  GX_RETURN_IF_ERROR(InitStatus());
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.events.erase(hEvent) == 0) return CUDA_ERROR_INVALID_HANDLE;
  return StickyStatus();
}

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

// --- Tensor maps ---

// Checks what the driver documents checking and writes FakeTensorMap.
GX_EXPORT CUresult cuTensorMapEncodeTiled(
    CUtensorMap* tensorMap, CUtensorMapDataType dataType, cuuint32_t rank, void* globalAddress,
    const cuuint64_t* globalDim, const cuuint64_t* globalStrides, const cuuint32_t* boxDim,
    const cuuint32_t* elementStrides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (tensorMap == nullptr || reinterpret_cast<uintptr_t>(tensorMap) % 64 != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (rank < 1 || rank > 5 || (interleave != CU_TENSOR_MAP_INTERLEAVE_NONE && rank < 3)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (dataType > CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ ||
      interleave > CU_TENSOR_MAP_INTERLEAVE_32B || swizzle > CU_TENSOR_MAP_SWIZZLE_128B ||
      l2Promotion > CU_TENSOR_MAP_L2_PROMOTION_L2_256B ||
      oobFill > CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const uintptr_t address = reinterpret_cast<uintptr_t>(globalAddress);
  if (address % (interleave == CU_TENSOR_MAP_INTERLEAVE_32B ? 32 : 16) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  FakeTensorMap m;
  std::memset(&m, 0, sizeof(m));
  m.magic = kFakeTensorMapMagic;
  m.address = address;
  m.data_type = dataType;
  m.rank = rank;
  m.oob_fill = oobFill;
  for (cuuint32_t i = 0; i < rank; ++i) {
    if (globalDim[i] == 0 || globalDim[i] > (uint64_t{1} << 32)) return CUDA_ERROR_INVALID_VALUE;
    if (boxDim[i] == 0 || boxDim[i] > 256) return CUDA_ERROR_INVALID_VALUE;
    if (elementStrides[i] == 0 || elementStrides[i] > 8) return CUDA_ERROR_INVALID_VALUE;
    m.dims[i] = globalDim[i];
    m.box[i] = boxDim[i];
    if (i + 1 < rank) {
      if (globalStrides[i] % 16 != 0 || globalStrides[i] >= (uint64_t{1} << 40)) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      m.strides[i] = globalStrides[i];
    }
  }
  std::memset(tensorMap, 0, sizeof(*tensorMap));
  std::memcpy(tensorMap, &m, sizeof(m));
  return CUDA_SUCCESS;
}

// --- Green contexts ---
//
// A device is SMs 0..131. A CUdevResource of the double is a range of them:
// smCount from its first SM, which _internal_padding holds with the device,
// a marker and whether it may be split (only the API writes a resource, so
// the padding is the driver's own). Parts follow compute capability 9.0
// whatever the flags: at least 8 SMs, multiples of 8. As the driver
// documents, a green context retains its device's primary context, and
// the parts a split makes cannot be split again (only a device's or a
// green context's SMs can).

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

// Live streams of `priority` in this process.
GX_EXPORT uint64_t gxfake_streams_at_priority(int priority) {
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  uint64_t n = 0;
  for (const auto& [handle, s] : d.streams) n += s->priority == priority ? 1 : 0;
  return n;
}

// Successful cuModuleLoadDataEx calls in this process.
GX_EXPORT uint64_t gxfake_module_loads(void) { return g_module_loads.load(); }

// The kernels of real images the double runs (comma-separated), for the
// daemon's refusal of the others.
GX_EXPORT const char* gxfake_example_kernels(void) { return kExampleKernels; }

// Live green contexts (made and not yet destroyed).
GX_EXPORT uint64_t gxfake_green_contexts(void) {
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  return d.green_contexts.size();
}

// Device bytes currently allocated, summed over all devices.
GX_EXPORT uint64_t gxfake_bytes_allocated(void) {
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  uint64_t total = 0;
  for (const auto& device : d.devices) total += device->allocated_bytes;
  return total;
}

// --- Signatures ---

// Each export has exactly the type the daemon calls it through (cuda_api.h),
// so a mistyped parameter here fails the build instead of a test.
#define GX_CHECK_SIGNATURE(symbol, api)                           \
  static_assert(std::is_same_v<decltype(&::symbol), ::PFN_##api>, \
                #symbol " does not have the type PFN_" #api " of cuda_api.h")
GX_CHECK_SIGNATURE(cuInit, cuInit);
GX_CHECK_SIGNATURE(cuDriverGetVersion, cuDriverGetVersion);
GX_CHECK_SIGNATURE(cuGetErrorName, cuGetErrorName);
GX_CHECK_SIGNATURE(cuGetErrorString, cuGetErrorString);
GX_CHECK_SIGNATURE(cuDeviceGetCount, cuDeviceGetCount);
GX_CHECK_SIGNATURE(cuDeviceGet, cuDeviceGet);
GX_CHECK_SIGNATURE(cuDeviceGetName, cuDeviceGetName);
GX_CHECK_SIGNATURE(cuDeviceGetAttribute, cuDeviceGetAttribute);
GX_CHECK_SIGNATURE(cuDeviceTotalMem_v2, cuDeviceTotalMem);
GX_CHECK_SIGNATURE(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain);
GX_CHECK_SIGNATURE(cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease);
GX_CHECK_SIGNATURE(cuCtxSetCurrent, cuCtxSetCurrent);
GX_CHECK_SIGNATURE(cuCtxSynchronize, cuCtxSynchronize);
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
GX_CHECK_SIGNATURE(cuModuleLoadDataEx, cuModuleLoadDataEx);
GX_CHECK_SIGNATURE(cuModuleUnload, cuModuleUnload);
GX_CHECK_SIGNATURE(cuModuleGetFunction, cuModuleGetFunction);
GX_CHECK_SIGNATURE(cuFuncGetParamInfo, cuFuncGetParamInfo);
GX_CHECK_SIGNATURE(cuFuncGetAttribute, cuFuncGetAttribute);
GX_CHECK_SIGNATURE(cuFuncSetAttribute, cuFuncSetAttribute);
GX_CHECK_SIGNATURE(cuStreamCreate, cuStreamCreate);
GX_CHECK_SIGNATURE(cuStreamCreateWithPriority, cuStreamCreateWithPriority);
GX_CHECK_SIGNATURE(cuCtxGetStreamPriorityRange, cuCtxGetStreamPriorityRange);
GX_CHECK_SIGNATURE(cuStreamDestroy_v2, cuStreamDestroy);
GX_CHECK_SIGNATURE(cuStreamSynchronize, cuStreamSynchronize);
GX_CHECK_SIGNATURE(cuLaunchHostFunc, cuLaunchHostFunc);
GX_CHECK_SIGNATURE(cuEventCreate, cuEventCreate);
GX_CHECK_SIGNATURE(cuEventRecord, cuEventRecord);
GX_CHECK_SIGNATURE(cuEventQuery, cuEventQuery);
GX_CHECK_SIGNATURE(cuEventElapsedTime, cuEventElapsedTime);
GX_CHECK_SIGNATURE(cuEventElapsedTime_v2, cuEventElapsedTime);
GX_CHECK_SIGNATURE(cuEventDestroy_v2, cuEventDestroy);
GX_CHECK_SIGNATURE(cuLaunchKernel, cuLaunchKernel);
GX_CHECK_SIGNATURE(cuLaunchKernelEx, cuLaunchKernelEx);
GX_CHECK_SIGNATURE(cuOccupancyMaxActiveBlocksPerMultiprocessor,
                   cuOccupancyMaxActiveBlocksPerMultiprocessor);
GX_CHECK_SIGNATURE(cuOccupancyMaxActiveClusters, cuOccupancyMaxActiveClusters);
GX_CHECK_SIGNATURE(cuTensorMapEncodeTiled, cuTensorMapEncodeTiled);
GX_CHECK_SIGNATURE(cuDeviceGetDevResource, cuDeviceGetDevResource);
GX_CHECK_SIGNATURE(cuDevSmResourceSplitByCount, cuDevSmResourceSplitByCount);
GX_CHECK_SIGNATURE(cuDevResourceGenerateDesc, cuDevResourceGenerateDesc);
GX_CHECK_SIGNATURE(cuGreenCtxCreate, cuGreenCtxCreate);
GX_CHECK_SIGNATURE(cuGreenCtxDestroy, cuGreenCtxDestroy);
GX_CHECK_SIGNATURE(cuGreenCtxGetDevResource, cuGreenCtxGetDevResource);
GX_CHECK_SIGNATURE(cuGreenCtxStreamCreate, cuGreenCtxStreamCreate);
#undef GX_CHECK_SIGNATURE
