#ifndef GPUEXEC_SERVER_CUDA_DRIVER_H_
#define GPUEXEC_SERVER_CUDA_DRIVER_H_

// The CUDA Driver API, loaded at run time (dlopen, never linked), behind
// absl::Status. This header does not include <cuda.h>: the driver's handle
// types are forward-declared and wrapped in move-only owners that release
// them in their destructors.
//
// Threading: a Driver may be shared; every call that needs a context must run
// on the thread that made that context current (the device executor).
// Owners must be destroyed on that thread too.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/port/types.h"

// The driver's own opaque types (as in cuda.h), declared, not defined.
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
struct CUevent_st;
struct CUmemPoolHandle_st;
struct CUgreenCtx_st;
struct CUgraph_st;
struct CUgraphExec_st;
struct CUgraphNode_st;

namespace gpuexec::cuda {

struct DriverApi;  // the table of resolved entry points (driver_api_internal.h)

// The plain types of a device's vocabulary (server/port/types.h).
using port::DeviceProperties;
using port::DevicePtr;
using port::FunctionAttributes;
using port::LaunchGeometry;
using port::MemoryInfo;
using port::ParamInfo;

// Whether a CUresult leaves the context unusable for good (a sticky fault:
// only a new process gets the device back). The one table; see driver.cc.
bool IsStickyResult(int result);
// The canonical code for a CUresult (the same table).
absl::StatusCode CodeForResult(int result);
// The CUresult a failed call's status carries (every error this layer
// makes does, through Driver::Load too), if any.
std::optional<int> ResultOf(const absl::Status& status);
// Whether `status` is a sticky fault: by its CUresult where it carries one;
// an ABORTED status that carries none (made elsewhere from a driver error)
// counts as sticky, to be safe.
bool IsSticky(const absl::Status& status);
// Whether `status` (from Driver::Load or a call) says the driver cannot
// serve this process yet but will soon: an MPS server that is still taking
// down the clients of a fatal fault (CUDA_ERROR_MPS_SERVER_NOT_READY). A new
// process a little later gets the device.
bool NotReadyYet(const absl::Status& status);

class Driver;

// Owners. Each is move-only, holds the Driver that made it, and releases its
// handle in the destructor (errors there are ignored: nothing can be done).
template <typename Handle, void (*Release)(const Driver*, Handle)>
class Owned {
 public:
  Owned() = default;
  Owned(const Driver* driver, Handle handle) : driver_(driver), handle_(handle) {}
  Owned(Owned&& other) noexcept
      : driver_(other.driver_), handle_(std::exchange(other.handle_, Handle{})) {}
  Owned& operator=(Owned&& other) noexcept {
    if (this != &other) {
      reset();
      driver_ = other.driver_;
      handle_ = std::exchange(other.handle_, Handle{});
    }
    return *this;
  }
  ~Owned() { reset(); }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;

  Handle get() const { return handle_; }
  explicit operator bool() const { return handle_ != Handle{}; }
  void reset() {
    if (handle_ != Handle{}) Release(driver_, handle_);
    handle_ = Handle{};
  }

 private:
  const Driver* driver_ = nullptr;
  Handle handle_{};
};

void ReleaseModule(const Driver* d, CUmod_st* m);
void ReleaseStream(const Driver* d, CUstream_st* s);
void ReleaseEvent(const Driver* d, CUevent_st* e);
void ReleasePinned(const Driver* d, void* p);
void ReleaseGreenContext(const Driver* d, CUgreenCtx_st* g);
void ReleaseGraph(const Driver* d, CUgraph_st* g);
void ReleaseGraphExec(const Driver* d, CUgraphExec_st* e);

using Module = Owned<CUmod_st*, &ReleaseModule>;
using Stream = Owned<CUstream_st*, &ReleaseStream>;
using Event = Owned<CUevent_st*, &ReleaseEvent>;
using PinnedMemory = Owned<void*, &ReleasePinned>;
using GreenContext = Owned<CUgreenCtx_st*, &ReleaseGreenContext>;
using Function = CUfunc_st*;  // owned by its module
// A graph being built, and a graph instantiated for launch: each lives on
// without the other (an instantiated graph keeps what it was built of).
using Graph = Owned<CUgraph_st*, &ReleaseGraph>;
using GraphExec = Owned<CUgraphExec_st*, &ReleaseGraphExec>;
// A node of a Graph, owned by it; it names the node in the instantiated
// graph too (SetKernelNodeParams).
using GraphNode = CUgraphNode_st*;

// The primary context of one device, retained for the owner's lifetime.
class PrimaryContext {
 public:
  PrimaryContext() = default;
  PrimaryContext(const Driver* driver, int ordinal, CUctx_st* ctx)
      : driver_(driver), ordinal_(ordinal), ctx_(ctx) {}
  PrimaryContext(PrimaryContext&& o) noexcept
      : driver_(o.driver_), ordinal_(o.ordinal_), ctx_(std::exchange(o.ctx_, nullptr)) {}
  PrimaryContext& operator=(PrimaryContext&& o) noexcept;
  ~PrimaryContext();
  CUctx_st* get() const { return ctx_; }

 private:
  const Driver* driver_ = nullptr;
  int ordinal_ = 0;
  CUctx_st* ctx_ = nullptr;
};

using HostCallback = void (*)(void* user_data);

// A device's streaming multiprocessors as green contexts see them: how many,
// and the rules of a part (0 where the driver does not say: before 13.0).
struct SmResources {
  uint32_t sms = 0;
  uint32_t min_part = 0;
  uint32_t step = 0;
};

// One part of a device's SMs: a green context and the SMs it was given.
struct GreenPart {
  GreenContext context;
  uint32_t sms = 0;
};

class Driver {
 public:
  // Opens `library` (for example "libcuda.so.1" or a test double), resolves
  // the entry points and calls cuInit. Fails with UNAVAILABLE naming the
  // library and the reason when any step fails.
  static absl::StatusOr<std::unique_ptr<Driver>> Load(const std::string& library);
  ~Driver();

  const std::string& library() const { return library_; }
  // True when the library is gpuexec's own libcuda test double (it exports
  // gxfake_module_loads); images in its format are accepted only then.
  bool is_test_double() const { return test_double_; }
  // The kernels of real images the test double runs (e.g. "saxpy,
  // add_kernel"); empty for a real driver. A launch of any other kernel is
  // refused with FAILED_PRECONDITION saying so (`gpuexecd --simulator`).
  const std::string& example_kernels() const { return example_kernels_; }
  int version() const { return version_; }

  absl::StatusOr<int> DeviceCount() const;
  absl::StatusOr<DeviceProperties> Properties(int ordinal) const;
  absl::StatusOr<PrimaryContext> RetainPrimaryContext(int ordinal) const;
  absl::Status SetCurrent(CUctx_st* ctx, int ordinal) const;

  // The calls below need the context current on the calling thread.
  absl::StatusOr<MemoryInfo> MemInfo(int ordinal) const;

  // Loads an image. For PTX a JIT failure returns FAILED_PRECONDITION with
  // the JIT log. `what` names the module in errors.
  absl::StatusOr<Module> LoadModule(absl::string_view image, bool is_ptx,
                                    absl::string_view what) const;
  absl::StatusOr<Function> GetFunction(const Module& module, const std::string& name,
                                       absl::string_view what) const;
  // The kernel's parameter layout (cuFuncGetParamInfo until it says no more).
  absl::StatusOr<std::vector<ParamInfo>> ParamLayout(Function f, absl::string_view what) const;
  absl::StatusOr<FunctionAttributes> Attributes(Function f, absl::string_view what) const;
  absl::Status SetMaxDynamicShared(Function f, int bytes, absl::string_view what) const;

  absl::StatusOr<Stream> CreateStream(absl::string_view what) const;
  // A stream of `priority`, within StreamPriorities' range (lower numbers
  // are served first).
  absl::StatusOr<Stream> CreateStream(int priority, absl::string_view what) const;
  struct PriorityRange {
    int least = 0;
    int greatest = 0;
  };
  absl::StatusOr<PriorityRange> StreamPriorities() const;
  absl::StatusOr<Event> CreateEvent(bool timing, absl::string_view what) const;
  absl::Status Record(const Event& event, CUstream_st* stream, absl::string_view what) const;
  // OK, or UNAVAILABLE-free "not ready" as false.
  absl::StatusOr<bool> EventDone(const Event& event, absl::string_view what) const;
  absl::StatusOr<float> ElapsedMs(const Event& start, const Event& end,
                                  absl::string_view what) const;
  absl::Status LaunchHostFunc(CUstream_st* stream, HostCallback fn, void* data,
                              absl::string_view what) const;

  absl::Status ConfigureMemoryPool(int ordinal) const;
  absl::Status TrimMemoryPool(int ordinal) const;
  absl::StatusOr<DevicePtr> AllocAsync(uint64_t size, CUstream_st* stream,
                                       absl::string_view what) const;
  absl::Status FreeAsync(DevicePtr ptr, CUstream_st* stream, absl::string_view what) const;
  absl::Status MemsetAsync(DevicePtr ptr, uint8_t value, uint64_t size, CUstream_st* stream,
                           absl::string_view what) const;
  absl::Status CopyDtoDAsync(DevicePtr dst, DevicePtr src, uint64_t size, CUstream_st* stream,
                             absl::string_view what) const;
  absl::Status CopyHtoDAsync(DevicePtr dst, const void* src, uint64_t size, CUstream_st* stream,
                             absl::string_view what) const;
  absl::Status CopyDtoHAsync(void* dst, DevicePtr src, uint64_t size, CUstream_st* stream,
                             absl::string_view what) const;
  absl::StatusOr<PinnedMemory> AllocPinned(uint64_t size, absl::string_view what) const;

  // Launches `f`; `params[i]` points at the bytes of parameter i. The
  // geometry's attributes (cooperative, programmatic dependent, cluster
  // scheduling policy) go with it.
  absl::Status Launch(Function f, const LaunchGeometry& geometry, void** params,
                      CUstream_st* stream, absl::string_view what) const;
  // Blocks of `f` that can be resident at once on the whole device for
  // `geometry` (its block, shared memory and cluster), on a device of
  // `multiprocessors`: the most a cooperative launch may have.
  absl::StatusOr<uint64_t> MaxCoResidentBlocks(Function f, const LaunchGeometry& geometry,
                                               int multiprocessors, absl::string_view what) const;
  // Lets `f` be launched in clusters of more than 8 blocks.
  absl::Status AllowNonPortableClusters(Function f, absl::string_view what) const;
  // Encodes `map` (checked by the caller) into the 128 bytes at `out`.
  absl::Status EncodeTensorMap(const port::TensorMapEncoding& map, void* out,
                               absl::string_view what) const;

  // Green contexts (green_contexts.cc). Whether the driver has every entry
  // point they need (CUDA 12.5 and newer).
  bool has_green_contexts() const;
  absl::StatusOr<SmResources> DeviceSms(int ordinal) const;
  // Splits device `ordinal`'s SMs into parts of `sms[i]` SMs each, in order,
  // and a last part of the SMs left (none when no SM is left): a green
  // context each. Fails, making none, when the driver refuses a part (its
  // size off the device's rules, or more SMs than are left).
  absl::StatusOr<std::vector<GreenPart>> CreateGreenContexts(int ordinal,
                                                             const std::vector<uint32_t>& sms,
                                                             absl::string_view what) const;
  // A stream whose work runs on `part`'s SMs alone; `priority` as
  // cuStreamCreateWithPriority's (0: the default).
  absl::StatusOr<Stream> CreateGreenStream(const GreenContext& part, int priority,
                                           absl::string_view what) const;

  // Graphs (graphs.cc): work built node by node, instantiated once and
  // launched many times. Where the driver lacks them, every call below
  // fails with FAILED_PRECONDITION saying so. Whether the driver has every
  // graph entry point (CUDA 12.0 and newer).
  bool has_graphs() const;
  absl::StatusOr<Graph> CreateGraph(absl::string_view what) const;
  // Each Add* appends a node that depends on `after` (nullptr: on none) and
  // returns it. Kernel nodes take the launch's geometry: cluster
  // dimensions, cooperative and the cluster scheduling policy become node
  // attributes (cuGraphKernelNodeSetAttribute); programmatic dependent
  // launch is refused (INVALID_ARGUMENT: a graph node cannot be launched
  // that way). The driver copies `params` (as Launch's) when the node is
  // added. On a failure the node may be in the graph without its
  // attributes: drop the graph.
  absl::StatusOr<GraphNode> AddKernelNode(const Graph& g, GraphNode after, Function f,
                                          const LaunchGeometry& geometry, void** params,
                                          absl::string_view what) const;
  // `bytes` of `value` at `dst` (1-byte elements, one row), in the current
  // context. `bytes` > 0: the driver refuses an empty node.
  absl::StatusOr<GraphNode> AddMemsetNode(const Graph& g, GraphNode after, DevicePtr dst,
                                          uint8_t value, uint64_t bytes,
                                          absl::string_view what) const;
  // `bytes` from `src` to `dst`, both device memory (a 1-D copy), in the
  // current context. `bytes` > 0, as for a memset node.
  absl::StatusOr<GraphNode> AddCopyNode(const Graph& g, GraphNode after, DevicePtr dst,
                                        DevicePtr src, uint64_t bytes,
                                        absl::string_view what) const;
  // cuGraphInstantiateWithFlags(..., 0): the graph's checks (a kernel
  // node's cluster against its grid, ...) fail here.
  absl::StatusOr<GraphExec> Instantiate(const Graph& g, absl::string_view what) const;
  // Makes `e` resident for launches on `stream` ahead of the first.
  absl::Status Upload(const GraphExec& e, CUstream_st* stream, absl::string_view what) const;
  // Enqueues every node of `e` on `stream`, in order with its other work.
  absl::Status LaunchGraph(const GraphExec& e, CUstream_st* stream, absl::string_view what) const;
  // New arguments for a kernel node of an instantiated graph, for its next
  // launches (launches already enqueued keep theirs); `f` and `geometry`
  // are the node's as built (the driver refuses another function).
  absl::Status SetKernelNodeParams(const GraphExec& e, GraphNode node, Function f,
                                   const LaunchGeometry& geometry, void** params,
                                   absl::string_view what) const;

  absl::Status SynchronizeContext(absl::string_view what) const;
  // Blocks the calling thread until `stream`'s work has finished.
  absl::Status SynchronizeStream(CUstream_st* stream, absl::string_view what) const;
  // Synchronous allocation outside the memory pool (cuMemAlloc / cuMemFree).
  absl::StatusOr<DevicePtr> Alloc(uint64_t size, absl::string_view what) const;
  absl::Status Free(DevicePtr ptr, absl::string_view what) const;
  // Page-locks host memory the caller owns (cuMemHostRegister), so that
  // copies from and to it run at DMA speed; Unregister before freeing it.
  absl::Status HostRegister(void* ptr, uint64_t size, absl::string_view what) const;
  absl::Status HostUnregister(void* ptr, absl::string_view what) const;

  // The status for a failed call: the call, the CUresult name and text, and
  // the object it concerned. Public for the device layer's own checks.
  absl::Status Error(int result, absl::string_view call, absl::string_view what) const;

  const DriverApi& api() const { return *api_; }

 private:
  Driver(std::string library, void* handle, std::unique_ptr<DriverApi> api);
  // The status of a failed launch, or of a kernel node's add: Error's,
  // unless the simulator refuses a kernel it has no model of
  // (CUDA_ERROR_NOT_SUPPORTED), which it says, with what to do.
  absl::Status KernelError(int result, absl::string_view call, absl::string_view what) const;

  std::string library_;
  void* handle_ = nullptr;  // dlopen handle, closed in the destructor
  std::unique_ptr<DriverApi> api_;
  int version_ = 0;
  bool test_double_ = false;
  std::string example_kernels_;
};

}  // namespace gpuexec::cuda

#endif  // GPUEXEC_SERVER_CUDA_DRIVER_H_
