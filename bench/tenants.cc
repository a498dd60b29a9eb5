// Two tenants, a worker each (or one for both: --tenants_isolation=device):
// one's launches beside the other's kernels.
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "bench.h"

namespace gpuexec::bench {

TenantFigures RunTenants(const Plan& plan, const std::string& daemon_path,
                         const std::string& driver, const std::string& cubin) {
  TenantFigures out;
  const std::string mps = absl::GetFlag(FLAGS_tenants_mps);
  const char* pipes = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  out.mps = mps == "own" || (mps != "off" && pipes != nullptr && *pipes != '\0');
  out.share = absl::GetFlag(FLAGS_tenant_share);
  std::string share_entry;
  if (!out.share.empty()) {
    absl::string_view s = out.share;
    share_entry = absl::ConsumeSuffix(&s, "sm")
                      ? absl::StrCat(" compute_share { sms: ", s, " }")
                      : absl::StrCat(" compute_share { fraction: ", s, " }");
  }
  char templ[] = "/tmp/gpuexec-bench-tenants-XXXXXX";
  const char* made = mkdtemp(templ);
  if (made == nullptr) Die("mkdtemp");
  const std::string file = std::string(made) + "/tenants.textproto";
  {
    std::ofstream f(file);
    f << "tenant { name: \"bench\" token_sha256: \"" << gpuexec::Sha256Hex(kBenchToken) << "\""
      << share_entry << " }\ntenant { name: \"neighbour\" token_sha256: \""
      << gpuexec::Sha256Hex(kNeighbourToken) << "\" }\n";
  }
  // A worker each (MPS holds them to their shares), or one for both (green
  // contexts do).
  const std::string isolation = absl::GetFlag(FLAGS_tenants_isolation);
  Daemon d(daemon_path, driver, "tenants",
           {"--tenants=" + file, "--isolation=" + isolation, "--mps=" + mps});
  const std::string image = ReadFileOrDie(cubin);
  ClientOptions mine = BenchClientOptions();
  mine.token = kBenchToken;
  Client client = Must(Client::Connect(d.tcp(), mine), "connect as tenant 'bench'");
  Session session = Must(client.OpenSession({}), "open a session");
  Module module = Must(session.LoadModule(image, ModuleKind::kCubin), "load the module");
  Function empty = Must(module.GetFunction("gx_empty"), "gx_empty");
  auto launch_sync = [&] { Must(session.LaunchAndWait(empty, One(), {}), "launch and wait"); };
  out.alone = Measure(plan.latency_iters, launch_sync);

  ClientOptions theirs = BenchClientOptions();
  theirs.token = kNeighbourToken;
  Client neighbour = Must(Client::Connect(d.tcp(), theirs), "connect as tenant 'neighbour'");
  Session busy = Must(neighbour.OpenSession({}), "open the neighbour's session");
  Module busy_module = Must(busy.LoadModule(image, ModuleKind::kCubin), "load the module");
  Function spin = Must(busy_module.GetFunction("gx_spin"), "gx_spin");
  const uint64_t spin_ns = uint64_t{1000} * absl::GetFlag(FLAGS_neighbour_kernel_us);
  LaunchConfig flood = One();
  flood.grid.x = static_cast<uint32_t>(std::max(1, absl::GetFlag(FLAGS_neighbour_blocks)));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> kernels{0};
  std::thread load([&] {
    // Keeps a few of its kernels queued all the time.
    while (!stop.load()) {
      for (int i = 0; i < 8; ++i) {
        Must(busy.LaunchAsync(spin, flood, {Arg::U64(spin_ns)}), "the neighbour's launch");
      }
      Must(busy.Synchronize(), "the neighbour's synchronize");
      kernels += 8;
    }
  });
  // Its worker is started and busy before the measurement begins; its rate
  // alone over a second, then beside the measured tenant.
  while (kernels.load() < 16) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const uint64_t a0 = kernels.load();
  const auto alone_t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  out.neighbour_alone_per_s = (kernels.load() - a0) / Seconds(alone_t0, Clock::now());
  const uint64_t k0 = kernels.load();
  const auto t0 = Clock::now();
  out.beside = Measure(plan.latency_iters, launch_sync);
  out.neighbour_kernels_per_s = (kernels.load() - k0) / Seconds(t0, Clock::now());
  stop.store(true);
  load.join();
  Must(busy.Close(), "close the neighbour's session");
  Must(session.Close(), "close the session");
  const bool one_worker = isolation == "device";
  const char* how = one_worker ? " (one worker for both: their streams share a context)"
                    : out.mps  ? " (a worker each, under MPS)"
                               : " (a worker each, no MPS: the two contexts are time-sliced)";
  Note(absl::StrFormat(
      "tenant 'bench' alone: launch + synchronize p50 %.1f us p99 %.1f us; beside tenant "
      "'neighbour' (%d us kernels of %d blocks, %.0f of them a second meanwhile, %.0f alone): "
      "p50 %.1f us p99 %.1f us%s%s",
      out.alone.p50, out.alone.p99, absl::GetFlag(FLAGS_neighbour_kernel_us),
      absl::GetFlag(FLAGS_neighbour_blocks), out.neighbour_kernels_per_s, out.neighbour_alone_per_s,
      out.beside.p50, out.beside.p99, how,
      out.share.empty()
          ? ""
          : absl::StrCat("; tenant 'bench' holds a compute share of ", out.share,
                         one_worker ? " (a green context)" : " (an MPS percentage)")));
  std::remove(file.c_str());
  rmdir(made);
  return out;
}

}  // namespace gpuexec::bench
