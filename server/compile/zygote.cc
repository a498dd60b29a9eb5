// Starting compile processes, cold or from the warm one (zygote.h).

#include "server/compile/zygote.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "compile.pb.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/compile/compile_main.h"
#include "server/compile/frame.h"
#include "server/shm/region_fd.h"

extern char** environ;

namespace gpuexec::compile {

std::vector<std::string> CompileEnvironment(const std::string& dir) {
  std::vector<std::string> env = {"PATH=/usr/bin:/bin", absl::StrCat("TMPDIR=", dir),
                                  absl::StrCat("HOME=", dir), "LANG=C"};
  for (char** e = environ; *e != nullptr; ++e) {
    if (absl::StartsWith(*e, "LD_LIBRARY_PATH=") || absl::StartsWith(*e, "GXFAKE_")) {
      env.emplace_back(*e);
    }
  }
  return env;
}

absl::StatusOr<pid_t> SpawnCompileProcess(const std::string& program,
                                          const std::vector<std::string>& args,
                                          const std::vector<std::string>& env, int socket) {
  std::vector<char*> argv, envp;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  argv.push_back(nullptr);
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, socket, kCompileSocketFd);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // SIGUSR1 is the daemon's drain: a `systemctl kill -s USR1` that reaches
  // every process of the unit must not end a compile.
  sigset_t none, defaults;
  sigemptyset(&none);
  sigaddset(&none, SIGUSR1);
  sigemptyset(&defaults);
  for (int sig : {SIGPIPE, SIGXCPU, SIGXFSZ, SIGTERM, SIGINT, SIGHUP}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  // A session of its own: out of the daemon's process group (a signal to
  // the group, a terminal's ^C, does not reach it; it ends with the daemon
  // by PR_SET_PDEATHSIG).
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSID);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, program.c_str(), &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (spawned != 0) {
    return absl::InternalError(
        absl::StrCat("cannot start the compile process (", program, "): ", strerror(spawned)));
  }
  return pid;
}

absl::StatusOr<std::unique_ptr<Zygote>> Zygote::Start(const Options& options) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return absl::InternalError(absl::StrCat("socketpair: ", strerror(errno)));
  }
  const std::vector<std::string> args = {options.program, kCompileArg, kWarmArg,
                                         absl::StrCat("--parent=", getpid())};
  absl::StatusOr<pid_t> pid =
      SpawnCompileProcess(options.program, args, CompileEnvironment("/nonexistent"), sv[1]);
  close(sv[1]);
  if (!pid.ok()) {
    close(sv[0]);
    return pid.status();
  }
  // From here the destructor kills and reaps it, whatever follows.
  std::unique_ptr<Zygote> z(new Zygote(*pid, sv[0]));
  wire::Request req;
  req.add_nvrtc(options.nvrtc);
  req.set_warm_up(options.warm_up);
  req.set_warm_up_arch(options.warm_up_arch);
  std::string bytes;
  req.SerializeToString(&bytes);
  const absl::Time deadline = absl::Now() + options.timeout;
  absl::Status sent = WriteFrame(z->control_, bytes, deadline);
  absl::StatusOr<std::string> answer =
      sent.ok() ? ReadFrame(z->control_, 1 << 20, deadline) : absl::StatusOr<std::string>(sent);
  wire::Reply reply;
  if (!answer.ok() || !reply.ParseFromString(*answer)) {
    return absl::InternalError(absl::StrCat(
        "the warm compile process did not answer (",
        answer.ok() ? "an answer that does not parse" : answer.status().message(), ")"));
  }
  if (reply.outcome() != wire::Reply::OK) {
    return absl::FailedPreconditionError(
        absl::StrCat("the warm compile process cannot serve: ", Quoted(reply.message(), 256)));
  }
  return z;
}

Zygote::~Zygote() {
  close(control_);
  kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

absl::StatusOr<pid_t> Zygote::Fork(const std::string& dir, const sandbox::Limits& limits,
                                   int socket, absl::Duration timeout) {
  wire::Fork fork;
  fork.set_tmp(dir);
  fork.set_memory_bytes(limits.memory_bytes);
  fork.set_cpu_s(limits.cpu_seconds);
  fork.set_cpu_total_s(limits.cpu_total_seconds);
  std::string bytes;
  fork.SerializeToString(&bytes);
  const absl::Time deadline = absl::Now() + timeout;
  GPUEXEC_RETURN_IF_ERROR(WriteFrame(control_, bytes, deadline));
  const char byte = 0;
  GPUEXEC_RETURN_IF_ERROR(shm::SendWithDescriptor(control_, &byte, 1, socket));
  GPUEXEC_ASSIGN_OR_RETURN(std::string answer, ReadFrame(control_, 4096, deadline));
  wire::Forked forked;
  if (!forked.ParseFromString(answer)) {
    return absl::InternalError("the warm compile process answered a fork that does not parse");
  }
  if (forked.pid() <= 1 || forked.pid() == pid_) {
    return absl::InternalError(
        absl::StrCat("the warm compile process could not fork: ", Quoted(forked.message(), 256)));
  }
  // It must be this process's child: it is killed and waited for as one.
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(forked.pid()), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
    return absl::InternalError(absl::StrCat("the warm compile process answered pid ", forked.pid(),
                                            ", not a child of the daemon"));
  }
  return static_cast<pid_t>(forked.pid());
}

CompileStarter::CompileStarter(Options options) : options_(std::move(options)) {
  if (options_.warm && options_.reuse) sweeper_ = std::thread([this] { Sweep(); });
}

CompileStarter::~CompileStarter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    idle_changed_.Signal();
  }
  if (sweeper_.joinable()) sweeper_.join();
  absl::MutexLock lock(&mu_);
  EndIdleLocked(/*all=*/true);
  zygote_.reset();
}

namespace {

// Whether a process that ended with `wait_status` crashed: a signal other
// than the daemon's own SIGKILL and the limits' signals.
bool Crashed(int wait_status) {
  if (!WIFSIGNALED(wait_status)) return false;
  const int sig = WTERMSIG(wait_status);
  return sig != SIGKILL && sig != SIGXCPU && sig != SIGXFSZ;
}

// Kills and reaps `p`; true when it had crashed.
bool EndProcess(const CompileStarter::Started& p) {
  close(p.socket);
  kill(p.pid, SIGKILL);
  int status = 0;
  while (waitpid(p.pid, &status, 0) < 0 && errno == EINTR) {
  }
  return Crashed(status);
}

// Whether a waiting process is still fit to serve: alive (not a zombie)
// and with nothing written on its socket since its last answer.
bool StillFit(const CompileStarter::Started& p) {
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(p.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
      info.si_pid != 0) {
    return false;
  }
  pollfd fd{p.socket, POLLIN, 0};
  return poll(&fd, 1, 0) == 0;
}

}  // namespace

int CompileStarter::IdleCountLocked() const {
  int n = 0;
  for (const auto& [scope, waiting] : idle_) n += static_cast<int>(waiting.size());
  return n;
}

void CompileStarter::EndIdleLocked(bool all) {
  const absl::Time now = absl::Now();
  bool crashed = false;
  for (auto it = idle_.begin(); it != idle_.end();) {
    std::vector<Started>& waiting = it->second;
    for (auto p = waiting.begin(); p != waiting.end();) {
      if (!all && now - p->idle_since < kIdleFor) {
        ++p;
        continue;
      }
      crashed |= EndProcess(*p);
      p = waiting.erase(p);
    }
    if (waiting.empty()) {
      idle_.erase(it++);
    } else {
      ++it;
    }
  }
  if (crashed) CrashedLocked();
}

void CompileStarter::CrashedLocked() {
  // Every fork shares the warm process's layout: it is replaced, and the
  // forks that wait end with it.
  zygote_.reset();
  retry_at_ = absl::InfinitePast();
  EndIdleLocked(/*all=*/true);
}

bool CompileStarter::Keep(Started started, const std::string& scope) {
  if (!started.warm || !options_.reuse || started.served + 1 >= kMaxServed) return false;
  absl::MutexLock lock(&mu_);
  EndIdleLocked(/*all=*/false);
  if (IdleCountLocked() >= kMaxIdle || !StillFit(started)) return false;
  // Stopped while it waits: it runs nothing until its next compile.
  if (kill(started.pid, SIGSTOP) != 0) return false;
  ++started.served;
  started.idle_since = absl::Now();
  idle_[scope].push_back(started);
  idle_changed_.Signal();
  return true;
}

void CompileStarter::Sweep() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    idle_changed_.WaitWithTimeout(&mu_, absl::Seconds(5));
    EndIdleLocked(/*all=*/false);
  }
}

void CompileStarter::UseNvrtc(const std::string& nvrtc) {
  absl::MutexLock lock(&mu_);
  nvrtc_ = nvrtc;
  if (options_.warm) StartZygote();
}

void CompileStarter::StartZygote() {
  Zygote::Options zo;
  zo.program = options_.program;
  zo.nvrtc = nvrtc_;
  zo.warm_up_arch = options_.warm_up_arch;
  zo.warm_up = warm_up_;
  zo.timeout = options_.start_timeout;
  absl::StatusOr<std::unique_ptr<Zygote>> z = Zygote::Start(zo);
  if (!z.ok() && warm_up_ && absl::IsFailedPrecondition(z.status())) {
    // NVRTC's warm-up may leave a thread behind; without it the process
    // may still fork.
    warm_up_ = false;
    zo.warm_up = false;
    z = Zygote::Start(zo);
  }
  if (z.ok()) {
    zygote_ = *std::move(z);
    zygote_since_ = absl::Now();
    zygote_forks_ = 0;
    retry_after_ = absl::Seconds(1);
    error_.clear();
    return;
  }
  error_ = std::string(z.status().message());
  never_ = absl::IsFailedPrecondition(z.status());
  retry_at_ = absl::Now() + retry_after_;
  retry_after_ = std::min(retry_after_ * 2, absl::Seconds(60));
}

absl::StatusOr<CompileStarter::Started> CompileStarter::Start(const std::string& dir,
                                                              const std::string& scope) {
  if (options_.warm) {
    absl::MutexLock lock(&mu_);
    EndIdleLocked(/*all=*/false);
    while (idle_.contains(scope)) {
      auto it = idle_.find(scope);
      Started waiting = it->second.back();
      it->second.pop_back();
      if (it->second.empty()) idle_.erase(it);
      if (StillFit(waiting) && kill(waiting.pid, SIGCONT) == 0) {
        ++reuses_;
        return waiting;
      }
      // Died while it waited, or wrote unasked: never served again.
      if (EndProcess(waiting)) CrashedLocked();
    }
    if (zygote_ != nullptr &&
        (zygote_forks_ >= kMaxForks || absl::Now() - zygote_since_ >= kMaxAge)) {
      zygote_.reset();  // replaced now: a fresh canary and address layout
      retry_at_ = absl::InfinitePast();
    }
    if (zygote_ == nullptr && !never_ && !nvrtc_.empty() && absl::Now() >= retry_at_) {
      StartZygote();
    }
    if (zygote_ != nullptr) {
      int sv[2];
      if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        return absl::InternalError(absl::StrCat("socketpair: ", strerror(errno)));
      }
      sandbox::Limits limits = options_.limits;
      limits.cpu_total_seconds = static_cast<uint32_t>(
          std::min<uint64_t>(uint64_t{limits.cpu_seconds} * kMaxServed + 1, 86400));
      absl::StatusOr<pid_t> pid = zygote_->Fork(dir, limits, sv[1], options_.fork_timeout);
      close(sv[1]);
      if (pid.ok()) {
        ++zygote_forks_;
        ++warm_starts_;
        return Started{*pid, sv[0], true};
      }
      // Broken (killed, or it stopped answering): this compile starts cold
      // on a socket of its own (a fork that did happen reads the end of
      // this one and exits); a later compile starts a new warm process.
      close(sv[0]);
      error_ = std::string(pid.status().message());
      zygote_.reset();
      retry_at_ = absl::Now() + retry_after_;
    }
  }
  return StartCold(dir);
}

absl::StatusOr<CompileStarter::Started> CompileStarter::StartCold(const std::string& dir) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return absl::InternalError(absl::StrCat("socketpair: ", strerror(errno)));
  }
  const std::vector<std::string> args = {
      options_.program,
      kCompileArg,
      absl::StrCat("--memory_bytes=", options_.limits.memory_bytes),
      absl::StrCat("--cpu_s=", options_.limits.cpu_seconds),
      absl::StrCat("--tmp=", dir),
      absl::StrCat("--parent=", getpid())};
  absl::StatusOr<pid_t> pid =
      SpawnCompileProcess(options_.program, args, CompileEnvironment(dir), sv[1]);
  close(sv[1]);
  if (!pid.ok()) {
    close(sv[0]);
    return pid.status();
  }
  absl::MutexLock lock(&mu_);
  ++cold_starts_;
  return Started{*pid, sv[0], false};
}

void CompileStarter::Ended(const Started& started, int wait_status) {
  if (!started.warm || !Crashed(wait_status)) return;
  absl::MutexLock lock(&mu_);
  CrashedLocked();
}

std::string CompileStarter::mode() const {
  absl::MutexLock lock(&mu_);
  if (!options_.warm) return "each compile process started cold";
  if (zygote_ == nullptr) {
    return absl::StrCat(
        "each compile process started cold for now (the warm one cannot serve: ", error_, ")");
  }
  return warm_up_ ? "compile processes forked from a warm one (NVRTC loaded and warmed up)"
                  : "compile processes forked from a warm one (NVRTC loaded)";
}

pid_t CompileStarter::zygote_pid() const {
  absl::MutexLock lock(&mu_);
  return zygote_ != nullptr ? zygote_->pid() : 0;
}

int64_t CompileStarter::warm_starts() const {
  absl::MutexLock lock(&mu_);
  return warm_starts_;
}

int64_t CompileStarter::reuses() const {
  absl::MutexLock lock(&mu_);
  return reuses_;
}

int64_t CompileStarter::cold_starts() const {
  absl::MutexLock lock(&mu_);
  return cold_starts_;
}

}  // namespace gpuexec::compile
