// The front's CPU beside command rings (issue 36: "front CPU per 100k
// launches and idle"): the daemon's user + system time from /proc/PID/stat
// around a run of async launches through a ring and through the Execute
// stream of the same daemon, and its threads' time on a CPU (schedstat)
// over seconds of quiet, alone and beside sessions that each hold a ring.
// The client's CPU is this process's (getrusage).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <vector>

#include "absl/time/clock.h"
#include "bench.h"

namespace gpuexec::bench {

namespace {

// User + system time of `pid`, in milliseconds.
double ProcessCpuMs(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  const std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream rest(stat.substr(paren + 2));
  std::string field;
  double ticks = 0;
  // Fields 3.. follow the name; utime and stime are the 14th and 15th.
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);
  }
  return ticks * 1e3 / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Time on a CPU of every thread `pid` has now, in milliseconds, from
// their schedstat (nanoseconds: where /proc/PID/stat counts 10 ms ticks,
// which over seconds of quiet are all or nothing).
double ProcessRunMs(pid_t pid) {
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  double ns = 0;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
    uint64_t on_cpu = 0;
    if (std::ifstream(task.path() / "schedstat") >> on_cpu) ns += static_cast<double>(on_cpu);
  }
  return ns / 1e6;
}

// The front's CPU in ms/s over `quiet` from now, from ProcessRunMs.
double IdleMsPerS(pid_t front, absl::Duration quiet) {
  const double before = ProcessRunMs(front);
  absl::SleepFor(quiet);
  return (ProcessRunMs(front) - before) / absl::ToDoubleSeconds(quiet);
}

double SelfCpuMs() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

}  // namespace

CpuClock::CpuClock(pid_t front)
    : front_(front), front0_(ProcessCpuMs(front)), self0_(SelfCpuMs()) {}

CpuSpent CpuClock::Spent(double scale) const {
  return {(ProcessCpuMs(front_) - front0_) * scale, (SelfCpuMs() - self0_) * scale};
}

namespace {

// Front and client CPU per 100k async launches of gx_empty on a session of
// a client with `ring` set as told.
CpuSpent PerLaunches(int launches, pid_t front, const std::string& target, const std::string& image,
                     bool ring) {
  ClientOptions options = BenchClientOptions();
  options.command_ring = ring;
  Client client = Must(Client::Connect(target, options), "connect");
  Session session = Must(client.OpenSession({}), "open a session");
  Module module = Must(session.LoadModule(image, ModuleKind::kCubin), "load the module");
  Function empty = Must(module.GetFunction("gx_empty"), "gx_empty");
  Must(session.LaunchAndWait(empty, One(), {}), "launch and wait");
  const CpuClock clock(front);
  for (int i = 0; i < launches; ++i) Must(session.LaunchAsync(empty, One(), {}), "launch");
  Must(session.Synchronize(), "sync");
  return clock.Spent(1e5 / launches);
}

}  // namespace

RingCpuFigures RunRingCpu(const Plan& plan, bool quick, pid_t front, const std::string& target,
                          const std::string& cubin) {
  RingCpuFigures out;
  const std::string image = ReadFileOrDie(cubin);
  // Enough launches that the clock's 10 ms ticks are a small part (100k
  // in the full plan).
  const int launches = plan.async_launches * 5;
  const CpuSpent ring = PerLaunches(launches, front, target, image, true);
  const CpuSpent stream = PerLaunches(launches, front, target, image, false);
  out.ring_front_ms = ring.front_ms;
  out.ring_client_ms = ring.client_ms;
  out.stream_front_ms = stream.front_ms;
  out.stream_client_ms = stream.client_ms;

  // The front alone, quiet: its own threads' wake-ups (leases, health,
  // the workers' pings), the floor of the rows below.
  const absl::Duration quiet = quick ? absl::Seconds(1) : absl::Seconds(5);
  absl::SleepFor(absl::Milliseconds(500));  // past the sessions' close
  out.idle_alone_ms_per_s = IdleMsPerS(front, quiet);

  // 64 sessions, each of which took its ring with one launch (or, for the
  // floor of what the sessions cost without rings, its Execute stream),
  // then quiet.
  out.idle_rings = quick ? 8 : 64;
  for (const bool ring : {false, true}) {
    ClientOptions options = BenchClientOptions();
    options.command_ring = ring;
    Client client = Must(Client::Connect(target, options), "connect");
    std::vector<Session> sessions;
    for (int i = 0; i < out.idle_rings; ++i) {
      sessions.push_back(Must(client.OpenSession({}), "open a session"));
      Module module = Must(sessions.back().LoadModule(image, ModuleKind::kCubin), "load");
      Function empty = Must(module.GetFunction("gx_empty"), "gx_empty");
      Must(sessions.back().LaunchAndWait(empty, One(), {}), "launch and wait");
    }
    absl::SleepFor(absl::Milliseconds(500));  // past every spin window
    if (!ring) {
      out.idle_sessions_ms_per_s = IdleMsPerS(front, quiet);
      continue;
    }
    // Their first seconds of quiet (their threads' sleeps grow to 4 s),
    // then once settled.
    out.idle_first_ms_per_s = IdleMsPerS(front, quiet);
    if (!quick) absl::SleepFor(absl::Seconds(5));
    out.idle_front_ms_per_s = IdleMsPerS(front, quiet);
  }
  Note(absl::StrFormat(
      "front CPU per 100k async launches: %.0f ms through rings, %.0f ms through the Execute "
      "stream; the client's %.0f and %.0f ms; idle: %.2f ms/s with no session, %.2f ms/s beside "
      "%d sessions without rings, beside %d with rings %.2f ms/s in their first %.0f s of quiet "
      "and %.2f ms/s after",
      out.ring_front_ms, out.stream_front_ms, out.ring_client_ms, out.stream_client_ms,
      out.idle_alone_ms_per_s, out.idle_sessions_ms_per_s, out.idle_rings, out.idle_rings,
      out.idle_first_ms_per_s, absl::ToDoubleSeconds(quiet), out.idle_front_ms_per_s));
  return out;
}

}  // namespace gpuexec::bench
