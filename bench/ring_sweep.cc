// The command ring's spin windows (`gpuexec_bench --ring_sweep`): for each
// daemon spin (`gpuexecd --ring_spin_us`) a daemon of its own, and against
// it each client spin (`ClientOptions::spin_wait`): launch + synchronize
// p50/p99 through a ring, async launches a second, and the CPU the front
// and the client spent per 100k of each, beside native in the same run;
// then launch + synchronize and async launches of an untimed session
// (SessionOptions::gpu_time = false) through the same ring path.
// The chosen window is the smallest (daemon, then client) whose p50 is
// within 5% of the best. `--read_thread_ab` measures the same figures with
// the worker's read thread off and on (`gpuexecd --worker_read_thread`),
// a daemon each, in turn.
#include <algorithm>

#include "absl/strings/str_join.h"
#include "bench.h"

namespace gpuexec::bench {
namespace {

// One session's figures through the ring: launch + synchronize and async
// launches, and the front's CPU for each per 100k.
struct SessionFigures {
  Latency sync;
  double async_rate = 0;
  CpuSpent sync_cpu, async_cpu;  // per 100k
};

struct Cell {
  int daemon_us = 0, client_us = 0;
  SessionFigures timed, untimed;
};

SessionFigures MeasureSession(const Plan& plan, pid_t front, Client& client,
                              const std::string& image, bool gpu_time) {
  SessionFigures f;
  SessionOptions session_options;
  session_options.gpu_time = gpu_time;
  // A session that asks for a shorter kernel time limit than the daemon's
  // shares a watch among its runs' launches (device::DeviceOptions::
  // launches_per_watch); 0: the daemon's own.
  session_options.kernel_time_limit =
      absl::Milliseconds(absl::GetFlag(FLAGS_session_time_limit_ms));
  Session session = Must(client.OpenSession(session_options), "open a session");
  if (session.gpu_time() != gpu_time) Die("the daemon did not time the session as asked");
  Module module = Must(session.LoadModule(image, ModuleKind::kCubin), "load the module");
  Function empty = Must(module.GetFunction("gx_empty"), "gx_empty");
  Must(session.LaunchAndWait(empty, One(), {}), "launch and wait");
  const double scale = 1e5 / plan.latency_iters;
  CpuClock clock(front);
  f.sync = Measure(plan.latency_iters,
                   [&] { Must(session.LaunchAndWait(empty, One(), {}), "launch and wait"); });
  // Measure runs a tenth more as warm-up: counted in the CPU, not the time.
  f.sync_cpu = clock.Spent(scale / 1.1);
  const int launches = plan.async_launches;
  CpuClock async_clock(front);
  const auto t0 = Clock::now();
  for (int i = 0; i < launches; ++i) Must(session.LaunchAsync(empty, One(), {}), "launch");
  Must(session.Synchronize(), "sync");
  f.async_rate = launches / Seconds(t0, Clock::now());
  f.async_cpu = async_clock.Spent(1e5 / launches);
  Must(session.Close(), "close the session");
  return f;
}

// `client_us` < 0: the client's default spin.
Cell Measure1(const Plan& plan, pid_t front, const std::string& target, const std::string& image,
              int daemon_us, int client_us) {
  Cell c;
  c.daemon_us = daemon_us;
  c.client_us = client_us;
  ClientOptions options = BenchClientOptions();
  if (client_us >= 0) options.spin_wait = absl::Microseconds(client_us);
  options.command_ring = true;
  Client client = Must(Client::Connect(target, options), "connect");
  c.timed = MeasureSession(plan, front, client, image, /*gpu_time=*/true);
  c.untimed = MeasureSession(plan, front, client, image, /*gpu_time=*/false);
  return c;
}

}  // namespace

namespace {

// One side of an A/B: a daemon program and its flags beside
// --command_rings.
struct Side {
  std::string name;
  std::string daemon;
  std::vector<std::string> flags;
};

// Each side's daemon in turn, three rounds: the ring's launch figures,
// timed and untimed, beside native in the same run.
int RunAB(const Plan& plan, bool quick, const std::string& what, const std::string& column,
          const std::vector<Side>& sides, const std::string& driver, const std::string& cubin) {
  const NativeFigures native = RunNative(plan, driver, cubin);
  const std::string image = ReadFileOrDie(cubin);
  Section("launch + synchronize and async launches through a command ring, " + what);
  std::printf(
      "native: launch + synchronize p50 %s (p99 %s), async %s\n\n"
      "| round | %s | launch + sync p50 (p99) | x native | async | x native | untimed "
      "launch + sync p50 (p99) | x native | untimed async | x native | front CPU per 100k "
      "async |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
      Us(native.launch_sync.p50).c_str(), Us(native.launch_sync.p99).c_str(),
      Rate(1e6 / native.async_launch_us).c_str(), column.c_str());
  const double native_rate = 1e6 / native.async_launch_us;
  for (int round = 1; round <= (quick ? 1 : 3); ++round) {
    for (const Side& side : sides) {
      std::vector<std::string> flags = {"--command_rings"};
      flags.insert(flags.end(), side.flags.begin(), side.flags.end());
      Daemon d(side.daemon, driver, absl::StrCat("ab-", side.name, "-", round), flags);
      const Cell c = Measure1(plan, d.pid(), d.uds(), image, /*daemon_us=*/-1, /*client_us=*/-1);
      std::printf("| %d | %s | %s (%s) | %s | %s | %s | %s (%s) | %s | %s | %s | %.0f ms |\n",
                  round, side.name.c_str(), Us(c.timed.sync.p50).c_str(),
                  Us(c.timed.sync.p99).c_str(),
                  Ratio(c.timed.sync.p50 / native.launch_sync.p50).c_str(),
                  Rate(c.timed.async_rate).c_str(), Ratio(c.timed.async_rate / native_rate).c_str(),
                  Us(c.untimed.sync.p50).c_str(), Us(c.untimed.sync.p99).c_str(),
                  Ratio(c.untimed.sync.p50 / native.launch_sync.p50).c_str(),
                  Rate(c.untimed.async_rate).c_str(),
                  Ratio(c.untimed.async_rate / native_rate).c_str(), c.untimed.async_cpu.front_ms);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int RunReadThreadAB(const Plan& plan, bool quick, const std::string& daemon,
                    const std::string& driver, const std::string& cubin) {
  std::printf("gpuexec_bench%s: the worker's read thread off and on, driver %s, daemon %s\n",
              quick ? " (quick: not a measurement)" : "", driver.c_str(), daemon.c_str());
  return RunAB(
      plan, quick, "read thread off / on", "read thread",
      {{"off", daemon, {"--worker_read_thread=off"}}, {"on", daemon, {"--worker_read_thread=on"}}},
      driver, cubin);
}

int RunDaemonAB(const Plan& plan, bool quick, const std::string& before, const std::string& daemon,
                const std::string& driver, const std::string& cubin) {
  std::printf("gpuexec_bench%s: two daemon builds in turn, driver %s, before %s, after %s\n",
              quick ? " (quick: not a measurement)" : "", driver.c_str(), before.c_str(),
              daemon.c_str());
  return RunAB(plan, quick, "the daemon before / after", "daemon",
               {{"before", before, {}}, {"after", daemon, {}}}, driver, cubin);
}

int RunRingSweep(const Plan& plan, bool quick, const std::string& daemon, const std::string& driver,
                 const std::string& cubin) {
  const std::vector<int> daemon_spins =
      quick ? std::vector<int>{0, 50} : std::vector<int>{0, 10, 30, 100, 300};
  const std::vector<int> client_spins =
      quick ? std::vector<int>{0, 50} : std::vector<int>{0, 20, 50, 200};
  std::printf("gpuexec_bench%s: the command ring's spin windows, driver %s, daemon %s\n",
              quick ? " (quick: not a measurement)" : "", driver.c_str(), daemon.c_str());
  const NativeFigures native = RunNative(plan, driver, cubin);
  const std::string image = ReadFileOrDie(cubin);
  std::vector<Cell> cells;
  for (int d_us : daemon_spins) {
    Daemon d(daemon, driver, absl::StrCat("sweep-", d_us),
             {"--command_rings", absl::StrCat("--ring_spin_us=", d_us)});
    for (int c_us : client_spins) {
      cells.push_back(Measure1(plan, d.pid(), d.uds(), image, d_us, c_us));
    }
  }
  Section("launch + synchronize and async launches through a command ring, by spin window");
  std::printf(
      "native: launch + synchronize p50 %s (p99 %s), async %s; with the GPU time's events as "
      "a worker takes it p50 %s (p99 %s); with plain events as an untimed one does p50 %s (p99 "
      "%s)\n\n"
      "| daemon spin | client spin | launch + sync p50 (p99) | x native p50 | front / client CPU "
      "per 100k launch + sync | async launches | front / client CPU per 100k async | untimed "
      "launch + sync p50 (p99) | x native p50 | untimed async |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
      Us(native.launch_sync.p50).c_str(), Us(native.launch_sync.p99).c_str(),
      Rate(1e6 / native.async_launch_us).c_str(), Us(native.launch_timed.p50).c_str(),
      Us(native.launch_timed.p99).c_str(), Us(native.launch_plain.p50).c_str(),
      Us(native.launch_plain.p99).c_str());
  double best = 1e300;
  for (const Cell& c : cells) best = std::min(best, c.timed.sync.p50);
  const Cell* chosen = nullptr;
  for (const Cell& c : cells) {
    std::printf(
        "| %d us | %d us | %s (%s) | %s | %.0f / %.0f ms | %s | %.0f / %.0f ms | %s (%s) | %s | %s "
        "|\n",
        c.daemon_us, c.client_us, Us(c.timed.sync.p50).c_str(), Us(c.timed.sync.p99).c_str(),
        Ratio(c.timed.sync.p50 / native.launch_sync.p50).c_str(), c.timed.sync_cpu.front_ms,
        c.timed.sync_cpu.client_ms, Rate(c.timed.async_rate).c_str(), c.timed.async_cpu.front_ms,
        c.timed.async_cpu.client_ms, Us(c.untimed.sync.p50).c_str(), Us(c.untimed.sync.p99).c_str(),
        Ratio(c.untimed.sync.p50 / native.launch_sync.p50).c_str(),
        Rate(c.untimed.async_rate).c_str());
    if (chosen == nullptr && c.timed.sync.p50 <= best * 1.05) chosen = &c;
  }
  if (chosen != nullptr) {
    std::printf("\nsmallest window within 5%% of the best p50 (%s): daemon %d us, client %d us\n",
                Us(best).c_str(), chosen->daemon_us, chosen->client_us);
  }
  return 0;
}

}  // namespace gpuexec::bench
