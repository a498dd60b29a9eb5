// The cuda layer against the libcuda test double, loaded through the same
// dlopen path as the real driver.
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/cuda/driver.h"

namespace gpuexec::cuda {
namespace {

using ::testing::HasSubstr;

// The double without its graph entry points, built beside it, as a driver
// older than CUDA 12.0 looks.
std::string NoGraphsLibrary() {
  std::string path = GXFAKE_LIBRARY_PATH;
  const std::string name = "libgpuexec_fakecuda.so";
  path.replace(path.rfind(name), name.size(), "libgpuexec_fakecuda_nographs.so");
  return path;
}

// Graphs and instantiated graphs alive in the double.
uint64_t LiveGraphs() {
  void* handle = dlopen(GXFAKE_LIBRARY_PATH, RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return UINT64_MAX;
  auto count = reinterpret_cast<uint64_t (*)()>(dlsym(handle, "gxfake_graphs"));
  return count != nullptr ? count() : UINT64_MAX;
}

// Each message of `status` names the call, the object and the driver's code.
void ExpectNamed(const absl::Status& status, absl::StatusCode code, const std::string& call,
                 const std::string& what, const std::string& result) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(call));
  EXPECT_THAT(std::string(status.message()), HasSubstr(what));
  EXPECT_THAT(std::string(status.message()), HasSubstr(result));
}

TEST(Driver, MissingLibraryIsUnavailableAndNamed) {
  auto d = Driver::Load("libdoes-not-exist.so.1");
  ASSERT_EQ(d.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("libdoes-not-exist.so.1"));
}

TEST(Driver, LibraryWithoutEntryPointsIsRefused) {
  auto d = Driver::Load("libm.so.6");
  ASSERT_EQ(d.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("cuInit"));
}

TEST(Driver, ResultTableIsMeaningful) {
  EXPECT_EQ(CodeForResult(2), absl::StatusCode::kResourceExhausted);     // OUT_OF_MEMORY
  EXPECT_EQ(CodeForResult(1), absl::StatusCode::kInvalidArgument);       // INVALID_VALUE
  EXPECT_EQ(CodeForResult(100), absl::StatusCode::kUnavailable);         // NO_DEVICE
  EXPECT_EQ(CodeForResult(700), absl::StatusCode::kAborted);             // ILLEGAL_ADDRESS
  EXPECT_EQ(CodeForResult(500), absl::StatusCode::kNotFound);            // NOT_FOUND
  EXPECT_EQ(CodeForResult(218), absl::StatusCode::kFailedPrecondition);  // INVALID_PTX
  EXPECT_TRUE(IsStickyResult(700));
  EXPECT_FALSE(IsStickyResult(2));
  EXPECT_EQ(CodeForResult(123456), absl::StatusCode::kInternal);
  // ABORTED but not sticky: the table says which.
  EXPECT_EQ(CodeForResult(709), absl::StatusCode::kAborted);  // CONTEXT_IS_DESTROYED
  EXPECT_FALSE(IsStickyResult(709));
  EXPECT_EQ(CodeForResult(807), absl::StatusCode::kUnavailable);  // MPS_SERVER_NOT_READY
  // A status that carries no CUresult: ABORTED counts as sticky.
  EXPECT_EQ(ResultOf(absl::AbortedError("x")), std::nullopt);
  EXPECT_TRUE(IsSticky(absl::AbortedError("made elsewhere")));
  EXPECT_FALSE(IsSticky(absl::InternalError("x")));
  EXPECT_FALSE(IsSticky(absl::OkStatus()));
}

TEST(Driver, DoubleLoadsAndErrorsNameCallAndObject) {
  auto d = Driver::Load(GXFAKE_LIBRARY_PATH);
  ASSERT_TRUE(d.ok()) << d.status();
  auto count = (*d)->DeviceCount();
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_GE(*count, 1);
  auto props = (*d)->Properties(0);
  ASSERT_TRUE(props.ok()) << props.status();
  EXPECT_EQ(props->cc_major, 9);
  EXPECT_GT(props->max_shared_per_block_optin, props->max_shared_per_block);
  auto bad = (*d)->Properties(99);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("cuDeviceGet"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("device 99"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("CUDA_ERROR_INVALID_DEVICE"));
  // Each error carries its CUresult: stickiness is the table's, not the
  // status code's.
  EXPECT_EQ(ResultOf(bad.status()), 101);  // CUDA_ERROR_INVALID_DEVICE
  EXPECT_FALSE(IsSticky(bad.status()));
  EXPECT_FALSE(NotReadyYet(bad.status()));

  auto ctx = (*d)->RetainPrimaryContext(0);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  ASSERT_TRUE((*d)->SetCurrent(ctx->get(), 0).ok());
  auto ptx = (*d)->LoadModule(".version 8.0\n.target sm_90\nnot ptx\n", true, "module m1");
  ASSERT_EQ(ptx.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(ptx.status().message()), HasSubstr("JIT log"));
  EXPECT_THAT(std::string(ptx.status().message()), HasSubstr("module m1"));
  auto m = (*d)->LoadModule("GXFAKE1\ngx_saxpy\n", false, "module m2");
  ASSERT_TRUE(m.ok()) << m.status();
  auto f = (*d)->GetFunction(*m, "gx_saxpy", "module m2");
  ASSERT_TRUE(f.ok()) << f.status();
  auto layout = (*d)->ParamLayout(*f, "gx_saxpy");
  ASSERT_TRUE(layout.ok());
  ASSERT_EQ(layout->size(), 4u);
  EXPECT_EQ((*layout)[3].offset, 24u);
  auto missing = (*d)->GetFunction(*m, "nope", "module m2");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  auto huge = (*d)->AllocAsync(1ull << 60, nullptr, "a huge buffer");
  ASSERT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("cuMemAllocAsync"));
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("a huge buffer"));
}

TEST(Driver, GraphsBuildReplayAndPatch) {
  auto loaded = Driver::Load(GXFAKE_LIBRARY_PATH);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Driver& d = **loaded;
  ASSERT_TRUE(d.has_graphs());
  auto ctx = d.RetainPrimaryContext(0);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  ASSERT_TRUE(d.SetCurrent(ctx->get(), 0).ok());
  auto stream = d.CreateStream("stream s1");
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto m = d.LoadModule("GXFAKE1\ngx_fill_u32\ngx_saxpy\ngx_cluster_rank\n", false, "module m");
  ASSERT_TRUE(m.ok()) << m.status();
  auto fill = d.GetFunction(*m, "gx_fill_u32", "module m");
  auto saxpy = d.GetFunction(*m, "gx_saxpy", "module m");
  auto rank = d.GetFunction(*m, "gx_cluster_rank", "module m");
  ASSERT_TRUE(fill.ok() && saxpy.ok() && rank.ok());
  constexpr uint64_t kN = 256;
  auto x = d.Alloc(kN * 4, "x");
  auto y = d.Alloc(kN * 4, "y");
  auto z = d.Alloc(kN * 4, "z");
  ASSERT_TRUE(x.ok() && y.ok() && z.ok());
  const uint64_t graphs_before = LiveGraphs();

  // y = 0; x = 1.5; y = a * x + y; z = y.
  uint32_t x_bits = 0;
  const float one_and_a_half = 1.5f;
  std::memcpy(&x_bits, &one_and_a_half, 4);
  float a = 2.0f;
  uint64_t n = kN;
  DevicePtr xp = *x, yp = *y;
  void* fill_params[] = {&xp, &x_bits, &n};
  void* saxpy_params[] = {&a, &xp, &yp, &n};
  LaunchGeometry geometry;
  geometry.block[0] = 256;
  auto g = d.CreateGraph("graph 1 of session s");
  ASSERT_TRUE(g.ok()) << g.status();
  auto memset = d.AddMemsetNode(*g, nullptr, *y, 0, kN * 4, "node 0 (memset)");
  ASSERT_TRUE(memset.ok()) << memset.status();
  auto filled = d.AddKernelNode(*g, *memset, *fill, geometry, fill_params, "node 1 (gx_fill_u32)");
  ASSERT_TRUE(filled.ok()) << filled.status();
  auto axpy = d.AddKernelNode(*g, *filled, *saxpy, geometry, saxpy_params, "node 2 (gx_saxpy)");
  ASSERT_TRUE(axpy.ok()) << axpy.status();
  auto copy = d.AddCopyNode(*g, *axpy, *z, *y, kN * 4, "node 3 (copy)");
  ASSERT_TRUE(copy.ok()) << copy.status();
  auto e = d.Instantiate(*g, "graph 1 of session s");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(LiveGraphs(), graphs_before + 2);
  ASSERT_TRUE(d.Upload(*e, stream->get(), "graph 1 of session s").ok());

  std::vector<float> out(kN);
  const auto replay = [&]() {
    EXPECT_TRUE(d.LaunchGraph(*e, stream->get(), "graph 1 of session s").ok());
    EXPECT_TRUE(d.CopyDtoHAsync(out.data(), *z, kN * 4, stream->get(), "z").ok());
    EXPECT_TRUE(d.SynchronizeStream(stream->get(), "stream s1").ok());
    return out;
  };
  EXPECT_EQ(replay(), std::vector<float>(kN, 3.0f));
  EXPECT_EQ(replay(), std::vector<float>(kN, 3.0f));  // y is set to 0 again
  a = 4.0f;
  ASSERT_TRUE(
      d.SetKernelNodeParams(*e, *axpy, *saxpy, geometry, saxpy_params, "node 2 (gx_saxpy)").ok());
  EXPECT_EQ(replay(), std::vector<float>(kN, 6.0f));

  // The launch attributes become node attributes.
  DevicePtr ranks_ptr = *x;
  void* rank_params[] = {&ranks_ptr};
  LaunchGeometry clustered;
  clustered.grid[0] = 4;
  clustered.grid[1] = 2;
  clustered.block[0] = 32;
  clustered.cluster[0] = 2;
  clustered.cluster[1] = 2;
  clustered.cluster_policy = 2;
  auto cg = d.CreateGraph("graph 2 of session s");
  ASSERT_TRUE(cg.ok());
  auto ranked = d.AddKernelNode(*cg, nullptr, *rank, clustered, rank_params, "node 0");
  ASSERT_TRUE(ranked.ok()) << ranked.status();
  auto ce = d.Instantiate(*cg, "graph 2 of session s");
  ASSERT_TRUE(ce.ok()) << ce.status();
  ASSERT_TRUE(d.LaunchGraph(*ce, stream->get(), "graph 2 of session s").ok());
  std::vector<uint32_t> ranks(8);
  ASSERT_TRUE(d.CopyDtoHAsync(ranks.data(), *x, 32, stream->get(), "x").ok());
  ASSERT_TRUE(d.SynchronizeStream(stream->get(), "stream s1").ok());
  EXPECT_EQ(ranks, (std::vector<uint32_t>{0, 1, 0, 1, 2, 3, 2, 3}));
  LaunchGeometry too_large = geometry;
  too_large.grid[0] = 1u << 20;
  too_large.cooperative = true;
  ASSERT_TRUE(d.AddKernelNode(*cg, *ranked, *fill, too_large, fill_params, "node 1").ok());
  ExpectNamed(d.Instantiate(*cg, "graph 2 of session s").status(),
              absl::StatusCode::kInvalidArgument, "cuGraphInstantiateWithFlags",
              "graph 2 of session s", "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE");

  // Refusals name the call and the object.
  LaunchGeometry programmatic = geometry;
  programmatic.programmatic_dependent = true;
  const absl::Status pdl =
      d.AddKernelNode(*g, *copy, *fill, programmatic, fill_params, "node 4 (gx_fill_u32)").status();
  EXPECT_EQ(pdl.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(pdl.message()), HasSubstr("node 4 (gx_fill_u32)"));
  EXPECT_THAT(std::string(pdl.message()), HasSubstr("programmatic dependent launch"));
  EXPECT_EQ(d.SetKernelNodeParams(*e, *axpy, *saxpy, programmatic, saxpy_params, "node 2").code(),
            absl::StatusCode::kInvalidArgument);
  LaunchGeometry too_wide = geometry;
  too_wide.block[0] = 2048;
  ExpectNamed(d.AddKernelNode(*g, *copy, *fill, too_wide, fill_params, "node 4").status(),
              absl::StatusCode::kInvalidArgument, "cuGraphAddKernelNode", "node 4",
              "CUDA_ERROR_INVALID_VALUE");
  ExpectNamed(d.AddMemsetNode(*g, *copy, *y, 0, kN * 4 + 1, "node 4 (memset)").status(),
              absl::StatusCode::kInvalidArgument, "cuGraphAddMemsetNode", "node 4 (memset)",
              "CUDA_ERROR_INVALID_VALUE");
  ExpectNamed(d.AddCopyNode(*g, *copy, *z, *y + 8, kN * 4, "node 4 (copy)").status(),
              absl::StatusCode::kInvalidArgument, "cuGraphAddMemcpyNode", "node 4 (copy)",
              "CUDA_ERROR_INVALID_VALUE");
  ExpectNamed(d.SetKernelNodeParams(*e, *axpy, *fill, geometry, fill_params, "node 2 (patch)"),
              absl::StatusCode::kInvalidArgument, "cuGraphExecKernelNodeSetParams",
              "node 2 (patch)", "CUDA_ERROR_INVALID_VALUE");
  // Without a current context, memset and copy nodes have none to run in.
  std::thread([&] {
    ExpectNamed(d.AddMemsetNode(*g, *copy, *y, 0, 4, "node 4 (memset)").status(),
                absl::StatusCode::kInternal, "cuGraphAddMemsetNode", "node 4 (memset)",
                "CUDA_ERROR_INVALID_CONTEXT");
    ExpectNamed(d.LaunchGraph(*e, stream->get(), "graph 1 of session s"),
                absl::StatusCode::kInternal, "cuGraphLaunch", "graph 1 of session s",
                "CUDA_ERROR_INVALID_CONTEXT");
  }).join();

  // The owners destroy what they hold, each on its own.
  g->reset();
  EXPECT_EQ(replay(), std::vector<float>(kN, 6.0f));  // the instantiated graph lives on
  e->reset();
  cg->reset();
  ce->reset();
  EXPECT_EQ(LiveGraphs(), graphs_before);
  for (const DevicePtr p : {*x, *y, *z}) EXPECT_TRUE(d.Free(p, "buffer").ok());
}

TEST(Driver, GraphsNeedTheirEntryPoints) {
  auto loaded = Driver::Load(NoGraphsLibrary());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Driver& d = **loaded;
  EXPECT_FALSE(d.has_graphs());
  const absl::Status created = d.CreateGraph("graph 1 of session s").status();
  EXPECT_EQ(created.code(), absl::StatusCode::kFailedPrecondition) << created;
  for (const char* says : {"(13.0)", "has no CUDA graphs", "cuGraphAddKernelNode_v2",
                           "cuGraphExecKernelNodeSetParams_v2", "CUDA 12.0 or newer"}) {
    EXPECT_THAT(std::string(created.message()), HasSubstr(says));
  }
  const Graph g;
  const GraphExec e;
  const LaunchGeometry geometry;
  for (const absl::Status& s : {
           d.AddKernelNode(g, nullptr, nullptr, geometry, nullptr, "node 0").status(),
           d.AddMemsetNode(g, nullptr, 0, 0, 4, "node 0").status(),
           d.AddCopyNode(g, nullptr, 0, 0, 4, "node 0").status(),
           d.Instantiate(g, "graph").status(),
           d.Upload(e, nullptr, "graph"),
           d.LaunchGraph(e, nullptr, "graph"),
           d.SetKernelNodeParams(e, nullptr, nullptr, geometry, nullptr, "node 0"),
       }) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_EQ(s.message(), created.message());
  }
}

}  // namespace
}  // namespace gpuexec::cuda
