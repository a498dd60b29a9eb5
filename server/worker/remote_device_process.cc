// A device's worker process: started, watched, read from, reset.
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
#include "server/common/environment.h"
#include "server/common/log.h"
#include "server/common/thread_name.h"
#include "server/common/trace.h"
#include "server/worker/channel.h"
#include "server/worker/convert.h"
#include "server/worker/remote_device.h"
#include "server/worker/remote_device_internal.h"
#include "server/worker/sandbox.h"
#include "server/worker/worker_main.h"
#include "worker.pb.h"

extern char** environ;

namespace gpuexec::worker {

using internal::Backoff;
using internal::Clock;
using internal::ExitText;
using internal::HighFd;
using internal::kNotReadyRetry;
using internal::kRestartTimeout;

// ------------------------------------------------------------ lifecycle

void RemoteDevice::Spawn() {
  int sv[2];
  int rv[2] = {-1, -1};   // the descriptor socket (regions' memfds)
  int out[2] = {-1, -1};  // the worker's stdout (device printf), read by sandbox::WorkerOutput
  absl::Status error;
  pid_t pid = 0;
  RingFds worker_rings;  // the worker's side, closed here once it has them
  std::unique_ptr<RingPair> rings;
  if (options_.ring_bytes > 0) {
    absl::StatusOr<RingSetup> made = RingPair::Create(options_.ring_bytes);
    if (made.ok()) {
      worker_rings = made->worker;
      // Above the descriptors the child gets, so that none is overwritten
      // before it is handed on.
      for (int* fd : worker_rings.all()) {
        *fd = HighFd(*fd);
        if (*fd < 0) error = absl::InternalError("cannot move the worker's ring descriptors");
      }
      absl::StatusOr<std::unique_ptr<RingPair>> opened =
          RingPair::Open(made->front, options_.ring_bytes, /*front=*/true);
      if (!opened.ok()) {
        error = opened.status();
      } else if (error.ok()) {
        rings = std::move(*opened);  // it owns the front's descriptors now
      }
    } else {
      error = made.status();
    }
  }
  if (!error.ok()) {
    // Reported below, as a start that failed.
  } else if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    error = absl::InternalError(absl::StrCat("socketpair: ", strerror(errno)));
  } else if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, rv) != 0) {
    error = absl::InternalError(absl::StrCat("socketpair: ", strerror(errno)));
    close(sv[0]);
    close(sv[1]);
  } else if (pipe2(out, O_CLOEXEC) != 0) {
    error = absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
    close(sv[0]);
    close(sv[1]);
    close(rv[0]);
    close(rv[1]);
  } else {
    out[1] = HighFd(out[1]);
    sv[0] = HighFd(sv[0]);
    sv[1] = HighFd(sv[1]);
    rv[0] = HighFd(rv[0]);
    rv[1] = HighFd(rv[1]);
    // The front never waits on the worker's descriptor socket.
    (void)fcntl(rv[0], F_SETFL, O_NONBLOCK);
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
        absl::StrCat("--log_format=", options_.log_format),
        absl::StrCat("--busy_poll_us=", absl::ToInt64Microseconds(options_.busy_poll)),
        absl::StrCat("--ring_bytes=", rings != nullptr ? options_.ring_bytes : 0),
        absl::StrCat("--stream_turns=", options_.stream_turns ? "true" : "false"),
        absl::StrCat("--read_thread=", options_.read_thread ? "true" : "false")};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // The daemon's environment, with the worker's own settings (its MPS
    // share) in place of any the daemon has.
    std::vector<std::string> env_storage = ChildEnvironment(environ, options_.environment);
    std::vector<char*> envp;
    for (auto& e : env_storage) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    // The child gets exactly the descriptors worker_main.h lists: its
    // socket, its own staging, its rings, its descriptor socket; stdin from
    // /dev/null, stdout to the front's reader; stderr (its log) as ours.
    int rc = posix_spawn_file_actions_adddup2(&fa, sv[1], kSocketFd);
    if (rc == 0) rc = posix_spawn_file_actions_adddup2(&fa, staging_fd_, kStagingFd);
    if (rc == 0) rc = posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    if (rc == 0) {
      rc = posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    }
    if (rings != nullptr) {
      for (auto [from, to] : {std::pair{worker_rings.memory, kRingMemoryFd},
                              std::pair{worker_rings.in_data, kRingInDataFd},
                              std::pair{worker_rings.in_space, kRingInSpaceFd},
                              std::pair{worker_rings.out_data, kRingOutDataFd},
                              std::pair{worker_rings.out_space, kRingOutSpaceFd}}) {
        if (rc == 0) rc = posix_spawn_file_actions_adddup2(&fa, from, to);
      }
    }
    // Last: a source above may sit on kRegionFd itself (HighFd gives 10 and up).
    if (rc == 0) rc = posix_spawn_file_actions_adddup2(&fa, rv[1], kRegionFd);
    // Nothing else of the front's reaches a worker, whatever a library of
    // ours left without close-on-exec (another tenant's memfd above all).
    if (rc == 0) rc = posix_spawn_file_actions_addclosefrom_np(&fa, kRegionFd + 1);
    if (rc == 0) {
      rc = posix_spawn(&pid, options_.program.c_str(), &fa, nullptr, argv.data(), envp.data());
    }
    posix_spawn_file_actions_destroy(&fa);
    close(sv[1]);
    close(rv[1]);
    close(out[1]);
    if (rc == 0) {
      sandbox::WorkerOutput::Get().Add(out[0], absl::StrCat(Label(), " worker (pid ", pid, ")"));
    } else {
      close(out[0]);
    }
    if (rc != 0) {
      close(sv[0]);
      close(rv[0]);
      error = absl::InternalError(
          absl::StrCat("cannot start the worker program '", options_.program, "': ", strerror(rc)));
    }
  }
  CloseRingFds(worker_rings);  // the worker has its own copies, or none is started
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
  conn->channel = std::make_unique<Channel>(sv[0], /*never_block=*/true, std::move(rings));
  conn->region_fd = rv[0];
  conn->pid = pid;
  conn->started = absl::Now();
  ListWorker(pid);
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
  conn->reader = std::thread([this, conn] {
    NameThisThread(absl::StrCat("gx-reader-", options_.ordinal));
    ReadLoop(conn);
  });
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
  // Off the metrics' list while its pid is still its own (not yet reaped).
  UnlistWorker(conn->pid);
  if (conn->channel->peer_misbehaved()) {
    // As for an unreadable message: the worker is broken, not dying.
    Reset(conn, "its worker broke the framing of its messages", /*kill=*/true);
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
  GPUEXEC_TRACE(kFrontReply);
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
      NoteDriverVersion(e.ready().driver_version());
      absl::ReleasableMutexLock lock(&mu_);
      if (conn_ != conn) return;
      if (!first_ready_) {
        driver_info_.driver_version = e.ready().driver_version();
        driver_info_.device_count = e.ready().device_count();
        driver_info_.test_double = e.ready().test_double();
        driver_info_.green_contexts = e.ready().green_contexts();
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
        const absl::Time now = absl::Now();
        std::vector<ReplyFn> failed = DetachLocked(conn, now);
        state_ = State::kBackingOff;
        next_spawn_ = now + kNotReadyRetry;
        const bool first = ++not_ready_waits_ == 1;
        // Every 100 ms for 30 s from the first refusal; past that the
        // refusals count as failed starts (backing off), until one serves.
        if (first) not_ready_since_ = now;
        down_ = absl::UnavailableError(
            absl::StrCat("device ", options_.ordinal, " is restarting: ", st.message()));
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
    case Event::kFault: {
      // The charge and each reader's words follow these facts; the text
      // is the log's (a worker that sends no reason is a stale one: its
      // message names no session since kernels came as facts).
      ResetInfo facts;
      facts.kernel_caused = true;
      facts.result = e.fault().result();
      for (const InFlight& k : e.fault().kernels()) {
        facts.kernels.push_back(port::ResetKernel{k.stream(), k.kernel(), k.graph()});
      }
      const std::string& reason =
          e.fault().reason().empty() ? e.fault().message() : e.fault().reason();
      Reset(conn, reason, /*kill=*/true, &facts, e.fault().message());
      return;
    }
    case Event::kHung: {
      ResetInfo facts;
      facts.kernel_caused = true;
      facts.hang = true;
      facts.kernels.push_back(
          port::ResetKernel{e.hung().stream(), e.hung().kernel(), e.hung().graph()});
      facts.limit_ms = e.hung().limit_ms();
      facts.ran_ms = e.hung().ran_ms();
      // Bounded as the worker's watches are (one per eight launches at
      // most); clamped so that a broken worker cannot make the words lie.
      facts.launches = std::clamp<uint32_t>(e.hung().launches(), 1, 1024);
      const std::string& reason =
          e.hung().reason().empty() ? e.hung().message() : e.hung().reason();
      Reset(conn, reason, /*kill=*/true, &facts, e.hung().message());
      return;
    }
    case Event::EVENT_NOT_SET:
      return;
  }
}

std::vector<RemoteDevice::ReplyFn> RemoteDevice::DetachLocked(
    const std::shared_ptr<Connection>& conn, absl::Time now) {
  conn_ = nullptr;
  retired_.push_back(conn);
  conn->ended_at = now;
  std::vector<ReplyFn> pending;
  for (auto& [id, fn] : pending_) pending.push_back(std::move(fn));
  pending_.clear();
  answer_streams_.clear();  // mapped in that worker only
  answer_areas_.clear();
  return pending;
}

void RemoteDevice::Reset(const std::shared_ptr<Connection>& conn, const std::string& why,
                         bool kill_worker, const ResetInfo* kernel, const std::string& detail) {
  const bool kernel_caused = kernel != nullptr;
  std::vector<ReplyFn> failed;
  std::function<void(const ResetInfo&)> listener;
  std::function<void()> on_state;
  ResetInfo info;
  absl::Duration delay;
  absl::Status first_failure;
  {
    absl::MutexLock lock(&mu_);
    if (conn_ != conn || stop_) return;
    const absl::Time now = absl::Now();
    failed = DetachLocked(conn, now);
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
      if (kernel != nullptr) info = *kernel;
      info.device = options_.ordinal;
      info.epoch = epoch_;
      info.at = now;
      info.why = why;
      last_reset_ = info;
      history_.push_back(info);
      if (history_.size() > 64) history_.erase(history_.begin());
      down_ = absl::UnavailableError(
          absl::StrCat("device ", options_.ordinal, " is restarting: ", why));
      live_streams_.clear();
      parts_live_ = parts_.empty();
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
  log::Error(
      Label(), " reset (epoch ", info.epoch, "): ", detail.empty() ? why : detail, "; worker pid ",
      conn->pid, kill_worker ? " killed" : " gone", ", its buffers are lost; restarting",
      delay > absl::ZeroDuration() ? absl::StrCat(" in ", absl::ToInt64Milliseconds(delay), " ms")
                                   : std::string(""));
  if (listener) listener(info);
  {
    absl::MutexLock lock(&mu_);
    ++resets_told_;
  }
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

}  // namespace gpuexec::worker
