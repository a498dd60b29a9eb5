#include "server/rpc/command_ring_server.h"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "gpuexec/command_ring.h"
#include "server/common/log.h"
#include "server/common/thread_name.h"
#include "server/rpc/observability.h"
#include "server/shm/region_fd.h"

namespace gpuexec::rpc {

struct CommandRingServer::Ledger {
  absl::Mutex mu;
  // Counted from registration until the ring's last command is done.
  int total ABSL_GUARDED_BY(mu) = 0;
  // The ring (by id) each session has, until its header says closed: the
  // client may register another from then on, though the closed one still
  // counts in the figures above until its last command is done.
  absl::flat_hash_map<std::string, uint64_t> sessions ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, int> per_peer ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, int> per_tenant ABSL_GUARDED_BY(mu);
  // The server while it lives, and the calls into it under way.
  CommandRingServer* server ABSL_GUARDED_BY(mu) = nullptr;
  int active ABSL_GUARDED_BY(mu) = 0;
  int wake_fd ABSL_GUARDED_BY(mu) = -1;  // the server's, while it lives

  // Has the watch thread look at its rings again (a ring's header closed:
  // its lifeline may go). Takes only this lock: it runs under a ring's.
  void Wake() {
    absl::MutexLock lock(&mu);
    if (wake_fd < 0) return;
    const uint64_t one = 1;
    (void)!write(wake_fd, &one, sizeof(one));
  }

  // Ring `id` of `session` is closed as its client sees it.
  void Closed(const std::string& session, uint64_t id) {
    absl::MutexLock lock(&mu);
    ForgetLocked(session, id);
  }
  void ForgetLocked(const std::string& session, uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = sessions.find(session);
    if (it != sessions.end() && it->second == id) sessions.erase(it);
  }

  void Release(const std::string& session, uint64_t id, const std::string& tenant,
               const std::string& peer_key) {
    absl::MutexLock lock(&mu);
    --total;
    ForgetLocked(session, id);
    if (--per_peer[peer_key] == 0) per_peer.erase(peer_key);
    if (--per_tenant[tenant] == 0) per_tenant.erase(tenant);
  }
};

struct CommandRingServer::Ring {
  uint64_t id = 0;
  core::Caller caller;
  std::string session;
  bool close_session_on_hangup = false;
  // Set once Adopt has finished: the runner, lifeline and watch are in.
  bool adopted = false;
  bool ended = false;
  absl::Time ended_at;
  absl::Status reason;  // why it ended, when it ended before adoption
  int conn = -1;
  uint64_t watch = 0;
  std::unique_ptr<core::CommandRingRunner> runner;
};

namespace {

std::string Short(const std::string& token) { return token.substr(0, 8); }

}  // namespace

absl::StatusOr<std::unique_ptr<CommandRingServer>> CommandRingServer::Start(core::Engine* engine,
                                                                            Options options) {
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) return absl::UnavailableError(absl::StrCat("epoll_create1: ", strerror(errno)));
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;
  if (wake < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, wake, &ev) != 0) {
    const int e = errno;
    if (wake >= 0) close(wake);
    close(ep);
    return absl::UnavailableError(absl::StrCat("command rings: eventfd: ", strerror(e)));
  }
  return std::unique_ptr<CommandRingServer>(new CommandRingServer(engine, options, ep, wake));
}

CommandRingServer::CommandRingServer(core::Engine* engine, Options options, int epoll_fd,
                                     int wake_fd)
    : engine_(engine),
      options_(options),
      slots_(options.ring_threads),
      epoll_fd_(epoll_fd),
      wake_fd_(wake_fd),
      ledger_(std::make_shared<Ledger>()) {
  {
    absl::MutexLock lock(&ledger_->mu);
    ledger_->server = this;
    ledger_->wake_fd = wake_fd;
  }
  thread_ = std::thread(&CommandRingServer::WatchLoop, this);
}

void CommandRingServer::EndVia(const std::shared_ptr<Ledger>& ledger, uint64_t id,
                               const absl::Status& why, bool hung_up) {
  CommandRingServer* server;
  {
    absl::MutexLock lock(&ledger->mu);
    server = ledger->server;
    if (server == nullptr) return;  // gone, and every ring with it
    ++ledger->active;
  }
  server->End(id, why, hung_up);
  absl::MutexLock lock(&ledger->mu);
  --ledger->active;
}

CommandRingServer::~CommandRingServer() {
  {
    // No watch or ring calls in from here on; wait out those under way.
    absl::MutexLock lock(&ledger_->mu);
    ledger_->server = nullptr;
    ledger_->wake_fd = -1;
    ledger_->mu.Await(absl::Condition(
        +[](int* active) { return *active == 0; }, &ledger_->active));
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [id, ring] : rings_) {
      ring->ended = true;
      if (ring->runner != nullptr) {
        ring->runner->Stop(absl::UnavailableError("the daemon is stopping"));
      }
    }
  }
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
  Reap(true);
  close(epoll_fd_);
  close(wake_fd_);
}

size_t CommandRingServer::rings() const {
  absl::MutexLock lock(&mu_);
  return rings_.size();
}

absl::Status CommandRingServer::Adopt(
    const core::Caller& caller, const std::string& session, int conn, int memfd, uint64_t bytes,
    const v1::CommandRingRequest& request,
    const std::function<void(int, const v1::RegisterRegionResponse&)>& answer) {
  if (request.layout_version() < ring::kVersion ||
      request.layout_version() > ring::kAnswerAreaVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("command ring layout version ", request.layout_version(),
                     " is not served: this daemon serves versions ", ring::kVersion, " to ",
                     ring::kAnswerAreaVersion, "; use a client library of this daemon's release"));
  }
  const uint64_t sq = request.submission_bytes(), cq = request.completion_bytes();
  const uint64_t aq = request.answer_bytes();
  if (aq != 0 && request.layout_version() < ring::kAnswerAreaVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("command ring: an answer area (answer_bytes ", aq, ") needs layout version ",
                     ring::kAnswerAreaVersion, ", not ", request.layout_version()));
  }
  if (sq > ring::kMaxSubmissionBytes || cq > ring::kMaxCompletionBytes ||
      aq > ring::kMaxAnswerBytes || bytes != ring::kHeaderBytes + sq + cq + aq) {
    return absl::InvalidArgumentError(absl::StrCat(
        "command ring of ", bytes, " bytes for a submission ring of ", sq,
        " bytes, a completion ring of ", cq, " bytes and an answer area of ", aq,
        " bytes: it must be ", ring::kHeaderBytes,
        " + submission + completion + answer bytes, with at most ", ring::kMaxSubmissionBytes, ", ",
        ring::kMaxCompletionBytes, " and ", ring::kMaxAnswerBytes));
  }
  if (absl::Status st = shm::CheckRegionFd(memfd, bytes, shm::RegionLimits{bytes}); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("command ring: ", st.message()));
  }
  if (caller.tenant != nullptr && !caller.tenant->limits.host_memory) {
    return absl::PermissionDeniedError(absl::StrCat(
        "tenant '", caller.tenant_name(),
        "' may not register command rings (its entry in the tenants file does not allow "
        "host_memory)"));
  }
  // The session must be the caller's before anything is spent on it.
  if (absl::StatusOr<uint64_t> lease = engine_->KeepAlive(caller, session); !lease.ok()) {
    return lease.status();
  }
  const std::string tenant = caller.tenant_name();
  const std::string principal = core::PeerHost(caller.peer);
  const std::string peer_key = absl::StrCat(tenant, "/", principal);
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = ++next_id_;
  }
  {
    absl::MutexLock lock(&ledger_->mu);
    if (ledger_->sessions.contains(session)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "session ", Short(session),
          " has a command ring already: one ring per session; use that one, or open another "
          "session"));
    }
    if (ledger_->total >= options_.max_rings) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the daemon serves ", options_.max_rings,
                       " command rings already (--max_command_rings); use the Execute stream, "
                       "or try again when rings have closed"));
    }
    const uint32_t tenant_limit =
        caller.tenant != nullptr ? caller.tenant->limits.max_command_rings : 0;
    if (tenant_limit > 0) {
      // The tenants file's figure, from all of the tenant's peers together.
      if (static_cast<uint32_t>(ledger_->per_tenant[tenant]) >= tenant_limit) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "tenant '", tenant, "' command ring limit: ", ledger_->per_tenant[tenant], " of its ",
            tenant_limit,
            " command rings are served (max_command_rings in the tenants file); close a session "
            "that has one, or use the Execute stream"));
      }
    } else if (ledger_->per_peer[peer_key] >= kMaxRingsPerPeer) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant '", tenant, "' has ", kMaxRingsPerPeer, " command rings from ", principal,
          " already, the most one peer may have; close a session that has one, or use the "
          "Execute stream"));
    }
    ++ledger_->total;
    ledger_->sessions.emplace(session, id);
    ++ledger_->per_peer[peer_key];
    ++ledger_->per_tenant[tenant];
  }
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      ledger_->Release(session, id, tenant, peer_key);
      return absl::UnavailableError("the daemon is stopping");
    }
    auto r = std::make_unique<Ring>();
    r->id = id;
    r->caller = caller;
    r->session = session;
    r->close_session_on_hangup = request.close_session_on_hangup();
    rings_.emplace(id, std::move(r));
  }
  // Undoes the reservation above on a refusal before the runner holds it.
  auto refuse = [&](absl::Status st) {
    {
      absl::MutexLock lock(&mu_);
      rings_.erase(id);
    }
    ledger_->Release(session, id, tenant, peer_key);
    return st;
  };
  // A command stream of its session, as an Execute stream is.
  std::shared_ptr<CallBudget::Ticket> ticket;
  if (options_.budget != nullptr) {
    auto admitted =
        options_.budget->Admit(CallBudget::Kind::kStream, "CommandRing", caller, session);
    if (!admitted.ok()) return refuse(admitted.status());
    ticket = *std::move(admitted);
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (base == MAP_FAILED) {
    return refuse(absl::ResourceExhaustedError(
        absl::StrCat("command ring: mapping ", bytes, " bytes failed: ", strerror(errno))));
  }
  core::CommandRingOptions ro;
  ro.max_in_flight = options_.max_in_flight;
  ro.aq_bytes = aq;
  // The session's device posts its waiting launches' successes in the
  // answer area itself; unmapped when the ring is done.
  std::function<void()> unmap_area;
  if (aq != 0) {
    auto lease = engine_->MapAnswerArea(caller, session, memfd, ring::kHeaderBytes + sq + cq, aq);
    if (lease.ok()) {
      ro.answer_area = lease->area;
      unmap_area = std::move(lease->unmap);
    }
  }
  ro.spin = options_.spin;
  ro.slots = &slots_;
  if (ticket != nullptr) {
    const int bound = static_cast<int>(options_.max_in_flight);
    ro.share = [ticket, bound] { return static_cast<uint64_t>(ticket->CommandShare(bound)); };
  }
  const std::string peer = caller.peer;
  // Its last line (a run's count) when the runner lets go of it.
  ro.on_failure = [failures =
                       std::make_shared<CommandFailureLog>(peer)](const core::CommandResult& r) {
    failures->Failed(absl::StrCat("command ring ", r.op), r.status);
  };
  std::shared_ptr<Ledger> ledger = ledger_;
  ro.on_close = [ledger, id](const absl::Status& why) { EndVia(ledger, id, why, false); };
  // The lifeline is closed only after the header says closed, so that a
  // client reads its started commands' answers before the ring's end.
  ro.on_header_closed = [ledger, session, id] {
    ledger->Closed(session, id);
    ledger->Wake();
  };
  // Once the runner holds the ring, its last reference gives the place back.
  // The ticket goes with the ring's last reference too.
  ro.on_release = [ledger, session, id, tenant, peer_key, ticket, unmap_area]() mutable {
    ticket.reset();
    if (unmap_area) unmap_area();
    ledger->Release(session, id, tenant, peer_key);
  };
  auto runner = core::CommandRingRunner::Start(engine_, caller, session,
                                               std::make_unique<core::RingMapping>(base, bytes), sq,
                                               cq, std::move(ro));
  if (!runner.ok()) {
    if (unmap_area) unmap_area();
    return refuse(runner.status());  // no runner: nothing released it
  }
  absl::StatusOr<uint64_t> watch =
      engine_->WatchClose(caller, session, [ledger, id, session](const std::string& why) {
        // The words of a closed session's gRPC calls, which clients
        // recognize ("session 5d629d64 was closed: <why>").
        EndVia(ledger, id,
               absl::NotFoundError(absl::StrCat("session ", Short(session), " was closed: ", why)),
               false);
      });
  if (!watch.ok()) {
    runner->reset();  // its release gives the place back
    absl::MutexLock lock(&mu_);
    rings_.erase(id);
    return watch.status();
  }
  v1::RegisterRegionResponse response;
  response.set_bytes(bytes);
  v1::CommandRingResponse* c = response.mutable_command_ring();
  c->set_ring(id);
  c->set_max_in_flight(static_cast<uint32_t>((*runner)->max_in_flight()));
  c->set_max_record_bytes(ring::kMaxRecordBytes);
  answer(conn, response);
  bool reap = false;
  {
    absl::MutexLock lock(&mu_);
    Ring& r = *rings_.at(id);
    r.runner = *std::move(runner);
    r.conn = conn;
    r.watch = *watch;
    r.adopted = true;
    // Watched only while it serves: a ring that ended meanwhile (its
    // session closed) keeps its lifeline unwatched until it is reaped, or a
    // hang-up would wake the watch thread again and again until then.
    bool watched = true;
    if (!r.ended) {
      epoll_event ev{};
      ev.events = EPOLLRDHUP | EPOLLHUP | EPOLLERR;
      ev.data.u64 = id;
      watched = epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, conn, &ev) == 0;
    }
    if (!watched && !r.ended) {
      r.ended = true;
      r.ended_at = absl::Now();
      r.runner->Stop(absl::UnavailableError("the daemon could not watch the ring's lifeline"));
    } else if (r.ended) {
      r.runner->Stop(r.reason);
    }
    reap = r.ended;
  }
  log::Debug("command ring ", id, " serves session ", Short(session), " of tenant '", tenant, "' (",
             sq, " + ", cq, " bytes)");
  if (reap) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
  return absl::OkStatus();
}

void CommandRingServer::Reidentify(
    const std::function<std::shared_ptr<const core::Tenant>(const std::string&)>& find) {
  std::vector<std::pair<uint64_t, absl::Status>> ends;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, ring] : rings_) {
      Ring& r = *ring;
      // The implicit tenant is no entry of the file.
      if (r.ended || r.caller.tenant == nullptr || r.caller.tenant == core::DefaultTenant()) {
        continue;
      }
      const std::string& name = r.caller.tenant->name;
      std::shared_ptr<const core::Tenant> now = find(name);
      if (now == nullptr) {
        ends.emplace_back(id, absl::PermissionDeniedError(absl::StrCat(
                                  "tenant '", name, "' was removed from the tenants file")));
        continue;
      }
      if (!now->limits.host_memory) {
        ends.emplace_back(
            id, absl::PermissionDeniedError(absl::StrCat(
                    "tenant '", name,
                    "' may no longer use command rings (its entry in the tenants file no longer "
                    "allows host_memory); its session serves on through the Execute stream")));
        continue;
      }
      r.caller.tenant = now;
      if (r.runner != nullptr) r.runner->SetCaller(r.caller);
    }
  }
  for (const auto& [id, why] : ends) End(id, why, false);
}

void CommandRingServer::End(uint64_t id, const absl::Status& reason, bool hung_up) {
  core::Caller caller;
  std::string session;
  {
    absl::MutexLock lock(&mu_);
    auto it = rings_.find(id);
    if (it == rings_.end()) return;
    Ring& r = *it->second;
    // Its lifeline stays open until the header says closed, but is watched
    // no more: a hung-up one would wake the watch thread again and again.
    if (r.conn >= 0) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, r.conn, nullptr);
    if (r.ended) return;
    r.ended = true;
    r.ended_at = absl::Now();
    r.reason = reason;
    // A lifeline hung up after the header said closed is a client that saw
    // its ring end (a broken record) and goes on on the Execute stream, not
    // one that died: the runner writes the header before it tells this
    // server, so such a hang-up can come first.
    const bool closed_first = r.runner != nullptr && r.runner->header_closed();
    if (r.runner != nullptr) {
      r.runner->Stop(reason);
      // Nobody reads the answers of a ring whose lifeline hung up: its
      // header says closed now, and it is reaped now (what it counts
      // against the limits stays counted until its last command is done).
      if (hung_up) r.runner->CloseWithoutWaiting();
    }
    if (hung_up && r.close_session_on_hangup && !closed_first) {
      caller = r.caller;
      session = r.session;
    }
    log::Debug("command ring ", id, " of session ", Short(r.session), " ended: ", reason.message());
  }
  if (!session.empty()) engine_->CloseSession(caller, session, [](absl::Status) {});
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

bool CommandRingServer::Reap(bool all) {
  std::vector<std::unique_ptr<Ring>> done;
  bool waiting = false;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (auto it = rings_.begin(); it != rings_.end();) {
      Ring& r = *it->second;
      // A ring whose started commands are still to be answered keeps its
      // lifeline until its header says closed (on_header_closed wakes
      // this thread then), for kEndGrace at most, except at shutdown.
      if (r.ended && r.adopted && r.runner != nullptr && !all && !r.runner->header_closed() &&
          now - r.ended_at >= kEndGrace) {
        r.runner->CloseWithoutWaiting();
      }
      // Joined here only once its thread has left its loop (at shutdown,
      // all: they were all stopped first, so their waits overlap): a
      // thread its client moved off its futex wakes only at its park's
      // end (up to kRingIdleParkLimit), and this thread serves every
      // ring's lifeline meanwhile.
      const bool joinable =
          all || r.runner == nullptr || (r.runner->header_closed() && r.runner->ended());
      if (r.ended && r.adopted && joinable) {
        done.push_back(std::move(it->second));
        rings_.erase(it++);
      } else {
        waiting = waiting || (r.ended && r.adopted);
        ++it;
      }
    }
  }
  for (auto& r : done) {
    engine_->CancelCloseWatch(r->caller, r->session, r->watch);
    r->runner.reset();  // joins its thread
    if (r->conn >= 0) {
      epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, r->conn, nullptr);
      close(r->conn);
    }
  }
  return waiting;
}

void CommandRingServer::WatchLoop() {
  NameThisThread("gx-ring-watch");
  epoll_event events[64];
  bool waiting = false;  // a ring that ended waits for its commands' answers
  while (true) {
    const int n = epoll_wait(epoll_fd_, events, 64, waiting ? 1000 : -1);
    if (n < 0 && errno != EINTR) {
      log::Error("command rings: epoll_wait: ", strerror(errno));
      return;
    }
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == 0) {
        uint64_t count;
        (void)!read(wake_fd_, &count, sizeof(count));
        continue;
      }
      End(events[i].data.u64, absl::CancelledError("the client hung up the ring's lifeline"), true);
    }
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    waiting = Reap();
  }
}

}  // namespace gpuexec::rpc
