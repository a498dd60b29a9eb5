// placement_sim: how well a pool's clients place sessions with d random
// choices, on a simulated pool (only one machine is at hand). 1,000 daemons
// of one 141 GiB device each; sessions arrive asking for 1 to 32 GiB
// (most small, a few large), live a random while and leave, until the pool
// holds about `--load` of its memory on average. Each placement asks d
// daemons drawn at random (the pool's SampleDaemons) and opens the session
// on the best fit (the pool's ChooseDevice), from figures as fresh as the
// probe. For d = 1, 2, 3 (and all daemons, for reference) it prints the
// memory load of the fullest daemon over the mean (max/mean), the
// sessions refused although the pool had room, the probes per placement,
// the CPU time of a placement's choice, and the time of an OpenSession
// modelled as the slowest of d concurrent probes plus one OpenSession,
// round trips drawn from --rtt_us (a log-normal with that median).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <queue>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/random/random.h"
#include "absl/strings/str_format.h"
#include "internal/placement.h"

ABSL_FLAG(int, daemons, 1000, "simulated daemons (one device each)");
ABSL_FLAG(int, sessions, 200000, "sessions placed per run");
ABSL_FLAG(double, load, 0.7, "the mean share of device memory held, at steady state");
ABSL_FLAG(double, rtt_us, 300, "median round trip of a probe or an OpenSession, microseconds");
ABSL_FLAG(uint64_t, seed, 1, "random seed");

namespace {

using gpuexec::internal::ChooseDevice;
using gpuexec::internal::DeviceLoad;
using gpuexec::internal::PlacementNeeds;
using gpuexec::internal::SampleDaemons;

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kDeviceBytes = 141 * kGiB;

struct Result {
  double mean_load = 0;      // memory held over memory, at the end
  double max_over_mean = 0;  // memory held, at the end of the run
  double p99_over_mean = 0;  // the 99th percentile daemon over the mean
  uint64_t refused_with_room = 0;
  double probes = 0;     // per placement
  double choose_ns = 0;  // per placement, CPU
  double open_p50_us = 0, open_p99_us = 0;
};

// A session's memory: 1 to 32 GiB, log-uniform (most small, a few large).
uint64_t SessionBytes(absl::BitGen& bits) {
  return static_cast<uint64_t>(std::exp2(absl::Uniform(bits, 0.0, 5.0)) * kGiB);
}

Result Run(int daemons, int d, int sessions, double load, double rtt_us, uint64_t seed) {
  absl::BitGen bits(std::seed_seq{seed});
  std::vector<DeviceLoad> pool(daemons);
  for (int i = 0; i < daemons; ++i) {
    pool[i].daemon = i;
    pool[i].healthy = true;
    pool[i].memory_total_bytes = kDeviceBytes;
    pool[i].memory_free_bytes = kDeviceBytes;
    pool[i].cc_major = 9;
  }
  // Little's law: mean sessions held = arrival rate x mean life. Arrivals
  // at 1 per tick; mean life so that `load` of the memory is held.
  const double mean_bytes = (32.0 - 1.0) / std::log(32.0) * kGiB;  // of the log-uniform
  const double mean_life = load * daemons * kDeviceBytes / mean_bytes;
  struct Leave {
    double at;
    int daemon;
    uint64_t bytes;
    bool operator>(const Leave& o) const { return at > o.at; }
  };
  std::priority_queue<Leave, std::vector<Leave>, std::greater<Leave>> leaving;
  Result r;
  uint64_t total_free = uint64_t(daemons) * kDeviceBytes;
  std::vector<DeviceLoad> asked;
  std::vector<double> open_us;
  double choose_ns = 0;
  uint64_t probes = 0;
  for (int t = 0; t < sessions; ++t) {
    while (!leaving.empty() && leaving.top().at <= t) {
      const Leave l = leaving.top();
      leaving.pop();
      pool[l.daemon].memory_free_bytes += l.bytes;
      pool[l.daemon].sessions -= 1;
      total_free += l.bytes;
    }
    PlacementNeeds needs;
    needs.memory_bytes = SessionBytes(bits);
    const auto start = std::chrono::steady_clock::now();
    const std::vector<size_t> drawn =
        SampleDaemons(pool.size(), d <= 0 ? pool.size() : static_cast<size_t>(d), bits);
    asked.clear();
    for (size_t i : drawn) asked.push_back(pool[i]);
    auto best = ChooseDevice(asked, needs, "the simulated pool");
    choose_ns +=
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    probes += drawn.size();
    // The OpenSession: the slowest of the probes (sent at once), then one
    // round trip to the chosen daemon.
    double slowest = 0;
    for (size_t i = 0; i < drawn.size(); ++i) {
      slowest = std::max(slowest, rtt_us * std::exp(absl::Gaussian(bits, 0.0, 0.5)));
    }
    open_us.push_back(slowest + rtt_us * std::exp(absl::Gaussian(bits, 0.0, 0.5)));
    if (!best.ok()) {
      // Refused although some daemon of the pool had the room?
      for (const DeviceLoad& dev : pool) {
        if (dev.memory_free_bytes >= needs.memory_bytes) {
          ++r.refused_with_room;
          break;
        }
      }
      continue;
    }
    DeviceLoad& chosen = pool[asked[*best].daemon];
    chosen.memory_free_bytes -= needs.memory_bytes;
    chosen.sessions += 1;
    total_free -= needs.memory_bytes;
    leaving.push({t + absl::Exponential(bits, 1.0 / mean_life), static_cast<int>(chosen.daemon),
                  needs.memory_bytes});
  }
  std::vector<double> held;
  for (const DeviceLoad& dev : pool) {
    held.push_back(static_cast<double>(kDeviceBytes - dev.memory_free_bytes));
  }
  std::sort(held.begin(), held.end());
  double mean = 0;
  for (double h : held) mean += h;
  mean /= held.size();
  r.mean_load = mean / kDeviceBytes;
  r.max_over_mean = held.back() / mean;
  r.p99_over_mean = held[held.size() * 99 / 100] / mean;
  r.probes = static_cast<double>(probes) / sessions;
  r.choose_ns = choose_ns / sessions;
  std::sort(open_us.begin(), open_us.end());
  r.open_p50_us = open_us[open_us.size() / 2];
  r.open_p99_us = open_us[open_us.size() * 99 / 100];
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int daemons = absl::GetFlag(FLAGS_daemons);
  const int sessions = absl::GetFlag(FLAGS_sessions);
  const double load = absl::GetFlag(FLAGS_load);
  const double rtt = absl::GetFlag(FLAGS_rtt_us);
  std::printf(
      "placement of %d sessions (1-32 GiB each) on %d simulated daemons of 141 GiB, mean load "
      "%.0f%%, probe round trip median %.0f us\n",
      sessions, daemons, load * 100, rtt);
  std::printf("%-8s %10s %10s %10s %18s %12s %12s %16s %16s\n", "choices", "mean load", "max/mean",
              "p99/mean", "refused with room", "probes/open", "choice CPU", "OpenSession p50",
              "OpenSession p99");
  for (int d : {1, 2, 3, 0}) {
    const Result r = Run(daemons, d, sessions, load, rtt, absl::GetFlag(FLAGS_seed));
    std::printf("%-8s %9.0f%% %10.2f %10.2f %18llu %12.0f %9.1f us %13.0f us %13.0f us\n",
                d == 0 ? "all" : absl::StrFormat("d = %d", d).c_str(), r.mean_load * 100,
                r.max_over_mean, r.p99_over_mean,
                static_cast<unsigned long long>(r.refused_with_room), r.probes, r.choose_ns / 1000,
                r.open_p50_us, r.open_p99_us);
  }
  return 0;
}
