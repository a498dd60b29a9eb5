// Kernels from source (--compile_only): what CompileModule costs against
// NVRTC called in this process, and what a neighbour's compiles do to a
// session's launches. Each "first" compile sends a source the daemon has
// not seen (a numbered comment makes it new), so it pays the compile
// process, the sandbox and NVRTC; a "cached" compile sends one it has.
#include "absl/strings/numbers.h"
#include "bench.h"
#include "server/compile/compile_request.h"
#include "server/compile/nvrtc.h"

namespace gpuexec::bench {
namespace {

// Two kernels the driver double also models (gx_empty, gx_saxpy), and a
// template, so the figures have work for NVRTC's front end and back end.
constexpr char kSource[] = R"(
extern "C" __global__ void gx_empty() {}
extern "C" __global__ void gx_saxpy(float a, const float* x, float* y, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (; i < n; i += stride) y[i] = a * x[i] + y[i];
}
template <typename T>
__global__ void gx_scale(T* y, T a, unsigned long long n) {
  unsigned long long i = (blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x) * 4;
#pragma unroll
  for (int k = 0; k < 4; ++k) if (i + k < n) y[i + k] *= a;
}
)";

std::string Variant(int n) { return absl::StrCat(kSource, "// variant ", n, "\n"); }

CompileSpec Spec(std::string source) {
  CompileSpec spec;
  spec.source = std::move(source);
  spec.name = "bench.cu";
  spec.name_expressions = {"gx_scale<float>"};
  return spec;
}

// "sm_90" -> {9, 0}.
std::pair<int, int> ParseArch(const std::string& arch) {
  int cc = 0;
  if (arch.size() < 5 || !absl::SimpleAtoi(arch.substr(3), &cc)) Die("arch " + arch);
  return {cc / 10, cc % 10};
}

}  // namespace

int RunCompile(const Plan& plan, bool quick, const std::string& daemon_path,
               const std::string& driver, const std::string& nvrtc_flag) {
  const int iters = quick ? 3 : 20;
  const int clients = quick ? 2 : absl::GetFlag(FLAGS_clients);
  // Every client here is one principal (this host): the per-tenant limit
  // raised so that the daemon's own (--max_compiles) is what they meet.
  std::vector<std::string> args = {"--compile", "--max_compiles_per_tenant=64"};
  if (!nvrtc_flag.empty()) args.push_back("--nvrtc=" + nvrtc_flag);
  Daemon d(daemon_path, driver, "compile", args);
  Client client = Must(Client::Connect(d.uds(), BenchClientOptions()), "connect");
  Session session = Must(client.OpenSession({0}), "open a session");
  // The first compile of all starts NVRTC's own caches in nothing: one
  // compile process each, so it is a first compile like any other.
  const auto t0 = Clock::now();
  CompiledModule first = Must(session.CompileModule(Spec(Variant(-1))), "CompileModule");
  const double very_first_ms = Seconds(t0, Clock::now()) * 1e3;
  std::printf("gpuexec_bench%s: kernels from source, NVRTC %s for %s, daemon %s\n",
              quick ? " (quick: not a measurement)" : "", first.nvrtc_version.c_str(),
              first.arch.c_str(), daemon_path.c_str());
  const auto [major, minor] = ParseArch(first.arch);

  Section("kernels from source: NVRTC in this process (the baseline)");
  std::string nvrtc_path = nvrtc_flag;
  std::unique_ptr<compile::Nvrtc> nvrtc;
  std::vector<std::string> tried =
      nvrtc_path.empty() ? compile::DefaultNvrtcCandidates() : std::vector<std::string>{nvrtc_path};
  for (const std::string& candidate : tried) {
    if (auto opened = compile::Nvrtc::Open(candidate); opened.ok()) {
      nvrtc = *std::move(opened);
      nvrtc_path = candidate;
      break;
    }
  }
  if (nvrtc == nullptr) Die("no NVRTC to open in this process (--nvrtc)");
  Latency native;
  {
    int n = 0;
    native = Measure(iters, [&] {
      compile::CompileInput input;
      input.source = Variant(n++);
      input.source_name = "bench.cu";
      input.name_expressions = {"gx_scale<float>"};
      compile::CompileResult r =
          nvrtc->Compile(input, compile::CompileOptions(input, major, minor));
      if (r.result != 0) Die(absl::StrCat("NVRTC: ", r.result_name, "\n", r.log));
    });
  }
  Note(absl::StrFormat("%s: compile p50 %.1f ms, p99 %.1f ms", nvrtc_path, native.p50 / 1e3,
                       native.p99 / 1e3));

  Section("kernels from source: CompileModule (a gpuexecd process, Unix socket)");
  int n = 1000;
  const Latency cold =
      Measure(iters, [&] { Must(session.CompileModule(Spec(Variant(n++))), "CompileModule"); });
  const Latency cached =
      Measure(iters * 5, [&] { Must(session.CompileModule(Spec(Variant(7))), "CompileModule"); });
  Note(absl::StrFormat("the daemon's very first compile: %.1f ms", very_first_ms));
  // The same, each compile process started anew instead of forked from the
  // warm one (server/compile/zygote.h): what the warm one saves.
  Latency unwarmed;
  {
    std::vector<std::string> cold_args = args;
    cold_args.push_back("--warm_compiles=false");
    Daemon dc(daemon_path, driver, "compile-cold", cold_args);
    Client cc = Must(Client::Connect(dc.uds(), BenchClientOptions()), "connect");
    Session cs = Must(cc.OpenSession({0}), "open a session");
    unwarmed = Measure(iters, [&] { Must(cs.CompileModule(Spec(Variant(n++))), "CompileModule"); });
  }

  // Launches of one session while `clients` others compile new sources.
  Function empty = Must(first.module.GetFunction("gx_empty"), "gx_empty");
  auto launch = [&] { Must(session.LaunchAndWait(empty, One(), {}).status(), "launch"); };
  const Latency idle = Measure(plan.latency_iters, launch);
  std::atomic<bool> stop{false};
  std::atomic<int> compiled{0};
  std::vector<std::thread> threads;
  const auto busy_from = Clock::now();
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      Client mine = Must(Client::Connect(d.uds(), BenchClientOptions()), "connect");
      Session s = Must(mine.OpenSession({0}), "open a session");
      for (int k = 0; !stop.load(); ++k) {
        Must(s.CompileModule(Spec(Variant(100000 * (c + 1) + k))), "CompileModule");
        compiled.fetch_add(1);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(quick ? 50 : 500));
  const Latency busy = Measure(plan.latency_iters, launch);
  std::this_thread::sleep_for(std::chrono::milliseconds(quick ? 100 : 2000));
  stop = true;
  for (std::thread& t : threads) t.join();
  const double rate = compiled.load() / Seconds(busy_from, Clock::now());

  g_rows.push_back({"compile, a new source (p50 / p99)", Us(cold.p50) + " / " + Us(cold.p99), "",
                    "NVRTC in-process " + Us(native.p50), Ratio(cold.p50 / native.p50), "", ""});
  g_rows.push_back(
      {"compile, a new source, --warm_compiles=false", Us(unwarmed.p50) + " / " + Us(unwarmed.p99),
       "", "NVRTC in-process " + Us(native.p50), Ratio(unwarmed.p50 / native.p50), "", ""});
  g_rows.push_back({"compile, a cached source (p50 / p99)", Us(cached.p50) + " / " + Us(cached.p99),
                    "", "", "", "", ""});
  g_rows.push_back({absl::StrCat("compiles/s, ", clients, " clients with new sources"),
                    absl::StrFormat("%.1f/s", rate), "",
                    absl::StrFormat("NVRTC in-process, one: %.1f/s", 1e6 / native.p50),
                    Ratio(rate / (1e6 / native.p50)), "", ""});
  g_rows.push_back({absl::StrCat("launch + sync p50 beside ", clients, " clients compiling"),
                    Us(busy.p50), "", "idle " + Us(idle.p50), Ratio(busy.p50 / idle.p50), "", ""});
  std::printf("\n%-48s %-22s %-34s %s\n", "figure", "gpuexec (Unix socket)", "baseline", "ratio");
  for (const Row& r : g_rows) {
    std::printf("%-48s %-22s %-34s %s\n", r.what.c_str(), r.tcp.c_str(), r.baseline.c_str(),
                r.ratio.c_str());
  }
  return 0;
}

}  // namespace gpuexec::bench
