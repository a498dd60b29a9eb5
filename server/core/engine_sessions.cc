// Listing devices, opening, keeping and closing sessions.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/log.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/core/engine.h"
#include "server/core/engine_internal.h"
#include "server/core/image_check.h"
#include "server/core/launch_check.h"

namespace gpuexec::core {

using internal::Join;
using internal::TenantLimitError;

void Engine::ListDevices(const Caller& caller, Callback<std::vector<DeviceStatus>> done) {
  auto result = std::make_shared<std::vector<DeviceStatus>>(devices_.size());
  // The caller's tenant's own workers, and how many each device runs.
  std::vector<std::shared_ptr<port::DevicePort>> own(devices_.size());
  std::vector<uint32_t> workers(devices_.size(), 1);
  // Modules loaded by the tenants' workers, which count on the device too.
  std::vector<uint32_t> tenant_modules(devices_.size(), 0);
  std::vector<uint64_t> tenant_module_loads(devices_.size(), 0);
  std::vector<uint32_t> tenant_pending(devices_.size(), 0);
  {
    absl::MutexLock lock(&ports_mu_);
    for (size_t i = 0; i < tenant_ports_.size(); ++i) {
      workers[i] += static_cast<uint32_t>(tenant_ports_[i].size());
      for (const auto& [tenant, tp] : tenant_ports_[i]) {
        if (tp.port == nullptr) continue;
        tenant_modules[i] += tp.port->modules_loaded();
        // Other tenants' own workers' traffic is not a tenant's to watch.
        if (caller.sees_all || tenant == caller.tenant_name()) {
          tenant_pending[i] += tp.port->pending_requests();
        }
        tenant_module_loads[i] += tp.port->module_loads_total();
      }
      auto it = tenant_ports_[i].find(caller.tenant_name());
      if (it != tenant_ports_[i].end()) own[i] = it->second.port;
    }
  }
  {
    absl::MutexLock lock(&sessions_mu_);
    // The caller's own sessions per device; others' are not its business.
    std::vector<uint32_t> mine(devices_.size(), 0);
    for (const auto& [token, s] : sessions_) {
      if (caller.sees_all || s->tenant() == caller.tenant_name()) ++mine[s->device()];
    }
    for (size_t i = 0; i < devices_.size(); ++i) {
      const port::DevicePort& d = *devices_[i];
      const port::DeviceProperties& p = d.properties();
      DeviceStatus& st = (*result)[i];
      st.index = static_cast<uint32_t>(p.ordinal);
      st.name = p.name;
      st.cc_major = p.cc_major;
      st.cc_minor = p.cc_minor;
      st.memory_total = p.total_memory;
      st.healthy = d.healthy();
      st.multiprocessors = p.multiprocessors;
      // Its own share only: other tenants' are the operator's to know.
      if (options_.shares != nullptr && !caller.sees_all) {
        if (auto use = options_.shares->UseOf(static_cast<int>(i), caller.tenant_name())) {
          st.share_sms = use->sms;
          st.share_own = use->own;
        }
      }
      st.modules_loaded = d.modules_loaded() + tenant_modules[i];
      st.module_loads_total = d.module_loads_total() + tenant_module_loads[i];
      st.sessions = mine[i];
      st.pending_requests = d.pending_requests() + tenant_pending[i];
      // How many other tenants use the device is not a tenant's to know:
      // it sees the shared worker and its own.
      st.workers = caller.sees_all ? workers[i] : 1 + (own[i] != nullptr ? 1 : 0);
      st.resets = d.resets();
      st.epoch = d.epoch();
      if (own[i] != nullptr) {
        // The tenant's own worker: its resets are the ones that touch it,
        // and their reasons are its own.
        st.own_worker = true;
        st.healthy = own[i]->healthy();
        st.resets = own[i]->resets();
        st.epoch = own[i]->epoch();
        if (auto r = own[i]->last_reset(); r.has_value()) {
          st.last_reset = ResetTextFor(caller, own[i].get(), *r);
        }
      } else if (auto r = d.last_reset(); r.has_value()) {
        // The reason names no kernel; the reader is told its own by name,
        // every other tenant's as another tenant's.
        st.last_reset = ResetTextFor(caller, &d, *r);
      }
    }
  }
  // Never waits long on a worker: one that does not answer is listed with
  // its last figures, and since when it has not answered.
  auto join =
      std::make_shared<Join>(static_cast<int>(devices_.size()), [this, result, done](absl::Status) {
        for (size_t i = 0; i < devices_.size(); ++i) {
          (*result)[i].not_answering_since = devices_[i]->not_answering_since();
          (*result)[i].worker_unsent_bytes = devices_[i]->unsent_bytes();
        }
        done(*result);
      });
  for (size_t i = 0; i < devices_.size(); ++i) {
    devices_[i]->QueryMemory([result, join, i](absl::StatusOr<port::MemoryInfo> m) {
      // A faulted device reports no free memory; it is marked unhealthy.
      if (m.ok()) (*result)[i].memory_free = m->free;
      join->Report(absl::OkStatus());
    });
  }
}

void Engine::OpenSession(const Caller& caller, const SessionAsk& ask, Callback<SessionInfo> done) {
  const std::optional<uint32_t> device = ask.device;
  uint64_t lease_ms = ask.lease_ms;
  uint64_t memory_limit = ask.memory_limit;
  const uint64_t kernel_time_limit_ms = ask.kernel_time_limit_ms;
  const bool untimed = ask.untimed;
  if (absl::Status drain = drain_.RefuseOpen(); !drain.ok()) return done(drain);
  if (devices_.empty()) {
    return done(absl::UnavailableError(
        absl::StrCat("no GPU is available on this host: ",
                     driver_status_.ok() ? "no devices" : driver_status_.message())));
  }
  const TenantLimits& limits =
      caller.tenant != nullptr ? caller.tenant->limits : DefaultTenant()->limits;
  auto excluded = [&limits](size_t i) {
    return std::find(limits.excluded_devices.begin(), limits.excluded_devices.end(), i) !=
           limits.excluded_devices.end();
  };
  auto allowed = [&limits](size_t i) { return MayUseDevice(limits, static_cast<uint32_t>(i)); };
  // A tenant with workers of its own does not wait for the device's shared
  // worker to come back from another's fault.
  const bool own_worker = options_.isolation == EngineOptions::Isolation::kTenant &&
                          caller.tenant != nullptr && caller.tenant != DefaultTenant();
  auto usable = [&](size_t i) { return own_worker || devices_[i]->healthy(); };
  int index = -1;
  if (device.has_value()) {
    if (*device >= devices_.size()) {
      return done(absl::InvalidArgumentError(absl::StrCat(
          "device ", *device, " does not exist; this host has ", devices_.size(), " device(s)")));
    }
    if (excluded(*device)) {
      return done(absl::PermissionDeniedError(TenantLimitError(
          caller,
          absl::StrCat("may not use device ", *device, ": it is dedicated to another tenant"))));
    }
    if (!allowed(*device)) {
      return done(absl::PermissionDeniedError(TenantLimitError(
          caller, absl::StrCat("may not use device ", *device,
                               "; its devices: ", absl::StrJoin(limits.devices, ", ")))));
    }
    index = static_cast<int>(*device);
    if (!usable(index)) {
      return done(absl::UnavailableError(
          absl::StrCat("device ", index, " is unusable: ", devices_[index]->fault().message())));
    }
  } else {
    absl::MutexLock lock(&sessions_mu_);
    for (size_t i = 0; i < devices_.size(); ++i) {
      if (!usable(i) || !allowed(i)) continue;
      if (index < 0 || sessions_per_device_[i] < sessions_per_device_[index])
        index = static_cast<int>(i);
    }
    if (index < 0) {
      bool any = false;
      for (size_t i = 0; i < devices_.size(); ++i) any |= allowed(i);
      if (!any) {
        return done(absl::PermissionDeniedError(TenantLimitError(
            caller,
            "may use none of this host's devices (the others are dedicated to other "
            "tenants, or not among its devices)")));
      }
      std::string why;
      for (size_t i = 0; i < devices_.size(); ++i) {
        if (allowed(i))
          absl::StrAppend(&why, why.empty() ? "" : "; ", devices_[i]->fault().message());
      }
      return done(absl::UnavailableError(absl::StrCat("no device of this host is usable: ", why)));
    }
  }
  if (lease_ms == 0) lease_ms = options_.default_lease_ms;
  lease_ms = std::min(lease_ms, options_.max_lease_ms);
  if (limits.max_lease_ms != 0) lease_ms = std::min(lease_ms, limits.max_lease_ms);
  uint64_t limit = options_.max_session_memory_bytes;
  std::string cap_flag = absl::StrCat("--session_memory_limit=", limit);
  if (limit == 0 && options_.session_memory_share > 0) {
    // A session takes at most this share of its device (by default all of
    // it without tenants, half with them).
    limit = static_cast<uint64_t>(options_.session_memory_share *
                                  static_cast<double>(devices_[index]->properties().total_memory));
    cap_flag = absl::StrCat("--session_memory_share=", options_.session_memory_share);
  }
  std::string capped;
  if (memory_limit != 0 && limit != 0 && memory_limit > limit) {
    // What the client asked for and what it got differ: say so, and why.
    capped = absl::StrCat(ByteSize(memory_limit), " asked, capped to ", ByteSize(limit), " by ",
                          cap_flag);
  }
  if (memory_limit == 0) memory_limit = options_.default_session_memory_bytes;
  if (memory_limit != 0) limit = limit == 0 ? memory_limit : std::min(limit, memory_limit);
  if (kernel_time_limit_ms != 0 && kernel_time_limit_ms < kMinKernelTimeLimitMs) {
    // A hung kernel restarts the device for all its sessions: a limit
    // ordinary kernels could reach by accident is refused.
    return done(absl::InvalidArgumentError(absl::StrCat(
        "kernel_time_limit_ms ", kernel_time_limit_ms, " is below the minimum of ",
        kMinKernelTimeLimitMs, " ms (a launch past it restarts the device for every session)")));
  }
  uint64_t time_limit = options_.kernel_time_limit_ms;
  if (limits.kernel_time_limit_ms != 0) {
    time_limit = time_limit == 0 ? limits.kernel_time_limit_ms
                                 : std::min(time_limit, limits.kernel_time_limit_ms);
  }
  // The operator's, before the session's own request lowers it.
  const uint64_t operator_limit = time_limit;
  if (kernel_time_limit_ms != 0) {
    time_limit =
        time_limit == 0 ? kernel_time_limit_ms : std::min(time_limit, kernel_time_limit_ms);
  }
  std::shared_ptr<TenantUsage> usage;
  {
    absl::MutexLock lock(&sessions_mu_);
    if (options_.max_sessions != 0 && sessions_.size() + opening_ >= options_.max_sessions) {
      return done(absl::ResourceExhaustedError(
          absl::StrCat("daemon session limit: ", options_.max_sessions, " sessions are open")));
    }
    const std::string peer_host = PeerHost(caller.peer);
    if (options_.max_sessions_per_peer != 0) {
      auto it = sessions_per_peer_.find(PeerKey(caller.tenant_name(), peer_host));
      if (it != sessions_per_peer_.end() && it->second >= options_.max_sessions_per_peer) {
        return done(absl::ResourceExhaustedError(
            absl::StrCat("peer session limit: tenant '", caller.tenant_name(), "' has ", it->second,
                         " sessions open from ", Quoted(peer_host, 80),
                         ", the most one tenant may have from "
                         "one peer (--max_sessions_per_peer=",
                         options_.max_sessions_per_peer,
                         "); close sessions it no longer uses, or raise the flag")));
      }
    }
    usage = UsageOf(caller.tenant_name());
    if (limits.max_sessions != 0 && usage->sessions.load() >= limits.max_sessions) {
      return done(absl::ResourceExhaustedError(TenantLimitError(
          caller, absl::StrCat("session limit: ", usage->sessions.load(), " of its ",
                               limits.max_sessions, " sessions are open"))));
    }
    // A named tenant whose entry sets no limit gets a share of the daemon's
    // sessions: one tenant never takes them all.
    const uint32_t tenant_default = options_.tenant_max_sessions != 0 ? options_.tenant_max_sessions
                                                                      : options_.max_sessions / 4;
    if (limits.max_sessions == 0 && caller.tenant != nullptr && caller.tenant != DefaultTenant() &&
        tenant_default != 0 && usage->sessions.load() >= tenant_default) {
      return done(absl::ResourceExhaustedError(TenantLimitError(
          caller,
          absl::StrCat("session limit: ", usage->sessions.load(), " of its ", tenant_default,
                       " sessions are open (its tenants-file entry sets no max_sessions, so the "
                       "daemon's default applies: ",
                       options_.tenant_max_sessions != 0
                           ? absl::StrCat("--tenant_max_sessions=", options_.tenant_max_sessions)
                           : absl::StrCat("a quarter of --max_sessions=", options_.max_sessions),
                       "); close sessions it no longer uses, or set max_sessions in its "
                       "entry"))));
    }
    // Counted now, so that concurrent opens cannot pass the limits together.
    usage->sessions.fetch_add(1);
    ++opening_;
    ++sessions_per_peer_[PeerKey(caller.tenant_name(), peer_host)];
  }
  AcquirePort(
      caller, index,
      [this, caller, index, lease_ms, limit, capped, time_limit, operator_limit, untimed, usage,
       done](absl::StatusOr<std::shared_ptr<port::DevicePort>> port) {
        // A drain that began while the port came (a tenant's worker can
        // take seconds to start) refuses this session too; one that begins
        // later finds it open and closes it at its deadline.
        if (absl::Status drain = drain_.RefuseOpen(); port.ok() && !drain.ok()) port = drain;
        if (!port.ok()) {
          {
            absl::MutexLock lock(&sessions_mu_);
            usage->sessions.fetch_sub(1);
            --opening_;
            if (auto peer =
                    sessions_per_peer_.find(PeerKey(caller.tenant_name(), PeerHost(caller.peer)));
                peer != sessions_per_peer_.end() && --peer->second == 0) {
              sessions_per_peer_.erase(peer);
            }
          }
          return done(port.status());
        }
        // The stream comes to be in the worker with the session's first work.
        // On the tenant's part of the SMs where the device is cut into
        // parts, behind the others' work where its priority is low.
        const port::StreamId stream = (*port)->CreateStream(
            absl::Milliseconds(time_limit),
            {caller.tenant_name(), caller.tenant != nullptr && caller.tenant->limits.low_priority,
             /*shares_turns=*/caller.tenant != nullptr && caller.tenant != DefaultTenant(), untimed,
             operator_limit});
        auto session = std::make_shared<Session>(NewSessionToken(), usage, index, *port, stream,
                                                 lease_ms, limit);
        session->peer_host = PeerHost(caller.peer);
        session->memory_capped = capped;
        session->untimed = untimed;
        // Without tenants, everyone is the implicit tenant: a peer is charged.
        session->strike_key = caller.tenant == DefaultTenant()
                                  ? absl::StrCat("peer ", Quoted(session->peer_host, 80))
                                  : absl::StrCat("tenant '", caller.tenant_name(), "'");
        {
          absl::MutexLock lock(&session->mu);
          session->Touch();
        }
        {
          absl::MutexLock lock(&sessions_mu_);
          sessions_.emplace(session->token(), session);
          --opening_;
          ++sessions_per_device_[index];
        }
        sessions_opened_.fetch_add(1);
        usage->sessions_opened.fetch_add(1);
        if (std::string more; TakeSessionLine(session->strike_key, &more)) {
          log::Info(session->name(), " of tenant '", caller.tenant_name(), "' from ",
                    Quoted(caller.peer, 96), " opened on device ", index, " (lease ", lease_ms,
                    " ms, memory limit ", limit == 0 ? std::string("none") : ByteSize(limit),
                    ", kernel time limit ",
                    time_limit == 0 ? std::string("none") : absl::StrCat(time_limit, " ms"),
                    untimed ? ", untimed: charged the host's view of its busy time" : "",
                    capped.empty() ? "" : absl::StrCat("; session memory limit: ", capped), ")",
                    more);
        }
        done(SessionInfo{session->token(), static_cast<uint32_t>(index), lease_ms, limit, capped,
                         time_limit, untimed});
      });
}

absl::StatusOr<uint64_t> Engine::KeepAlive(const Caller& caller, const std::string& token) {
  GPUEXEC_ASSIGN_OR_RETURN(std::shared_ptr<Session> s, FindSession(caller, token));
  return s->lease_ms();
}

void Engine::CloseSession(const Caller& caller, const std::string& token, Done done) {
  auto s = FindSession(caller, token);
  if (!s.ok()) return done(s.status());
  Close(*s, CloseReason::kClient, absl::StrCat("its client (", caller.peer, ") closed it"),
        std::move(done));
}

absl::StatusOr<uint64_t> Engine::WatchClose(const Caller& caller, const std::string& token,
                                            std::function<void(const std::string&)> on_close) {
  GPUEXEC_ASSIGN_OR_RETURN(std::shared_ptr<Session> s, FindSession(caller, token));
  absl::MutexLock lock(&s->mu);
  if (s->closed) return FindSession(caller, token).status();
  const uint64_t watch = ++s->next_close_watch;
  s->close_watches.emplace(watch, std::move(on_close));
  return watch;
}

void Engine::CancelCloseWatch(const Caller& caller, const std::string& token, uint64_t watch) {
  auto s = FindSession(caller, token);
  if (!s.ok()) return;  // closed: its watches were told, or dropped
  absl::MutexLock lock(&(*s)->mu);
  (*s)->close_watches.erase(watch);
}

size_t Engine::CloseTenant(const std::string& tenant, const std::string& why) {
  std::vector<std::shared_ptr<Session>> theirs;
  {
    absl::MutexLock lock(&sessions_mu_);
    for (auto& [token, s] : sessions_) {
      if (s->tenant() == tenant) theirs.push_back(s);
    }
  }
  for (auto& s : theirs) Close(s, CloseReason::kRevoked, why, [](absl::Status) {});
  return theirs.size();
}

size_t Engine::CloseTenantOffLimits(const Tenant& tenant) {
  std::vector<std::shared_ptr<Session>> off;
  {
    absl::MutexLock lock(&sessions_mu_);
    for (auto& [token, s] : sessions_) {
      if (s->tenant() == tenant.name &&
          !MayUseDevice(tenant.limits, static_cast<uint32_t>(s->device()))) {
        off.push_back(s);
      }
    }
  }
  for (auto& s : off) {
    Close(s, CloseReason::kRevoked,
          absl::StrCat("its tenant may no longer use device ", s->device(),
                       " (the tenants file was reloaded)"),
          [](absl::Status) {});
  }
  return off.size();
}

size_t Engine::CloseDeviceSessions(int device, const std::string& why) {
  std::vector<std::shared_ptr<Session>> on;
  {
    absl::MutexLock lock(&sessions_mu_);
    for (auto& [token, s] : sessions_) {
      if (s->device() == device) on.push_back(s);
    }
  }
  for (auto& s : on) Close(s, CloseReason::kRevoked, why, [](absl::Status) {});
  return on.size();
}

void Engine::ReleaseMemory(Session& s, uint64_t bytes) {
  s.memory_used -= bytes;
  s.usage().memory.fetch_sub(bytes);
  daemon_memory_used_.fetch_sub(bytes);
}

void Engine::Close(std::shared_ptr<Session> s, CloseReason reason, const std::string& why,
                   Done done) {
  {
    absl::MutexLock lock(&sessions_mu_);
    auto it = sessions_.find(s->token());
    if (it == sessions_.end() || it->second != s) {
      // Someone else closed it first.
      return done(absl::OkStatus());
    }
    sessions_.erase(it);
    --sessions_per_device_[s->device()];
    s->usage().sessions.fetch_sub(1);
    if (auto peer = sessions_per_peer_.find(PeerKey(s->tenant(), s->peer_host));
        peer != sessions_per_peer_.end() && --peer->second == 0) {
      sessions_per_peer_.erase(peer);
    }
  }
  if (reason == CloseReason::kClient) sessions_closed_.fetch_add(1);
  if (reason == CloseReason::kExpired) sessions_expired_.fetch_add(1);
  // A session the daemon ended says why to its client's next call.
  if (reason != CloseReason::kClient && reason != CloseReason::kShutdown) RememberClosed(*s, why);
  port::DevicePort* dev = DeviceOf(*s);
  uint64_t freed = 0;
  size_t buffers = 0;
  absl::flat_hash_map<uint64_t, std::function<void(const std::string&)>> watches;
  {
    absl::MutexLock lock(&s->mu);
    s->closed = true;
    watches.swap(s->close_watches);
    DropGraphsLocked(*s);
    for (auto& [handle, b] : s->buffers) {
      if (b.lost) continue;  // went with its device's worker
      dev->Free(s->stream(), b.ptr, b.epoch, s->Describe(b), [](absl::Status) {});
      freed += b.size;
      ++buffers;
    }
    ReleaseMemory(*s, s->memory_used);
    s->buffers.clear();
    DropRegions(s);
    s->functions.clear();
    for (const auto& [handle, image] : s->modules) ReleaseModule(*s, image->sha256);
    s->modules.clear();
  }
  for (auto& [id, on_close] : watches) on_close(why);
  if (std::string more; TakeSessionLine(s->strike_key, &more)) {
    log::Info(s->name(), " of tenant '", s->tenant(), "' closed: ", why, "; freed ", buffers,
              " buffer(s), ", freed, " bytes", more);
  }
  dev->DestroyStream(s->stream(), [done](absl::Status st) { done(absl::OkStatus()); });
  ReleasePort(*s);
}

bool Engine::TakeSessionLine(const std::string& key, std::string* left_out_note) {
  // A steady clock: a step of the wall clock must not stop the refill.
  const absl::Time now =
      absl::FromUnixNanos(std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::steady_clock::now().time_since_epoch())
                              .count());
  uint64_t left_out = 0;
  bool take;
  {
    absl::MutexLock lock(&session_lines_mu_);
    // Keys are tenants and peer principals; past this many (peers from
    // everywhere), the budgets start over rather than grow.
    if (session_lines_.size() >= 4096 && !session_lines_.contains(key)) session_lines_.clear();
    std::unique_ptr<log::LineBudget>& budget = session_lines_[key];
    if (budget == nullptr) {
      budget = std::make_unique<log::LineBudget>(kSessionLinesPerSecond, kSessionLinesBurst);
    }
    take = budget->Take(now, &left_out);
  }
  if (!take) {
    session_lines_left_out_.fetch_add(1);
    return false;
  }
  *left_out_note = left_out == 0 ? std::string()
                                 : absl::StrCat(" (", left_out, " session line(s) of ", key,
                                                " left out before this one)");
  return true;
}

}  // namespace gpuexec::core
