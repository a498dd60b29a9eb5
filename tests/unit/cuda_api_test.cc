// Checks server/cuda/cuda_api.h, the project's own declarations of the CUDA
// Driver API, against a toolkit's cuda.h (built only where configure finds
// one, CUDA 12.4 or newer). Both sets of declarations live in this one file:
// ours inside namespace `ours`, the toolkit's in the global namespace. Each
// of ours is compared with the toolkit's:
//   * an enum constant: its value, and that it belongs to the same enum;
//   * an enum: its size and underlying type;
//   * a struct or union: its size and alignment, and each field's offset,
//     size and type;
//   * a type alias and an entry point's PFN_ type: the very same type, once
//     each of our enums, structs and opaque handles is replaced by the
//     toolkit's of the same name (Theirs<> below);
//   * each entry point the daemon resolves (driver_api_internal.h): that the
//     symbol it resolves is the one cuda.h maps the API name to.
// A last test reads cuda_api.h and fails naming each declaration that no
// check covered, so a new declaration cannot go unchecked.

#include <cxxabi.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#define GPUEXEC_CUDA_API_NAMESPACE ours
#include "server/cuda/cuda_api.h"
#undef GPUEXEC_CUDA_API_NAMESPACE

// The daemon's table of entry points, X(member, symbol, API name), over ours.
namespace gpuexec::cuda {
using namespace ::ours;  // NOLINT(build/namespaces): the table names PFN_* unqualified
}  // namespace gpuexec::cuda
#include "server/cuda/driver_api_internal.h"

// Our constants that cuda.h defines as macros, read before its macros exist
// (and named apart from them).
namespace ours_macros {
const uintptr_t OursCU_STREAM_LEGACY = reinterpret_cast<uintptr_t>(ours::CU_STREAM_LEGACY);
const uintptr_t OursCU_STREAM_PER_THREAD = reinterpret_cast<uintptr_t>(ours::CU_STREAM_PER_THREAD);
const uintptr_t OursCU_LAUNCH_PARAM_END = reinterpret_cast<uintptr_t>(ours::CU_LAUNCH_PARAM_END);
const uintptr_t OursCU_MEMHOSTALLOC_PORTABLE = ours::CU_MEMHOSTALLOC_PORTABLE;
const uintptr_t OursCU_MEMHOSTALLOC_DEVICEMAP = ours::CU_MEMHOSTALLOC_DEVICEMAP;
const uintptr_t OursCU_MEMHOSTALLOC_WRITECOMBINED = ours::CU_MEMHOSTALLOC_WRITECOMBINED;
}  // namespace ours_macros

#include <cuda.h>

#ifndef GPUEXEC_CUDA_API_HEADER
#error "GPUEXEC_CUDA_API_HEADER must name server/cuda/cuda_api.h"
#endif

namespace {

// --- Our types, rewritten in the toolkit's ---

// The nominal types of cuda_api.h, by kind (each also checked below).
// clang-format off
#define GX_ENUMS(X)                                                         \
  X(CUresult) X(CUdevice_attribute) X(CUfunction_attribute) X(CUjit_option) \
  X(CUmemPool_attribute) X(CUstream_flags) X(CUevent_flags)                 \
  X(CUclusterSchedulingPolicy) X(CUlaunchAttributeID) X(CUtensorMapDataType) \
  X(CUtensorMapInterleave) X(CUtensorMapSwizzle) X(CUtensorMapL2promotion)  \
  X(CUtensorMapFloatOOBfill) X(CUdevResourceType) X(CUgreenCtxCreate_flags) \
  X(CUmemorytype)
#define GX_AGGREGATES(X)                                                                    \
  X(CUlaunchAttributeValue) X(CUlaunchAttribute) X(CUlaunchConfig) X(CUtensorMap)           \
  X(CUdevSmResource) X(CUdevResource) X(CUDA_KERNEL_NODE_PARAMS_v2) X(CUDA_MEMSET_NODE_PARAMS) \
  X(CUDA_MEMCPY3D)
#define GX_OPAQUE(X)                                                                          \
  X(CUctx_st) X(CUmod_st) X(CUfunc_st) X(CUstream_st) X(CUevent_st) X(CUmemPoolHandle_st)     \
  X(CUgreenCtx_st) X(CUdevResourceDesc_st) X(CUgraph_st) X(CUgraphNode_st) X(CUgraphExec_st) \
  X(CUkern_st) X(CUarray_st)
// clang-format on

// Theirs<T>::type is T with each of our nominal types replaced by the
// toolkit's of the same name. A nominal type without a mapping stays ours,
// and so never equals the toolkit's type.
template <typename T>
struct Theirs {
  using type = T;
};
template <typename T>
using TheirsT = typename Theirs<T>::type;
template <typename T>
struct Theirs<T*> {
  using type = TheirsT<T>*;
};
template <typename T>
struct Theirs<const T> {
  using type = const TheirsT<T>;
};
template <typename T, size_t N>
struct Theirs<T[N]> {
  using type = TheirsT<T>[N];
};
template <typename T, size_t N>
struct Theirs<const T[N]> {
  using type = const TheirsT<T>[N];
};
template <typename R, typename... Args>
struct Theirs<R(Args...)> {
  using type = TheirsT<R>(TheirsT<Args>...);
};
#define GX_MAP(name)          \
  template <>                 \
  struct Theirs<ours::name> { \
    using type = ::name;      \
  };
GX_ENUMS(GX_MAP)
GX_AGGREGATES(GX_MAP)
GX_OPAQUE(GX_MAP)
#undef GX_MAP

template <typename T>
std::string TypeName() {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(
      abi::__cxa_demangle(typeid(T).name(), nullptr, nullptr, &status), std::free);
  return status == 0 ? name.get() : typeid(T).name();
}

// What a group of checks covered, and what it found wrong.
struct Checker {
  std::set<std::string> checked;
  std::vector<std::string> wrong;

  void Expect(bool ok, const std::string& name, const std::string& what) {
    checked.insert(name);
    if (!ok) wrong.push_back(name + ": " + what);
  }
  template <typename Ours, typename Toolkit>
  void ExpectSameType(const std::string& name) {
    Expect(std::is_same_v<TheirsT<Ours>, Toolkit>, name,
           "cuda_api.h has " + TypeName<Ours>() + ", cuda.h has " + TypeName<Toolkit>());
  }
  void ExpectEqual(long long ours, long long toolkit, const std::string& name,
                   const std::string& what) {
    Expect(ours == toolkit, name,
           what + " is " + std::to_string(ours) + " in cuda_api.h, " + std::to_string(toolkit) +
               " in cuda.h");
  }
  std::string Report() const {
    std::string out;
    for (const std::string& w : wrong) out += "  " + w + "\n";
    return out;
  }
};

// --- The groups of checks ---

// An enum constant: value, and the enum it belongs to.
#define GX_CONSTANT(name)                                                                       \
  c.ExpectEqual(static_cast<long long>(ours::name), static_cast<long long>(::name), #name,      \
                "the value");                                                                   \
  c.ExpectSameType<std::remove_cv_t<decltype(ours::name)>, std::remove_cv_t<decltype(::name)>>( \
      #name)
// A constant cuda.h spells as a macro (an integer or a special pointer):
// its value.
#define GX_MACRO_CONSTANT(name)                                  \
  c.ExpectEqual(static_cast<long long>(ours_macros::Ours##name), \
                static_cast<long long>((uintptr_t)(name)), #name, "the value")

void CheckConstants(Checker& c) {
  GX_CONSTANT(CUDA_SUCCESS);
  GX_CONSTANT(CUDA_ERROR_INVALID_RESOURCE_TYPE);
  GX_CONSTANT(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  GX_CONSTANT(CU_DEV_RESOURCE_TYPE_INVALID);
  GX_CONSTANT(CU_DEV_RESOURCE_TYPE_SM);
  GX_CONSTANT(CU_GREEN_CTX_DEFAULT_STREAM);
  GX_CONSTANT(CUDA_ERROR_INVALID_VALUE);
  GX_CONSTANT(CUDA_ERROR_OUT_OF_MEMORY);
  GX_CONSTANT(CUDA_ERROR_NOT_INITIALIZED);
  GX_CONSTANT(CUDA_ERROR_DEINITIALIZED);
  GX_CONSTANT(CUDA_ERROR_PROFILER_DISABLED);
  GX_CONSTANT(CUDA_ERROR_STUB_LIBRARY);
  GX_CONSTANT(CUDA_ERROR_DEVICE_UNAVAILABLE);
  GX_CONSTANT(CUDA_ERROR_NO_DEVICE);
  GX_CONSTANT(CUDA_ERROR_INVALID_DEVICE);
  GX_CONSTANT(CUDA_ERROR_INVALID_IMAGE);
  GX_CONSTANT(CUDA_ERROR_INVALID_CONTEXT);
  GX_CONSTANT(CUDA_ERROR_CONTEXT_ALREADY_CURRENT);
  GX_CONSTANT(CUDA_ERROR_MAP_FAILED);
  GX_CONSTANT(CUDA_ERROR_UNMAP_FAILED);
  GX_CONSTANT(CUDA_ERROR_NO_BINARY_FOR_GPU);
  GX_CONSTANT(CUDA_ERROR_ECC_UNCORRECTABLE);
  GX_CONSTANT(CUDA_ERROR_INVALID_PTX);
  GX_CONSTANT(CUDA_ERROR_JIT_COMPILER_NOT_FOUND);
  GX_CONSTANT(CUDA_ERROR_UNSUPPORTED_PTX_VERSION);
  GX_CONSTANT(CUDA_ERROR_INVALID_SOURCE);
  GX_CONSTANT(CUDA_ERROR_FILE_NOT_FOUND);
  GX_CONSTANT(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND);
  GX_CONSTANT(CUDA_ERROR_OPERATING_SYSTEM);
  GX_CONSTANT(CUDA_ERROR_INVALID_HANDLE);
  GX_CONSTANT(CUDA_ERROR_ILLEGAL_STATE);
  GX_CONSTANT(CUDA_ERROR_NOT_FOUND);
  GX_CONSTANT(CUDA_ERROR_NOT_READY);
  GX_CONSTANT(CUDA_ERROR_ILLEGAL_ADDRESS);
  GX_CONSTANT(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
  GX_CONSTANT(CUDA_ERROR_LAUNCH_TIMEOUT);
  GX_CONSTANT(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
  GX_CONSTANT(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  GX_CONSTANT(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE);
  GX_CONSTANT(CUDA_ERROR_CONTEXT_IS_DESTROYED);
  GX_CONSTANT(CUDA_ERROR_ASSERT);
  GX_CONSTANT(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  GX_CONSTANT(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  GX_CONSTANT(CUDA_ERROR_HARDWARE_STACK_ERROR);
  GX_CONSTANT(CUDA_ERROR_ILLEGAL_INSTRUCTION);
  GX_CONSTANT(CUDA_ERROR_MISALIGNED_ADDRESS);
  GX_CONSTANT(CUDA_ERROR_INVALID_ADDRESS_SPACE);
  GX_CONSTANT(CUDA_ERROR_INVALID_PC);
  GX_CONSTANT(CUDA_ERROR_LAUNCH_FAILED);
  GX_CONSTANT(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
  GX_CONSTANT(CUDA_ERROR_NOT_PERMITTED);
  GX_CONSTANT(CUDA_ERROR_NOT_SUPPORTED);
  GX_CONSTANT(CUDA_ERROR_SYSTEM_NOT_READY);
  GX_CONSTANT(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH);
  GX_CONSTANT(CUDA_ERROR_MPS_SERVER_NOT_READY);
  GX_CONSTANT(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  GX_CONSTANT(CUDA_ERROR_TIMEOUT);
  GX_CONSTANT(CUDA_ERROR_INVALID_CLUSTER_SIZE);
  GX_CONSTANT(CUDA_ERROR_UNKNOWN);

  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_WARP_SIZE);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_ECC_ENABLED);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED);
  GX_CONSTANT(CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH);

  GX_CONSTANT(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  GX_CONSTANT(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
  GX_CONSTANT(CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES);
  GX_CONSTANT(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES);
  GX_CONSTANT(CU_FUNC_ATTRIBUTE_NUM_REGS);
  GX_CONSTANT(CU_FUNC_ATTRIBUTE_PTX_VERSION);
  GX_CONSTANT(CU_FUNC_ATTRIBUTE_BINARY_VERSION);
  GX_CONSTANT(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
  GX_CONSTANT(CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT);
  GX_CONSTANT(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED);
  GX_CONSTANT(CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE);

  GX_CONSTANT(CU_JIT_INFO_LOG_BUFFER);
  GX_CONSTANT(CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES);
  GX_CONSTANT(CU_JIT_ERROR_LOG_BUFFER);
  GX_CONSTANT(CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES);
  GX_CONSTANT(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD);
  GX_CONSTANT(CU_STREAM_DEFAULT);
  GX_CONSTANT(CU_STREAM_NON_BLOCKING);
  GX_CONSTANT(CU_EVENT_DEFAULT);
  GX_CONSTANT(CU_EVENT_BLOCKING_SYNC);
  GX_CONSTANT(CU_EVENT_DISABLE_TIMING);
  GX_CONSTANT(CU_EVENT_INTERPROCESS);
  GX_CONSTANT(CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING);
  GX_CONSTANT(CU_LAUNCH_ATTRIBUTE_COOPERATIVE);
  GX_CONSTANT(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
  GX_CONSTANT(CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE);
  GX_CONSTANT(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
  GX_CONSTANT(CU_TENSOR_MAP_DATA_TYPE_FLOAT32);
  GX_CONSTANT(CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ);
  GX_CONSTANT(CU_TENSOR_MAP_INTERLEAVE_NONE);
  GX_CONSTANT(CU_TENSOR_MAP_INTERLEAVE_32B);
  GX_CONSTANT(CU_TENSOR_MAP_SWIZZLE_128B);
  GX_CONSTANT(CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
  GX_CONSTANT(CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA);
  GX_CONSTANT(CU_MEMORYTYPE_HOST);
  GX_CONSTANT(CU_MEMORYTYPE_DEVICE);
  GX_CONSTANT(CU_MEMORYTYPE_ARRAY);
  GX_CONSTANT(CU_MEMORYTYPE_UNIFIED);

  GX_MACRO_CONSTANT(CU_MEMHOSTALLOC_PORTABLE);
  GX_MACRO_CONSTANT(CU_MEMHOSTALLOC_DEVICEMAP);
  GX_MACRO_CONSTANT(CU_MEMHOSTALLOC_WRITECOMBINED);
  GX_MACRO_CONSTANT(CU_STREAM_LEGACY);
  GX_MACRO_CONSTANT(CU_STREAM_PER_THREAD);
  GX_MACRO_CONSTANT(CU_LAUNCH_PARAM_END);
}

// Enums (size, underlying type), opaque handles (the mapping exists), and
// type aliases (the same type).
#define GX_ENUM(name)                                                                          \
  c.ExpectEqual(sizeof(ours::name), sizeof(::name), #name, "sizeof");                          \
  c.Expect(std::is_same_v<std::underlying_type_t<ours::name>, std::underlying_type_t<::name>>, \
           #name, "the underlying types differ");
#define GX_OPAQUE_CHECK(name) c.ExpectSameType<ours::name*, ::name*>(#name);
#define GX_ALIAS(name) c.ExpectSameType<ours::name, ::name>(#name)

void CheckTypes(Checker& c) {
  GX_ENUMS(GX_ENUM)
  GX_OPAQUE(GX_OPAQUE_CHECK)
  GX_ALIAS(cuuint32_t);
  GX_ALIAS(cuuint64_t);
  GX_ALIAS(CUdeviceptr);
  GX_ALIAS(CUdevice);
  GX_ALIAS(CUcontext);
  GX_ALIAS(CUmodule);
  GX_ALIAS(CUfunction);
  GX_ALIAS(CUstream);
  GX_ALIAS(CUevent);
  GX_ALIAS(CUmemoryPool);
  GX_ALIAS(CUhostFn);
  GX_ALIAS(CUgreenCtx);
  GX_ALIAS(CUdevResourceDesc);
  GX_ALIAS(CUgraph);
  GX_ALIAS(CUgraphNode);
  GX_ALIAS(CUgraphExec);
  GX_ALIAS(CUkernel);
  GX_ALIAS(CUarray);
  GX_ALIAS(CUkernelNodeAttrID);
  GX_ALIAS(CUkernelNodeAttrValue);
}

// A struct's size and alignment; a field's offset, size and type (a
// member path such as clusterDim.x reaches into a nested struct).
#define GX_AGGREGATE(name, alignment_may_be_stricter)                                      \
  c.ExpectEqual(sizeof(ours::name), sizeof(::name), #name, "sizeof");                      \
  if (alignment_may_be_stricter) {                                                         \
    c.Expect(alignof(ours::name) % alignof(::name) == 0, #name,                            \
             "alignof " + std::to_string(alignof(ours::name)) + " is not a multiple of " + \
                 std::to_string(alignof(::name)));                                         \
  } else {                                                                                 \
    c.ExpectEqual(alignof(ours::name), alignof(::name), #name, "alignof");                 \
  }
#define GX_FIELD_LAYOUT(agg, path)                                                               \
  c.ExpectEqual(offsetof(ours::agg, path), offsetof(::agg, path), #agg "." #path, "the offset"); \
  c.ExpectEqual(sizeof(std::declval<ours::agg&>().path), sizeof(std::declval<::agg&>().path),    \
                #agg "." #path, "sizeof")
#define GX_FIELD(agg, path)                                   \
  GX_FIELD_LAYOUT(agg, path);                                 \
  c.ExpectSameType<decltype(std::declval<ours::agg&>().path), \
                   decltype(std::declval<::agg&>().path)>(#agg "." #path)

void CheckAggregates(Checker& c) {
  GX_AGGREGATE(CUlaunchAttributeValue, false);
  GX_FIELD(CUlaunchAttributeValue, pad);
  GX_FIELD(CUlaunchAttributeValue, cooperative);
  GX_FIELD_LAYOUT(CUlaunchAttributeValue, clusterDim);
  GX_FIELD(CUlaunchAttributeValue, clusterDim.x);
  GX_FIELD(CUlaunchAttributeValue, clusterDim.y);
  GX_FIELD(CUlaunchAttributeValue, clusterDim.z);
  GX_FIELD(CUlaunchAttributeValue, clusterSchedulingPolicyPreference);
  GX_FIELD(CUlaunchAttributeValue, programmaticStreamSerializationAllowed);

  GX_AGGREGATE(CUlaunchAttribute, false);
  GX_FIELD(CUlaunchAttribute, id);
  GX_FIELD(CUlaunchAttribute, pad);
  GX_FIELD(CUlaunchAttribute, value);

  GX_AGGREGATE(CUlaunchConfig, false);
  GX_FIELD(CUlaunchConfig, gridDimX);
  GX_FIELD(CUlaunchConfig, gridDimY);
  GX_FIELD(CUlaunchConfig, gridDimZ);
  GX_FIELD(CUlaunchConfig, blockDimX);
  GX_FIELD(CUlaunchConfig, blockDimY);
  GX_FIELD(CUlaunchConfig, blockDimZ);
  GX_FIELD(CUlaunchConfig, sharedMemBytes);
  GX_FIELD(CUlaunchConfig, hStream);
  GX_FIELD(CUlaunchConfig, attrs);
  GX_FIELD(CUlaunchConfig, numAttrs);

  // CUDA 12 aligns a tensor map to 64 bytes, CUDA 13 to 128; ours takes the
  // stricter, which serves both.
  GX_AGGREGATE(CUtensorMap, true);
  GX_FIELD(CUtensorMap, opaque);

  GX_AGGREGATE(CUdevSmResource, false);
  GX_FIELD(CUdevSmResource, smCount);
  GX_FIELD(CUdevSmResource, minSmPartitionSize);
  GX_FIELD(CUdevSmResource, smCoscheduledAlignment);

  GX_AGGREGATE(CUdevResource, false);
  GX_FIELD(CUdevResource, type);
  GX_FIELD(CUdevResource, _internal_padding);
  GX_FIELD(CUdevResource, sm);
  GX_FIELD(CUdevResource, _oversize);

  GX_AGGREGATE(CUDA_KERNEL_NODE_PARAMS_v2, false);
  GX_FIELD(CUDA_KERNEL_NODE_PARAMS_v2, func);
  GX_FIELD(CUDA_KERNEL_NODE_PARAMS_v2, gridDimX);
  GX_FIELD(CUDA_KERNEL_NODE_PARAMS_v2, gridDimY);
  GX_FIELD(CUDA_KERNEL_NODE_PARAMS_v2, gridDimZ);
  GX_FIELD(CUDA_KERNEL_NODE_PARAMS_v2, blockDimX);
  GX_FIELD(CUDA_KERNEL_NODE_PARAMS_v2, blockDimY);
  GX_FIELD(CUDA_KERNEL_NODE_PARAMS_v2, blockDimZ);
  GX_FIELD(CUDA_KERNEL_NODE_PARAMS_v2, sharedMemBytes);
  GX_FIELD(CUDA_KERNEL_NODE_PARAMS_v2, kernelParams);
  GX_FIELD(CUDA_KERNEL_NODE_PARAMS_v2, extra);
  GX_FIELD(CUDA_KERNEL_NODE_PARAMS_v2, kern);
  GX_FIELD(CUDA_KERNEL_NODE_PARAMS_v2, ctx);

  GX_AGGREGATE(CUDA_MEMSET_NODE_PARAMS, false);
  GX_FIELD(CUDA_MEMSET_NODE_PARAMS, dst);
  GX_FIELD(CUDA_MEMSET_NODE_PARAMS, pitch);
  GX_FIELD(CUDA_MEMSET_NODE_PARAMS, value);
  GX_FIELD(CUDA_MEMSET_NODE_PARAMS, elementSize);
  GX_FIELD(CUDA_MEMSET_NODE_PARAMS, width);
  GX_FIELD(CUDA_MEMSET_NODE_PARAMS, height);

  GX_AGGREGATE(CUDA_MEMCPY3D, false);
  GX_FIELD(CUDA_MEMCPY3D, srcXInBytes);
  GX_FIELD(CUDA_MEMCPY3D, srcY);
  GX_FIELD(CUDA_MEMCPY3D, srcZ);
  GX_FIELD(CUDA_MEMCPY3D, srcLOD);
  GX_FIELD(CUDA_MEMCPY3D, srcMemoryType);
  GX_FIELD(CUDA_MEMCPY3D, srcHost);
  GX_FIELD(CUDA_MEMCPY3D, srcDevice);
  GX_FIELD(CUDA_MEMCPY3D, srcArray);
  GX_FIELD(CUDA_MEMCPY3D, reserved0);
  GX_FIELD(CUDA_MEMCPY3D, srcPitch);
  GX_FIELD(CUDA_MEMCPY3D, srcHeight);
  GX_FIELD(CUDA_MEMCPY3D, dstXInBytes);
  GX_FIELD(CUDA_MEMCPY3D, dstY);
  GX_FIELD(CUDA_MEMCPY3D, dstZ);
  GX_FIELD(CUDA_MEMCPY3D, dstLOD);
  GX_FIELD(CUDA_MEMCPY3D, dstMemoryType);
  GX_FIELD(CUDA_MEMCPY3D, dstHost);
  GX_FIELD(CUDA_MEMCPY3D, dstDevice);
  GX_FIELD(CUDA_MEMCPY3D, dstArray);
  GX_FIELD(CUDA_MEMCPY3D, reserved1);
  GX_FIELD(CUDA_MEMCPY3D, dstPitch);
  GX_FIELD(CUDA_MEMCPY3D, dstHeight);
  GX_FIELD(CUDA_MEMCPY3D, WidthInBytes);
  GX_FIELD(CUDA_MEMCPY3D, Height);
  GX_FIELD(CUDA_MEMCPY3D, Depth);
}

#define GX_STR(x) GX_STR_(x)
#define GX_STR_(x) #x

// Entry points the daemon resolves deliberately by a name other than the
// one the toolkit maps the API name to, and why.
bool OlderSymbolOnPurpose(const std::string& symbol) {
  // The version-1 symbol: every driver from 12.4 on exports it, with the
  // same signature; CUDA 12.8+ headers map the name to _v2.
  return symbol == "cuEventElapsedTime";
}

// An entry point's type, and the symbol the daemon resolves it by.
#define GX_ENTRY(member, symbol, api)                                                  \
  c.ExpectSameType<ours::PFN_##api, decltype(&::api)>("PFN_" #api);                    \
  c.Expect(                                                                            \
      symbol == std::string(GX_STR(api)) || OlderSymbolOnPurpose(symbol), "PFN_" #api, \
      std::string("the daemon resolves ") + symbol + ", cuda.h maps " #api " to " + GX_STR(api));

void CheckEntryPoints(Checker& c) {
  GPUEXEC_DRIVER_ENTRY_POINTS(GX_ENTRY)
  GPUEXEC_DRIVER_OPTIONAL_ENTRY_POINTS(GX_ENTRY)
  // Served by the driver double only.
  c.ExpectSameType<ours::PFN_cuLaunchKernel, decltype(&::cuLaunchKernel)>("PFN_cuLaunchKernel");
}

// --- The declarations of cuda_api.h, read from its text ---

std::string StripComment(const std::string& line) {
  const size_t at = line.find("//");
  return at == std::string::npos ? line : line.substr(0, at);
}

// The names of every declaration: types, constants, entry-point types, and
// fields as "Aggregate.field" ("Aggregate.nested.field" inside a nested
// struct). Relies on the header's layout: one declaration a line, top-level
// declarations at column 0.
std::set<std::string> DeclaredNames(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  static const std::regex kAggregate(R"(^(?:struct|union) (?:alignas\(\d+\) )?(\w+) \{)");
  static const std::regex kForward(R"(^struct (\w+);)");
  static const std::regex kEnum(R"(^enum (\w+) \{)");
  static const std::regex kEnumerator(R"(^\s+(\w+) = .*,)");
  static const std::regex kAlias(R"(^using (\w+) =)");
  static const std::regex kConstant(R"(^inline (?:constexpr|const) [\w\s\*]*?\b(\w+) =)");
  static const std::regex kEntry(R"(^typedef \w+ \(\*(PFN_\w+)\))");
  static const std::regex kNestedOpen(R"(^\s+(?:struct|union) \{)");
  static const std::regex kNestedClose(R"(^\s+\} (\w+);)");
  static const std::regex kAnonymousClose(R"(^\s+\};)");
  static const std::regex kField(R"(^\s+[\w\s\*]+?\b(\w+)(?:\[[^\]]*\])?;)");
  std::set<std::string> names;
  std::string aggregate;            // the struct or union being read
  bool nested = false;              // inside a nested struct of it
  std::vector<std::string> inside;  // the nested struct's fields
  bool in_enum = false;
  std::string raw;
  std::smatch m;
  while (std::getline(in, raw)) {
    const std::string line = StripComment(raw);
    if (in_enum) {
      if (std::regex_search(line, m, kEnumerator)) names.insert(m[1]);
      if (line.rfind("};", 0) == 0) in_enum = false;
    } else if (!aggregate.empty()) {
      if (line.rfind("};", 0) == 0) {
        aggregate.clear();
        nested = false;
      } else if (nested && std::regex_search(line, m, kAnonymousClose)) {
        // An anonymous union's members are the aggregate's own.
        for (const std::string& field : inside) names.insert(aggregate + "." + field);
        nested = false;
      } else if (std::regex_search(line, m, kNestedOpen)) {
        nested = true;
        inside.clear();
      } else if (nested && std::regex_search(line, m, kNestedClose)) {
        const std::string member = aggregate + "." + m[1].str();
        names.insert(member);
        for (const std::string& field : inside) names.insert(member + "." + field);
        nested = false;
      } else if (std::regex_search(line, m, kField)) {
        if (nested) {
          inside.push_back(m[1]);
        } else {
          names.insert(aggregate + "." + m[1].str());
        }
      }
    } else if (std::regex_search(line, m, kAggregate)) {
      names.insert(m[1]);
      aggregate = m[1];
    } else if (std::regex_search(line, m, kEnum)) {
      names.insert(m[1]);
      in_enum = true;
    } else if (std::regex_search(line, m, kForward) || std::regex_search(line, m, kAlias) ||
               std::regex_search(line, m, kConstant) || std::regex_search(line, m, kEntry)) {
      names.insert(m[1]);
    }
  }
  return names;
}

// --- Tests ---

TEST(CudaApiTest, ConstantsMatchTheToolkit) {
  Checker c;
  CheckConstants(c);
  EXPECT_TRUE(c.wrong.empty()) << "cuda_api.h disagrees with cuda.h:\n" << c.Report();
}

TEST(CudaApiTest, TypesMatchTheToolkit) {
  Checker c;
  CheckTypes(c);
  EXPECT_TRUE(c.wrong.empty()) << "cuda_api.h disagrees with cuda.h:\n" << c.Report();
}

TEST(CudaApiTest, StructLayoutsMatchTheToolkit) {
  Checker c;
  CheckAggregates(c);
  EXPECT_TRUE(c.wrong.empty()) << "cuda_api.h disagrees with cuda.h:\n" << c.Report();
}

TEST(CudaApiTest, EntryPointsMatchTheToolkit) {
  Checker c;
  CheckEntryPoints(c);
  EXPECT_TRUE(c.wrong.empty()) << "cuda_api.h disagrees with cuda.h:\n" << c.Report();
}

TEST(CudaApiTest, EveryDeclarationIsChecked) {
  Checker c;
  CheckConstants(c);
  CheckTypes(c);
  CheckAggregates(c);
  CheckEntryPoints(c);
  const std::set<std::string> declared = DeclaredNames(GPUEXEC_CUDA_API_HEADER);
  EXPECT_GT(declared.size(), 100u) << "the reading of cuda_api.h found too little";
  std::string unchecked;
  for (const std::string& name : declared) {
    if (c.checked.count(name) == 0) unchecked += " " + name;
  }
  EXPECT_EQ(unchecked, "") << "declared in cuda_api.h but not checked here";
  std::string unknown;
  for (const std::string& name : c.checked) {
    if (declared.count(name) == 0) unknown += " " + name;
  }
  EXPECT_EQ(unknown, "") << "checked here but not found in cuda_api.h (is the reading stale?)";
}

}  // namespace
