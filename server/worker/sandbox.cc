// The worker's confinement (sandbox.h); the seccomp filter is the daemon's
// shared deny list (server/common/seccomp.h).
#include "server/worker/sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/common/log.h"
#include "server/common/seccomp.h"
#include "server/common/text.h"
#include "server/common/thread_name.h"

namespace gpuexec::worker::sandbox {
namespace {

// What a driver run as root may still need on its device nodes and pinned
// memory; every other capability leaves the worker.
constexpr int kKeptCapabilities[] = {
    CAP_CHOWN,    CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER,       CAP_FSETID,
    CAP_IPC_LOCK, CAP_IPC_OWNER,    CAP_SYS_NICE,        CAP_SYS_RESOURCE, CAP_MKNOD};

bool Kept(int cap) {
  return std::find(std::begin(kKeptCapabilities), std::end(kKeptCapabilities), cap) !=
         std::end(kKeptCapabilities);
}

absl::Status Refused(absl::string_view step) {
  return absl::InternalError(
      absl::StrCat("the worker's sandbox: the kernel refused ", step, ": ", strerror(errno),
                   " (gpuexecd --worker_sandbox=off runs workers without it)"));
}

// Drops every capability outside kKeptCapabilities; returns how many left
// the bounding set.
absl::StatusOr<int> DropCapabilities() {
  int dropped = 0;
  // The bounding set first: dropping from it needs CAP_SETPCAP, which the
  // capset below takes away. Without CAP_SETPCAP (a daemon not run as
  // root) the bounding set stays, and no_new_privs keeps it from mattering.
  for (int cap = 0; cap < 64; ++cap) {
    if (Kept(cap) || prctl(PR_CAPBSET_READ, cap, 0, 0, 0) != 1) continue;
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0) {
      ++dropped;
    } else if (errno == EPERM) {
      break;
    }
  }
  (void)prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &header, data) != 0) return Refused("capget");
  bool any = false;
  for (int cap = 0; cap < 64; ++cap) {
    const uint32_t bit = 1u << (cap % 32);
    __user_cap_data_struct& d = data[cap / 32];
    if (Kept(cap) || ((d.effective | d.permitted | d.inheritable) & bit) == 0) continue;
    d.effective &= ~bit;
    d.permitted &= ~bit;
    d.inheritable &= ~bit;
    any = true;
  }
  if (any && syscall(SYS_capset, &header, data) != 0) return Refused("capset");
  return dropped;
}

}  // namespace

absl::Status ConfineFront() {
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return Refused("PR_SET_DUMPABLE 0");
  return absl::OkStatus();
}

bool WorkerSandboxOff() {
  const char* v = std::getenv("GPUEXEC_WORKER_SANDBOX");
  if (v == nullptr) return false;
  const std::string s = absl::AsciiStrToLower(v);
  return s == "off" || s == "0" || s == "false" || s == "no";
}

absl::StatusOr<Confinement> ConfineWorker(bool sandbox_off) {
  Confinement c;
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return Refused("PR_SET_DUMPABLE 0");
  c.dumpable_off = true;
  if (sandbox_off) return c;
  absl::StatusOr<int> dropped = DropCapabilities();
  if (!dropped.ok()) return dropped.status();
  c.capabilities_dropped = *dropped;
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return Refused("PR_SET_NO_NEW_PRIVS 1");
  c.no_new_privs = true;
  if (!seccomp::DenyCalls({}).ok()) return Refused("the seccomp filter");
  c.seccomp = true;
  return c;
}

// ---------------------------------------------------------- WorkerOutput

struct WorkerOutput::State {
  struct Source {
    int fd = -1;
    std::string label;
    std::string pending;  // bytes after the last newline
    double tokens = kBurst;
    absl::Time refilled = absl::Now();
    uint64_t left_out = 0;
  };

  absl::Mutex mu;
  std::vector<Source> added ABSL_GUARDED_BY(mu);
  int wake[2] = {-1, -1};
  std::atomic<uint64_t> logged{0};
  std::atomic<uint64_t> left_out{0};

  void Line(Source& s, absl::string_view line) {
    const absl::Time now = absl::Now();
    s.tokens = std::min<double>(
        kBurst, s.tokens + absl::ToDoubleSeconds(now - s.refilled) * kLinesPerSecond);
    s.refilled = now;
    if (s.tokens < 1) {
      ++s.left_out;
      left_out.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    s.tokens -= 1;
    Report(s);
    log::Info(s.label, " printed: \"", Quoted(line, kLineBytes), "\"");
    logged.fetch_add(1, std::memory_order_relaxed);
  }
  static void Report(Source& s) {
    if (s.left_out == 0) return;
    log::Warning(s.label, ": ", s.left_out, " printed lines left out (at most ", kBurst,
                 " at once, then ", kLinesPerSecond, " a second, are logged)");
    s.left_out = 0;
  }
  // Logs the complete lines of s.pending (and, at the end, the rest).
  void Lines(Source& s, bool end) {
    size_t from = 0;
    for (;;) {
      const size_t nl = s.pending.find('\n', from);
      if (nl == std::string::npos) break;
      Line(s, absl::string_view(s.pending).substr(from, nl - from));
      from = nl + 1;
    }
    s.pending.erase(0, from);
    while (s.pending.size() >= kLineBytes) {
      Line(s, absl::string_view(s.pending).substr(0, kLineBytes));
      s.pending.erase(0, kLineBytes);
    }
    if (end) {
      if (!s.pending.empty()) Line(s, s.pending);
      s.pending.clear();
      Report(s);
    }
  }

  void Loop() {
    NameThisThread("gx-worker-out");
    std::vector<Source> sources;
    std::vector<pollfd> fds;
    char buf[4096];
    for (;;) {
      fds.assign(1, pollfd{wake[0], POLLIN, 0});
      for (const Source& s : sources) fds.push_back(pollfd{s.fd, POLLIN, 0});
      if (poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
      if (fds[0].revents != 0) {
        while (read(wake[0], buf, sizeof(buf)) > 0) {
        }
        absl::MutexLock lock(&mu);
        for (Source& s : added) sources.push_back(std::move(s));
        added.clear();
      }
      // Sources added just now are polled next time round.
      for (size_t i = fds.size() - 1; i >= 1; --i) {
        if (fds[i].revents == 0) continue;
        Source& s = sources[i - 1];
        const ssize_t n = read(s.fd, buf, sizeof(buf));
        if (n > 0) {
          s.pending.append(buf, static_cast<size_t>(n));
          Lines(s, /*end=*/false);
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          Lines(s, /*end=*/true);
          close(s.fd);
          sources.erase(sources.begin() + static_cast<ptrdiff_t>(i - 1));
        }
      }
    }
  }
};

WorkerOutput::WorkerOutput() : state_(std::make_unique<State>()) {
  if (pipe2(state_->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    log::Error("cannot make the pipe of the workers' output reader: ", strerror(errno));
    return;
  }
  std::thread([s = state_.get()] { s->Loop(); }).detach();
}

WorkerOutput& WorkerOutput::Get() {
  // Never destroyed: its thread reads until the process ends.
  static WorkerOutput* const one = new WorkerOutput();
  return *one;
}

void WorkerOutput::Add(int fd, std::string label) {
  if (state_->wake[1] < 0) {
    close(fd);
    return;
  }
  (void)fcntl(fd, F_SETFL, O_NONBLOCK);
  {
    absl::MutexLock lock(&state_->mu);
    State::Source s;
    s.fd = fd;
    s.label = std::move(label);
    state_->added.push_back(std::move(s));
  }
  const char one = 1;
  (void)!write(state_->wake[1], &one, 1);
}

uint64_t WorkerOutput::lines_logged() const { return state_->logged.load(); }
uint64_t WorkerOutput::lines_left_out() const { return state_->left_out.load(); }

}  // namespace gpuexec::worker::sandbox
