#include "server/cuda/driver.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/cuda/driver_api_internal.h"

namespace gpuexec::cuda {
namespace {

// The payload that carries a failed call's CUresult, in decimal.
constexpr char kResultPayload[] = "gpuexec.dev/cuda-result";

// The one table from CUresult to a canonical code. Sticky faults poison the
// context until the process ends: ABORTED, so that clients know the device
// must be reset.
struct ResultEntry {
  CUresult result;
  const char* name;  // used when the driver cannot name its own code
  absl::StatusCode code;
  bool sticky;
};

constexpr ResultEntry kResults[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", absl::StatusCode::kOk, false},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", absl::StatusCode::kInvalidArgument,
     false},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", absl::StatusCode::kResourceExhausted,
     false},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", absl::StatusCode::kUnavailable,
     false},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", absl::StatusCode::kUnavailable, false},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", absl::StatusCode::kUnavailable, false},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", absl::StatusCode::kUnavailable, false},
    {CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
     absl::StatusCode::kUnavailable, false},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", absl::StatusCode::kFailedPrecondition,
     false},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU",
     absl::StatusCode::kFailedPrecondition, false},
    {CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", absl::StatusCode::kFailedPrecondition,
     false},
    {CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
     absl::StatusCode::kFailedPrecondition, false},
    {CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
     absl::StatusCode::kFailedPrecondition, false},
    {CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND",
     absl::StatusCode::kFailedPrecondition, false},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", absl::StatusCode::kFailedPrecondition,
     false},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", absl::StatusCode::kNotFound, false},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", absl::StatusCode::kUnavailable, false},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", absl::StatusCode::kInternal, false},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", absl::StatusCode::kInternal, false},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
     absl::StatusCode::kInvalidArgument, false},
    {CUDA_ERROR_INVALID_CLUSTER_SIZE, "CUDA_ERROR_INVALID_CLUSTER_SIZE",
     absl::StatusCode::kInvalidArgument, false},
    {CUDA_ERROR_INVALID_RESOURCE_TYPE, "CUDA_ERROR_INVALID_RESOURCE_TYPE",
     absl::StatusCode::kInvalidArgument, false},
    {CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION",
     absl::StatusCode::kInvalidArgument, false},
    {CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
     absl::StatusCode::kInvalidArgument, false},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", absl::StatusCode::kAborted, true},
    {CUDA_ERROR_LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT", absl::StatusCode::kAborted, true},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", absl::StatusCode::kAborted, true},
    {CUDA_ERROR_HARDWARE_STACK_ERROR, "CUDA_ERROR_HARDWARE_STACK_ERROR", absl::StatusCode::kAborted,
     true},
    {CUDA_ERROR_ILLEGAL_INSTRUCTION, "CUDA_ERROR_ILLEGAL_INSTRUCTION", absl::StatusCode::kAborted,
     true},
    {CUDA_ERROR_MISALIGNED_ADDRESS, "CUDA_ERROR_MISALIGNED_ADDRESS", absl::StatusCode::kAborted,
     true},
    {CUDA_ERROR_INVALID_ADDRESS_SPACE, "CUDA_ERROR_INVALID_ADDRESS_SPACE",
     absl::StatusCode::kAborted, true},
    {CUDA_ERROR_INVALID_PC, "CUDA_ERROR_INVALID_PC", absl::StatusCode::kAborted, true},
    {CUDA_ERROR_ASSERT, "CUDA_ERROR_ASSERT", absl::StatusCode::kAborted, true},
    {CUDA_ERROR_ECC_UNCORRECTABLE, "CUDA_ERROR_ECC_UNCORRECTABLE", absl::StatusCode::kAborted,
     true},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", absl::StatusCode::kAborted,
     false},
    {CUDA_ERROR_MPS_SERVER_NOT_READY, "CUDA_ERROR_MPS_SERVER_NOT_READY",
     absl::StatusCode::kUnavailable, false},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", absl::StatusCode::kInternal, false},
};

const ResultEntry* FindResult(int result) {
  for (const ResultEntry& e : kResults) {
    if (static_cast<int>(e.result) == result) return &e;
  }
  return nullptr;
}

}  // namespace

std::optional<int> ResultOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kResultPayload);
  int result = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &result)) {
    return std::nullopt;
  }
  return result;
}

bool IsSticky(const absl::Status& status) {
  if (status.ok()) return false;
  if (const std::optional<int> result = ResultOf(status)) return IsStickyResult(*result);
  return status.code() == absl::StatusCode::kAborted;
}

bool NotReadyYet(const absl::Status& status) {
  return ResultOf(status) == CUDA_ERROR_MPS_SERVER_NOT_READY;
}

bool IsStickyResult(int result) {
  const ResultEntry* e = FindResult(result);
  return e != nullptr && e->sticky;
}

absl::StatusCode CodeForResult(int result) {
  const ResultEntry* e = FindResult(result);
  return e != nullptr ? e->code : absl::StatusCode::kInternal;
}

absl::Status Driver::Error(int result, absl::string_view call, absl::string_view what) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api_->GetErrorName != nullptr) api_->GetErrorName(static_cast<CUresult>(result), &name);
  if (api_->GetErrorString != nullptr) api_->GetErrorString(static_cast<CUresult>(result), &text);
  if (name == nullptr) {
    const ResultEntry* e = FindResult(result);
    name = e != nullptr ? e->name : "unknown CUresult";
  }
  std::string message = absl::StrCat(call, " failed for ", what, ": ", name, " (", result);
  if (text != nullptr) absl::StrAppend(&message, ": ", text);
  absl::StrAppend(&message, ")");
  absl::Status status(CodeForResult(result), message);
  status.SetPayload(kResultPayload, absl::Cord(absl::StrCat(result)));
  return status;
}

absl::StatusOr<std::unique_ptr<Driver>> Driver::Load(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::UnavailableError(absl::StrCat("cannot load the CUDA driver library '", library,
                                               "': ", why != nullptr ? why : "unknown error"));
  }
  auto api = std::make_unique<DriverApi>();
  std::string missing;
#define GPUEXEC_RESOLVE_ENTRY(member, symbol, fn)                               \
  api->member = reinterpret_cast<decltype(api->member)>(dlsym(handle, symbol)); \
  if (api->member == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", symbol);
  GPUEXEC_DRIVER_ENTRY_POINTS(GPUEXEC_RESOLVE_ENTRY)
#undef GPUEXEC_RESOLVE_ENTRY
#define GPUEXEC_RESOLVE_OPTIONAL(member, symbol, fn) \
  api->member = reinterpret_cast<decltype(api->member)>(dlsym(handle, symbol));
  GPUEXEC_DRIVER_OPTIONAL_ENTRY_POINTS(GPUEXEC_RESOLVE_OPTIONAL)
#undef GPUEXEC_RESOLVE_OPTIONAL
  if (!missing.empty()) {
    dlclose(handle);
    return absl::UnavailableError(absl::StrCat("the CUDA driver library '", library,
                                               "' lacks entry points this daemon needs (", missing,
                                               "); a driver for CUDA 12.4 or newer is "
                                               "required"));
  }
  std::unique_ptr<Driver> driver(new Driver(library, handle, std::move(api)));
  driver->test_double_ = dlsym(handle, "gxfake_module_loads") != nullptr;
  if (auto examples = reinterpret_cast<const char* (*)()>(dlsym(handle, "gxfake_example_kernels"));
      driver->test_double_ && examples != nullptr && examples() != nullptr) {
    driver->example_kernels_ = examples();
  }
  const CUresult init = driver->api_->Init(0);
  if (init != CUDA_SUCCESS) {
    absl::Status s = driver->Error(init, "cuInit", absl::StrCat("driver library '", library, "'"));
    absl::Status unavailable = absl::UnavailableError(s.message());
    unavailable.SetPayload(kResultPayload, absl::Cord(absl::StrCat(init)));
    return unavailable;
  }
  int version = 0;
  if (driver->api_->DriverGetVersion(&version) == CUDA_SUCCESS) driver->version_ = version;
  return driver;
}

Driver::Driver(std::string library, void* handle, std::unique_ptr<DriverApi> api)
    : library_(std::move(library)), handle_(handle), api_(std::move(api)) {}

Driver::~Driver() {
  // The library stays mapped: driver threads may still run host functions
  // that live in this process, and unloading libcuda is not supported anyway.
  (void)handle_;
}

absl::StatusOr<int> Driver::DeviceCount() const {
  int count = 0;
  GPUEXEC_CU(DeviceGetCount, (&count), "the host");
  return count;
}

absl::StatusOr<DeviceProperties> Driver::Properties(int ordinal) const {
  const std::string what = absl::StrCat("device ", ordinal);
  CUdevice dev;
  GPUEXEC_CU(DeviceGet, (&dev, ordinal), what);
  DeviceProperties p;
  p.ordinal = ordinal;
  char name[256] = {0};
  GPUEXEC_CU(DeviceGetName, (name, sizeof(name) - 1, dev), what);
  p.name = name;
  size_t total = 0;
  GPUEXEC_CU(DeviceTotalMem, (&total, dev), what);
  p.total_memory = total;
  auto attr = [&](CUdevice_attribute a, int* out) -> absl::Status {
    GPUEXEC_CU(DeviceGetAttribute, (out, a, dev), what);
    return absl::OkStatus();
  };
  int cluster = 0, pools = 0;
  GPUEXEC_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &p.cc_major));
  GPUEXEC_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &p.cc_minor));
  GPUEXEC_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, &p.multiprocessors));
  GPUEXEC_RETURN_IF_ERROR(
      attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, &p.max_threads_per_block));
  GPUEXEC_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, &p.max_block[0]));
  GPUEXEC_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, &p.max_block[1]));
  GPUEXEC_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, &p.max_block[2]));
  GPUEXEC_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, &p.max_grid[0]));
  GPUEXEC_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, &p.max_grid[1]));
  GPUEXEC_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, &p.max_grid[2]));
  GPUEXEC_RETURN_IF_ERROR(
      attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, &p.max_shared_per_block));
  GPUEXEC_RETURN_IF_ERROR(
      attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, &p.max_shared_per_block_optin));
  GPUEXEC_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, &cluster));
  GPUEXEC_RETURN_IF_ERROR(attr(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, &pools));
  p.cluster_launch = cluster != 0;
  p.memory_pools = pools != 0;
  if (p.max_shared_per_block_optin < p.max_shared_per_block) {
    p.max_shared_per_block_optin = p.max_shared_per_block;
  }
  return p;
}

absl::StatusOr<PrimaryContext> Driver::RetainPrimaryContext(int ordinal) const {
  const std::string what = absl::StrCat("device ", ordinal);
  CUdevice dev;
  GPUEXEC_CU(DeviceGet, (&dev, ordinal), what);
  CUcontext ctx = nullptr;
  GPUEXEC_CU(DevicePrimaryCtxRetain, (&ctx, dev), what);
  return PrimaryContext(this, ordinal, ctx);
}

PrimaryContext& PrimaryContext::operator=(PrimaryContext&& o) noexcept {
  if (this != &o) {
    this->~PrimaryContext();
    driver_ = o.driver_;
    ordinal_ = o.ordinal_;
    ctx_ = std::exchange(o.ctx_, nullptr);
  }
  return *this;
}

PrimaryContext::~PrimaryContext() {
  if (ctx_ == nullptr) return;
  CUdevice dev;
  if (driver_->api().DeviceGet(&dev, ordinal_) == CUDA_SUCCESS) {
    driver_->api().DevicePrimaryCtxRelease(dev);
  }
  ctx_ = nullptr;
}

absl::Status Driver::SetCurrent(CUctx_st* ctx, int ordinal) const {
  GPUEXEC_CU(CtxSetCurrent, (ctx), absl::StrCat("the primary context of device ", ordinal));
  return absl::OkStatus();
}

absl::StatusOr<MemoryInfo> Driver::MemInfo(int ordinal) const {
  size_t free = 0, total = 0;
  GPUEXEC_CU(MemGetInfo, (&free, &total), absl::StrCat("device ", ordinal));
  return MemoryInfo{free, total};
}

absl::StatusOr<Module> Driver::LoadModule(absl::string_view image, bool is_ptx,
                                          absl::string_view what) const {
  // The driver wants PTX NUL-terminated; cubins and fatbins carry their size.
  std::string ptx;
  const void* data = image.data();
  if (is_ptx) {
    ptx.assign(image.data(), image.size());
    ptx.push_back('\0');
    data = ptx.data();
  }
  std::string error_log(16 * 1024, '\0');
  std::string info_log(4 * 1024, '\0');
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                            CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {error_log.data(), reinterpret_cast<void*>(error_log.size()), info_log.data(),
                    reinterpret_cast<void*>(info_log.size())};
  CUmodule module = nullptr;
  const CUresult r = api_->ModuleLoadDataEx(&module, data, 4, options, values);
  if (r != CUDA_SUCCESS) {
    absl::Status s = Error(r, "cuModuleLoadDataEx", what);
    error_log.resize(strnlen(error_log.data(), error_log.size()));
    if (!error_log.empty()) {
      return absl::Status(s.code(), absl::StrCat(s.message(), "; JIT log: ", error_log));
    }
    return s;
  }
  return Module(this, module);
}

absl::StatusOr<Function> Driver::GetFunction(const Module& module, const std::string& name,
                                             absl::string_view what) const {
  CUfunction f = nullptr;
  const CUresult r = api_->ModuleGetFunction(&f, module.get(), name.c_str());
  if (r == CUDA_ERROR_NOT_FOUND) {
    return absl::NotFoundError(absl::StrCat("no kernel named '", Quoted(name), "' in ", what,
                                            " (cuModuleGetFunction: CUDA_ERROR_NOT_FOUND); "
                                            "kernels need extern \"C\" or their mangled name"));
  }
  if (r != CUDA_SUCCESS) {
    return Error(r, "cuModuleGetFunction", absl::StrCat("kernel '", Quoted(name), "' of ", what));
  }
  return f;
}

absl::StatusOr<std::vector<ParamInfo>> Driver::ParamLayout(Function f,
                                                           absl::string_view what) const {
  std::vector<ParamInfo> params;
  for (size_t i = 0;; ++i) {
    size_t offset = 0, size = 0;
    const CUresult r = api_->FuncGetParamInfo(f, i, &offset, &size);
    if (r == CUDA_ERROR_INVALID_VALUE) break;  // past the last parameter
    if (r != CUDA_SUCCESS) return Error(r, "cuFuncGetParamInfo", what);
    params.push_back({offset, size});
    if (params.size() > 4096) {
      return absl::InternalError(absl::StrCat(what, " reports more than 4096 parameters"));
    }
  }
  return params;
}

absl::StatusOr<FunctionAttributes> Driver::Attributes(Function f, absl::string_view what) const {
  FunctionAttributes a;
  auto get = [&](CUfunction_attribute attr, int* out) -> absl::Status {
    GPUEXEC_CU(FuncGetAttribute, (out, attr, f), what);
    return absl::OkStatus();
  };
  GPUEXEC_RETURN_IF_ERROR(get(CU_FUNC_ATTRIBUTE_NUM_REGS, &a.num_registers));
  GPUEXEC_RETURN_IF_ERROR(get(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, &a.static_shared_bytes));
  GPUEXEC_RETURN_IF_ERROR(get(CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES, &a.const_bytes));
  GPUEXEC_RETURN_IF_ERROR(get(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, &a.local_bytes));
  GPUEXEC_RETURN_IF_ERROR(get(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, &a.max_threads_per_block));
  GPUEXEC_RETURN_IF_ERROR(
      get(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, &a.max_dynamic_shared_bytes));
  GPUEXEC_RETURN_IF_ERROR(get(CU_FUNC_ATTRIBUTE_PTX_VERSION, &a.ptx_version));
  GPUEXEC_RETURN_IF_ERROR(get(CU_FUNC_ATTRIBUTE_BINARY_VERSION, &a.binary_version));
  return a;
}

absl::Status Driver::SetMaxDynamicShared(Function f, int bytes, absl::string_view what) const {
  GPUEXEC_CU(FuncSetAttribute, (f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes), what);
  return absl::OkStatus();
}

absl::StatusOr<Stream> Driver::CreateStream(absl::string_view what) const {
  CUstream s = nullptr;
  GPUEXEC_CU(StreamCreate, (&s, CU_STREAM_NON_BLOCKING), what);
  return Stream(this, s);
}

absl::StatusOr<Stream> Driver::CreateStream(int priority, absl::string_view what) const {
  CUstream s = nullptr;
  GPUEXEC_CU(StreamCreateWithPriority, (&s, CU_STREAM_NON_BLOCKING, priority), what);
  return Stream(this, s);
}

absl::StatusOr<Driver::PriorityRange> Driver::StreamPriorities() const {
  PriorityRange r;
  GPUEXEC_CU(CtxGetStreamPriorityRange, (&r.least, &r.greatest), "the stream priorities");
  return r;
}

absl::StatusOr<Event> Driver::CreateEvent(bool timing, absl::string_view what) const {
  CUevent e = nullptr;
  GPUEXEC_CU(EventCreate, (&e, timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING), what);
  return Event(this, e);
}

absl::Status Driver::Record(const Event& event, CUstream_st* stream, absl::string_view what) const {
  GPUEXEC_CU(EventRecord, (event.get(), stream), what);
  return absl::OkStatus();
}

absl::StatusOr<bool> Driver::EventDone(const Event& event, absl::string_view what) const {
  const CUresult r = api_->EventQuery(event.get());
  if (r == CUDA_SUCCESS) return true;
  if (r == CUDA_ERROR_NOT_READY) return false;
  return Error(r, "cuEventQuery", what);
}

absl::StatusOr<float> Driver::ElapsedMs(const Event& start, const Event& end,
                                        absl::string_view what) const {
  float ms = 0;
  GPUEXEC_CU(EventElapsedTime, (&ms, start.get(), end.get()), what);
  return ms;
}

absl::Status Driver::LaunchHostFunc(CUstream_st* stream, HostCallback fn, void* data,
                                    absl::string_view what) const {
  GPUEXEC_CU(LaunchHostFunc, (stream, fn, data), what);
  return absl::OkStatus();
}

absl::Status Driver::ConfigureMemoryPool(int ordinal) const {
  const std::string what = absl::StrCat("the default memory pool of device ", ordinal);
  CUdevice dev;
  GPUEXEC_CU(DeviceGet, (&dev, ordinal), what);
  CUmemoryPool pool = nullptr;
  GPUEXEC_CU(DeviceGetDefaultMemPool, (&pool, dev), what);
  // Keep freed memory in the pool up to a modest size: allocation stays fast
  // for steady workloads, and the rest goes back to the device at each
  // synchronization so free memory reflects what sessions hold.
  cuuint64_t threshold = 64ull << 20;
  GPUEXEC_CU(MemPoolSetAttribute, (pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold), what);
  return absl::OkStatus();
}

absl::Status Driver::TrimMemoryPool(int ordinal) const {
  const std::string what = absl::StrCat("the default memory pool of device ", ordinal);
  CUdevice dev;
  GPUEXEC_CU(DeviceGet, (&dev, ordinal), what);
  CUmemoryPool pool = nullptr;
  GPUEXEC_CU(DeviceGetDefaultMemPool, (&pool, dev), what);
  GPUEXEC_CU(MemPoolTrimTo, (pool, 0), what);
  return absl::OkStatus();
}

absl::StatusOr<DevicePtr> Driver::AllocAsync(uint64_t size, CUstream_st* stream,
                                             absl::string_view what) const {
  CUdeviceptr p = 0;
  GPUEXEC_CU(MemAllocAsync, (&p, size, stream), what);
  return static_cast<DevicePtr>(p);
}

absl::Status Driver::FreeAsync(DevicePtr ptr, CUstream_st* stream, absl::string_view what) const {
  GPUEXEC_CU(MemFreeAsync, (static_cast<CUdeviceptr>(ptr), stream), what);
  return absl::OkStatus();
}

absl::Status Driver::MemsetAsync(DevicePtr ptr, uint8_t value, uint64_t size, CUstream_st* stream,
                                 absl::string_view what) const {
  GPUEXEC_CU(MemsetD8Async, (static_cast<CUdeviceptr>(ptr), value, size, stream), what);
  return absl::OkStatus();
}

absl::Status Driver::CopyDtoDAsync(DevicePtr dst, DevicePtr src, uint64_t size, CUstream_st* stream,
                                   absl::string_view what) const {
  GPUEXEC_CU(MemcpyDtoDAsync, (dst, src, size, stream), what);
  return absl::OkStatus();
}

absl::Status Driver::CopyHtoDAsync(DevicePtr dst, const void* src, uint64_t size,
                                   CUstream_st* stream, absl::string_view what) const {
  GPUEXEC_CU(MemcpyHtoDAsync, (dst, src, size, stream), what);
  return absl::OkStatus();
}

absl::Status Driver::CopyDtoHAsync(void* dst, DevicePtr src, uint64_t size, CUstream_st* stream,
                                   absl::string_view what) const {
  GPUEXEC_CU(MemcpyDtoHAsync, (dst, src, size, stream), what);
  return absl::OkStatus();
}

absl::StatusOr<PinnedMemory> Driver::AllocPinned(uint64_t size, absl::string_view what) const {
  void* p = nullptr;
  GPUEXEC_CU(MemHostAlloc, (&p, size, 0), what);
  return PinnedMemory(this, p);
}

namespace {

// The grid, block and shared memory of `g` as the driver's launch
// configuration; no stream, no attributes.
CUlaunchConfig ConfigOf(const LaunchGeometry& g) {
  CUlaunchConfig config;
  std::memset(&config, 0, sizeof(config));
  SetGrid(g, &config);
  return config;
}

}  // namespace

absl::Status Driver::Launch(Function f, const LaunchGeometry& g, void** params, CUstream_st* stream,
                            absl::string_view what) const {
  CUlaunchConfig config = ConfigOf(g);
  config.hStream = stream;
  CUlaunchAttribute attrs[4];
  const unsigned n = LaunchAttributesOf(g, attrs);
  config.attrs = n == 0 ? nullptr : attrs;
  config.numAttrs = n;
  const CUresult result = api_->LaunchKernelEx(&config, f, params, nullptr);
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  return KernelError(result, "cuLaunchKernelEx", what);
}

absl::Status Driver::KernelError(int result, absl::string_view call, absl::string_view what) const {
  if (result != CUDA_ERROR_NOT_SUPPORTED || example_kernels_.empty()) {
    return Error(result, call, what);
  }
  // The simulator loads any kernel but runs only the ones it has a host
  // model of: say so, and what to do, before the driver's detail.
  absl::Status refused = absl::FailedPreconditionError(absl::StrCat(
      what, ": the gpuexec simulator cannot run this kernel: it runs only its example kernels (",
      example_kernels_,
      ") with the examples' parameters; run other kernels on a GPU (gpuexecd without "
      "--simulator, on a host with an NVIDIA driver) [",
      Error(result, call, "it").message(), "]"));
  refused.SetPayload(kResultPayload, absl::Cord(absl::StrCat(result)));
  return refused;
}

absl::StatusOr<uint64_t> Driver::MaxCoResidentBlocks(Function f, const LaunchGeometry& g,
                                                     int multiprocessors,
                                                     absl::string_view what) const {
  const uint64_t threads = uint64_t{g.block[0]} * g.block[1] * g.block[2];
  if (g.cluster[0] == 0) {
    int per_sm = 0;
    GPUEXEC_CU(OccupancyMaxActiveBlocksPerMultiprocessor,
               (&per_sm, f, static_cast<int>(threads), g.shared_bytes), what);
    return static_cast<uint64_t>(std::max(per_sm, 0)) *
           static_cast<uint64_t>(std::max(multiprocessors, 0));
  }
  // Clusters are placed whole: the device holds so many clusters at once.
  CUlaunchConfig config = ConfigOf(g);
  CUlaunchAttribute attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attr.value.clusterDim.x = g.cluster[0];
  attr.value.clusterDim.y = g.cluster[1] == 0 ? 1 : g.cluster[1];
  attr.value.clusterDim.z = g.cluster[2] == 0 ? 1 : g.cluster[2];
  config.attrs = &attr;
  config.numAttrs = 1;
  int clusters = 0;
  GPUEXEC_CU(OccupancyMaxActiveClusters, (&clusters, f, &config), what);
  const uint64_t size =
      uint64_t{attr.value.clusterDim.x} * attr.value.clusterDim.y * attr.value.clusterDim.z;
  return static_cast<uint64_t>(std::max(clusters, 0)) * size;
}

absl::Status Driver::AllowNonPortableClusters(Function f, absl::string_view what) const {
  GPUEXEC_CU(FuncSetAttribute, (f, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1), what);
  return absl::OkStatus();
}

absl::Status Driver::EncodeTensorMap(const port::TensorMapEncoding& m, void* out,
                                     absl::string_view what) const {
  static_assert(sizeof(CUtensorMap) == port::kTensorMapBytes);
  if (m.rank < 1 || m.rank > port::kMaxTensorRank) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": a tensor map of rank ", m.rank));
  }
  // Encoded into aligned storage (the driver asks for 64 bytes), then
  // copied into the parameter block, which has no such alignment.
  CUtensorMap map;
  cuuint64_t dims[port::kMaxTensorRank];
  cuuint64_t strides[port::kMaxTensorRank];
  cuuint32_t box[port::kMaxTensorRank];
  cuuint32_t element_strides[port::kMaxTensorRank];
  for (uint32_t i = 0; i < m.rank; ++i) {
    dims[i] = m.dims[i];
    box[i] = m.box[i];
    element_strides[i] = m.element_strides[i];
    strides[i] = i + 1 < m.rank ? m.strides[i] : 0;
  }
  GPUEXEC_CU(TensorMapEncodeTiled,
             (&map, static_cast<CUtensorMapDataType>(m.data_type), m.rank,
              reinterpret_cast<void*>(static_cast<uintptr_t>(m.address)), dims, strides, box,
              element_strides, static_cast<CUtensorMapInterleave>(m.interleave),
              static_cast<CUtensorMapSwizzle>(m.swizzle),
              static_cast<CUtensorMapL2promotion>(m.l2_promotion),
              static_cast<CUtensorMapFloatOOBfill>(m.oob_fill)),
             what);
  std::memcpy(out, &map, sizeof(map));
  return absl::OkStatus();
}

absl::Status Driver::SynchronizeContext(absl::string_view what) const {
  GPUEXEC_CU(CtxSynchronize, (), what);
  return absl::OkStatus();
}

absl::Status Driver::SynchronizeStream(CUstream_st* stream, absl::string_view what) const {
  GPUEXEC_CU(StreamSynchronize, (stream), what);
  return absl::OkStatus();
}

absl::StatusOr<DevicePtr> Driver::Alloc(uint64_t size, absl::string_view what) const {
  CUdeviceptr p = 0;
  GPUEXEC_CU(MemAlloc, (&p, size), what);
  return static_cast<DevicePtr>(p);
}

absl::Status Driver::Free(DevicePtr ptr, absl::string_view what) const {
  GPUEXEC_CU(MemFree, (static_cast<CUdeviceptr>(ptr)), what);
  return absl::OkStatus();
}

absl::Status Driver::HostRegister(void* ptr, uint64_t size, absl::string_view what) const {
  GPUEXEC_CU(MemHostRegister, (ptr, size, 0), what);
  return absl::OkStatus();
}

absl::Status Driver::HostUnregister(void* ptr, absl::string_view what) const {
  GPUEXEC_CU(MemHostUnregister, (ptr), what);
  return absl::OkStatus();
}

void ReleaseModule(const Driver* d, CUmod_st* m) { d->api().ModuleUnload(m); }
void ReleaseStream(const Driver* d, CUstream_st* s) { d->api().StreamDestroy(s); }
void ReleaseEvent(const Driver* d, CUevent_st* e) { d->api().EventDestroy(e); }
void ReleasePinned(const Driver* d, void* p) { d->api().MemFreeHost(p); }

}  // namespace gpuexec::cuda
