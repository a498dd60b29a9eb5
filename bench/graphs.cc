// Graphs (`gpuexec_bench --graphs_only`): N empty kernels as N launches +
// synchronize against one graph replay + synchronize, natively (the driver
// in this process) and through a daemon on the Unix socket, in the same
// run; then a graph of 64 kernels with arguments replayed with 0, 1 and 64
// patched arguments. Prints the goals for N = 32: a replay within
// 1.3x of native graph replay + the session's launch + synchronize floor,
// and at least 4x faster than 32 async launches through gpuexec.
#include <algorithm>

#include "bench.h"

namespace gpuexec::bench {
namespace {

constexpr int kPatchNodes = 64;

// Fewer iterations for the long rows: each N launches.
int Iters(const Plan& plan, int n) {
  return std::clamp(plan.latency_iters / (1 + n / 8), 20, plan.latency_iters);
}

struct GraphRow {
  int n = 0;
  Latency launches, replay;        // native
  Latency gx_launches, gx_replay;  // gpuexec
  double instantiate_us = 0, gx_instantiate_us = 0;
};

struct PatchRow {
  int patches = 0;
  Latency native, gx;
};

struct Native {
  std::unique_ptr<cuda::Driver> driver;
  cuda::PrimaryContext ctx;
  cuda::Module module;
  cuda::Function empty{}, fill{};
  cuda::Stream stream;
};

Native OpenNative(const std::string& driver_lib, const std::string& cubin) {
  Native n;
  n.driver = Must(cuda::Driver::Load(driver_lib), "load the driver");
  n.ctx = Must(n.driver->RetainPrimaryContext(0), "retain the primary context");
  Must(n.driver->SetCurrent(n.ctx.get(), 0), "set the context");
  if (!n.driver->has_graphs()) Die("this driver has no graph entry points");
  n.module = Must(n.driver->LoadModule(ReadFileOrDie(cubin), false, "gx_kernels"), "load");
  n.empty = Must(n.driver->GetFunction(n.module, "gx_empty", "gx_empty"), "gx_empty");
  n.fill = Must(n.driver->GetFunction(n.module, "gx_fill_u32", "gx_fill_u32"), "gx_fill_u32");
  n.stream = Must(n.driver->CreateStream("bench"), "create a stream");
  return n;
}

// Native: N launches + sync, one replay of an N-node graph + sync.
void MeasureNative(const Plan& plan, Native& nat, GraphRow& row) {
  const cuda::Driver& d = *nat.driver;
  cuda::LaunchGeometry one;
  row.launches = Measure(Iters(plan, row.n), [&] {
    for (int i = 0; i < row.n; ++i)
      Must(d.Launch(nat.empty, one, nullptr, nat.stream.get(), "l"), "l");
    Must(d.SynchronizeStream(nat.stream.get(), "sync"), "sync");
  });
  const auto t0 = Clock::now();
  cuda::Graph g = Must(d.CreateGraph("g"), "create a graph");
  cuda::GraphNode last = nullptr;
  for (int i = 0; i < row.n; ++i) {
    last = Must(d.AddKernelNode(g, last, nat.empty, one, nullptr, "node"), "add a node");
  }
  cuda::GraphExec e = Must(d.Instantiate(g, "g"), "instantiate");
  Must(d.Upload(e, nat.stream.get(), "g"), "upload");
  Must(d.SynchronizeStream(nat.stream.get(), "sync"), "sync");
  row.instantiate_us = Seconds(t0, Clock::now()) * 1e6;
  row.replay = Measure(Iters(plan, row.n), [&] {
    Must(d.LaunchGraph(e, nat.stream.get(), "replay"), "replay");
    Must(d.SynchronizeStream(nat.stream.get(), "sync"), "sync");
  });
}

// Native: a 64-node graph of gx_fill_u32(null, value, 0) (it writes
// nothing), `patches` nodes given a new value before each replay.
Latency MeasureNativePatches(const Plan& plan, Native& nat, int patches) {
  const cuda::Driver& d = *nat.driver;
  cuda::LaunchGeometry one;
  uint64_t out = 0, n = 0;
  uint32_t value = 0;
  void* params[] = {&out, &value, &n};
  cuda::Graph g = Must(d.CreateGraph("g"), "create a graph");
  std::vector<cuda::GraphNode> nodes;
  for (int i = 0; i < kPatchNodes; ++i) {
    nodes.push_back(Must(
        d.AddKernelNode(g, nodes.empty() ? nullptr : nodes.back(), nat.fill, one, params, "node"),
        "add a node"));
  }
  cuda::GraphExec e = Must(d.Instantiate(g, "g"), "instantiate");
  return Measure(Iters(plan, kPatchNodes), [&] {
    ++value;
    for (int i = 0; i < patches; ++i) {
      Must(d.SetKernelNodeParams(e, nodes[i], nat.fill, one, params, "patch"), "patch");
    }
    Must(d.LaunchGraph(e, nat.stream.get(), "replay"), "replay");
    Must(d.SynchronizeStream(nat.stream.get(), "sync"), "sync");
  });
}

void MeasureGpuexec(const Plan& plan, Session& s, const Function& empty, GraphRow& row) {
  row.gx_launches = Measure(Iters(plan, row.n), [&] {
    for (int i = 0; i < row.n; ++i) Must(s.LaunchAsync(empty, One(), {}), "launch");
    Must(s.Synchronize(), "sync");
  });
  Must(s.BeginGraph(), "begin a graph");
  for (int i = 0; i < row.n; ++i) Must(s.LaunchAsync(empty, One(), {}), "record a launch");
  Graph g = Must(s.EndGraph(), "end the graph");
  row.gx_instantiate_us = absl::ToDoubleMicroseconds(g.instantiate_time());
  row.gx_replay = Measure(Iters(plan, row.n), [&] { Must(g.LaunchAndWait(), "replay"); });
  Must(g.Free(), "free the graph");
}

Latency MeasureGpuexecPatches(const Plan& plan, Session& s, const Function& fill, int patches) {
  Must(s.BeginGraph(), "begin a graph");
  for (int i = 0; i < kPatchNodes; ++i) {
    Must(s.LaunchAsync(fill, One(), {Arg::Null(), Arg::U32(0), Arg::U64(0)}), "record");
  }
  Graph g = Must(s.EndGraph(), "end the graph");
  uint32_t value = 0;
  std::vector<GraphPatch> p;
  p.reserve(patches);
  Latency l = Measure(Iters(plan, kPatchNodes), [&] {
    ++value;
    p.clear();
    for (int i = 0; i < patches; ++i) p.push_back({static_cast<uint32_t>(i), 1, Arg::U32(value)});
    Must(g.LaunchAndWait(p), "replay");
  });
  Must(g.Free(), "free the graph");
  return l;
}

}  // namespace

int RunGraphs(const Plan& plan, bool quick, const std::string& daemon, const std::string& driver,
              const std::string& cubin) {
  std::printf("gpuexec_bench%s: graphs, driver %s, daemon %s\n",
              quick ? " (quick: not a measurement)" : "", driver.c_str(), daemon.c_str());
  const std::vector<int> sizes =
      quick ? std::vector<int>{1, 8, 32} : std::vector<int>{1, 8, 32, 128, 512};
  std::vector<GraphRow> rows;
  std::vector<PatchRow> patch_rows;
  for (int n : sizes) rows.emplace_back().n = n;
  for (int p : {0, 1, kPatchNodes}) patch_rows.emplace_back().patches = p;
  {
    Native nat = OpenNative(driver, cubin);
    for (GraphRow& r : rows) MeasureNative(plan, nat, r);
    for (PatchRow& r : patch_rows) r.native = MeasureNativePatches(plan, nat, r.patches);
  }
  Latency floor;
  {
    Daemon d(daemon, driver, "graphs");
    Client client = Must(Client::Connect(d.uds(), BenchClientOptions()), "connect");
    Session s = Must(client.OpenSession({}), "open a session");
    Module module = Must(s.LoadModule(ReadFileOrDie(cubin), ModuleKind::kCubin), "load");
    Function empty = Must(module.GetFunction("gx_empty"), "gx_empty");
    Function fill = Must(module.GetFunction("gx_fill_u32"), "gx_fill_u32");
    floor = Measure(plan.latency_iters, [&] { Must(s.LaunchAndWait(empty, One(), {}), "launch"); });
    for (GraphRow& r : rows) MeasureGpuexec(plan, s, empty, r);
    for (PatchRow& r : patch_rows) r.gx = MeasureGpuexecPatches(plan, s, fill, r.patches);
    Must(s.Close(), "close the session");
  }
  Section("N empty kernels: N launches + synchronize against one graph replay + synchronize");
  std::printf(
      "gpuexec over the Unix socket; its launch + synchronize floor: p50 %s (p99 %s)\n\n"
      "| kernels | native launches | native replay | gpuexec launches (async) | gpuexec replay | "
      "replay x faster than launches (gpuexec) | instantiate native / gpuexec |\n"
      "| --- | --- | --- | --- | --- | --- | --- |\n",
      Us(floor.p50).c_str(), Us(floor.p99).c_str());
  const GraphRow* r32 = nullptr;
  for (const GraphRow& r : rows) {
    std::printf("| %d | %s | %s | %s | %s | %.1fx | %s / %s |\n", r.n, Us(r.launches.p50).c_str(),
                Us(r.replay.p50).c_str(), Us(r.gx_launches.p50).c_str(),
                Us(r.gx_replay.p50).c_str(), r.gx_launches.p50 / r.gx_replay.p50,
                Us(r.instantiate_us).c_str(), Us(r.gx_instantiate_us).c_str());
    if (r.n == 32) r32 = &r;
  }
  Section(
      absl::StrCat("a graph of ", kPatchNodes, " kernels with arguments, replay + synchronize"));
  std::printf(
      "| patched arguments | native (cuGraphExecKernelNodeSetParams) | gpuexec | gpuexec - native "
      "|\n"
      "| --- | --- | --- | --- |\n");
  for (const PatchRow& r : patch_rows) {
    std::printf("| %d | %s | %s | %s |\n", r.patches, Us(r.native.p50).c_str(),
                Us(r.gx.p50).c_str(), Us(r.gx.p50 - r.native.p50).c_str());
  }
  if (r32 != nullptr) {
    const double bound = 1.3 * (r32->replay.p50 + floor.p50);
    const double speedup = r32->gx_launches.p50 / r32->gx_replay.p50;
    Section("goals, 32 kernels");
    std::printf("replay %s <= 1.3 x (native replay %s + floor %s) = %s: %s\n",
                Us(r32->gx_replay.p50).c_str(), Us(r32->replay.p50).c_str(), Us(floor.p50).c_str(),
                Us(bound).c_str(), Met(r32->gx_replay.p50 <= bound).c_str());
    std::printf("replay %.1fx faster than 32 async launches + synchronize (>= 4x): %s\n", speedup,
                Met(speedup >= 4).c_str());
  }
  return 0;
}

}  // namespace gpuexec::bench
