// Modules and their functions. A module image "GXFAKE1\n<kernel name>\n..."
// names the kernels it holds (names without a model are left out); a real
// cubin, PTX or fatbin is read by image_reader.h, and every kernel in it
// loads with the image's own parameter layout (it runs only where a model
// has that name and layout; see launch.cc). Then the functions' lookup,
// parameters and attributes.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tests/fake_cuda/fake_cuda_internal.h"

namespace gxfake::internal {
namespace {

constexpr char kModuleMagic[] = "GXFAKE1\n";
// A failed load's JIT error log leads with this, then says what the double
// could not read.
constexpr char kPtxErrorLog[] = "ptxas application ptx input; error   : ";

// What gxfake_module_loads reports.
std::atomic<uint64_t> g_module_loads{0};

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

}  // namespace
}  // namespace gxfake::internal

using namespace gxfake::internal;  // NOLINT(build/namespaces): the entry points are global

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

// --- Test-only exports ---

// Successful cuModuleLoadDataEx calls in this process.
GX_EXPORT uint64_t gxfake_module_loads(void) { return g_module_loads.load(); }

// --- Signatures ---

GX_CHECK_SIGNATURE(cuModuleLoadDataEx, cuModuleLoadDataEx);
GX_CHECK_SIGNATURE(cuModuleUnload, cuModuleUnload);
GX_CHECK_SIGNATURE(cuModuleGetFunction, cuModuleGetFunction);
GX_CHECK_SIGNATURE(cuFuncGetParamInfo, cuFuncGetParamInfo);
GX_CHECK_SIGNATURE(cuFuncGetAttribute, cuFuncGetAttribute);
GX_CHECK_SIGNATURE(cuFuncSetAttribute, cuFuncSetAttribute);
