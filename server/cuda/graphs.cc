// CUDA graphs: work built node by node (a kernel, memset or copy node
// each), instantiated once, then launched many times on a stream, a kernel
// node's arguments patched between launches without instantiating again
// (docs/graphs-plan.md). The device's worker builds a session's recorded
// commands into one.

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/cuda/driver.h"
#include "server/cuda/driver_api_internal.h"

namespace gpuexec::cuda {

bool Driver::has_graphs() const {
#define GPUEXEC_HAS_ENTRY(member, symbol, fn) api_->member != nullptr&&
  return GPUEXEC_DRIVER_GRAPH_ENTRY_POINTS(GPUEXEC_HAS_ENTRY) true;
#undef GPUEXEC_HAS_ENTRY
}

namespace {

absl::Status NoGraphs(const Driver& d, const DriverApi& api) {
  std::string missing;
#define GPUEXEC_NAME_MISSING(member, symbol, fn) \
  if (api.member == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", symbol);
  GPUEXEC_DRIVER_GRAPH_ENTRY_POINTS(GPUEXEC_NAME_MISSING)
#undef GPUEXEC_NAME_MISSING
  const std::string driver = d.version() > 0 ? absl::StrCat("the CUDA driver (", d.version() / 1000,
                                                            ".", d.version() % 1000 / 10, ")")
                                             : std::string("the CUDA driver");
  return absl::FailedPreconditionError(absl::StrCat(
      driver, " in '", d.library(), "' has no CUDA graphs (it lacks ", missing,
      "): recording and replaying work needs a driver for CUDA 12.0 or newer; update the "
      "NVIDIA driver, or launch the work one command at a time"));
}

// The kernel node parameters of `f` for `g`: its grid, block, dynamic
// shared memory and arguments (the attributes are set apart).
CUDA_KERNEL_NODE_PARAMS_v2 KernelParamsOf(Function f, const LaunchGeometry& g, void** params) {
  CUDA_KERNEL_NODE_PARAMS_v2 p;
  std::memset(&p, 0, sizeof(p));
  p.func = f;
  SetGrid(g, &p);
  p.kernelParams = params;
  return p;
}

absl::Status NoProgrammaticNode(absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(what,
                   ": a graph node cannot be launched with programmatic dependent launch "
                   "(it may start before the node it depends on ends); record the kernel "
                   "without it, or launch it outside the graph"));
}

}  // namespace

absl::StatusOr<Graph> Driver::CreateGraph(absl::string_view what) const {
  if (!has_graphs()) return NoGraphs(*this, *api_);
  CUgraph g = nullptr;
  GPUEXEC_CU(GraphCreate, (&g, 0), what);
  return Graph(this, g);
}

absl::StatusOr<GraphNode> Driver::AddKernelNode(const Graph& g, GraphNode after, Function f,
                                                const LaunchGeometry& geometry, void** params,
                                                absl::string_view what) const {
  if (!has_graphs()) return NoGraphs(*this, *api_);
  if (geometry.programmatic_dependent) return NoProgrammaticNode(what);
  const CUDA_KERNEL_NODE_PARAMS_v2 p = KernelParamsOf(f, geometry, params);
  CUgraphNode node = nullptr;
  const CUresult added =
      api_->GraphAddKernelNode(&node, g.get(), after ? &after : nullptr, after ? 1 : 0, &p);
  if (added != CUDA_SUCCESS) return KernelError(added, "cuGraphAddKernelNode", what);
  // The attributes Launch gives a launch (programmatic dependent launch
  // refused above).
  CUlaunchAttribute attrs[4];
  const unsigned n = LaunchAttributesOf(geometry, attrs);
  for (unsigned i = 0; i < n; ++i) {
    GPUEXEC_CU(GraphKernelNodeSetAttribute, (node, attrs[i].id, &attrs[i].value), what);
  }
  return node;
}

absl::StatusOr<GraphNode> Driver::AddMemsetNode(const Graph& g, GraphNode after, DevicePtr dst,
                                                uint8_t value, uint64_t bytes,
                                                absl::string_view what) const {
  if (!has_graphs()) return NoGraphs(*this, *api_);
  CUcontext ctx = nullptr;
  GPUEXEC_CU(CtxGetCurrent, (&ctx), what);
  CUDA_MEMSET_NODE_PARAMS p;
  std::memset(&p, 0, sizeof(p));
  p.dst = static_cast<CUdeviceptr>(dst);
  p.value = value;
  p.elementSize = 1;
  p.width = bytes;
  p.height = 1;
  CUgraphNode node = nullptr;
  GPUEXEC_CU(GraphAddMemsetNode, (&node, g.get(), after ? &after : nullptr, after ? 1 : 0, &p, ctx),
             what);
  return node;
}

absl::StatusOr<GraphNode> Driver::AddCopyNode(const Graph& g, GraphNode after, DevicePtr dst,
                                              DevicePtr src, uint64_t bytes,
                                              absl::string_view what) const {
  if (!has_graphs()) return NoGraphs(*this, *api_);
  CUcontext ctx = nullptr;
  GPUEXEC_CU(CtxGetCurrent, (&ctx), what);
  CUDA_MEMCPY3D p;
  std::memset(&p, 0, sizeof(p));
  p.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  p.srcDevice = static_cast<CUdeviceptr>(src);
  p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  p.dstDevice = static_cast<CUdeviceptr>(dst);
  p.WidthInBytes = bytes;
  p.Height = 1;
  p.Depth = 1;
  CUgraphNode node = nullptr;
  GPUEXEC_CU(GraphAddMemcpyNode, (&node, g.get(), after ? &after : nullptr, after ? 1 : 0, &p, ctx),
             what);
  return node;
}

absl::StatusOr<GraphExec> Driver::Instantiate(const Graph& g, absl::string_view what) const {
  if (!has_graphs()) return NoGraphs(*this, *api_);
  CUgraphExec e = nullptr;
  GPUEXEC_CU(GraphInstantiateWithFlags, (&e, g.get(), 0), what);
  return GraphExec(this, e);
}

absl::Status Driver::Upload(const GraphExec& e, CUstream_st* stream, absl::string_view what) const {
  if (!has_graphs()) return NoGraphs(*this, *api_);
  GPUEXEC_CU(GraphUpload, (e.get(), stream), what);
  return absl::OkStatus();
}

absl::Status Driver::LaunchGraph(const GraphExec& e, CUstream_st* stream,
                                 absl::string_view what) const {
  if (!has_graphs()) return NoGraphs(*this, *api_);
  GPUEXEC_CU(GraphLaunch, (e.get(), stream), what);
  return absl::OkStatus();
}

absl::Status Driver::SetKernelNodeParams(const GraphExec& e, GraphNode node, Function f,
                                         const LaunchGeometry& geometry, void** params,
                                         absl::string_view what) const {
  if (!has_graphs()) return NoGraphs(*this, *api_);
  if (geometry.programmatic_dependent) return NoProgrammaticNode(what);
  const CUDA_KERNEL_NODE_PARAMS_v2 p = KernelParamsOf(f, geometry, params);
  GPUEXEC_CU(GraphExecKernelNodeSetParams, (e.get(), node, &p), what);
  return absl::OkStatus();
}

void ReleaseGraph(const Driver* d, CUgraph_st* g) {
  if (d->api().GraphDestroy != nullptr) d->api().GraphDestroy(g);
}

void ReleaseGraphExec(const Driver* d, CUgraphExec_st* e) {
  if (d->api().GraphExecDestroy != nullptr) d->api().GraphExecDestroy(e);
}

}  // namespace gpuexec::cuda
