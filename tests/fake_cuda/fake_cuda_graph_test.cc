// The libcuda test double's graphs: nodes, instantiation, replays,
// patches, kernel node attributes and the refusals of each entry.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tests/fake_cuda/fake_cuda_test_fixture.h"

namespace gxfake::testing {
namespace {

// ---------------------------------------------------------------------------
// Graphs: nodes, instantiation, replays and patches.
// ---------------------------------------------------------------------------

uint32_t Bits(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  return u;
}

// The same pipeline as a graph and as direct work, on two sets of buffers:
// a memset, a fill, a saxpy that accumulates into y, and a copy of y.
TEST_F(FakeCudaContextTest, GraphReplaysAsTheSameWorkLaunchedDirectly) {
  const CUfunction fill = LoadKernel("gx_fill_u32");
  const CUfunction saxpy = LoadKernel("gx_saxpy");
  constexpr uint64_t kN = 256;
  struct Buffers {
    CUdeviceptr x, y, z;
  };
  const Buffers g{Alloc(kN * 4), Alloc(kN * 4), Alloc(kN * 4)};
  const Buffers d{Alloc(kN * 4), Alloc(kN * 4), Alloc(kN * 4)};
  for (const Buffers& b : {g, d}) ASSERT_CU(cu_.cuMemsetD8Async(b.y, 0, kN * 4, stream_));
  uint32_t x_bits = Bits(1.5f);
  float a = 2.0f;
  uint64_t n = kN;
  void* g_fill[] = {const_cast<CUdeviceptr*>(&g.x), &x_bits, &n};
  void* g_saxpy[] = {&a, const_cast<CUdeviceptr*>(&g.x), const_cast<CUdeviceptr*>(&g.y), &n};

  CUgraph graph = nullptr;
  ASSERT_CU(cu_.cuGraphCreate(&graph, 0));
  CUgraphNode memset = nullptr, fill_node = nullptr, saxpy_node = nullptr, copy = nullptr;
  const CUDA_MEMSET_NODE_PARAMS reset = MemsetNode(g.y, 0, 16);  // y[0..3] start again
  ASSERT_CU(cu_.cuGraphAddMemsetNode(&memset, graph, nullptr, 0, &reset, ctx_));
  const CUDA_KERNEL_NODE_PARAMS_v2 fill_params = KernelNode(fill, 1, 256, g_fill);
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&fill_node, graph, &memset, 1, &fill_params));
  const CUDA_KERNEL_NODE_PARAMS_v2 saxpy_params = KernelNode(saxpy, 1, 256, g_saxpy);
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&saxpy_node, graph, &fill_node, 1, &saxpy_params));
  const CUDA_MEMCPY3D copy_params = CopyNode(g.z, g.y, kN * 4);
  ASSERT_CU(cu_.cuGraphAddMemcpyNode(&copy, graph, &saxpy_node, 1, &copy_params, ctx_));
  // The arguments were copied when the nodes were added.
  a = -100.0f;
  x_bits = 0;
  CUgraphExec exec = nullptr;
  ASSERT_CU(cu_.cuGraphInstantiateWithFlags(&exec, graph, 0));
  ASSERT_CU(cu_.cuGraphUpload(exec, stream_));
  // The instantiated graph lives on without its graph.
  EXPECT_EQ(cu_.gxfake_graphs(), 2u);
  ASSERT_CU(cu_.cuGraphDestroy(graph));
  EXPECT_EQ(cu_.gxfake_graphs(), 1u);
  a = 2.0f;
  x_bits = Bits(1.5f);

  void* d_fill[] = {const_cast<CUdeviceptr*>(&d.x), &x_bits, &n};
  void* d_saxpy[] = {&a, const_cast<CUdeviceptr*>(&d.x), const_cast<CUdeviceptr*>(&d.y), &n};
  for (int replay = 1; replay <= 3; ++replay) {
    ASSERT_CU(cu_.cuGraphLaunch(exec, stream_));
    ASSERT_CU(cu_.cuMemsetD8Async(d.y, 0, 16, stream_));
    ASSERT_CU(cu_.cuLaunchKernel(fill, 1, 1, 1, 256, 1, 1, 0, stream_, d_fill, nullptr));
    ASSERT_CU(cu_.cuLaunchKernel(saxpy, 1, 1, 1, 256, 1, 1, 0, stream_, d_saxpy, nullptr));
    ASSERT_CU(cu_.cuMemcpyDtoDAsync_v2(d.z, d.y, kN * 4, stream_));
    const std::vector<float> y = Download<float>(g.y, kN);
    EXPECT_EQ(y, Download<float>(d.y, kN)) << "replay " << replay;
    EXPECT_EQ(Download<float>(g.z, kN), y) << "replay " << replay;
    EXPECT_EQ(Download<float>(g.x, kN), std::vector<float>(kN, 1.5f));
    EXPECT_EQ(y[0], 3.0f);
    EXPECT_EQ(y[kN - 1], 3.0f * replay);
  }
  EXPECT_CU(cu_.cuGraphExecDestroy(exec));
  EXPECT_EQ(cu_.gxfake_graphs(), 0u);
}

// A memset node of 4-byte elements, and a kernel node of a green context's
// stream runs on its SMs.
TEST_F(FakeCudaContextTest, GraphNodesRunAsTheirKindsRun) {
  const CUfunction sm_ids = LoadKernel("gx_sm_ids");
  constexpr unsigned kBlocks = 264;
  CUdeviceptr ids = Alloc(kBlocks * 4);
  CUdeviceptr words = Alloc(64);
  uint64_t ns = 0;
  void* params[] = {&ids, &ns};
  CUgraph graph = nullptr;
  ASSERT_CU(cu_.cuGraphCreate(&graph, 0));
  CUgraphNode kernel = nullptr, memset = nullptr;
  const CUDA_KERNEL_NODE_PARAMS_v2 p = KernelNode(sm_ids, kBlocks, 32, params);
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&kernel, graph, nullptr, 0, &p));
  CUDA_MEMSET_NODE_PARAMS words_params = MemsetNode(words + 8, 0, 4);
  words_params.elementSize = 4;
  words_params.value = 0x01020304;
  ASSERT_CU(cu_.cuGraphAddMemsetNode(&memset, graph, &kernel, 1, &words_params, ctx_));
  CUgraphExec exec = nullptr;
  ASSERT_CU(cu_.cuGraphInstantiateWithFlags(&exec, graph, 0));

  CUdevResource device = DeviceSms(cu_);
  CUdevResource part{}, rest{};
  unsigned int groups = 1;
  ASSERT_CU(cu_.cuDevSmResourceSplitByCount(&part, &groups, &device, &rest, 0, 16));
  const CUgreenCtx green = MakeGreen(cu_, &part);
  CUstream gs = nullptr;
  ASSERT_CU(cu_.cuGreenCtxStreamCreate(&gs, green, CU_STREAM_NON_BLOCKING, 0));
  ASSERT_CU(cu_.cuMemsetD8Async(words, 0xFF, 64, stream_));
  ASSERT_CU(cu_.cuStreamSynchronize(stream_));
  ASSERT_CU(cu_.cuGraphLaunch(exec, gs));
  ASSERT_CU(cu_.cuStreamSynchronize(gs));
  const std::vector<uint32_t> got = Download<uint32_t>(ids, kBlocks);
  const std::set<uint32_t> sms(got.begin(), got.end());
  EXPECT_EQ(sms.size(), 16u);
  EXPECT_EQ(*sms.rbegin(), 15u);
  std::vector<uint32_t> want(16, 0xFFFFFFFFu);
  for (int i = 2; i < 6; ++i) want[i] = 0x01020304;
  EXPECT_EQ(Download<uint32_t>(words, 16), want);
  ASSERT_CU(cu_.cuGraphLaunch(exec, stream_));
  const std::vector<uint32_t> on_device = Download<uint32_t>(ids, kBlocks);
  EXPECT_EQ(std::set<uint32_t>(on_device.begin(), on_device.end()).size(), 132u);

  EXPECT_CU(cu_.cuStreamDestroy_v2(gs));
  EXPECT_CU(cu_.cuGreenCtxDestroy(green));
  EXPECT_CU(cu_.cuGraphExecDestroy(exec));
  EXPECT_CU(cu_.cuGraphDestroy(graph));
}

// A patch replaces the node's arguments in the instantiated graph for the
// replays after it: not a replay already enqueued, not the graph.
TEST_F(FakeCudaContextTest, GraphPatchChangesTheNextReplaysOnly) {
  const CUfunction fill = LoadKernel("gx_fill_u32");
  const CUfunction spin = LoadKernel("gx_spin");
  constexpr uint64_t kN = 64;
  CUdeviceptr out = Alloc(kN * 4);
  CUdeviceptr other = Alloc(kN * 4);
  uint64_t ns = 100'000'000;
  uint32_t value = 1;
  uint64_t n = kN;
  void* spin_params[] = {&ns};
  void* fill_params[] = {&out, &value, &n};
  CUgraph graph = nullptr;
  ASSERT_CU(cu_.cuGraphCreate(&graph, 0));
  CUgraphNode spin_node = nullptr, fill_node = nullptr, memset = nullptr;
  const CUDA_KERNEL_NODE_PARAMS_v2 spin_p = KernelNode(spin, 1, 1, spin_params);
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&spin_node, graph, nullptr, 0, &spin_p));
  const CUDA_KERNEL_NODE_PARAMS_v2 fill_p = KernelNode(fill, 1, 64, fill_params);
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&fill_node, graph, &spin_node, 1, &fill_p));
  const CUDA_MEMSET_NODE_PARAMS memset_p = MemsetNode(other, 0, 4);
  ASSERT_CU(cu_.cuGraphAddMemsetNode(&memset, graph, &fill_node, 1, &memset_p, ctx_));
  CUgraphExec exec = nullptr;
  ASSERT_CU(cu_.cuGraphInstantiateWithFlags(&exec, graph, 0));

  std::vector<uint32_t> first(kN), second(kN), third(kN);
  ASSERT_CU(cu_.cuGraphLaunch(exec, stream_));  // still spinning when patched
  ASSERT_CU(cu_.cuMemcpyDtoHAsync_v2(first.data(), out, kN * 4, stream_));
  value = 2;
  const CUDA_KERNEL_NODE_PARAMS_v2 patch = KernelNode(fill, 1, 64, fill_params);
  ASSERT_CU(cu_.cuGraphExecKernelNodeSetParams_v2(exec, fill_node, &patch));
  value = 3;  // copied by the patch
  ASSERT_CU(cu_.cuGraphLaunch(exec, stream_));
  ASSERT_CU(cu_.cuMemcpyDtoHAsync_v2(second.data(), out, kN * 4, stream_));
  ASSERT_CU(cu_.cuGraphLaunch(exec, stream_));  // the patch lasts
  ASSERT_CU(cu_.cuMemcpyDtoHAsync_v2(third.data(), out, kN * 4, stream_));
  ASSERT_CU(cu_.cuStreamSynchronize(stream_));
  EXPECT_EQ(first, std::vector<uint32_t>(kN, 1));
  EXPECT_EQ(second, std::vector<uint32_t>(kN, 2));
  EXPECT_EQ(third, std::vector<uint32_t>(kN, 2));
  // The graph keeps the arguments it was built with.
  CUgraphExec again = nullptr;
  ASSERT_CU(cu_.cuGraphInstantiateWithFlags(&again, graph, 0));
  ASSERT_CU(cu_.cuGraphLaunch(again, stream_));
  EXPECT_EQ(Download<uint32_t>(out, kN), std::vector<uint32_t>(kN, 1));

  // Refused: another function, a node that is not a kernel node, a node of
  // no instantiated graph, a geometry the function cannot launch with.
  const CUDA_KERNEL_NODE_PARAMS_v2 other_function = KernelNode(spin, 1, 64, spin_params);
  EXPECT_EQ(cu_.cuGraphExecKernelNodeSetParams_v2(exec, fill_node, &other_function),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphExecKernelNodeSetParams_v2(exec, memset, &patch), CUDA_ERROR_INVALID_VALUE);
  CUgraph lone = nullptr;
  CUgraphNode stranger = nullptr;
  ASSERT_CU(cu_.cuGraphCreate(&lone, 0));
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&stranger, lone, nullptr, 0, &fill_p));
  EXPECT_EQ(cu_.cuGraphExecKernelNodeSetParams_v2(exec, stranger, &patch),
            CUDA_ERROR_INVALID_VALUE);
  CUDA_KERNEL_NODE_PARAMS_v2 too_wide = patch;
  too_wide.blockDimX = 2048;
  EXPECT_EQ(cu_.cuGraphExecKernelNodeSetParams_v2(exec, fill_node, &too_wide),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphExecKernelNodeSetParams_v2(nullptr, fill_node, &patch),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphExecKernelNodeSetParams_v2(exec, fill_node, nullptr),
            CUDA_ERROR_INVALID_VALUE);
  // A refused patch leaves the node as it was.
  ASSERT_CU(cu_.cuGraphLaunch(exec, stream_));
  EXPECT_EQ(Download<uint32_t>(out, kN), std::vector<uint32_t>(kN, 2));

  EXPECT_CU(cu_.cuGraphExecDestroy(again));
  EXPECT_CU(cu_.cuGraphExecDestroy(exec));
  EXPECT_EQ(cu_.cuGraphExecKernelNodeSetParams_v2(exec, fill_node, &patch),
            CUDA_ERROR_INVALID_HANDLE);
  EXPECT_CU(cu_.cuGraphDestroy(lone));
  EXPECT_CU(cu_.cuGraphDestroy(graph));
}

// Kernel node attributes, honoured and checked as cuLaunchKernelEx's.
TEST_F(FakeCudaContextTest, GraphKernelNodeAttributes) {
  const CUfunction rank = LoadKernel("gx_cluster_rank");
  const CUfunction coop = LoadKernel("gx_coop_count");
  CUdeviceptr out = Alloc(16 * 4);
  void* params[] = {&out};
  CUgraph graph = nullptr;
  ASSERT_CU(cu_.cuGraphCreate(&graph, 0));
  CUDA_KERNEL_NODE_PARAMS_v2 p = KernelNode(rank, 4, 32, params);
  p.gridDimY = 2;
  CUgraphNode node = nullptr;
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&node, graph, nullptr, 0, &p));
  CUkernelNodeAttrValue value{};
  value.clusterDim.x = 2;
  value.clusterDim.y = 2;
  value.clusterDim.z = 1;
  ASSERT_CU(cu_.cuGraphKernelNodeSetAttribute(node, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &value));
  CUkernelNodeAttrValue policy{};
  policy.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING;
  ASSERT_CU(cu_.cuGraphKernelNodeSetAttribute(
      node, CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE, &policy));
  CUgraphExec exec = nullptr;
  ASSERT_CU(cu_.cuGraphInstantiateWithFlags(&exec, graph, 0));
  ASSERT_CU(cu_.cuGraphLaunch(exec, stream_));
  const std::vector<uint32_t> ranks = Download<uint32_t>(out, 8);
  for (uint32_t y = 0; y < 2; ++y) {
    for (uint32_t x = 0; x < 4; ++x) {
      EXPECT_EQ(ranks[x + 4 * y], (x % 2) + 2 * (y % 2)) << x << "," << y;
    }
  }
  EXPECT_CU(cu_.cuGraphExecDestroy(exec));

  // Checked when set: a zero dimension, a policy out of range, programmatic
  // stream serialization (a graph's are its edges), a node of another kind.
  CUkernelNodeAttrValue bad = value;
  bad.clusterDim.z = 0;
  EXPECT_EQ(cu_.cuGraphKernelNodeSetAttribute(node, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &bad),
            CUDA_ERROR_INVALID_VALUE);
  CUkernelNodeAttrValue bad_policy{};
  bad_policy.clusterSchedulingPolicyPreference = static_cast<CUclusterSchedulingPolicy>(3);
  EXPECT_EQ(cu_.cuGraphKernelNodeSetAttribute(
                node, CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE, &bad_policy),
            CUDA_ERROR_INVALID_VALUE);
  CUkernelNodeAttrValue serialize{};
  serialize.programmaticStreamSerializationAllowed = 1;
  EXPECT_EQ(cu_.cuGraphKernelNodeSetAttribute(
                node, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, &serialize),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphKernelNodeSetAttribute(node, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, nullptr),
            CUDA_ERROR_INVALID_VALUE);
  CUgraphNode memset = nullptr;
  const CUDA_MEMSET_NODE_PARAMS m = MemsetNode(out, 0, 4);
  ASSERT_CU(cu_.cuGraphAddMemsetNode(&memset, graph, &node, 1, &m, ctx_));
  EXPECT_EQ(
      cu_.cuGraphKernelNodeSetAttribute(memset, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &value),
      CUDA_ERROR_INVALID_VALUE);

  // Checked when instantiated, as a launch: a cluster over the portable
  // limit, one that does not divide the grid.
  value.clusterDim.x = 4;
  value.clusterDim.y = 4;
  ASSERT_CU(cu_.cuGraphKernelNodeSetAttribute(node, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &value));
  EXPECT_EQ(cu_.cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_ERROR_INVALID_CLUSTER_SIZE);
  value.clusterDim.x = 3;
  value.clusterDim.y = 1;
  ASSERT_CU(cu_.cuGraphKernelNodeSetAttribute(node, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &value));
  EXPECT_EQ(cu_.cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_CU(cu_.cuGraphDestroy(graph));

  // A cooperative node: its grid against the double's occupancy (32 blocks
  // of 32 threads on each of 132 SMs).
  CUdeviceptr counter = Alloc(8);
  ASSERT_CU(cu_.cuMemsetD8Async(counter, 0, 8, stream_));
  CUdeviceptr blocks = counter + 4;
  void* coop_params[] = {&counter, &blocks};
  ASSERT_CU(cu_.cuGraphCreate(&graph, 0));
  const CUDA_KERNEL_NODE_PARAMS_v2 fits = KernelNode(coop, 4224, 32, coop_params);
  const CUDA_KERNEL_NODE_PARAMS_v2 too_many = KernelNode(coop, 4225, 32, coop_params);
  CUgraphNode a = nullptr, b = nullptr;
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&a, graph, nullptr, 0, &fits));
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&b, graph, &a, 1, &too_many));
  CUkernelNodeAttrValue cooperative{};
  cooperative.cooperative = 1;
  ASSERT_CU(cu_.cuGraphKernelNodeSetAttribute(a, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &cooperative));
  ASSERT_CU(cu_.cuGraphKernelNodeSetAttribute(b, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &cooperative));
  EXPECT_EQ(cu_.cuGraphInstantiateWithFlags(&exec, graph, 0),
            CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
  cooperative.cooperative = 0;
  ASSERT_CU(cu_.cuGraphKernelNodeSetAttribute(b, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &cooperative));
  ASSERT_CU(cu_.cuGraphInstantiateWithFlags(&exec, graph, 0));
  ASSERT_CU(cu_.cuGraphLaunch(exec, stream_));
  EXPECT_EQ(Download<uint32_t>(counter, 2), (std::vector<uint32_t>{4224 + 4225, 4225}));
  EXPECT_CU(cu_.cuGraphExecDestroy(exec));
  EXPECT_CU(cu_.cuGraphDestroy(graph));
}

// The entry checks, and the codes of the refusals.
TEST_F(FakeCudaContextTest, GraphRefusals) {
  const CUfunction fill = LoadKernel("gx_fill_u32");
  CUdeviceptr buf = Alloc(64);
  CUdeviceptr other_buf = Alloc(64);
  uint32_t value = 5;
  uint64_t n = 16;
  void* params[] = {&buf, &value, &n};
  CUgraph graph = nullptr;
  EXPECT_EQ(cu_.cuGraphCreate(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphCreate(&graph, 1), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cu_.cuGraphCreate(&graph, 0));
  CUgraph other = nullptr;
  ASSERT_CU(cu_.cuGraphCreate(&other, 0));
  CUgraphNode node = nullptr, first = nullptr, theirs = nullptr;
  const CUDA_MEMSET_NODE_PARAMS m = MemsetNode(buf, 1, 64);
  ASSERT_CU(cu_.cuGraphAddMemsetNode(&first, graph, nullptr, 0, &m, ctx_));
  ASSERT_CU(cu_.cuGraphAddMemsetNode(&theirs, other, nullptr, 0, &m, ctx_));

  // The graph and the dependencies.
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(nullptr, graph, nullptr, 0, &m, ctx_),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, nullptr, nullptr, 0, &m, ctx_),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, graph, &theirs, 1, &m, ctx_),
            CUDA_ERROR_INVALID_VALUE);  // a node of another graph
  const CUgraphNode twice[] = {first, first};
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, graph, twice, 2, &m, ctx_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, graph, nullptr, 1, &m, ctx_), CUDA_ERROR_INVALID_VALUE);
  const CUgraphNode none[] = {nullptr};
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, graph, none, 1, &m, ctx_), CUDA_ERROR_INVALID_VALUE);

  // Memset nodes.
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, graph, &first, 1, nullptr, ctx_),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, graph, &first, 1, &m, nullptr),
            CUDA_ERROR_INVALID_CONTEXT);
  CUctx_st* const not_a_context = reinterpret_cast<CUctx_st*>(&value);
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, graph, &first, 1, &m, not_a_context),
            CUDA_ERROR_INVALID_CONTEXT);
  CUcontext released = nullptr;  // device 1's, never retained here
  ASSERT_CU(cu_.cuDevicePrimaryCtxRetain(&released, 1));
  ASSERT_CU(cu_.cuDevicePrimaryCtxRelease_v2(1));
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, graph, &first, 1, &m, released),
            CUDA_ERROR_INVALID_CONTEXT);
  for (const auto& change : std::vector<std::function<void(CUDA_MEMSET_NODE_PARAMS&)>>{
           [](CUDA_MEMSET_NODE_PARAMS& p) { p.elementSize = 3; },
           [](CUDA_MEMSET_NODE_PARAMS& p) { p.width = 0; },
           [](CUDA_MEMSET_NODE_PARAMS& p) { p.height = 0; },
           [](CUDA_MEMSET_NODE_PARAMS& p) { p.width = 65; },  // past the allocation
           [](CUDA_MEMSET_NODE_PARAMS& p) { p.dst = 0x1000; },
           [](CUDA_MEMSET_NODE_PARAMS& p) { p.dst += 2, p.elementSize = 4, p.width = 2; },
           [](CUDA_MEMSET_NODE_PARAMS& p) { p.width = 8, p.height = 2, p.pitch = 4; },
       }) {
    CUDA_MEMSET_NODE_PARAMS bad = m;
    change(bad);
    EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, graph, &first, 1, &bad, ctx_),
              CUDA_ERROR_INVALID_VALUE);
  }

  // Copy nodes: device memory, one row, inside allocations.
  const CUDA_MEMCPY3D c = CopyNode(other_buf, buf, 64);
  EXPECT_EQ(cu_.cuGraphAddMemcpyNode(&node, graph, &first, 1, nullptr, ctx_),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphAddMemcpyNode(&node, graph, &first, 1, &c, nullptr),
            CUDA_ERROR_INVALID_CONTEXT);
  for (const auto& change : std::vector<std::function<void(CUDA_MEMCPY3D&)>>{
           [](CUDA_MEMCPY3D& p) { p.WidthInBytes = 0; },
           [](CUDA_MEMCPY3D& p) { p.WidthInBytes = 65; },
           [](CUDA_MEMCPY3D& p) { p.srcXInBytes = 1; },
           [](CUDA_MEMCPY3D& p) { p.srcDevice = 0x1000; },
           [](CUDA_MEMCPY3D& p) { p.dstMemoryType = static_cast<CUmemorytype>(0); },
           [](CUDA_MEMCPY3D& p) { p.reserved0 = &p; },
           [](CUDA_MEMCPY3D& p) { p.dstLOD = 1; },
       }) {
    CUDA_MEMCPY3D bad = c;
    change(bad);
    EXPECT_EQ(cu_.cuGraphAddMemcpyNode(&node, graph, &first, 1, &bad, ctx_),
              CUDA_ERROR_INVALID_VALUE);
  }
  for (const auto& change : std::vector<std::function<void(CUDA_MEMCPY3D&)>>{
           [](CUDA_MEMCPY3D& p) { p.srcMemoryType = CU_MEMORYTYPE_HOST; },
           [](CUDA_MEMCPY3D& p) { p.dstMemoryType = CU_MEMORYTYPE_ARRAY; },
           [](CUDA_MEMCPY3D& p) { p.WidthInBytes = 16, p.Height = 2, p.srcPitch = 16; },
       }) {
    CUDA_MEMCPY3D unmodelled = c;
    change(unmodelled);
    EXPECT_EQ(cu_.cuGraphAddMemcpyNode(&node, graph, &first, 1, &unmodelled, ctx_),
              CUDA_ERROR_NOT_SUPPORTED);
  }

  // Kernel nodes: as a launch of them.
  const CUDA_KERNEL_NODE_PARAMS_v2 k = KernelNode(fill, 1, 32, params);
  EXPECT_EQ(cu_.cuGraphAddKernelNode_v2(&node, graph, &first, 1, nullptr),
            CUDA_ERROR_INVALID_VALUE);
  CUDA_KERNEL_NODE_PARAMS_v2 bad = k;
  bad.gridDimX = 0;
  EXPECT_EQ(cu_.cuGraphAddKernelNode_v2(&node, graph, &first, 1, &bad), CUDA_ERROR_INVALID_VALUE);
  bad = k;
  bad.kernelParams = nullptr;
  EXPECT_EQ(cu_.cuGraphAddKernelNode_v2(&node, graph, &first, 1, &bad), CUDA_ERROR_INVALID_VALUE);
  void* extra[] = {CU_LAUNCH_PARAM_END};
  bad = k;
  bad.extra = extra;
  EXPECT_EQ(cu_.cuGraphAddKernelNode_v2(&node, graph, &first, 1, &bad), CUDA_ERROR_INVALID_VALUE);
  bad = k;
  bad.func = nullptr;
  EXPECT_EQ(cu_.cuGraphAddKernelNode_v2(&node, graph, &first, 1, &bad), CUDA_ERROR_INVALID_VALUE);
  bad.kern = reinterpret_cast<CUkernel>(&value);  // library kernels: not modelled
  EXPECT_EQ(cu_.cuGraphAddKernelNode_v2(&node, graph, &first, 1, &bad), CUDA_ERROR_NOT_SUPPORTED);
  bad = k;
  bad.func = reinterpret_cast<CUfunction>(&value);
  EXPECT_EQ(cu_.cuGraphAddKernelNode_v2(&node, graph, &first, 1, &bad), CUDA_ERROR_INVALID_HANDLE);
  CUgraphNode kernel = nullptr;
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&kernel, graph, &first, 1, &k));

  // Instantiation and launches.
  CUgraphExec exec = nullptr;
  EXPECT_EQ(cu_.cuGraphInstantiateWithFlags(nullptr, graph, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphInstantiateWithFlags(&exec, nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphInstantiateWithFlags(&exec, graph, 1), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cu_.cuGraphInstantiateWithFlags(&exec, graph, 0));
  EXPECT_EQ(cu_.cuGraphLaunch(nullptr, stream_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphUpload(nullptr, stream_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphLaunch(exec, reinterpret_cast<CUstream>(&value)), CUDA_ERROR_INVALID_HANDLE);
  std::thread([&] {  // no current context
    EXPECT_EQ(cu_.cuGraphLaunch(exec, stream_), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cu_.cuGraphUpload(exec, stream_), CUDA_ERROR_INVALID_CONTEXT);
  })
      .join();
  ASSERT_CU(cu_.cuGraphLaunch(exec, nullptr));  // the NULL stream runs it at once
  EXPECT_EQ(Download<uint32_t>(buf, 16), std::vector<uint32_t>(16, 5));

  // Destroyed handles.
  ASSERT_CU(cu_.cuGraphDestroy(other));
  EXPECT_EQ(cu_.cuGraphDestroy(other), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu_.cuGraphDestroy(nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu_.cuGraphAddMemsetNode(&node, other, nullptr, 0, &m, ctx_),
            CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu_.cuGraphInstantiateWithFlags(&exec, other, 0), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu_.cuGraphKernelNodeSetAttribute(theirs, CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
                                              reinterpret_cast<CUkernelNodeAttrValue*>(&n)),
            CUDA_ERROR_INVALID_HANDLE);
  ASSERT_CU(cu_.cuGraphExecDestroy(exec));
  EXPECT_EQ(cu_.cuGraphExecDestroy(exec), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu_.cuGraphLaunch(exec, stream_), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu_.cuGraphUpload(exec, stream_), CUDA_ERROR_INVALID_HANDLE);

  // A kernel node whose module is gone cannot be instantiated or launched.
  ASSERT_CU(cu_.cuGraphInstantiateWithFlags(&exec, graph, 0));
  CUmodule mod = nullptr;
  ASSERT_CU(cu_.cuModuleLoadDataEx(&mod, "GXFAKE1\ngx_fill_u32\n", 0, nullptr, nullptr));
  CUfunction own_fill = nullptr;
  ASSERT_CU(cu_.cuModuleGetFunction(&own_fill, mod, "gx_fill_u32"));
  CUgraph doomed = nullptr;
  CUgraphExec doomed_exec = nullptr;
  ASSERT_CU(cu_.cuGraphCreate(&doomed, 0));
  const CUDA_KERNEL_NODE_PARAMS_v2 own = KernelNode(own_fill, 1, 32, params);
  ASSERT_CU(cu_.cuGraphAddKernelNode_v2(&node, doomed, nullptr, 0, &own));
  ASSERT_CU(cu_.cuGraphInstantiateWithFlags(&doomed_exec, doomed, 0));
  ASSERT_CU(cu_.cuModuleUnload(mod));
  EXPECT_EQ(cu_.cuGraphInstantiateWithFlags(&exec, doomed, 0), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu_.cuGraphLaunch(doomed_exec, stream_), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_CU(cu_.cuGraphExecDestroy(doomed_exec));
  EXPECT_CU(cu_.cuGraphDestroy(doomed));
  EXPECT_CU(cu_.cuGraphExecDestroy(exec));
  EXPECT_CU(cu_.cuGraphDestroy(graph));
  EXPECT_EQ(cu_.gxfake_graphs(), 0u);
}

}  // namespace
}  // namespace gxfake::testing
