#ifndef GPUEXEC_SERVER_COMMON_CORES_H_
#define GPUEXEC_SERVER_COMMON_CORES_H_

// The cores this process may run on: the CPUs of its affinity mask, and no
// more than its cgroup's CPU quota (cgroup v2 `cpu.max`, rounded up) where
// one is set, as in a container with a CPU limit. The daemon's defaults
// that spend a core (busy polling, the workers' read thread) ask this, not
// the host's count, which a container or `taskset` does not lower.

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

namespace gpuexec {

// `cpu_max` is cgroup v2's "QUOTA PERIOD" or "max PERIOD"; 0: no limit.
inline unsigned CoresOfQuota(const std::string& cpu_max) {
  long long quota = 0, period = 0;
  if (std::sscanf(cpu_max.c_str(), "%lld %lld", &quota, &period) != 2 || quota <= 0 ||
      period <= 0) {
    return 0;  // "max", or unreadable: no limit
  }
  return static_cast<unsigned>(std::max(1LL, (quota + period - 1) / period));
}

inline unsigned UsableCores() {
  unsigned cores = std::thread::hardware_concurrency();
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  std::ifstream f("/sys/fs/cgroup/cpu.max");
  std::string line;
  if (std::getline(f, line)) {
    if (const unsigned quota = CoresOfQuota(line); quota != 0) cores = std::min(cores, quota);
  }
  return std::max(1u, cores);
}

}  // namespace gpuexec

#endif  // GPUEXEC_SERVER_COMMON_CORES_H_
