#ifndef GPUEXEC_SERVER_METRICS_PROCESS_METRICS_H_
#define GPUEXEC_SERVER_METRICS_PROCESS_METRICS_H_

// The Prometheus client libraries' standard process_* metrics, for the
// daemon's front process and each of its workers, read from /proc at
// scrape time:
//   process_cpu_seconds_total       user + system CPU time (stat)
//   process_resident_memory_bytes   resident set (stat's rss pages)
//   process_virtual_memory_bytes    virtual memory (stat's vsize)
//   process_open_fds                entries of /proc/<pid>/fd
//   process_max_fds                 the soft "Max open files" (limits)
//   process_start_time_seconds      since the epoch (stat's starttime and
//                                   /proc/stat's btime)
// with the label process="front" or "worker" and the worker's own labels.
//
// Workers are non-dumpable (worker/sandbox.h): the front cannot list their
// /proc/<pid>/fd, and reads the count from stat()'s size of that directory
// instead (Linux 6.2+); where neither works the process has no
// process_open_fds sample. A process that ends between the listing and the
// reading has no samples at all; that is no error.
//
// Bounded work: at most kMaxFdsCounted descriptors are counted per
// process. No gRPC and no CUDA here.

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/metrics/metrics.h"

namespace gpuexec::metrics {

inline constexpr uint64_t kMaxFdsCounted = 1 << 20;

struct ProcessStats {
  double cpu_seconds = 0;
  uint64_t resident_bytes = 0;
  uint64_t virtual_bytes = 0;
  double start_time_seconds = 0;     // since the Unix epoch, whole seconds
  std::optional<uint64_t> open_fds;  // unknown where /proc does not say
  std::optional<uint64_t> max_fds;   // unknown, or unlimited
};

// What /proc/<pid>/stat says, in its own units (clock ticks, pages).
struct ProcStat {
  uint64_t utime_ticks = 0;
  uint64_t stime_ticks = 0;
  uint64_t start_ticks = 0;  // after boot
  uint64_t vsize_bytes = 0;
  uint64_t rss_pages = 0;
};
// Parses the one line of /proc/<pid>/stat (whose command name, in
// parentheses, may hold spaces and parentheses); INVALID_ARGUMENT if it
// is not such a line.
absl::StatusOr<ProcStat> ParseProcStat(absl::string_view line);
// The soft limit of "Max open files" in /proc/<pid>/limits; nullopt if
// unlimited or absent.
std::optional<uint64_t> ParseMaxOpenFiles(absl::string_view limits);

// Reads process `pid`'s figures; NOT_FOUND if it is gone (or a zombie with
// no memory left to read), another error if /proc cannot be read.
absl::StatusOr<ProcessStats> ReadProcessStats(pid_t pid);

// A process to report, and the labels that name it (process="..." first).
struct ProcessTarget {
  pid_t pid = 0;
  Labels labels;
};

// Writes the process_* families for `targets` (each declared once, even
// with no sample); processes that are gone are left out.
void CollectProcesses(const std::vector<ProcessTarget>& targets, Sink& sink);

// Adds process_* for this process ({process="front"}) and for those
// `workers` lists at each scrape (may be null: the front alone).
void AddProcessCollector(Registry* registry, std::function<std::vector<ProcessTarget>()> workers);

}  // namespace gpuexec::metrics

#endif  // GPUEXEC_SERVER_METRICS_PROCESS_METRICS_H_
