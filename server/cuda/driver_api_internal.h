#ifndef GPUEXEC_SERVER_CUDA_DRIVER_API_INTERNAL_H_
#define GPUEXEC_SERVER_CUDA_DRIVER_API_INTERNAL_H_

// The table of driver entry points the daemon uses, resolved with dlsym from
// whatever library Driver::Load opened. The exported symbol names are the
// versioned ones that the toolkit's cuda.h maps the plain names to (checked
// by tests/unit/cuda_api_test.cc); the test double exports the same names.

#include <cstring>

#include "server/cuda/cuda_api.h"

namespace gpuexec::cuda {

// X(member, exported symbol, API name: its type is PFN_<API name> in cuda_api.h)
#define GPUEXEC_DRIVER_ENTRY_POINTS(X)                                                        \
  X(Init, "cuInit", cuInit)                                                                   \
  X(DriverGetVersion, "cuDriverGetVersion", cuDriverGetVersion)                               \
  X(GetErrorName, "cuGetErrorName", cuGetErrorName)                                           \
  X(GetErrorString, "cuGetErrorString", cuGetErrorString)                                     \
  X(DeviceGetCount, "cuDeviceGetCount", cuDeviceGetCount)                                     \
  X(DeviceGet, "cuDeviceGet", cuDeviceGet)                                                    \
  X(DeviceGetName, "cuDeviceGetName", cuDeviceGetName)                                        \
  X(DeviceGetAttribute, "cuDeviceGetAttribute", cuDeviceGetAttribute)                         \
  X(DeviceTotalMem, "cuDeviceTotalMem_v2", cuDeviceTotalMem)                                  \
  X(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain)             \
  X(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", cuDevicePrimaryCtxRelease)       \
  X(CtxSetCurrent, "cuCtxSetCurrent", cuCtxSetCurrent)                                        \
  X(CtxGetCurrent, "cuCtxGetCurrent", cuCtxGetCurrent)                                        \
  X(CtxSynchronize, "cuCtxSynchronize", cuCtxSynchronize)                                     \
  X(StreamSynchronize, "cuStreamSynchronize", cuStreamSynchronize)                            \
  X(MemAlloc, "cuMemAlloc_v2", cuMemAlloc)                                                    \
  X(MemFree, "cuMemFree_v2", cuMemFree)                                                       \
  X(MemHostRegister, "cuMemHostRegister_v2", cuMemHostRegister)                               \
  X(MemHostUnregister, "cuMemHostUnregister", cuMemHostUnregister)                            \
  X(MemGetInfo, "cuMemGetInfo_v2", cuMemGetInfo)                                              \
  X(ModuleLoadDataEx, "cuModuleLoadDataEx", cuModuleLoadDataEx)                               \
  X(ModuleUnload, "cuModuleUnload", cuModuleUnload)                                           \
  X(ModuleGetFunction, "cuModuleGetFunction", cuModuleGetFunction)                            \
  X(FuncGetParamInfo, "cuFuncGetParamInfo", cuFuncGetParamInfo)                               \
  X(FuncGetAttribute, "cuFuncGetAttribute", cuFuncGetAttribute)                               \
  X(FuncSetAttribute, "cuFuncSetAttribute", cuFuncSetAttribute)                               \
  X(StreamCreate, "cuStreamCreate", cuStreamCreate)                                           \
  X(StreamCreateWithPriority, "cuStreamCreateWithPriority", cuStreamCreateWithPriority)       \
  X(CtxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange", cuCtxGetStreamPriorityRange)    \
  X(StreamDestroy, "cuStreamDestroy_v2", cuStreamDestroy)                                     \
  X(LaunchHostFunc, "cuLaunchHostFunc", cuLaunchHostFunc)                                     \
  X(EventCreate, "cuEventCreate", cuEventCreate)                                              \
  X(EventRecord, "cuEventRecord", cuEventRecord)                                              \
  X(EventQuery, "cuEventQuery", cuEventQuery)                                                 \
  X(EventElapsedTime, "cuEventElapsedTime", cuEventElapsedTime)                               \
  X(EventDestroy, "cuEventDestroy_v2", cuEventDestroy)                                        \
  X(MemAllocAsync, "cuMemAllocAsync", cuMemAllocAsync)                                        \
  X(MemFreeAsync, "cuMemFreeAsync", cuMemFreeAsync)                                           \
  X(MemsetD8Async, "cuMemsetD8Async", cuMemsetD8Async)                                        \
  X(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", cuMemcpyDtoDAsync)                               \
  X(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", cuMemcpyHtoDAsync)                               \
  X(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", cuMemcpyDtoHAsync)                               \
  X(MemHostAlloc, "cuMemHostAlloc", cuMemHostAlloc)                                           \
  X(MemFreeHost, "cuMemFreeHost", cuMemFreeHost)                                              \
  X(LaunchKernelEx, "cuLaunchKernelEx", cuLaunchKernelEx)                                     \
  X(OccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor", \
    cuOccupancyMaxActiveBlocksPerMultiprocessor)                                              \
  X(OccupancyMaxActiveClusters, "cuOccupancyMaxActiveClusters", cuOccupancyMaxActiveClusters) \
  X(TensorMapEncodeTiled, "cuTensorMapEncodeTiled", cuTensorMapEncodeTiled)                   \
  X(DeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", cuDeviceGetDefaultMemPool)          \
  X(MemPoolSetAttribute, "cuMemPoolSetAttribute", cuMemPoolSetAttribute)                      \
  X(MemPoolTrimTo, "cuMemPoolTrimTo", cuMemPoolTrimTo)

// Entry points a driver may lack: resolved where present, null otherwise.
// Green contexts: CUDA 12.4 (cuGreenCtxStreamCreate 12.5); compute shares
// with --isolation=device need them all. Then the graphs' (below).
#define GPUEXEC_DRIVER_OPTIONAL_ENTRY_POINTS(X)                                            \
  X(DeviceGetDevResource, "cuDeviceGetDevResource", cuDeviceGetDevResource)                \
  X(DevSmResourceSplitByCount, "cuDevSmResourceSplitByCount", cuDevSmResourceSplitByCount) \
  X(DevResourceGenerateDesc, "cuDevResourceGenerateDesc", cuDevResourceGenerateDesc)       \
  X(GreenCtxCreate, "cuGreenCtxCreate", cuGreenCtxCreate)                                  \
  X(GreenCtxDestroy, "cuGreenCtxDestroy", cuGreenCtxDestroy)                               \
  X(GreenCtxGetDevResource, "cuGreenCtxGetDevResource", cuGreenCtxGetDevResource)          \
  X(GreenCtxStreamCreate, "cuGreenCtxStreamCreate", cuGreenCtxStreamCreate)                \
  GPUEXEC_DRIVER_GRAPH_ENTRY_POINTS(X)

// Graphs (issue 39: record once, replay many; docs/graphs-plan.md): a
// driver has graphs when it has every one of these (Driver::has_graphs).
// The _v2 kernel-node calls, whose parameters carry the function's handle,
// are CUDA 12.0's.
#define GPUEXEC_DRIVER_GRAPH_ENTRY_POINTS(X)                                                     \
  X(GraphCreate, "cuGraphCreate", cuGraphCreate)                                                 \
  X(GraphAddKernelNode, "cuGraphAddKernelNode_v2", cuGraphAddKernelNode)                         \
  X(GraphAddMemsetNode, "cuGraphAddMemsetNode", cuGraphAddMemsetNode)                            \
  X(GraphAddMemcpyNode, "cuGraphAddMemcpyNode", cuGraphAddMemcpyNode)                            \
  X(GraphKernelNodeSetAttribute, "cuGraphKernelNodeSetAttribute", cuGraphKernelNodeSetAttribute) \
  X(GraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags)       \
  X(GraphUpload, "cuGraphUpload", cuGraphUpload)                                                 \
  X(GraphLaunch, "cuGraphLaunch", cuGraphLaunch)                                                 \
  X(GraphExecKernelNodeSetParams, "cuGraphExecKernelNodeSetParams_v2",                           \
    cuGraphExecKernelNodeSetParams)                                                              \
  X(GraphExecDestroy, "cuGraphExecDestroy", cuGraphExecDestroy)                                  \
  X(GraphDestroy, "cuGraphDestroy", cuGraphDestroy)

struct DriverApi {
#define GPUEXEC_DECLARE_ENTRY(member, symbol, fn) PFN_##fn member = nullptr;
  GPUEXEC_DRIVER_ENTRY_POINTS(GPUEXEC_DECLARE_ENTRY)
  GPUEXEC_DRIVER_OPTIONAL_ENTRY_POINTS(GPUEXEC_DECLARE_ENTRY)
#undef GPUEXEC_DECLARE_ENTRY
};

// The grid, block and dynamic shared memory of `g` (a port::LaunchGeometry)
// into `p`: a CUlaunchConfig or a kernel node's parameters, which name them
// alike.
template <typename Geometry, typename Params>
void SetGrid(const Geometry& g, Params* p) {
  p->gridDimX = g.grid[0];
  p->gridDimY = g.grid[1];
  p->gridDimZ = g.grid[2];
  p->blockDimX = g.block[0];
  p->blockDimY = g.block[1];
  p->blockDimZ = g.block[2];
  p->sharedMemBytes = g.shared_bytes;
}

// The launch attributes of `g` (a port::LaunchGeometry) in `attrs`: its
// cluster (a dimension left 0 is 1) with its scheduling policy, its
// cooperative grid, its programmatic dependent launch. Returns how many.
template <typename Geometry>
unsigned LaunchAttributesOf(const Geometry& g, CUlaunchAttribute (&attrs)[4]) {
  std::memset(attrs, 0, sizeof(attrs));
  unsigned n = 0;
  if (g.cluster[0] != 0 || g.cluster[1] != 0 || g.cluster[2] != 0) {
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[n].value.clusterDim.x = g.cluster[0] == 0 ? 1 : g.cluster[0];
    attrs[n].value.clusterDim.y = g.cluster[1] == 0 ? 1 : g.cluster[1];
    attrs[n].value.clusterDim.z = g.cluster[2] == 0 ? 1 : g.cluster[2];
    ++n;
    if (g.cluster_policy != 0) {
      attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
      attrs[n].value.clusterSchedulingPolicyPreference =
          static_cast<CUclusterSchedulingPolicy>(g.cluster_policy);
      ++n;
    }
  }
  if (g.cooperative) {
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[n].value.cooperative = 1;
    ++n;
  }
  if (g.programmatic_dependent) {
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[n].value.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  return n;
}

// Inside a Driver member: runs api_->call args and returns the status of a
// failure, naming the call and `what`.
#define GPUEXEC_CU(call, args, what)                                                      \
  do {                                                                                    \
    const CUresult gpuexec_result_ = api_->call args;                                     \
    if (gpuexec_result_ != CUDA_SUCCESS) return Error(gpuexec_result_, "cu" #call, what); \
  } while (0)

}  // namespace gpuexec::cuda

#endif  // GPUEXEC_SERVER_CUDA_DRIVER_API_INTERNAL_H_
