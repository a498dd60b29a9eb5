#include "server/metrics/process_metrics.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace gpuexec::metrics {
namespace {

// The whole of a small /proc file, at most `limit` bytes of it.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t limit) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    return e == ENOENT || e == ESRCH
               ? absl::NotFoundError(absl::StrCat(path, ": ", strerror(e)))
               : absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", strerror(e)));
  }
  std::string text;
  char buf[4096];
  while (text.size() < limit) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      close(fd);
      // A process that exits while its file is read answers ESRCH.
      return e == ESRCH
                 ? absl::NotFoundError(absl::StrCat(path, ": ", strerror(e)))
                 : absl::UnavailableError(absl::StrCat("cannot read ", path, ": ", strerror(e)));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return text;
}

// The boot time in seconds since the epoch (/proc/stat's btime); 0 if
// unknown. Read once: it does not change while the system runs.
double BootTime() {
  static const double boot = [] {
    // Many CPUs make /proc/stat long; btime comes after the CPU lines and
    // the interrupt counts.
    absl::StatusOr<std::string> text = ReadSmallFile("/proc/stat", 16 << 20);
    if (!text.ok()) return 0.0;
    for (absl::string_view line : absl::StrSplit(*text, '\n')) {
      if (absl::ConsumePrefix(&line, "btime ")) {
        uint64_t seconds = 0;
        if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &seconds)) {
          return static_cast<double>(seconds);
        }
      }
    }
    return 0.0;
  }();
  return boot;
}

// Descriptors of `pid`, up to kMaxFdsCounted; nullopt where /proc does not
// tell this process.
std::optional<uint64_t> CountOpenFds(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/fd");
  if (DIR* dir = opendir(path.c_str()); dir != nullptr) {
    uint64_t n = 0;
    while (n < kMaxFdsCounted) {
      const struct dirent* e = readdir(dir);
      if (e == nullptr) break;
      if (e->d_name[0] == '.') continue;  // "." and ".."; descriptors are digits
      ++n;
    }
    closedir(dir);
    // The directory's own descriptor, when this process lists itself.
    if (pid == getpid() && n > 0) --n;
    return n;
  }
  // Another uid's, or a non-dumpable process's: Linux 6.2+ gives the count
  // as the directory's size (0 before, and no live process has none).
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && st.st_size > 0) {
    return std::min<uint64_t>(static_cast<uint64_t>(st.st_size), kMaxFdsCounted);
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<ProcStat> ParseProcStat(absl::string_view line) {
  // "pid (comm) state ppid ...": the command name may hold anything but
  // ends at the last ')'.
  const size_t close_paren = line.rfind(')');
  if (close_paren == absl::string_view::npos) {
    return absl::InvalidArgumentError("no command name in /proc/<pid>/stat");
  }
  const std::vector<absl::string_view> f =
      absl::StrSplit(line.substr(close_paren + 1), ' ', absl::SkipWhitespace());
  // f[0] is field 3 (state): field N is f[N - 3].
  constexpr size_t kUtime = 14 - 3, kStime = 15 - 3, kStart = 22 - 3, kVsize = 23 - 3,
                   kRss = 24 - 3;
  if (f.size() <= kRss) {
    return absl::InvalidArgumentError(
        absl::StrCat("/proc/<pid>/stat has ", f.size() + 2, " fields, fewer than 24"));
  }
  ProcStat s;
  int64_t rss = 0;
  if (!absl::SimpleAtoi(f[kUtime], &s.utime_ticks) ||
      !absl::SimpleAtoi(f[kStime], &s.stime_ticks) ||
      !absl::SimpleAtoi(f[kStart], &s.start_ticks) ||
      !absl::SimpleAtoi(f[kVsize], &s.vsize_bytes) || !absl::SimpleAtoi(f[kRss], &rss)) {
    return absl::InvalidArgumentError("/proc/<pid>/stat holds a field that is not a number");
  }
  s.rss_pages = rss > 0 ? static_cast<uint64_t>(rss) : 0;
  return s;
}

std::optional<uint64_t> ParseMaxOpenFiles(absl::string_view limits) {
  // "Max open files            1024                 1048576              files"
  for (absl::string_view line : absl::StrSplit(limits, '\n')) {
    if (!absl::ConsumePrefix(&line, "Max open files")) continue;
    const std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    uint64_t soft = 0;
    if (!f.empty() && absl::SimpleAtoi(f[0], &soft)) return soft;
    return std::nullopt;  // "unlimited"
  }
  return std::nullopt;
}

absl::StatusOr<ProcessStats> ReadProcessStats(pid_t pid) {
  absl::StatusOr<std::string> stat_line = ReadSmallFile(absl::StrCat("/proc/", pid, "/stat"), 4096);
  if (!stat_line.ok()) return stat_line.status();
  absl::StatusOr<ProcStat> st = ParseProcStat(*stat_line);
  if (!st.ok()) return st.status();
  static const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  ProcessStats p;
  p.cpu_seconds = static_cast<double>(st->utime_ticks + st->stime_ticks) / ticks;
  p.resident_bytes = st->rss_pages * page;
  p.virtual_bytes = st->vsize_bytes;
  // Whole seconds (btime's resolution anyway): the exposition prints a
  // fraction with 9 significant digits (FormatValue), which would cut a
  // timestamp to tens of seconds; an integer prints exactly.
  p.start_time_seconds = std::round(BootTime() + static_cast<double>(st->start_ticks) / ticks);
  absl::StatusOr<std::string> limits =
      ReadSmallFile(absl::StrCat("/proc/", pid, "/limits"), 16 << 10);
  if (limits.ok()) p.max_fds = ParseMaxOpenFiles(*limits);
  p.open_fds = CountOpenFds(pid);
  return p;
}

void CollectProcesses(const std::vector<ProcessTarget>& targets, Sink& sink) {
  std::vector<std::pair<const ProcessTarget*, ProcessStats>> read;
  for (const ProcessTarget& t : targets) {
    absl::StatusOr<ProcessStats> s = ReadProcessStats(t.pid);
    if (s.ok()) read.emplace_back(&t, *std::move(s));
  }
  auto family = [&](const char* name, const char* type, const char* help, auto value) {
    sink.Declare(name, type, help);
    for (const auto& [t, s] : read) {
      const std::optional<double> v = value(s);
      if (v.has_value()) sink.Sample(name, t->labels, *v);
    }
  };
  using Opt = std::optional<double>;
  family("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.",
         [](const ProcessStats& s) -> Opt { return s.cpu_seconds; });
  family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
         [](const ProcessStats& s) -> Opt { return static_cast<double>(s.resident_bytes); });
  family("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.",
         [](const ProcessStats& s) -> Opt { return static_cast<double>(s.virtual_bytes); });
  family("process_open_fds", "gauge", "Number of open file descriptors.",
         [](const ProcessStats& s) -> Opt {
           return s.open_fds ? Opt(static_cast<double>(*s.open_fds)) : std::nullopt;
         });
  family("process_max_fds", "gauge", "Maximum number of open file descriptors.",
         [](const ProcessStats& s) -> Opt {
           return s.max_fds ? Opt(static_cast<double>(*s.max_fds)) : std::nullopt;
         });
  family("process_start_time_seconds", "gauge",
         "Start time of the process since unix epoch in seconds.",
         [](const ProcessStats& s) -> Opt { return s.start_time_seconds; });
}

void AddProcessCollector(Registry* registry, std::function<std::vector<ProcessTarget>()> workers) {
  registry->AddCollector([workers = std::move(workers)](Sink& sink) {
    std::vector<ProcessTarget> targets = {{getpid(), {{"process", "front"}}}};
    if (workers) {
      for (ProcessTarget& w : workers()) targets.push_back(std::move(w));
    }
    CollectProcesses(targets, sink);
  });
}

}  // namespace gpuexec::metrics
