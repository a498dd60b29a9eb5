#ifndef GPUEXEC_TESTS_SUPPORT_CPU_TICKS_H_
#define GPUEXEC_TESTS_SUPPORT_CPU_TICKS_H_

// The CPU a process has used, from /proc/PID/stat, for tests that a
// waiting process waits asleep.

#include <sys/types.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

namespace gpuexec::testing {

// User + system CPU of `pid`, in clock ticks; -1 when it cannot be read.
inline int64_t CpuTicks(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');  // the name may hold spaces and parentheses
  if (paren == std::string::npos || paren + 2 > stat.size()) return -1;
  std::istringstream rest(stat.substr(paren + 2));
  std::string field;
  int64_t utime = 0, stime = 0;
  // Fields 3.. follow the name; utime and stime are the 14th and 15th.
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoll(field);
    if (i == 15) stime = std::stoll(field);
  }
  return utime + stime;
}

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_SUPPORT_CPU_TICKS_H_
