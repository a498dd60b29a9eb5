#include "server/worker/remote_device.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/log.h"
#include "server/worker/channel.h"
#include "server/worker/convert.h"
#include "server/worker/worker_main.h"
#include "worker.pb.h"

extern char** environ;

namespace gpuexec::worker {
namespace {

// Moves `fd` above the descriptors a child gets (3 and 4), close-on-exec.
int HighFd(int fd) {
  if (fd < 0 || fd >= 10) return fd;
  const int high = fcntl(fd, F_DUPFD_CLOEXEC, 10);
  close(fd);
  return high;
}

// The `what` of a request (what it is about, for messages); "" if none.
// Requests that give something back (or only ask after the worker) go
// even past the bound on unsent requests: refusing them would leak.
bool Releases(const Request& r) {
  return r.has_free() || r.has_destroy_stream() || r.has_unload_module() || r.has_ping() ||
         r.has_query_memory();
}

std::string WhatOf(const Request& r) {
  switch (r.op_case()) {
    case Request::kAfterQueued:
      return r.after_queued().what();
    case Request::kAllocate:
      return r.allocate().what();
    case Request::kFree:
      return r.free().what();
    case Request::kMemset:
      return r.memset().what();
    case Request::kCopy:
      return r.copy().what();
    case Request::kCopyToDevice:
      return r.copy_to_device().what();
    case Request::kCopyToHost:
      return r.copy_to_host().what();
    case Request::kLoadModule:
      return r.load_module().what();
    case Request::kGetKernel:
      return r.get_kernel().what();
    case Request::kLaunch:
      return r.launch().what();
    default:
      return "";
  }
}

// How long a restarted worker may take to become ready.
constexpr absl::Duration kRestartTimeout = absl::Seconds(30);
// How soon a worker that the MPS server did not take yet is tried again.
constexpr absl::Duration kNotReadyRetry = absl::Milliseconds(100);

// How long the next start waits after `quick_failures` quick failures in a
// row: not at all for the first, then 250 ms doubling up to 30 s.
absl::Duration Backoff(int quick_failures) {
  if (quick_failures <= 1) return absl::ZeroDuration();
  return std::min(absl::Milliseconds(250) * (1 << std::min(quick_failures - 2, 7)),
                  absl::Seconds(30));
}

std::string Clock(absl::Time t) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%E3S UTC", t, absl::UTCTimeZone());
}

std::string ExitText(int status) {
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  return "ended";
}

}  // namespace

struct RemoteDevice::Connection {
  std::unique_ptr<Channel> channel;
  pid_t pid = 0;
  uint64_t epoch = 0;
  absl::Time started;
  std::thread reader;
  std::atomic<bool> exited{false};
  absl::Time ended_at = absl::InfiniteFuture();  // when it was reset (under the device's mu_)
  std::atomic<bool> abandon{false};              // shutdown gave up waiting for the process
  // Requests still pending when the worker was ended. They are failed only
  // once its process is gone: until then the GPU may still copy into or out
  // of the staging slots they hold, which must not be handed out again.
  absl::Mutex mu;
  bool reaped ABSL_GUARDED_BY(mu) = false;
  std::vector<ReplyFn> orphans ABSL_GUARDED_BY(mu);
  Reply orphan_reply ABSL_GUARDED_BY(mu);

  // Fails what waited for the process to be gone (it is, or it is taking
  // too long).
  void FailOrphans() {
    std::vector<ReplyFn> fns;
    Reply r;
    {
      absl::MutexLock lock(&mu);
      reaped = true;
      fns.swap(orphans);
      r = orphan_reply;
    }
    for (auto& fn : fns) fn(r, 0);
  }

  // Sends SIGKILL unless the process was already waited for (so that the
  // pid cannot have been reused).
  void Kill() {
    absl::MutexLock lock(&mu);
    if (!waited) kill(pid, SIGKILL);
  }

  // Waits for the process to exit (polling, so that shutdown can give up
  // on one stuck in the kernel, with `give_up_on_abandon`), killing it if
  // it is still there at `kill_at`; then reaps it. Returns its status.
  int Wait(absl::Time kill_at, bool give_up_on_abandon) {
    siginfo_t info;
    bool killed = false;
    for (;;) {
      info.si_pid = 0;
      const int rc = waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT);
      if (rc == 0 && info.si_pid == pid) break;
      if (rc != 0 && errno != EINTR) break;  // not our child any more
      if (give_up_on_abandon && abandon.load()) return -1;
      if (!killed && absl::Now() >= kill_at) {
        Kill();
        killed = true;
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
    int status = 0;
    absl::MutexLock lock(&mu);
    waited = true;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return status;
  }
  bool waited ABSL_GUARDED_BY(mu) = false;
};

RemoteDevice::RemoteDevice(const WorkerOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<RemoteDevice>> RemoteDevice::Start(const WorkerOptions& options,
                                                                  DriverInfo* info) {
  std::unique_ptr<RemoteDevice> dev(new RemoteDevice(options));
  absl::Status st = dev->Init();
  if (!st.ok()) return st;
  dev->monitor_ = std::thread([d = dev.get()] { d->Monitor(); });
  struct Started {
    RemoteDevice* d;
    static bool Check(Started* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->d->mu_) {
      return s->d->first_ready_ || !s->d->start_status_.ok();
    }
  } started{dev.get()};
  {
    absl::MutexLock lock(&dev->mu_);
    if (!dev->mu_.AwaitWithTimeout(absl::Condition(&Started::Check, &started),
                                   options.start_timeout)) {
      dev->start_status_ = absl::DeadlineExceededError(
          absl::StrCat("device ", options.ordinal, ": its worker did not start within ",
                       absl::FormatDuration(options.start_timeout)));
    }
    *info = dev->driver_info_;
    if (!dev->first_ready_) return dev->start_status_;
  }
  return dev;
}

absl::Status RemoteDevice::Init() {
  const std::string name = absl::StrCat("gpuexec-staging-", options_.ordinal);
  const uint64_t size = options_.staging_bytes * static_cast<uint64_t>(options_.staging_slots);
  staging_fd_ = HighFd(memfd_create(name.c_str(), MFD_CLOEXEC));
  if (staging_fd_ < 0 || ftruncate(staging_fd_, static_cast<off_t>(size)) != 0) {
    return absl::InternalError(absl::StrCat("device ", options_.ordinal,
                                            ": cannot create the shared staging memory (", size,
                                            " bytes): ", strerror(errno)));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, staging_fd_, 0);
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(
        "device ", options_.ordinal, ": cannot map the shared staging memory: ", strerror(errno)));
  }
  staging_memory_ = static_cast<uint8_t*>(p);
  std::vector<uint8_t*> slots;
  for (int i = 0; i < options_.staging_slots; ++i) {
    slots.push_back(staging_memory_ + i * options_.staging_bytes);
  }
  staging_.Reset(std::move(slots), options_.staging_bytes);
  return absl::OkStatus();
}

RemoteDevice::~RemoteDevice() {
  std::shared_ptr<Connection> conn;
  std::vector<ReplyFn> failed;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    state_ = State::kStopping;
    conn = std::move(conn_);
    conn_ = nullptr;
    for (auto& [id, fn] : pending_) failed.push_back(std::move(fn));
    pending_.clear();
  }
  Reply gone;
  ToProto(absl::UnavailableError(absl::StrCat("device ", options_.ordinal, " is shutting down")),
          gone.mutable_status());
  for (auto& fn : failed) fn(gone, 0);
  if (monitor_.joinable()) monitor_.join();
  std::vector<std::shared_ptr<Connection>> all;
  {
    absl::MutexLock lock(&mu_);
    all = std::move(retired_);
  }
  if (conn != nullptr) {
    // The worker sees the end of its socket, drains and exits.
    conn->channel->Shutdown();
    all.push_back(conn);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (auto& c : all) {
    while (!c->exited.load() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    if (!c->exited.load()) {
      log::Warning(Label(), ": worker pid ", c->pid,
                   " did not exit within 10 s of shutdown; killing it");
      c->Kill();
      const absl::Time killed = absl::Now();
      while (!c->exited.load() && absl::Now() - killed < absl::Seconds(2)) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      // A process stuck in the kernel: stop waiting for it.
      c->abandon.store(true);
    }
    if (c->reader.joinable()) c->reader.join();
    c->FailOrphans();
  }
  // Completions that others deferred meanwhile.
  for (;;) {
    std::vector<std::function<void()>> deferred;
    {
      absl::MutexLock lock(&mu_);
      deferred.swap(deferred_);
    }
    if (deferred.empty()) break;
    for (auto& fn : deferred) fn();
  }
  if (staging_memory_ != nullptr) {
    munmap(staging_memory_, options_.staging_bytes * static_cast<uint64_t>(options_.staging_slots));
  }
  if (staging_fd_ >= 0) close(staging_fd_);
}

// ------------------------------------------------------------ lifecycle

void RemoteDevice::Spawn() {
  int sv[2];
  absl::Status error;
  pid_t pid = 0;
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    error = absl::InternalError(absl::StrCat("socketpair: ", strerror(errno)));
  } else {
    sv[0] = HighFd(sv[0]);
    sv[1] = HighFd(sv[1]);
    const int buf = 4 << 20;
    for (int fd : sv) {
      setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
    }
    // argv[0] names the program as `ps` should show it, even when it is
    // started through /proc/self/exe.
    std::string name = options_.program;
    if (name == "/proc/self/exe") {
      char path[4096];
      const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
      if (n > 0) name.assign(path, static_cast<size_t>(n));
    }
    std::vector<std::string> args = {
        name,
        kWorkerArg,
        absl::StrCat("--device=", options_.ordinal),
        absl::StrCat("--driver=", options_.driver_library),
        absl::StrCat("--staging_bytes=", options_.staging_bytes),
        absl::StrCat("--staging_slots=", options_.staging_slots),
        absl::StrCat("--max_queued_launches=", options_.max_queued_launches),
        absl::StrCat("--log_level=", options_.log_level),
        absl::StrCat("--busy_poll_us=", absl::ToInt64Microseconds(options_.busy_poll))};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, sv[1], kSocketFd);
    posix_spawn_file_actions_adddup2(&fa, staging_fd_, kStagingFd);
    const int rc = posix_spawn(&pid, options_.program.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(sv[1]);
    if (rc != 0) {
      close(sv[0]);
      error = absl::InternalError(
          absl::StrCat("cannot start the worker program '", options_.program, "': ", strerror(rc)));
    }
  }
  if (!error.ok()) {
    absl::MutexLock lock(&mu_);
    const std::string why = absl::StrCat("device ", options_.ordinal, ": ", error.message());
    if (!first_ready_) {
      start_status_ = absl::Status(error.code(), why);
      return;
    }
    ++quick_failures_;
    // A start that fails outright waits even the first time.
    const absl::Duration delay = Backoff(quick_failures_ + 1);
    next_spawn_ = absl::Now() + delay;
    down_ = absl::UnavailableError(why);
    log::Error(why, "; trying again in ", absl::ToInt64Milliseconds(delay), " ms");
    return;
  }
  auto conn = std::make_shared<Connection>();
  conn->channel = std::make_unique<Channel>(sv[0], /*never_block=*/true);
  conn->pid = pid;
  conn->started = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    conn->epoch = epoch_;
    if (stop_) {
      conn->channel->Shutdown();
      retired_.push_back(conn);
    } else {
      conn_ = conn;
      state_ = State::kStarting;
      next_spawn_ = absl::InfiniteFuture();
    }
  }
  conn->reader = std::thread([this, conn] { ReadLoop(conn); });
  log::Debug(Label(), ": worker pid ", pid, " started (epoch ", conn->epoch, ")");
}

void RemoteDevice::Monitor() {
  Spawn();
  absl::Time last_ping = absl::Now();
  for (;;) {
    std::shared_ptr<Connection> hung;
    std::shared_ptr<Connection> slow_start;
    std::vector<std::shared_ptr<Connection>> overdue;
    absl::Duration silent;
    uint64_t ping_epoch = 0;
    bool spawn = false;
    bool ping = false;
    std::vector<std::shared_ptr<Connection>> reaped;
    std::vector<std::function<void()>> deferred;
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&RemoteDevice::MonitorDue, this),
                           absl::Milliseconds(100));
      stopping = stop_;
      const absl::Time now = absl::Now();
      // Memory queries the worker is late with are answered from the last
      // figure it gave.
      for (auto it = memory_queries_.begin(); it != memory_queries_.end();) {
        if (now - it->second.asked <= kAnswerWithin) {
          ++it;
          continue;
        }
        deferred_.push_back([done = std::move(it->second.done), last = memory_] { done(last); });
        memory_queries_.erase(it++);
      }
      deferred.swap(deferred_);
      if (state_ == State::kBackingOff && conn_ == nullptr && now >= next_spawn_) spawn = true;
      // A new worker that does not come up is ended like a stuck one.
      if (state_ == State::kStarting && first_ready_ && conn_ != nullptr &&
          now - conn_->started > kRestartTimeout) {
        slow_start = conn_;
      }
      if (state_ == State::kServing && conn_ != nullptr) {
        if (ping_out_ && now - ping_sent_ > options_.kernel_time_limit + absl::Seconds(30)) {
          hung = conn_;
          silent = now - ping_sent_;
        } else if (!ping_out_ && now - last_ping >= absl::Seconds(1)) {
          ping = true;
          ping_epoch = epoch_;
          ping_out_ = true;
          ping_sent_ = now;
          last_ping = now;
        }
      }
      // The readers of workers that are gone; joined below, unlocked (a
      // reader may still be finishing a reset).
      for (auto it = retired_.begin(); it != retired_.end();) {
        if ((*it)->exited.load()) {
          reaped.push_back(std::move(*it));
          it = retired_.erase(it);
        } else {
          // Requests of a worker whose process lingers are failed after
          // 10 s all the same.
          if (now - (*it)->ended_at > absl::Seconds(10)) overdue.push_back(*it);
          ++it;
        }
      }
    }
    for (auto& fn : deferred) fn();
    for (auto& c : reaped) {
      if (c->reader.joinable()) c->reader.join();
    }
    if (stopping) break;
    for (auto& c : overdue) c->FailOrphans();
    if (slow_start != nullptr) {
      Reset(slow_start,
            absl::StrCat("its new worker did not become ready within ",
                         absl::ToInt64Seconds(kRestartTimeout), " s"),
            /*kill=*/true);
    }
    if (spawn) Spawn();
    if (hung != nullptr) {
      Reset(hung,
            absl::StrCat("its worker answered no ping for ", absl::ToInt64Seconds(silent),
                         " s (a driver call that never returns)"),
            /*kill=*/true);
    }
    if (ping) {
      Request r;
      r.mutable_ping();
      Call(r, 0, 0, 0, [this, ping_epoch](const Reply&, uint64_t) {
        absl::MutexLock lock(&mu_);
        if (epoch_ == ping_epoch) ping_out_ = false;  // not a stale worker's
      });
    }
  }
}

void RemoteDevice::ReadLoop(std::shared_ptr<Connection> conn) {
  std::string frame;
  // Replies come in bursts (a launch's, then its synchronize's a few
  // microseconds later), and a client that waits for each answer sends its
  // next request soon after: after each reply, look again for a while
  // before sleeping, which saves the wake-up on the path of the next one.
  absl::Time last = absl::InfinitePast();
  for (;;) {
    const Channel::Poll got = conn->channel->TryReceive(&frame);
    if (got == Channel::Poll::kEnd) break;
    if (got == Channel::Poll::kNothing) {
      if (absl::Now() - last < options_.busy_poll) continue;
      if (!conn->channel->Receive(&frame)) break;
    }
    OnMessage(conn, frame);
    last = absl::Now();
  }
  bool current;
  {
    absl::MutexLock lock(&mu_);
    current = conn_ == conn;
  }
  if (current) {
    // The worker closed its end by itself: it is dying. Give it a moment to
    // finish, then make sure.
    const int status = conn->Wait(absl::Now() + absl::Seconds(2), /*give_up_on_abandon=*/false);
    conn->FailOrphans();
    conn->exited.store(true);
    Reset(conn, absl::StrCat("its worker (pid ", conn->pid, ") ", ExitText(status)),
          /*kill=*/false);
    return;
  }
  conn->Wait(absl::InfiniteFuture(), /*give_up_on_abandon=*/true);
  conn->FailOrphans();
  conn->exited.store(true);
}

void RemoteDevice::OnMessage(const std::shared_ptr<Connection>& conn, std::string& frame) {
  FromWorker m;
  if (!m.ParseFromString(frame)) {
    Reset(conn, "its worker sent an unreadable message", /*kill=*/true);
    return;
  }
  if (m.has_reply()) {
    ReplyFn fn;
    {
      absl::MutexLock lock(&mu_);
      if (conn_ != conn) return;  // a worker already replaced
      auto it = pending_.find(m.reply().id());
      if (it == pending_.end()) return;
      fn = std::move(it->second);
      pending_.erase(it);
    }
    fn(m.reply(), conn->epoch);
    return;
  }
  const Event& e = m.event();
  switch (e.event_case()) {
    case Event::kReady: {
      const absl::Status st = FromProto(e.ready().status());
      absl::ReleasableMutexLock lock(&mu_);
      if (conn_ != conn) return;
      if (!first_ready_) {
        driver_info_.driver_version = e.ready().driver_version();
        driver_info_.device_count = e.ready().device_count();
        driver_info_.test_double = e.ready().test_double();
        if (!st.ok()) {
          start_status_ = st;
          return;
        }
        props_ = FromProto(e.ready().properties());
        first_ready_ = true;
      }
      if (!st.ok() && e.ready().retry_soon() &&
          (not_ready_waits_ == 0 || absl::Now() - not_ready_since_ < kRestartTimeout)) {
        // Under MPS, after a fatal fault the server takes no new client
        // until every client it had is gone (the daemon's other workers of
        // this device find their faults and restart too). Not a new reset:
        // the same one, lasting a little longer. A new worker soon.
        conn_ = nullptr;
        retired_.push_back(conn);
        conn->ended_at = absl::Now();
        state_ = State::kBackingOff;
        next_spawn_ = absl::Now() + kNotReadyRetry;
        const bool first = ++not_ready_waits_ == 1;
        // Every 100 ms for 30 s from the first refusal; past that the
        // refusals count as failed starts (backing off), until one serves.
        if (first) not_ready_since_ = absl::Now();
        down_ = absl::UnavailableError(
            absl::StrCat("device ", options_.ordinal, " is restarting: ", st.message()));
        std::vector<ReplyFn> failed;
        for (auto& [id, fn] : pending_) failed.push_back(std::move(fn));
        pending_.clear();
        Reply r;
        ToProto(down_, r.mutable_status());
        lock.Release();
        conn->Kill();
        conn->channel->Shutdown();
        for (auto& fn : failed) fn(r, 0);
        if (first) {
          log::Info(Label(), ": its new worker waits for the MPS server (", st.message(),
                    "); trying again every ", absl::ToInt64Milliseconds(kNotReadyRetry), " ms");
        }
        return;
      }
      if (!st.ok()) {
        lock.Release();
        Reset(conn, absl::StrCat("its new worker could not start: ", st.message()),
              /*kill=*/true);
        return;
      }
      state_ = State::kServing;
      down_ = absl::OkStatus();
      ready_at_ = absl::Now();
      const int not_ready_waits = std::exchange(not_ready_waits_, 0);
      const uint64_t epoch = epoch_;
      const absl::Duration since = ready_at_ - reset_at_;
      const bool restarted = resets_ > 0;
      std::function<void()> on_state = state_listener_;
      lock.Release();
      if (on_state) on_state();
      if (restarted) {
        log::Info(Label(), ": worker pid ", conn->pid, " serving (epoch ", epoch, "), ",
                  absl::ToInt64Milliseconds(since), " ms after the reset",
                  not_ready_waits > 0 ? absl::StrCat(" (", not_ready_waits,
                                                     " start(s) before it waited for the "
                                                     "MPS server)")
                                      : std::string());
      } else {
        log::Debug(Label(), ": worker pid ", conn->pid, " serving");
      }
      return;
    }
    case Event::kFault:
      Reset(conn, e.fault().message(), /*kill=*/true, /*kernel_caused=*/true);
      return;
    case Event::kHung:
      Reset(conn, e.hung().message(), /*kill=*/true, /*kernel_caused=*/true);
      return;
    case Event::EVENT_NOT_SET:
      return;
  }
}

void RemoteDevice::Reset(const std::shared_ptr<Connection>& conn, const std::string& why,
                         bool kill_worker, bool kernel_caused) {
  std::vector<ReplyFn> failed;
  std::function<void(const ResetInfo&)> listener;
  std::function<void()> on_state;
  ResetInfo info;
  absl::Duration delay;
  absl::Status first_failure;
  {
    absl::MutexLock lock(&mu_);
    if (conn_ != conn || stop_) return;
    conn_ = nullptr;
    retired_.push_back(conn);
    const absl::Time now = absl::Now();
    conn->ended_at = now;
    for (auto& [id, fn] : pending_) failed.push_back(std::move(fn));
    pending_.clear();
    if (!first_ready_) {
      // The first start failed: Start() reports why; nothing restarts. A
      // worker that said why (its driver did not load, say) and then ended
      // keeps its own reason: the end is only its consequence.
      if (start_status_.ok()) {
        start_status_ = absl::UnavailableError(
            absl::StrCat("device ", options_.ordinal, ": ", why, " before it was ready"));
      }
      first_failure = start_status_;
      state_ = State::kStopping;
      next_spawn_ = absl::InfiniteFuture();
    } else {
      // A kernel's fault or hang says nothing about the worker: it restarts
      // at once. A worker that fails by itself soon after it came up (or
      // never came up) is a quick failure; from the second in a row on, the
      // next start waits, longer each time (250 ms doubling up to 30 s).
      if (kernel_caused) {
        quick_failures_ = 0;
      } else if (state_ != State::kServing || now - ready_at_ < absl::Seconds(10)) {
        ++quick_failures_;
      } else {
        quick_failures_ = 1;
      }
      delay = Backoff(quick_failures_);
      ++epoch_;
      ++resets_;
      reset_at_ = now;
      info = ResetInfo{options_.ordinal, epoch_, now, why};
      last_reset_ = info;
      history_.push_back(info);
      if (history_.size() > 64) history_.erase(history_.begin());
      down_ = absl::UnavailableError(
          absl::StrCat("device ", options_.ordinal, " is restarting: ", why));
      live_streams_.clear();
      live_modules_.clear();
      live_kernels_.clear();
      ping_out_ = false;
      state_ = State::kBackingOff;
      next_spawn_ = now + delay;
      listener = listener_;
      on_state = state_listener_;
    }
  }
  if (kill_worker) conn->Kill();
  conn->channel->Shutdown();
  Reply r;
  if (!first_failure.ok()) {
    ToProto(first_failure, r.mutable_status());
    for (auto& fn : failed) fn(r, 0);
    return;
  }
  log::Error(Label(), " reset (epoch ", info.epoch, "): ", why, "; worker pid ", conn->pid,
             kill_worker ? " killed" : " gone", ", its buffers are lost; restarting",
             delay > absl::ZeroDuration()
                 ? absl::StrCat(" in ", absl::ToInt64Milliseconds(delay), " ms")
                 : std::string(""));
  if (listener) listener(info);
  if (on_state) on_state();
  ToProto(absl::AbortedError(absl::StrCat("device ", options_.ordinal, " was reset at ",
                                          Clock(info.at), ": ", why)),
          r.mutable_status());
  {
    absl::MutexLock lock(&conn->mu);
    if (!conn->reaped) {
      // Failed by the connection's reader once the process has exited (or
      // by the monitor, if that takes more than 10 s).
      conn->orphans = std::move(failed);
      conn->orphan_reply = r;
      failed.clear();
    }
  }
  for (auto& fn : failed) fn(r, 0);
}

// ------------------------------------------------------------ state

bool RemoteDevice::healthy() const {
  absl::MutexLock lock(&mu_);
  return state_ == State::kServing;
}

absl::Status RemoteDevice::fault() const {
  absl::MutexLock lock(&mu_);
  if (state_ == State::kServing) return absl::OkStatus();
  if (!down_.ok()) return down_;
  return absl::UnavailableError(absl::StrCat("device ", options_.ordinal, " is starting"));
}

uint64_t RemoteDevice::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

uint64_t RemoteDevice::resets() const {
  absl::MutexLock lock(&mu_);
  return resets_;
}

std::optional<ResetInfo> RemoteDevice::last_reset() const {
  absl::MutexLock lock(&mu_);
  return last_reset_;
}

int RemoteDevice::worker_pid() const {
  absl::MutexLock lock(&mu_);
  return conn_ == nullptr ? 0 : conn_->pid;
}

uint32_t RemoteDevice::modules_loaded() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(live_modules_.size());
}

void RemoteDevice::SetListeners(std::function<void(const ResetInfo&)> on_reset,
                                std::function<void()> on_state) {
  absl::MutexLock lock(&mu_);
  listener_ = std::move(on_reset);
  state_listener_ = std::move(on_state);
}

absl::Status RemoteDevice::LostError(uint64_t epoch, const std::string& what) const {
  absl::MutexLock lock(&mu_);
  for (const ResetInfo& r : history_) {
    if (r.epoch == epoch + 1) {
      return absl::AbortedError(absl::StrCat(what, " was lost: device ", options_.ordinal,
                                             " was reset at ", Clock(r.at), " because ", r.why));
    }
  }
  return absl::AbortedError(
      absl::StrCat(what, " was lost: device ", options_.ordinal, " was reset since"));
}

std::string RemoteDevice::Label() const {
  return options_.tenant.empty() ? absl::StrCat("device ", options_.ordinal)
                                 : absl::StrCat("device ", options_.ordinal, " (worker of tenant '",
                                                options_.tenant, "')");
}

absl::Status RemoteDevice::NotServingLocked() const {
  if (!down_.ok()) return down_;
  return absl::UnavailableError(absl::StrCat("device ", options_.ordinal, " is not serving"));
}

absl::Status RemoteDevice::StatusOf(const Reply& reply) {
  return reply.has_status() ? FromProto(reply.status()) : absl::OkStatus();
}

RemoteDevice::ReplyFn RemoteDevice::StatusTo(Done done) {
  return [done = std::move(done)](const Reply& reply, uint64_t) { done(StatusOf(reply)); };
}

RemoteDevice::ReplyFn RemoteDevice::ValueTo(Callback<uint64_t> done) {
  return [done = std::move(done)](const Reply& reply, uint64_t) {
    absl::Status st = StatusOf(reply);
    if (!st.ok()) return done(st);
    done(reply.value());
  };
}

// ------------------------------------------------------------ requests

void RemoteDevice::Defer(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  deferred_.push_back(std::move(fn));
}

void RemoteDevice::PrepareLocked(StreamId stream, uint64_t kernel, bool resolve,
                                 std::vector<Request>* prefix) {
  // A stream already destroyed (a late Free after its session closed) is
  // not created again: the worker runs such a request on no stream.
  auto it = streams_.find(stream);
  if (stream != 0 && !live_streams_.contains(stream) && it != streams_.end()) {
    const absl::Duration limit = it->second;
    Request r;
    r.set_id(next_id_++);
    r.mutable_create_stream()->set_stream(stream);
    r.mutable_create_stream()->set_kernel_time_limit_ms(
        static_cast<uint64_t>(absl::ToInt64Milliseconds(limit)));
    prefix->push_back(std::move(r));
    live_streams_.insert(stream);
  }
  if (kernel != 0 && !live_kernels_.contains(kernel)) {
    auto it = kernels_.find(kernel);
    if (it == kernels_.end()) return;  // the launch reports it
    KernelRecord& k = it->second;
    if (!live_modules_.contains(k.sha256)) {
      std::shared_ptr<const port::ModuleImage> image = k.image.lock();
      if (image == nullptr) return;
      Request r;
      r.set_id(next_id_++);
      auto* lm = r.mutable_load_module();
      lm->set_sha256(image->sha256);
      lm->set_image(image->bytes);
      lm->set_is_ptx(image->is_ptx);
      lm->set_what(
          absl::StrCat("module ", image->sha256.substr(0, 12), " (reloaded after a reset)"));
      prefix->push_back(std::move(r));
      live_modules_.insert(k.sha256);
    }
    live_kernels_.insert(kernel);
    if (!resolve) return;  // the request itself resolves it
    Request r;
    r.set_id(next_id_++);
    auto* g = r.mutable_get_kernel();
    g->set_kernel(kernel);
    g->set_sha256(k.sha256);
    g->set_name(k.name);
    g->set_what(absl::StrCat("module ", k.sha256.substr(0, 12)));
    prefix->push_back(std::move(r));
  }
}

void RemoteDevice::Call(Request& request, StreamId stream, uint64_t kernel, uint64_t epoch,
                        ReplyFn fn, uint64_t work_epoch) {
  // A GetKernel request resolves its kernel itself; anything else that
  // names a kernel has it resolved ahead.
  const bool resolve = !request.has_get_kernel();
  std::vector<Request> prefix;
  std::shared_ptr<Connection> conn;
  absl::Status error;
  bool flush = false;
  {
    absl::MutexLock lock(&mu_);
    if ((epoch != 0 && epoch != epoch_) || (work_epoch != 0 && work_epoch != epoch_)) {
      error = absl::AbortedError(
          absl::StrCat("device ", options_.ordinal, " was reset since this call's work began"));
    } else if (conn_ == nullptr) {
      error = NotServingLocked();
    } else if (options_.queue_bytes != 0 && !Releases(request) &&
               conn_->channel->unsent_bytes() >= options_.queue_bytes) {
      error = absl::ResourceExhaustedError(absl::StrCat(
          "device ", options_.ordinal, "'s worker has not yet taken ",
          conn_->channel->unsent_bytes(), " bytes of requests, at or past --worker_queue_bytes=",
          options_.queue_bytes, ": it is busy or not answering; try again later"));
    } else {
      conn = conn_;
      PrepareLocked(stream, kernel, resolve, &prefix);
      const uint64_t id = next_id_++;
      request.set_id(id);
      pending_.emplace(id, std::move(fn));
      std::vector<const google::protobuf::MessageLite*> messages;
      messages.reserve(prefix.size() + 1);
      for (const Request& p : prefix) messages.push_back(&p);
      messages.push_back(&request);
      // The order of requests is fixed here, under the lock; the writing
      // happens outside it.
      flush = conn->channel->Enqueue(messages);
    }
  }
  if (!error.ok()) {
    // Name what the call was about, as the worker's errors do.
    const std::string what = WhatOf(request);
    const uint64_t now = this->epoch();
    if (epoch != 0 && epoch != now) {
      error = LostError(epoch, "its device memory");
      if (!what.empty()) error = absl::AbortedError(absl::StrCat(what, ": ", error.message()));
    } else if (work_epoch != 0 && work_epoch != now) {
      error = LostError(work_epoch, "work queued on the session's stream");
    } else if (!what.empty()) {
      error = absl::Status(error.code(), absl::StrCat(what, ": ", error.message()));
    }
    Reply r;
    ToProto(error, r.mutable_status());
    Defer([fn = std::move(fn), r] { fn(r, 0); });
    return;
  }
  // A failed write means the worker is gone: its reader fails the call.
  if (flush) (void)conn->channel->Flush();
}

std::optional<absl::Time> RemoteDevice::NotAnsweringSinceLocked(absl::Time now) const {
  std::optional<absl::Time> since;
  if (ping_out_ && now - ping_sent_ > kAnswerWithin) since = ping_sent_;
  for (const auto& [id, q] : memory_queries_) {
    if (now - q.asked > kAnswerWithin && (!since.has_value() || q.asked < *since)) since = q.asked;
  }
  return since;
}

uint64_t RemoteDevice::unsent_bytes() const {
  absl::MutexLock lock(&mu_);
  return conn_ == nullptr ? 0 : conn_->channel->unsent_bytes();
}

std::optional<absl::Time> RemoteDevice::not_answering_since() const {
  absl::MutexLock lock(&mu_);
  return NotAnsweringSinceLocked(absl::Now());
}

void RemoteDevice::QueryMemory(Callback<port::MemoryInfo> done) {
  // Asked by listings: they should not wait for a worker to start.
  if (absl::Status st = fault(); !st.ok()) return Defer([done, st] { done(st); });
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (NotAnsweringSinceLocked(now).has_value()) {
      // Run by the monitor: the caller may hold a lock `done` takes.
      const port::MemoryInfo last = memory_;
      deferred_.push_back([done, last] { done(last); });
      return;
    }
    id = next_memory_query_++;
    memory_queries_.emplace(id, MemoryQuery{now, std::move(done)});
  }
  Request r;
  r.mutable_query_memory();
  Call(r, 0, 0, 0, [this, id](const Reply& reply, uint64_t) {
    Callback<port::MemoryInfo> waiting;
    const absl::Status st = StatusOf(reply);
    absl::StatusOr<port::MemoryInfo> answer =
        st.ok() ? absl::StatusOr<port::MemoryInfo>(
                      port::MemoryInfo{reply.memory().free(), reply.memory().total()})
                : absl::StatusOr<port::MemoryInfo>(st);
    {
      absl::MutexLock lock(&mu_);
      if (st.ok()) memory_ = *answer;
      auto it = memory_queries_.find(id);
      if (it == memory_queries_.end()) return;  // answered late, from memory_
      waiting = std::move(it->second.done);
      memory_queries_.erase(it);
    }
    waiting(std::move(answer));
  });
}

port::StreamId RemoteDevice::CreateStream(absl::Duration kernel_time_limit) {
  absl::MutexLock lock(&mu_);
  const StreamId id = next_stream_++;
  streams_.emplace(id, kernel_time_limit);
  return id;
}

void RemoteDevice::DestroyStream(StreamId stream, Done done) {
  bool live;
  {
    absl::MutexLock lock(&mu_);
    streams_.erase(stream);
    live = live_streams_.erase(stream) > 0;
  }
  if (!live) return Defer([done] { done(absl::OkStatus()); });  // never created in this worker
  Request r;
  r.mutable_destroy_stream()->set_stream(stream);
  Call(r, 0, 0, 0, StatusTo(done));
}

void RemoteDevice::AfterQueued(StreamId stream, uint64_t epoch, std::string what, Done done) {
  Request r;
  r.mutable_after_queued()->set_stream(stream);
  r.mutable_after_queued()->set_what(std::move(what));
  Call(r, stream, 0, epoch, StatusTo(done));
}

void RemoteDevice::Allocate(StreamId stream, uint64_t size, std::string what,
                            Callback<Allocation> done) {
  Request r;
  r.mutable_allocate()->set_stream(stream);
  r.mutable_allocate()->set_size(size);
  r.mutable_allocate()->set_what(std::move(what));
  Call(r, stream, 0, 0, [done](const Reply& reply, uint64_t epoch) {
    absl::Status st = StatusOf(reply);
    if (!st.ok()) return done(st);
    done(Allocation{reply.value(), epoch});
  });
}

void RemoteDevice::Free(StreamId stream, DevicePtr ptr, uint64_t epoch, std::string what,
                        Done done) {
  // Memory of an earlier worker went with it.
  if (epoch != this->epoch()) return Defer([done] { done(absl::OkStatus()); });
  Request r;
  r.mutable_free()->set_stream(stream);
  r.mutable_free()->set_ptr(ptr);
  r.mutable_free()->set_what(std::move(what));
  Call(r, stream, 0, epoch, StatusTo(done));
}

void RemoteDevice::Memset(StreamId stream, DevicePtr ptr, uint64_t epoch, uint8_t value,
                          uint64_t size, std::string what, Done done) {
  Request r;
  auto* m = r.mutable_memset();
  m->set_stream(stream);
  m->set_ptr(ptr);
  m->set_value(value);
  m->set_size(size);
  m->set_what(std::move(what));
  Call(r, stream, 0, epoch, StatusTo(done));
}

void RemoteDevice::Copy(StreamId stream, DevicePtr dst, DevicePtr src, uint64_t epoch,
                        uint64_t size, std::string what, Done done) {
  Request r;
  auto* c = r.mutable_copy();
  c->set_stream(stream);
  c->set_dst(dst);
  c->set_src(src);
  c->set_size(size);
  c->set_what(std::move(what));
  Call(r, stream, 0, epoch, StatusTo(done));
}

void RemoteDevice::CopyToDevice(StreamId stream, DevicePtr dst, uint64_t epoch,
                                port::StagingSlot slot, uint64_t size, std::string what,
                                Done done) {
  Request r;
  auto* c = r.mutable_copy_to_device();
  c->set_stream(stream);
  c->set_dst(dst);
  c->set_slot(static_cast<uint32_t>(slot.index));
  c->set_size(size);
  c->set_what(std::move(what));
  Call(r, stream, 0, epoch, StatusTo(done));
}

void RemoteDevice::CopyToHost(StreamId stream, port::StagingSlot slot, DevicePtr src,
                              uint64_t epoch, uint64_t size, std::string what, Done done) {
  Request r;
  auto* c = r.mutable_copy_to_host();
  c->set_stream(stream);
  c->set_slot(static_cast<uint32_t>(slot.index));
  c->set_src(src);
  c->set_size(size);
  c->set_what(std::move(what));
  Call(r, stream, 0, epoch, StatusTo(done));
}

void RemoteDevice::LoadModule(std::shared_ptr<const port::ModuleImage> image, std::string what,
                              Done done) {
  bool loaded;
  {
    absl::MutexLock lock(&mu_);
    loaded = live_modules_.contains(image->sha256) && conn_ != nullptr;
  }
  if (loaded) return Defer([done] { done(absl::OkStatus()); });
  Request r;
  auto* lm = r.mutable_load_module();
  lm->set_sha256(image->sha256);
  lm->set_image(image->bytes);
  lm->set_is_ptx(image->is_ptx);
  lm->set_what(std::move(what));
  Call(r, 0, 0, 0, [this, done, sha = image->sha256](const Reply& reply, uint64_t epoch) {
    absl::Status st = StatusOf(reply);
    if (st.ok()) {
      module_loads_total_.fetch_add(reply.value());
      absl::MutexLock lock(&mu_);
      if (epoch == epoch_) live_modules_.insert(sha);
    }
    done(st);
  });
}

void RemoteDevice::UnloadModule(const std::string& sha256) {
  bool live;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = kernels_.begin(); it != kernels_.end();) {
      if (it->second.sha256 == sha256) {
        kernel_ids_.erase(absl::StrCat(sha256, "/", it->second.name));
        live_kernels_.erase(it->first);
        kernels_.erase(it++);
      } else {
        ++it;
      }
    }
    live = live_modules_.erase(sha256) > 0;
  }
  if (!live) return;
  Request r;
  r.mutable_unload_module()->set_sha256(sha256);
  Call(r, 0, 0, 0, [](const Reply&, uint64_t) {});
}

void RemoteDevice::GetKernel(std::shared_ptr<const port::ModuleImage> image, std::string name,
                             std::string what, Callback<port::KernelInfo> done) {
  uint64_t id;
  std::optional<port::KernelInfo> known;
  {
    absl::MutexLock lock(&mu_);
    const std::string key = absl::StrCat(image->sha256, "/", name);
    auto it = kernel_ids_.find(key);
    if (it == kernel_ids_.end()) {
      id = next_kernel_++;
      kernel_ids_.emplace(key, id);
      kernels_.emplace(id, KernelRecord{image->sha256, name, image, std::nullopt});
    } else {
      id = it->second;
    }
    KernelRecord& k = kernels_[id];
    k.image = image;
    if (k.info.has_value() && live_kernels_.contains(id) && conn_ != nullptr) known = k.info;
  }
  if (known.has_value()) return Defer([done, info = *known] { done(info); });
  Request r;
  auto* g = r.mutable_get_kernel();
  g->set_kernel(id);
  g->set_sha256(image->sha256);
  g->set_name(name);
  g->set_what(std::move(what));
  Call(r, 0, id, 0, [this, id, done](const Reply& reply, uint64_t epoch) {
    absl::Status st = StatusOf(reply);
    if (!st.ok()) {
      {
        absl::MutexLock lock(&mu_);
        if (epoch == epoch_) live_kernels_.erase(id);
        // A name that never resolved leaves no record (a caller trying
        // names by the million must not grow this map).
        auto it = kernels_.find(id);
        if (it != kernels_.end() && !it->second.info.has_value()) {
          kernel_ids_.erase(absl::StrCat(it->second.sha256, "/", it->second.name));
          kernels_.erase(it);
        }
      }
      return done(st);
    }
    port::KernelInfo info = FromProto(reply.kernel(), id);
    {
      absl::MutexLock lock(&mu_);
      auto it = kernels_.find(id);
      if (it != kernels_.end()) it->second.info = info;
      if (epoch == epoch_) live_kernels_.insert(id);
    }
    done(info);
  });
}

namespace {

Request LaunchRequest(port::StreamId stream, port::LaunchOp& op) {
  Request r;
  auto* l = r.mutable_launch();
  l->set_stream(stream);
  l->set_kernel(op.kernel);
  ToProto(op.geometry, l->mutable_geometry());
  l->set_params(std::move(op.param_block));
  l->set_what(std::move(op.what));
  return r;
}

}  // namespace

void RemoteDevice::Launch(StreamId stream, port::LaunchOp op, uint64_t epoch, Done done) {
  Request r = LaunchRequest(stream, op);
  Call(r, stream, op.kernel, epoch, StatusTo(done));
}

void RemoteDevice::LaunchAndSynchronize(StreamId stream, port::LaunchOp op, uint64_t epoch,
                                        uint64_t work_epoch, port::LaunchedAndSynchronized done) {
  Request r = LaunchRequest(stream, op);
  r.mutable_launch()->set_synchronize(true);
  Call(
      r, stream, op.kernel, epoch,
      [done = std::move(done)](const Reply& reply, uint64_t) {
        absl::Status st = StatusOf(reply);
        if (!st.ok()) return done(st, reply.launched());
        done(reply.value(), true);
      },
      work_epoch);
}

void RemoteDevice::Synchronize(StreamId stream, uint64_t work_epoch, Callback<uint64_t> gpu_ns) {
  Request r;
  r.mutable_synchronize()->set_stream(stream);
  Call(r, stream, 0, 0, ValueTo(std::move(gpu_ns)), work_epoch);
}

}  // namespace gpuexec::worker
