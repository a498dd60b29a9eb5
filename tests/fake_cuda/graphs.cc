// Graphs. A graph is its nodes in the order added, each with the nodes of
// the same graph it depends on: a kernel node (its function, its shape with
// the attributes set on it, and a copy of its argument bytes taken when it
// is added, as the driver takes one), a memset node, or a 1-D copy between
// device memory. Instantiating copies the nodes, in dependency order, into
// an instantiated graph that lives on without the graph; a launch of it
// enqueues its nodes in that order on the stream's queue as the launches,
// memsets and copies of launch.cc and memory.cc (the same kernel models,
// checks when the work runs, faults and stream order). A kernel node's new
// parameters (cuGraphExecKernelNodeSetParams_v2) replace its copy in the
// instantiated graph only, for the launches after. cuGraphUpload checks its
// handles and does nothing else.
//
// Handles: a null one is CUDA_ERROR_INVALID_VALUE, one that is destroyed or
// was never made CUDA_ERROR_INVALID_HANDLE. The double models no library
// kernels (CUkernel), no host or array memory in copies, copies of more
// than one row, nor any instantiation flag.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tests/fake_cuda/fake_cuda_internal.h"

namespace gxfake::internal {
namespace {

// CUDA_ERROR_INVALID_CONTEXT unless `ctx` is a retained primary context.
CUresult CheckContext(CUctx_st* ctx) {
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  for (const auto& device : d.devices) {
    if (&device->context == ctx) {
      return ctx->retain_count > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    }
  }
  return CUDA_ERROR_INVALID_CONTEXT;
}

// a * b + c, or false where that overflows.
bool MulAdd(size_t a, size_t b, size_t c, size_t* out) {
  size_t product = 0;
  return !__builtin_mul_overflow(a, b, &product) && !__builtin_add_overflow(product, c, out);
}

// Fills a kernel node's function, context, grid, block, dynamic shared
// memory and argument copy from `p`, keeping the attributes already in
// `*work` (the cluster, cooperative grid and policy), and checks them as a
// launch of that shape.
CUresult KernelWork(const CUDA_KERNEL_NODE_PARAMS_v2* p, NodeWork* work) {
  if (p == nullptr || p->extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (p->func == nullptr) {
    return p->kern != nullptr ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
  }
  {
    Driver& d = GetDriver();
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.functions.count(p->func) == 0) return CUDA_ERROR_INVALID_HANDLE;
    work->context = p->func->module->context;
  }
  work->kind = NodeWork::Kind::kKernel;
  work->function = p->func;
  LaunchShape& shape = work->shape;
  shape.grid[0] = p->gridDimX;
  shape.grid[1] = p->gridDimY;
  shape.grid[2] = p->gridDimZ;
  shape.block[0] = p->blockDimX;
  shape.block[1] = p->blockDimY;
  shape.block[2] = p->blockDimZ;
  shape.shared_bytes = p->sharedMemBytes;
  GX_RETURN_IF_ERROR(CheckShape(work->function, work->context, shape, &work->kernel));
  // A kernel the double has no model of loads but cannot run.
  if (work->kernel == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return CopyArgs(*work->kernel, p->kernelParams, &work->args);
}

// Appends a node doing `work` to `graph`, after `dependencies` (nodes of
// that graph, each once).
CUresult AddNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* dependencies, size_t count,
                 NodeWork work) {
  if (out == nullptr || graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (count > 0 && dependencies == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.graphs.count(graph) == 0) return CUDA_ERROR_INVALID_HANDLE;
  auto node = std::make_unique<CUgraphNode_st>();
  for (size_t i = 0; i < count; ++i) {
    CUgraphNode_st* dependency = dependencies[i];
    auto it = d.graph_nodes.find(dependency);
    if (it == d.graph_nodes.end() || it->second != graph) return CUDA_ERROR_INVALID_VALUE;
    if (std::find(node->dependencies.begin(), node->dependencies.end(), dependency) !=
        node->dependencies.end()) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    node->dependencies.push_back(dependency);
  }
  node->graph = graph;
  node->work = std::move(work);
  *out = node.get();
  d.graph_nodes.emplace(node.get(), graph);
  graph->nodes.push_back(std::move(node));
  return CUDA_SUCCESS;
}

// `graph`'s nodes in an order where each comes after its dependencies (the
// order added among those free to go); CUDA_ERROR_INVALID_VALUE for a
// dependency outside the graph or a cycle. Driver::mu held.
CUresult DependencyOrder(const CUgraph_st& graph, std::vector<CUgraphNode_st*>* order) {
  std::unordered_map<const CUgraphNode_st*, size_t> index;
  for (size_t i = 0; i < graph.nodes.size(); ++i) index.emplace(graph.nodes[i].get(), i);
  std::vector<size_t> waiting(graph.nodes.size(), 0);
  std::vector<std::vector<size_t>> dependents(graph.nodes.size());
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    for (const CUgraphNode_st* dependency : graph.nodes[i]->dependencies) {
      auto it = index.find(dependency);
      if (it == index.end()) return CUDA_ERROR_INVALID_VALUE;
      dependents[it->second].push_back(i);
      ++waiting[i];
    }
  }
  std::deque<size_t> ready;
  for (size_t i = 0; i < waiting.size(); ++i) {
    if (waiting[i] == 0) ready.push_back(i);
  }
  order->clear();
  while (!ready.empty()) {
    const size_t i = ready.front();
    ready.pop_front();
    order->push_back(graph.nodes[i].get());
    for (size_t next : dependents[i]) {
      if (--waiting[next] == 0) ready.push_back(next);
    }
  }
  return order->size() == graph.nodes.size() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// Checks a kernel node as a launch of it on `sm_count` SMs: its function
// still loaded, its shape with its attributes.
CUresult CheckKernelNode(const NodeWork& w, unsigned sm_count) {
  const KernelDef* kernel = nullptr;
  GX_RETURN_IF_ERROR(CheckShape(w.function, w.context, w.shape, &kernel));
  return CheckCooperative(w.shape, sm_count);
}

// The stream operation of one node, run as the entry point of its kind
// runs its work.
StreamOp OpOf(NodeWork w, StreamSms sms) {
  switch (w.kind) {
    case NodeWork::Kind::kKernel:
      return KernelOp(w.kernel, w.context->device, w.shape, sms, std::move(w.args));
    case NodeWork::Kind::kMemset:
      return MemsetOp(w.memset, w.context->device);
    case NodeWork::Kind::kCopy:
      break;
  }
  return CopyOp(w.dst, w.src, w.bytes, w.context->device);
}

// One side of a copy node: its address, where its memory type is device
// memory.
CUresult CopySide(CUmemorytype type, CUdeviceptr base, size_t x, size_t y, size_t z, size_t pitch,
                  size_t height, size_t lod, CUdeviceptr* address) {
  if (type == CU_MEMORYTYPE_HOST || type == CU_MEMORYTYPE_ARRAY) return CUDA_ERROR_NOT_SUPPORTED;
  if (type != CU_MEMORYTYPE_DEVICE && type != CU_MEMORYTYPE_UNIFIED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (lod != 0) return CUDA_ERROR_INVALID_VALUE;  // levels of detail are an array's
  size_t row = 0;
  size_t offset = 0;
  if (!MulAdd(z, height, y, &row) || !MulAdd(row, pitch, x, &offset) ||
      __builtin_add_overflow(base, offset, address)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace gxfake::internal

using namespace gxfake::internal;  // NOLINT(build/namespaces): the entry points are global

// --- Graphs and their nodes ---

GX_EXPORT CUresult cuGraphCreate(CUgraph* phGraph, unsigned int flags) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (phGraph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  auto graph = std::make_unique<CUgraph_st>();
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  *phGraph = graph.get();
  d.graphs.emplace(graph.get(), std::move(graph));
  return CUDA_SUCCESS;
}

// The nodes go with the graph; graphs instantiated from it stay.
GX_EXPORT CUresult cuGraphDestroy(CUgraph hGraph) {
  GX_RETURN_IF_ERROR(InitStatus());
  if (hGraph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.graphs.find(hGraph);
  if (it == d.graphs.end()) return CUDA_ERROR_INVALID_HANDLE;
  for (const auto& node : it->second->nodes) d.graph_nodes.erase(node.get());
  d.graphs.erase(it);
  return StickyStatus();
}

// Takes a copy of the arguments now. A function the double has no model of
// is refused here (CUDA_ERROR_NOT_SUPPORTED), as its launch would be.
GX_EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode* phGraphNode, CUgraph hGraph,
                                           const CUgraphNode* dependencies, size_t numDependencies,
                                           const CUDA_KERNEL_NODE_PARAMS_v2* nodeParams) {
  GX_RETURN_IF_ERROR(EntryStatus());
  NodeWork work;
  GX_RETURN_IF_ERROR(KernelWork(nodeParams, &work));
  return AddNode(phGraphNode, hGraph, dependencies, numDependencies, std::move(work));
}

// Elements of 1, 2 or 4 bytes, aligned to their size, in one live
// allocation of the context's device.
GX_EXPORT CUresult cuGraphAddMemsetNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                        const CUgraphNode* dependencies, size_t numDependencies,
                                        const CUDA_MEMSET_NODE_PARAMS* memsetParams,
                                        CUcontext ctx) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (memsetParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GX_RETURN_IF_ERROR(CheckContext(ctx));
  const CUDA_MEMSET_NODE_PARAMS& p = *memsetParams;
  if (p.elementSize != 1 && p.elementSize != 2 && p.elementSize != 4) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  size_t row_bytes = 0;
  size_t span = 0;
  if (p.width == 0 || p.height == 0 || !MulAdd(p.width, p.elementSize, 0, &row_bytes) ||
      !MulAdd(p.height - 1, p.pitch, row_bytes, &span)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if ((p.height > 1 && p.pitch < row_bytes) || p.dst % p.elementSize != 0 ||
      !RangeIsLive(p.dst, span, ctx->device, false)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  NodeWork work;
  work.kind = NodeWork::Kind::kMemset;
  work.context = ctx;
  work.memset.dst = p.dst;
  work.memset.pitch = p.pitch;
  work.memset.value = p.value;
  work.memset.element_size = p.elementSize;
  work.memset.width = p.width;
  work.memset.height = p.height;
  return AddNode(phGraphNode, hGraph, dependencies, numDependencies, std::move(work));
}

// One row (Height and Depth 1) between device memory of the context's
// device, each side inside one live allocation.
GX_EXPORT CUresult cuGraphAddMemcpyNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                        const CUgraphNode* dependencies, size_t numDependencies,
                                        const CUDA_MEMCPY3D* copyParams, CUcontext ctx) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (copyParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GX_RETURN_IF_ERROR(CheckContext(ctx));
  const CUDA_MEMCPY3D& p = *copyParams;
  if (p.reserved0 != nullptr || p.reserved1 != nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (p.WidthInBytes == 0 || p.Height == 0 || p.Depth == 0) return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr src = 0;
  CUdeviceptr dst = 0;
  GX_RETURN_IF_ERROR(CopySide(p.srcMemoryType, p.srcDevice, p.srcXInBytes, p.srcY, p.srcZ,
                              p.srcPitch, p.srcHeight, p.srcLOD, &src));
  GX_RETURN_IF_ERROR(CopySide(p.dstMemoryType, p.dstDevice, p.dstXInBytes, p.dstY, p.dstZ,
                              p.dstPitch, p.dstHeight, p.dstLOD, &dst));
  if (p.Height != 1 || p.Depth != 1) return CUDA_ERROR_NOT_SUPPORTED;
  if (!RangeIsLive(src, p.WidthInBytes, ctx->device, false) ||
      !RangeIsLive(dst, p.WidthInBytes, ctx->device, false)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  NodeWork work;
  work.kind = NodeWork::Kind::kCopy;
  work.context = ctx;
  work.dst = dst;
  work.src = src;
  work.bytes = p.WidthInBytes;
  return AddNode(phGraphNode, hGraph, dependencies, numDependencies, std::move(work));
}

// The cluster dimension, the cooperative grid and the cluster scheduling
// policy are kept on the node and honoured as cuLaunchKernelEx honours
// them; programmatic stream serialization is refused (a graph's
// programmatic dependencies are its edges'); other attributes are accepted
// and ignored.
GX_EXPORT CUresult cuGraphKernelNodeSetAttribute(CUgraphNode hNode, CUkernelNodeAttrID attr,
                                                 const CUkernelNodeAttrValue* value) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (hNode == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.graph_nodes.count(hNode) == 0) return CUDA_ERROR_INVALID_HANDLE;
  NodeWork& w = hNode->work;
  if (w.kind != NodeWork::Kind::kKernel) return CUDA_ERROR_INVALID_VALUE;
  switch (attr) {
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
      if (value->clusterDim.x == 0 || value->clusterDim.y == 0 || value->clusterDim.z == 0) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      w.shape.cluster[0] = value->clusterDim.x;
      w.shape.cluster[1] = value->clusterDim.y;
      w.shape.cluster[2] = value->clusterDim.z;
      return CUDA_SUCCESS;
    case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
      w.shape.cooperative = value->cooperative != 0;
      return CUDA_SUCCESS;
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
      if (value->clusterSchedulingPolicyPreference > CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      w.cluster_policy = value->clusterSchedulingPolicyPreference;
      return CUDA_SUCCESS;
    case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
      return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

// --- Instantiated graphs ---

// Checks each kernel node as a launch of it on the whole device (its
// cluster against its grid and the function's limit, a cooperative grid
// against the occupancy) and copies the nodes.
GX_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph,
                                               unsigned long long flags) {  // NOLINT(runtime/int)
  GX_RETURN_IF_ERROR(EntryStatus());
  if (phGraphExec == nullptr || hGraph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  auto exec = std::make_unique<CUgraphExec_st>();
  Driver& d = GetDriver();
  {
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.graphs.find(hGraph);
    if (it == d.graphs.end()) return CUDA_ERROR_INVALID_HANDLE;
    std::vector<CUgraphNode_st*> order;
    GX_RETURN_IF_ERROR(DependencyOrder(*it->second, &order));
    for (CUgraphNode_st* node : order) {
      exec->index.emplace(node, exec->work.size());
      exec->work.push_back(node->work);
    }
  }
  for (const NodeWork& w : exec->work) {
    if (w.kind == NodeWork::Kind::kKernel) {
      GX_RETURN_IF_ERROR(CheckKernelNode(w, kFakeMultiprocessors));
    }
  }
  std::lock_guard<std::mutex> lock(d.mu);
  *phGraphExec = exec.get();
  d.graph_execs.emplace(exec.get(), std::move(exec));
  return CUDA_SUCCESS;
}

// Launches already enqueued keep the work they were given.
GX_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
  GX_RETURN_IF_ERROR(InitStatus());
  if (hGraphExec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.graph_execs.erase(hGraphExec) == 0) return CUDA_ERROR_INVALID_HANDLE;
  return StickyStatus();
}

// Checks the handles; the double has nothing to make resident.
GX_EXPORT CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  if (hGraphExec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<CUstream_st> stream;
  GX_RETURN_IF_ERROR(ResolveStream(hStream, ctx, &stream));
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  return d.graph_execs.count(hGraphExec) != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

// Each node is checked first as a launch on the stream's SMs (a kernel
// node's function must still be loaded), so that a refused launch enqueues
// nothing; then the nodes go on the stream's queue in dependency order.
GX_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  GX_RETURN_IF_ERROR(EntryStatus());
  CUctx_st* ctx = nullptr;
  GX_RETURN_IF_ERROR(CurrentContext(&ctx));
  if (hGraphExec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<CUstream_st> stream;
  GX_RETURN_IF_ERROR(ResolveStream(hStream, ctx, &stream));
  std::vector<NodeWork> work;
  {
    Driver& d = GetDriver();
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.graph_execs.find(hGraphExec);
    if (it == d.graph_execs.end()) return CUDA_ERROR_INVALID_HANDLE;
    work = it->second->work;
  }
  const StreamSms sms = SmsOf(stream.get());
  for (const NodeWork& w : work) {
    if (w.kind == NodeWork::Kind::kKernel) GX_RETURN_IF_ERROR(CheckKernelNode(w, sms.count));
  }
  for (NodeWork& w : work) GX_RETURN_IF_ERROR(Enqueue(stream, OpOf(std::move(w), sms)));
  return CUDA_SUCCESS;
}

// The node's function must stay the same; its grid, block, dynamic shared
// memory and arguments are taken anew (the arguments copied now), its
// attributes kept.
GX_EXPORT CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                     const CUDA_KERNEL_NODE_PARAMS_v2* nodeParams) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (hGraphExec == nullptr || hNode == nullptr || nodeParams == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Driver& d = GetDriver();
  NodeWork work;
  size_t index = 0;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.graph_execs.find(hGraphExec);
    if (it == d.graph_execs.end()) return CUDA_ERROR_INVALID_HANDLE;
    auto node = it->second->index.find(hNode);
    if (node == it->second->index.end()) return CUDA_ERROR_INVALID_VALUE;
    index = node->second;
    work = it->second->work[index];
  }
  if (work.kind != NodeWork::Kind::kKernel || nodeParams->func != work.function) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  GX_RETURN_IF_ERROR(KernelWork(nodeParams, &work));
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.graph_execs.find(hGraphExec);
  if (it == d.graph_execs.end()) return CUDA_ERROR_INVALID_HANDLE;
  it->second->work[index] = std::move(work);
  return CUDA_SUCCESS;
}

// --- Test-only exports ---

// Live graphs and instantiated graphs in this process.
GX_EXPORT uint64_t gxfake_graphs(void) {
  Driver& d = GetDriver();
  std::lock_guard<std::mutex> lock(d.mu);
  return d.graphs.size() + d.graph_execs.size();
}

// --- Signatures ---

GX_CHECK_SIGNATURE(cuGraphCreate, cuGraphCreate);
GX_CHECK_SIGNATURE(cuGraphDestroy, cuGraphDestroy);
GX_CHECK_SIGNATURE(cuGraphAddKernelNode_v2, cuGraphAddKernelNode);
GX_CHECK_SIGNATURE(cuGraphAddMemsetNode, cuGraphAddMemsetNode);
GX_CHECK_SIGNATURE(cuGraphAddMemcpyNode, cuGraphAddMemcpyNode);
GX_CHECK_SIGNATURE(cuGraphKernelNodeSetAttribute, cuGraphKernelNodeSetAttribute);
GX_CHECK_SIGNATURE(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags);
GX_CHECK_SIGNATURE(cuGraphExecDestroy, cuGraphExecDestroy);
GX_CHECK_SIGNATURE(cuGraphUpload, cuGraphUpload);
GX_CHECK_SIGNATURE(cuGraphLaunch, cuGraphLaunch);
GX_CHECK_SIGNATURE(cuGraphExecKernelNodeSetParams_v2, cuGraphExecKernelNodeSetParams);
