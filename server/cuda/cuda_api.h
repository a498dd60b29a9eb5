#ifndef GPUEXEC_SERVER_CUDA_CUDA_API_H_
#define GPUEXEC_SERVER_CUDA_CUDA_API_H_

// The part of the CUDA Driver API that gpuexec uses, declared by the project
// itself so that the build needs no CUDA toolkit: handle types, the enum
// constants and flags the daemon and the driver double pass or compare, the
// launch, graph-node and tensor-map structs, and one function-pointer type
// per entry point (PFN_<name>, the type of the name a caller writes; the
// versioned symbol that is resolved at run time is in driver_api_internal.h).
// Nothing here declares a function: libcuda is only ever reached through
// dlsym.
//
// The names, values and layouts are the driver's ABI (CUDA 12.4 and newer,
// 64-bit Linux). Enums list only the constants gpuexec uses; the driver may
// return or accept others. tests/unit/cuda_api_test.cc checks every
// declaration here against a toolkit's cuda.h where one is found at configure
// time, and fails on a declaration it does not check: add a check with every
// new one.
//
// Only server/cuda and the driver double (tests/fake_cuda) include this
// header (scripts/check_layering.py).

#include <cstddef>
#include <cstdint>

// The check test declares everything a second time inside a namespace of its
// own, beside the toolkit's global declarations.
#ifdef GPUEXEC_CUDA_API_NAMESPACE
namespace GPUEXEC_CUDA_API_NAMESPACE {
#endif

// --- Scalars and handles ---

using cuuint32_t = uint32_t;
using cuuint64_t = uint64_t;

// A device address; an integer of a pointer's width.
using CUdeviceptr = unsigned long long;  // NOLINT(runtime/int): the driver's type
static_assert(sizeof(CUdeviceptr) == sizeof(void*), "64-bit targets only");
// A device ordinal.
using CUdevice = int;

// Opaque objects of the driver; only pointers to them cross the ABI.
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
struct CUevent_st;
struct CUmemPoolHandle_st;
using CUcontext = CUctx_st*;
using CUmodule = CUmod_st*;
using CUfunction = CUfunc_st*;
using CUstream = CUstream_st*;
using CUevent = CUevent_st*;
using CUmemoryPool = CUmemPoolHandle_st*;
// Green contexts (CUDA 12.4+): a context confined to a part of the SMs, and
// the descriptor of the resources one is made of.
struct CUgreenCtx_st;
struct CUdevResourceDesc_st;
using CUgreenCtx = CUgreenCtx_st*;
using CUdevResourceDesc = CUdevResourceDesc_st*;
// Graphs: a graph of work, one of its nodes, and a graph instantiated for
// launch. Also the library kernel and the array that node parameters name
// (gpuexec sets neither).
struct CUgraph_st;
struct CUgraphNode_st;
struct CUgraphExec_st;
struct CUkern_st;
struct CUarray_st;
using CUgraph = CUgraph_st*;
using CUgraphNode = CUgraphNode_st*;
using CUgraphExec = CUgraphExec_st*;
using CUkernel = CUkern_st*;
using CUarray = CUarray_st*;

// A host function queued on a stream (cuLaunchHostFunc).
using CUhostFn = void (*)(void* userData);

// --- Results ---

// Every call's result. The enum has no fixed underlying type, as in C, so
// that it converts and compares like the driver's own.
enum CUresult {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_DEINITIALIZED = 4,
  CUDA_ERROR_PROFILER_DISABLED = 5,
  CUDA_ERROR_STUB_LIBRARY = 34,
  CUDA_ERROR_DEVICE_UNAVAILABLE = 46,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_IMAGE = 200,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_CONTEXT_ALREADY_CURRENT = 202,
  CUDA_ERROR_MAP_FAILED = 205,
  CUDA_ERROR_UNMAP_FAILED = 206,
  CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
  CUDA_ERROR_ECC_UNCORRECTABLE = 214,
  CUDA_ERROR_INVALID_PTX = 218,
  CUDA_ERROR_JIT_COMPILER_NOT_FOUND = 221,
  CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
  CUDA_ERROR_INVALID_SOURCE = 300,
  CUDA_ERROR_FILE_NOT_FOUND = 301,
  CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND = 302,
  CUDA_ERROR_OPERATING_SYSTEM = 304,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_ILLEGAL_STATE = 401,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_ILLEGAL_ADDRESS = 700,
  CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
  CUDA_ERROR_LAUNCH_TIMEOUT = 702,
  CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
  CUDA_ERROR_PEER_ACCESS_NOT_ENABLED = 705,
  CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE = 708,
  CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
  CUDA_ERROR_ASSERT = 710,
  CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
  CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
  CUDA_ERROR_HARDWARE_STACK_ERROR = 714,
  CUDA_ERROR_ILLEGAL_INSTRUCTION = 715,
  CUDA_ERROR_MISALIGNED_ADDRESS = 716,
  CUDA_ERROR_INVALID_ADDRESS_SPACE = 717,
  CUDA_ERROR_INVALID_PC = 718,
  CUDA_ERROR_LAUNCH_FAILED = 719,
  CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720,
  CUDA_ERROR_NOT_PERMITTED = 800,
  CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_SYSTEM_NOT_READY = 802,
  CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
  CUDA_ERROR_MPS_SERVER_NOT_READY = 807,
  CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
  CUDA_ERROR_TIMEOUT = 909,
  CUDA_ERROR_INVALID_CLUSTER_SIZE = 912,
  CUDA_ERROR_INVALID_RESOURCE_TYPE = 914,
  CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION = 915,
  CUDA_ERROR_UNKNOWN = 999,
};

// --- Attributes and options ---

// cuDeviceGetAttribute.
enum CUdevice_attribute {
  CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
  CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X = 2,
  CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y = 3,
  CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z = 4,
  CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X = 5,
  CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y = 6,
  CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z = 7,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8,
  CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY = 9,
  CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
  CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK = 12,
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY = 19,
  CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS = 31,
  CU_DEVICE_ATTRIBUTE_ECC_ENABLED = 32,
  CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
  CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39,
  CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81,
  CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR = 82,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
  CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED = 99,
  CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR = 106,
  CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115,
  CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH = 120,
};

// cuFuncGetAttribute / cuFuncSetAttribute.
enum CUfunction_attribute {
  CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0,
  CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1,
  CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES = 2,
  CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3,
  CU_FUNC_ATTRIBUTE_NUM_REGS = 4,
  CU_FUNC_ATTRIBUTE_PTX_VERSION = 5,
  CU_FUNC_ATTRIBUTE_BINARY_VERSION = 6,
  CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
  CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 9,
  CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14,
  CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 15,
};

// Options of cuModuleLoadDataEx (the JIT's log buffers).
enum CUjit_option {
  CU_JIT_INFO_LOG_BUFFER = 3,
  CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4,
  CU_JIT_ERROR_LOG_BUFFER = 5,
  CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
};

// cuMemPoolSetAttribute.
enum CUmemPool_attribute {
  CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
};

// Flags of cuStreamCreate.
enum CUstream_flags {
  CU_STREAM_DEFAULT = 0,
  CU_STREAM_NON_BLOCKING = 1,
};

// Flags of cuEventCreate.
enum CUevent_flags {
  CU_EVENT_DEFAULT = 0,
  CU_EVENT_BLOCKING_SYNC = 1,
  CU_EVENT_DISABLE_TIMING = 2,
  CU_EVENT_INTERPROCESS = 4,
};

// Flags of cuMemHostAlloc (plain integers in the driver's API).
inline constexpr unsigned int CU_MEMHOSTALLOC_PORTABLE = 0x1;
inline constexpr unsigned int CU_MEMHOSTALLOC_DEVICEMAP = 0x2;
inline constexpr unsigned int CU_MEMHOSTALLOC_WRITECOMBINED = 0x4;

// Stream handles with a special meaning: the legacy default stream and the
// calling thread's default stream. Values, not objects.
inline const CUstream CU_STREAM_LEGACY = reinterpret_cast<CUstream>(uintptr_t{1});
inline const CUstream CU_STREAM_PER_THREAD = reinterpret_cast<CUstream>(uintptr_t{2});

// Ends the `extra` array of cuLaunchKernel.
inline constexpr void* CU_LAUNCH_PARAM_END = nullptr;

// --- Launches (cuLaunchKernelEx, cuOccupancyMaxActiveClusters) ---

enum CUclusterSchedulingPolicy {
  CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING = 2,
};

enum CUlaunchAttributeID {
  CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2,
  CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4,
  CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 5,
  CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6,
};

// The value of one launch attribute: 64 bytes, 8-byte aligned (the driver's
// union also holds pointers); only the members gpuexec sets are named.
union alignas(8) CUlaunchAttributeValue {
  char pad[64];
  int cooperative;
  struct {
    unsigned int x;
    unsigned int y;
    unsigned int z;
  } clusterDim;
  CUclusterSchedulingPolicy clusterSchedulingPolicyPreference;
  int programmaticStreamSerializationAllowed;
};

struct CUlaunchAttribute {
  CUlaunchAttributeID id;
  char pad[8 - sizeof(CUlaunchAttributeID)];
  CUlaunchAttributeValue value;
};

// A kernel node's attributes are launch attributes (cuGraphKernelNodeSetAttribute).
using CUkernelNodeAttrID = CUlaunchAttributeID;
using CUkernelNodeAttrValue = CUlaunchAttributeValue;

struct CUlaunchConfig {
  unsigned int gridDimX;
  unsigned int gridDimY;
  unsigned int gridDimZ;
  unsigned int blockDimX;
  unsigned int blockDimY;
  unsigned int blockDimZ;
  unsigned int sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute* attrs;  // numAttrs of them; may be null when there are none
  unsigned int numAttrs;
};

// --- Graphs (cuGraphAddKernelNode, cuGraphAddMemsetNode, cuGraphAddMemcpyNode) ---

// The memory a copy reads or writes.
enum CUmemorytype {
  CU_MEMORYTYPE_HOST = 1,
  CU_MEMORYTYPE_DEVICE = 2,
  CU_MEMORYTYPE_ARRAY = 3,
  CU_MEMORYTYPE_UNIFIED = 4,
};

// A kernel node: the function (or a library kernel), its grid, block and
// dynamic shared memory, and its arguments as cuLaunchKernel takes them.
// The driver copies the arguments when the node is added or set.
struct CUDA_KERNEL_NODE_PARAMS_v2 {
  CUfunction func;
  unsigned int gridDimX;
  unsigned int gridDimY;
  unsigned int gridDimZ;
  unsigned int blockDimX;
  unsigned int blockDimY;
  unsigned int blockDimZ;
  unsigned int sharedMemBytes;
  void** kernelParams;
  void** extra;
  CUkernel kern;  // used only where func is null
  CUcontext ctx;  // ignored where func is set
};

// A memset node: `height` rows of `width` elements of `elementSize` bytes
// (1, 2 or 4), rows `pitch` bytes apart.
struct CUDA_MEMSET_NODE_PARAMS {
  CUdeviceptr dst;
  size_t pitch;
  unsigned int value;
  unsigned int elementSize;
  size_t width;
  size_t height;
};

// A copy of a box of WidthInBytes x Height x Depth; each side names its
// memory by type, its origin and its pitches.
struct CUDA_MEMCPY3D {
  size_t srcXInBytes;
  size_t srcY;
  size_t srcZ;
  size_t srcLOD;
  CUmemorytype srcMemoryType;
  const void* srcHost;
  CUdeviceptr srcDevice;
  CUarray srcArray;
  void* reserved0;  // must be null
  size_t srcPitch;
  size_t srcHeight;
  size_t dstXInBytes;
  size_t dstY;
  size_t dstZ;
  size_t dstLOD;
  CUmemorytype dstMemoryType;
  void* dstHost;
  CUdeviceptr dstDevice;
  CUarray dstArray;
  void* reserved1;  // must be null
  size_t dstPitch;
  size_t dstHeight;
  size_t WidthInBytes;
  size_t Height;
  size_t Depth;
};

// --- Green contexts (cuDeviceGetDevResource, cuDevSmResourceSplitByCount) ---

enum CUdevResourceType {
  CU_DEV_RESOURCE_TYPE_INVALID = 0,
  CU_DEV_RESOURCE_TYPE_SM = 1,
};

enum CUgreenCtxCreate_flags {
  CU_GREEN_CTX_DEFAULT_STREAM = 1,  // required by cuGreenCtxCreate
};

// A device's streaming multiprocessors. CUDA 12.x drivers fill smCount
// alone; 13.0 adds the partition rules (0 where the driver leaves them).
struct CUdevSmResource {
  unsigned int smCount;
  unsigned int minSmPartitionSize;
  unsigned int smCoscheduledAlignment;
};

// A tagged resource: 144 bytes, the driver's ABI version 1. Only the API
// that made one may write it.
struct CUdevResource {
  CUdevResourceType type;
  unsigned char _internal_padding[92];
  union {
    CUdevSmResource sm;
    unsigned char _oversize[48];
  };
};

// --- Tensor maps (cuTensorMapEncodeTiled) ---

// An encoded TMA descriptor: 128 opaque bytes. CUDA 12 aligns it to 64
// bytes, CUDA 13 to 128; the stricter alignment serves both.
struct alignas(128) CUtensorMap {
  cuuint64_t opaque[16];
};

enum CUtensorMapDataType {
  CU_TENSOR_MAP_DATA_TYPE_FLOAT32 = 7,
  CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ = 12,
};

enum CUtensorMapInterleave {
  CU_TENSOR_MAP_INTERLEAVE_NONE = 0,
  CU_TENSOR_MAP_INTERLEAVE_32B = 2,
};

enum CUtensorMapSwizzle {
  CU_TENSOR_MAP_SWIZZLE_128B = 3,
};

enum CUtensorMapL2promotion {
  CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3,
};

enum CUtensorMapFloatOOBfill {
  CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA = 1,
};

// --- Entry points ---
//
// The type of each entry point gpuexec resolves (and of cuLaunchKernel,
// which the driver double also serves).

typedef CUresult (*PFN_cuInit)(unsigned int flags);
typedef CUresult (*PFN_cuDriverGetVersion)(int* version);
typedef CUresult (*PFN_cuGetErrorName)(CUresult error, const char** name);
typedef CUresult (*PFN_cuGetErrorString)(CUresult error, const char** text);

typedef CUresult (*PFN_cuDeviceGetCount)(int* count);
typedef CUresult (*PFN_cuDeviceGet)(CUdevice* device, int ordinal);
typedef CUresult (*PFN_cuDeviceGetName)(char* name, int capacity, CUdevice device);
typedef CUresult (*PFN_cuDeviceGetAttribute)(int* value, CUdevice_attribute attribute,
                                             CUdevice device);
typedef CUresult (*PFN_cuDeviceTotalMem)(size_t* bytes, CUdevice device);
typedef CUresult (*PFN_cuDevicePrimaryCtxRetain)(CUcontext* context, CUdevice device);
typedef CUresult (*PFN_cuDevicePrimaryCtxRelease)(CUdevice device);
typedef CUresult (*PFN_cuDeviceGetDefaultMemPool)(CUmemoryPool* pool, CUdevice device);

typedef CUresult (*PFN_cuCtxSetCurrent)(CUcontext context);
typedef CUresult (*PFN_cuCtxGetCurrent)(CUcontext* context);
typedef CUresult (*PFN_cuCtxSynchronize)();

typedef CUresult (*PFN_cuMemAlloc)(CUdeviceptr* address, size_t bytes);
typedef CUresult (*PFN_cuMemFree)(CUdeviceptr address);
typedef CUresult (*PFN_cuMemGetInfo)(size_t* free_bytes, size_t* total_bytes);
typedef CUresult (*PFN_cuMemAllocAsync)(CUdeviceptr* address, size_t bytes, CUstream stream);
typedef CUresult (*PFN_cuMemFreeAsync)(CUdeviceptr address, CUstream stream);
typedef CUresult (*PFN_cuMemsetD8Async)(CUdeviceptr address, unsigned char value, size_t count,
                                        CUstream stream);
typedef CUresult (*PFN_cuMemcpyDtoDAsync)(CUdeviceptr to, CUdeviceptr from, size_t bytes,
                                          CUstream stream);
typedef CUresult (*PFN_cuMemcpyHtoDAsync)(CUdeviceptr to, const void* from, size_t bytes,
                                          CUstream stream);
typedef CUresult (*PFN_cuMemcpyDtoHAsync)(void* to, CUdeviceptr from, size_t bytes,
                                          CUstream stream);
typedef CUresult (*PFN_cuMemHostAlloc)(void** host, size_t bytes, unsigned int flags);
typedef CUresult (*PFN_cuMemFreeHost)(void* host);
typedef CUresult (*PFN_cuMemHostRegister)(void* host, size_t bytes, unsigned int flags);
typedef CUresult (*PFN_cuMemHostUnregister)(void* host);
typedef CUresult (*PFN_cuMemPoolSetAttribute)(CUmemoryPool pool, CUmemPool_attribute attribute,
                                              void* value);
typedef CUresult (*PFN_cuMemPoolTrimTo)(CUmemoryPool pool, size_t keep_bytes);

typedef CUresult (*PFN_cuModuleLoadDataEx)(CUmodule* module, const void* image,
                                           unsigned int option_count, CUjit_option* options,
                                           void** option_values);
typedef CUresult (*PFN_cuModuleUnload)(CUmodule module);
typedef CUresult (*PFN_cuModuleGetFunction)(CUfunction* function, CUmodule module,
                                            const char* name);
typedef CUresult (*PFN_cuFuncGetParamInfo)(CUfunction function, size_t index, size_t* offset,
                                           size_t* size);
typedef CUresult (*PFN_cuFuncGetAttribute)(int* value, CUfunction_attribute attribute,
                                           CUfunction function);
typedef CUresult (*PFN_cuFuncSetAttribute)(CUfunction function, CUfunction_attribute attribute,
                                           int value);

typedef CUresult (*PFN_cuStreamCreate)(CUstream* stream, unsigned int flags);
typedef CUresult (*PFN_cuStreamCreateWithPriority)(CUstream* stream, unsigned int flags,
                                                   int priority);
typedef CUresult (*PFN_cuCtxGetStreamPriorityRange)(int* least, int* greatest);
typedef CUresult (*PFN_cuStreamDestroy)(CUstream stream);
typedef CUresult (*PFN_cuStreamSynchronize)(CUstream stream);
typedef CUresult (*PFN_cuLaunchHostFunc)(CUstream stream, CUhostFn fn, void* user_data);

typedef CUresult (*PFN_cuEventCreate)(CUevent* event, unsigned int flags);
typedef CUresult (*PFN_cuEventRecord)(CUevent event, CUstream stream);
typedef CUresult (*PFN_cuEventQuery)(CUevent event);
typedef CUresult (*PFN_cuEventElapsedTime)(float* ms, CUevent start, CUevent end);
typedef CUresult (*PFN_cuEventDestroy)(CUevent event);

typedef CUresult (*PFN_cuLaunchKernel)(CUfunction function, unsigned int grid_x,
                                       unsigned int grid_y, unsigned int grid_z,
                                       unsigned int block_x, unsigned int block_y,
                                       unsigned int block_z, unsigned int shared_bytes,
                                       CUstream stream, void** params, void** extra);
typedef CUresult (*PFN_cuLaunchKernelEx)(const CUlaunchConfig* config, CUfunction function,
                                         void** params, void** extra);
typedef CUresult (*PFN_cuOccupancyMaxActiveBlocksPerMultiprocessor)(int* blocks,
                                                                    CUfunction function,
                                                                    int block_size,
                                                                    size_t dynamic_shared_bytes);
typedef CUresult (*PFN_cuOccupancyMaxActiveClusters)(int* clusters, CUfunction function,
                                                     const CUlaunchConfig* config);

typedef CUresult (*PFN_cuDeviceGetDevResource)(CUdevice device, CUdevResource* resource,
                                               CUdevResourceType type);
typedef CUresult (*PFN_cuDevSmResourceSplitByCount)(CUdevResource* result, unsigned int* groups,
                                                    const CUdevResource* input,
                                                    CUdevResource* remaining, unsigned int flags,
                                                    unsigned int min_count);
typedef CUresult (*PFN_cuDevResourceGenerateDesc)(CUdevResourceDesc* desc, CUdevResource* resources,
                                                  unsigned int count);
typedef CUresult (*PFN_cuGreenCtxCreate)(CUgreenCtx* context, CUdevResourceDesc desc,
                                         CUdevice device, unsigned int flags);
typedef CUresult (*PFN_cuGreenCtxDestroy)(CUgreenCtx context);
typedef CUresult (*PFN_cuGreenCtxGetDevResource)(CUgreenCtx context, CUdevResource* resource,
                                                 CUdevResourceType type);
typedef CUresult (*PFN_cuGreenCtxStreamCreate)(CUstream* stream, CUgreenCtx context,
                                               unsigned int flags, int priority);

typedef CUresult (*PFN_cuTensorMapEncodeTiled)(
    CUtensorMap* map, CUtensorMapDataType data_type, cuuint32_t rank, void* address,
    const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
    const cuuint32_t* element_strides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2_promotion, CUtensorMapFloatOOBfill oob_fill);

// Graphs: built node by node, instantiated once, launched and patched.
typedef CUresult (*PFN_cuGraphCreate)(CUgraph* graph, unsigned int flags);
typedef CUresult (*PFN_cuGraphAddKernelNode)(CUgraphNode* node, CUgraph graph,
                                             const CUgraphNode* dependencies,
                                             size_t dependency_count,
                                             const CUDA_KERNEL_NODE_PARAMS_v2* params);
typedef CUresult (*PFN_cuGraphAddMemsetNode)(CUgraphNode* node, CUgraph graph,
                                             const CUgraphNode* dependencies,
                                             size_t dependency_count,
                                             const CUDA_MEMSET_NODE_PARAMS* params,
                                             CUcontext context);
typedef CUresult (*PFN_cuGraphAddMemcpyNode)(CUgraphNode* node, CUgraph graph,
                                             const CUgraphNode* dependencies,
                                             size_t dependency_count, const CUDA_MEMCPY3D* params,
                                             CUcontext context);
typedef CUresult (*PFN_cuGraphKernelNodeSetAttribute)(CUgraphNode node,
                                                      CUkernelNodeAttrID attribute,
                                                      const CUkernelNodeAttrValue* value);
typedef CUresult (*PFN_cuGraphInstantiateWithFlags)(
    CUgraphExec* exec, CUgraph graph,
    unsigned long long flags);  // NOLINT(runtime/int): the driver's type
typedef CUresult (*PFN_cuGraphUpload)(CUgraphExec exec, CUstream stream);
typedef CUresult (*PFN_cuGraphLaunch)(CUgraphExec exec, CUstream stream);
typedef CUresult (*PFN_cuGraphExecKernelNodeSetParams)(CUgraphExec exec, CUgraphNode node,
                                                       const CUDA_KERNEL_NODE_PARAMS_v2* params);
typedef CUresult (*PFN_cuGraphExecDestroy)(CUgraphExec exec);
typedef CUresult (*PFN_cuGraphDestroy)(CUgraph graph);

#ifdef GPUEXEC_CUDA_API_NAMESPACE
}  // namespace GPUEXEC_CUDA_API_NAMESPACE
#endif

#endif  // GPUEXEC_SERVER_CUDA_CUDA_API_H_
