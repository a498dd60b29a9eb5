#ifndef GPUEXEC_TESTS_FAKE_CUDA_FAKE_CUDA_INTERNAL_H_
#define GPUEXEC_TESTS_FAKE_CUDA_FAKE_CUDA_INTERNAL_H_

// What the files of the libcuda double share (fake_cuda.cc describes the
// double and lists its files): the handle types that cuda_api.h declares,
// the one Driver that owns them, the checks every entry point makes first,
// and the context, memory, stream, launch and kernel-model machinery that
// more than one file uses (graphs replay launches, memsets and copies as
// those entry points run them). Nothing here is exported: only the entry
// points are (GX_EXPORT, and the version script of CMakeLists.txt).
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

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "server/cuda/cuda_api.h"
#include "tests/fake_cuda/image_reader.h"

// An exported entry point, defined at global scope. Signatures are
// cuda_api.h's PFN_* types (each file checks its own at its end with
// GX_CHECK_SIGNATURE); versioned names are spelled out (cuMemAlloc_v2, ...)
// because that is what the driver exports.
#define GX_EXPORT extern "C" __attribute__((visibility("default")))

// Each export has exactly the type the daemon calls it through (cuda_api.h),
// so a mistyped parameter here fails the build instead of a test.
#define GX_CHECK_SIGNATURE(symbol, api)                           \
  static_assert(std::is_same_v<decltype(&::symbol), ::PFN_##api>, \
                #symbol " does not have the type PFN_" #api " of cuda_api.h")

#define GX_RETURN_IF_ERROR(expr)                       \
  do {                                                 \
    const CUresult gx_status_ = (expr);                \
    if (gx_status_ != CUDA_SUCCESS) return gx_status_; \
  } while (0)

namespace gxfake::internal {

using gxfake::ParamSlot;

struct KernelDef;

// One queued stream operation. `droppable` operations (copies, memsets,
// kernels) are skipped once the process is poisoned; the others (host
// functions, event records, stream-ordered frees) always run so that no
// waiter hangs and no memory leaks.
struct StreamOp {
  std::function<void()> run;
  bool droppable = true;
};

// A kernel launch's grid, block, dynamic shared memory, cluster and
// cooperative grid: a launch's configuration and attributes, and a graph
// kernel node's parameters and attributes.
struct LaunchShape {
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned shared_bytes = 0;
  unsigned cluster[3] = {1, 1, 1};
  bool cooperative = false;
};

// A memset: `height` rows of `width` elements of `element_size` bytes (1,
// 2 or 4; the low bytes of `value`), rows `pitch` bytes apart.
struct MemsetShape {
  CUdeviceptr dst = 0;
  size_t pitch = 0;
  unsigned value = 0;
  unsigned element_size = 1;
  size_t width = 0;
  size_t height = 1;

  // The bytes from dst to the end of the last row.
  size_t Span() const { return (height - 1) * pitch + width * element_size; }
};

// What a node of a graph does each time its graph is launched.
struct NodeWork {
  enum class Kind { kKernel, kMemset, kCopy };
  Kind kind = Kind::kKernel;
  // The node's context (a kernel node's: its function's); its device's
  // memory is what the node may touch.
  CUctx_st* context = nullptr;
  // kKernel: the function and its model (found when the node was added),
  // the shape with the node's attributes, the scheduling policy attribute,
  // and the copy of the arguments taken when the node was added or set.
  CUfunction function = nullptr;
  const KernelDef* kernel = nullptr;
  LaunchShape shape;
  int cluster_policy = 0;
  std::vector<uint8_t> args;
  // kMemset.
  MemsetShape memset;
  // kCopy: a 1-D copy between device memory.
  CUdeviceptr dst = 0;
  CUdeviceptr src = 0;
  size_t bytes = 0;
};

}  // namespace gxfake::internal

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
  const gxfake::internal::KernelDef* kernel = nullptr;
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
  std::condition_variable cv;                    // Signals both new work and completed work.
  std::deque<gxfake::internal::StreamOp> queue;  // Guarded by mu.
  uint64_t enqueued = 0;                         // Guarded by mu.
  uint64_t completed = 0;                        // Guarded by mu.
  bool stopping = false;                         // Guarded by mu.
  std::thread worker;
};

// A node of a graph. Owned by its CUgraph_st; dies with it.
struct CUgraphNode_st {
  CUgraph_st* graph = nullptr;
  std::vector<CUgraphNode_st*> dependencies;  // nodes of the same graph, added before it
  gxfake::internal::NodeWork work;
};

// A graph: its nodes in the order added. Owned by Driver::graphs from
// cuGraphCreate until cuGraphDestroy; not tied to a context (its nodes name
// theirs).
struct CUgraph_st {
  std::vector<std::unique_ptr<CUgraphNode_st>> nodes;
};

// An instantiated graph: a copy of its graph's nodes, in dependency order,
// that lives on without the graph. Owned by Driver::graph_execs from
// cuGraphInstantiateWithFlags until cuGraphExecDestroy.
struct CUgraphExec_st {
  std::vector<gxfake::internal::NodeWork> work;
  // Where in `work` each node of the graph went (the handles are never
  // dereferenced: the graph may be gone).
  std::unordered_map<CUgraphNode_st*, size_t> index;
};

namespace gxfake::internal {

// The simulated device, an H100-like sm_90 part: SMs 0..131, and its limits.
inline constexpr int kFakeMultiprocessors = 132;
// cuCtxGetStreamPriorityRange, as an H100's: least 0, greatest -5.
inline constexpr int kGreatestPriority = -5;
inline constexpr int kMaxThreadsPerBlock = 1024;
inline constexpr unsigned kMaxBlockDim[3] = {1024, 1024, 64};
inline constexpr unsigned kMaxGridDim[3] = {2147483647u, 65535u, 65535u};
inline constexpr int kMaxSharedPerBlock = 49152;
inline constexpr int kMaxSharedPerBlockOptin = 232448;
inline constexpr unsigned kMaxPortableClusterSize = 8;
inline constexpr unsigned kMaxNonPortableClusterSize = 16;

// ---------------------------------------------------------------------------
// Process-wide state and the checks of every entry point (fake_cuda.cc).
// ---------------------------------------------------------------------------

extern std::atomic<bool> g_initialized;
extern std::atomic<bool> g_poisoned;

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
  // Graphs, the nodes of each live graph (node -> its graph), and
  // instantiated graphs.
  std::unordered_map<CUgraph_st*, std::unique_ptr<CUgraph_st>> graphs;
  std::unordered_map<CUgraphNode_st*, CUgraph_st*> graph_nodes;
  std::unordered_map<CUgraphExec_st*, std::unique_ptr<CUgraphExec_st>> graph_execs;
};

// The one Driver, created on first use and leaked on purpose (see above).
Driver& GetDriver();

// The state every entry point checks first.
CUresult InitStatus();

// InitStatus plus the sticky fault.
CUresult EntryStatus();

// What calls that release resources return: they do their work even after a
// fault (so that tests leak nothing) but still report the sticky error.
CUresult StickyStatus();

// The sticky fault: from now on every driver call returns
// CUDA_ERROR_ILLEGAL_ADDRESS. `what` names the cause in the one message
// printed, on the first fault only.
void Poison(const char* what);

// Requires Driver::mu. Null when `ordinal` names no device.
Device* DeviceLocked(Driver& d, CUdevice ordinal);

// CUDA_ERROR_INVALID_DEVICE when `ordinal` names no device.
CUresult CheckDevice(CUdevice ordinal);

// Positive integer from the environment, or `fallback`.
uint64_t EnvU64(const char* name, uint64_t fallback);

// ---------------------------------------------------------------------------
// Primary contexts (devices.cc).
// ---------------------------------------------------------------------------

// The context made current on this thread by cuCtxSetCurrent, while it is
// retained; else CUDA_ERROR_INVALID_CONTEXT.
CUresult CurrentContext(CUctx_st** out);

// A retain of a primary context (by cuDevicePrimaryCtxRetain or a green
// context). Driver::mu held.
void RetainLocked(CUctx_st& ctx);

// A release; true when it was the last, and the caller tears the context
// down (TearDownContext, without Driver::mu). Driver::mu held.
bool ReleaseLocked(CUctx_st& ctx);

// Destroys everything a primary context owns when its last retain goes.
void TearDownContext(CUctx_st* ctx);

// ---------------------------------------------------------------------------
// Device memory bookkeeping (memory.cc).
// ---------------------------------------------------------------------------

// True when [addr, addr + bytes) lies inside one allocation of `device`;
// a block whose stream-ordered free is pending counts where
// `allow_free_pending` (work queued ahead of the free may still use it).
bool RangeIsLive(uintptr_t addr, size_t bytes, int device, bool allow_free_pending);

// Requires Driver::mu. Frees the block at `base` if it is still tracked.
void FreeAllocationLocked(Driver& d, uintptr_t base);

// The stream operations of a memset and of a copy between device memory of
// `device`, checked again when they run: a range no longer live there is a
// fault (illegal address). Each is checked by its caller when enqueued.
StreamOp MemsetOp(const MemsetShape& m, int device);
StreamOp CopyOp(CUdeviceptr dst, CUdeviceptr src, size_t bytes, int device);

// ---------------------------------------------------------------------------
// Streams (streams.cc).
// ---------------------------------------------------------------------------

// True on stream worker threads and while a host function runs inline: the
// driver must not be called from there (CUDA_ERROR_NOT_PERMITTED).
bool InDriverCallback();

// Queues `op` on `s`, blocking while its queue is full. Null `s` means the
// NULL stream (`op` runs inline). Fails only for a stream being destroyed.
CUresult Enqueue(const std::shared_ptr<CUstream_st>& s, StreamOp op);

// Waits until everything enqueued before the call has run. Must not be
// called on the stream's own worker (entry points refuse that thread).
void DrainStream(CUstream_st* s);

// Lets queued work finish, then joins the worker. Called once, by whoever
// removed the stream from Driver::streams.
void StopStream(CUstream_st* s);

// Resolves a stream handle. The NULL stream resolves to an empty pointer.
// `ctx` (when not null) must own the stream.
CUresult ResolveStream(CUstream h, CUctx_st* ctx, std::shared_ptr<CUstream_st>* out);

// A new stream of `ctx` (on `green`'s SMs where set), its priority clamped
// into the range as the driver does, its worker started, in the stream
// table. Driver::mu held.
CUstream AddStreamLocked(Driver& d, CUctx_st* ctx, unsigned int flags, int priority,
                         std::shared_ptr<const CUgreenCtx_st> green);

// ---------------------------------------------------------------------------
// Kernel models (kernel_models.cc).
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Kernel launches (launch.cc), shared with graphs' kernel nodes.
// ---------------------------------------------------------------------------

// Checks `shape` for `f` as a launch in `ctx` checks it: `f` a live function
// of `ctx` (else CUDA_ERROR_INVALID_HANDLE), the grid, block and dynamic
// shared memory within the device's limits and the function's, the cluster
// within the function's limit and dividing the grid. Sets `*kernel` to the
// function's model (null where the double has none). Takes Driver::mu.
CUresult CheckShape(CUfunction f, CUctx_st* ctx, const LaunchShape& shape,
                    const KernelDef** kernel);

// The SMs the kernels of `stream` run on: its green context's, else the
// whole device's (also for the NULL stream, null here).
struct StreamSms {
  unsigned first = 0;
  unsigned count = 0;
};
StreamSms SmsOf(const CUstream_st* stream);

// CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE when `shape` is cooperative and
// its grid is larger than the double's occupancy on `sm_count` SMs.
CUresult CheckCooperative(const LaunchShape& shape, unsigned sm_count);

// The argument bytes of `kernel` (its parameters' layout, which is its
// function's) from cuLaunchKernel's `kernel_params`; INVALID_VALUE where
// one is missing.
CUresult CopyArgs(const KernelDef& kernel, void** kernel_params, std::vector<uint8_t>* args);

// The stream operation that runs `kernel` with `args` on `sms` of `device`;
// a fault poisons the process.
StreamOp KernelOp(const KernelDef* kernel, int device, const LaunchShape& shape, StreamSms sms,
                  std::vector<uint8_t> args);

// The first model named `name`, or null.
const KernelDef* FindKernel(const std::string& name);

// The model of `name` whose layout is `params`, or null.
const KernelDef* FindModel(const std::string& name, const std::vector<ParamSlot>& params);

}  // namespace gxfake::internal

#endif  // GPUEXEC_TESTS_FAKE_CUDA_FAKE_CUDA_INTERNAL_H_
