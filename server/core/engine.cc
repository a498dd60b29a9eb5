// The engine: its start, its end, its figures and the reaper. Sessions,
// ports, faults, modules, memory, transfers and launches are in the
// engine_*.cc files beside it.
#include "server/core/engine.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "server/common/log.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/core/engine_internal.h"
#include "server/core/image_check.h"
#include "server/core/launch_check.h"

namespace gpuexec::core {

using internal::ShortToken;

// ---------------------------------------------------------------- Engine

Engine::Engine(const EngineOptions& options)
    : options_(options), read_chunks_(ChunkPool::Create(options.chunk_bytes, 16)) {}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options,
                                                       port::DevicePortFactory open_device) {
  if (options.chunk_bytes == 0 || options.staging_buffers == 0) {
    return absl::InvalidArgumentError("chunk size and staging buffers must be positive");
  }
  if (options.chunk_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("chunk size ", options.chunk_bytes,
                                                   " is over the maximum of ", kMaxChunkBytes,
                                                   " (a Read message must fit gRPC's limit)"));
  }
  std::unique_ptr<Engine> engine(new Engine(options));
  engine->open_device_ = open_device;
  // The first device says how many there are.
  port::DriverInfo info;
  auto first = open_device(0, "", &info);
  std::vector<std::unique_ptr<port::DevicePort>> opened(1);
  if (info.device_count == 0) {
    // The driver did not load, or lists no device.
    engine->driver_status_ = first.ok() ? absl::UnavailableError("no CUDA device") : first.status();
    log::Warning("no CUDA driver or device: ", engine->driver_status_.message(),
                 "; serving with no devices");
  } else {
    log::Info("CUDA driver '", options.driver_library, "' version ", info.driver_version, ": ",
              info.device_count, info.test_double ? " simulated" : "", " device(s)");
    engine->test_double_ = info.test_double;
    engine->green_contexts_ = info.green_contexts;
    opened.resize(info.device_count);
    std::vector<absl::Status> failures(info.device_count);
    if (first.ok()) {
      opened[0] = std::move(first).value();
    } else {
      failures[0] = first.status();
    }
    // The other devices start side by side.
    std::vector<std::thread> starters;
    for (int i = 1; i < info.device_count; ++i) {
      starters.emplace_back([&, i] {
        port::DriverInfo ignored;
        auto dev = open_device(i, "", &ignored);
        if (dev.ok()) {
          opened[i] = std::move(dev).value();
        } else {
          failures[i] = dev.status();
        }
      });
    }
    for (auto& t : starters) t.join();
    for (int i = 0; i < info.device_count; ++i) {
      if (opened[i] == nullptr) {
        // A device that cannot start is left out; the others serve.
        log::Error("device ", i, " cannot be used: ", failures[i].message());
        continue;
      }
      const port::DeviceProperties& p = opened[i]->properties();
      log::Info("device ", i, ": ", p.name, ", compute capability ", p.cc_major, ".", p.cc_minor,
                ", ", p.total_memory >> 20, " MiB, ", p.multiprocessors, " SMs");
      engine->devices_.push_back(std::move(opened[i]));
    }
    if (engine->devices_.empty()) {
      engine->driver_status_ = absl::UnavailableError("no usable CUDA device");
      log::Warning("no usable CUDA device; serving with no devices");
    }
  }
  for (size_t i = 0; i < engine->devices_.size(); ++i) {
    Engine* e = engine.get();
    const int index = static_cast<int>(i);
    const port::DevicePort* p = engine->devices_[i].get();
    engine->devices_[i]->SetListeners(
        [e, index, p](const port::ResetInfo& r) { e->OnDeviceReset(index, p, r); },
        [e] {
          std::function<void()> fn;
          {
            absl::MutexLock lock(&e->health_mu_);
            fn = e->health_listener_;
          }
          if (fn) fn();
        });
  }
  {
    absl::MutexLock lock(&engine->sessions_mu_);
    engine->sessions_per_device_.assign(engine->devices_.size(), 0);
    engine->mps_windows_.resize(engine->devices_.size());
  }
  {
    absl::MutexLock lock(&engine->ports_mu_);
    engine->tenant_ports_.resize(engine->devices_.size());
    engine->draining_.assign(engine->devices_.size(), 0);
  }
  engine->traffic_ = std::make_unique<TrafficCounters[]>(engine->devices_.size());
  engine->reaper_ = std::thread(&Engine::ReaperLoop, engine.get());
  return engine;
}

Engine::~Engine() {
  stop_reaper_.Notify();
  if (reaper_.joinable()) reaper_.join();
  drain_.Stop(session_count());
  std::vector<std::shared_ptr<Session>> all;
  {
    absl::MutexLock lock(&sessions_mu_);
    for (auto& [token, s] : sessions_) all.push_back(s);
  }
  // All closes start at once and share one deadline (a stuck device must
  // not cost each of its sessions the whole wait).
  std::vector<std::shared_ptr<absl::Notification>> closes;
  for (auto& s : all) {
    // Shared: a close that outlasts the wait still has a live notification.
    auto closed = std::make_shared<absl::Notification>();
    Close(s, CloseReason::kShutdown, "the daemon is shutting down",
          [closed](absl::Status) { closed->Notify(); });
    closes.push_back(std::move(closed));
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (auto& closed : closes) closed->WaitForNotificationWithDeadline(deadline);
  std::vector<PortThread> threads;
  std::vector<std::shared_ptr<port::DevicePort>> ports;
  {
    absl::MutexLock lock(&ports_mu_);
    ports_closed_ = true;  // a start that finishes now serves no one
    threads.swap(port_threads_);
  }
  for (PortThread& t : threads) t.thread.join();
  {
    absl::MutexLock lock(&ports_mu_);
    for (auto& on_device : tenant_ports_) {
      for (auto& [tenant, tp] : on_device) {
        if (tp.port != nullptr) ports.push_back(std::move(tp.port));
      }
    }
    tenant_ports_.clear();
  }
  ports.clear();     // each tenant's worker drains and exits
  devices_.clear();  // each worker drains, releases its context and exits
}

std::vector<ShareDevice> Engine::ShareDevices() const {
  std::vector<ShareDevice> out;
  for (size_t i = 0; i < devices_.size(); ++i) {
    const port::DeviceProperties& p = devices_[i]->properties();
    out.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(p.multiprocessors), p.cc_major,
                   p.cc_minor});
  }
  return out;
}

namespace {

std::vector<port::ComputePart> PartsOf(const std::vector<DeviceShares>& plans, size_t device) {
  std::vector<port::ComputePart> parts;
  for (const DeviceShares& p : plans) {
    if (p.device != device) continue;
    for (const DeviceShares::Part& part : p.parts) parts.push_back({part.tenant, part.sms});
  }
  return parts;
}

}  // namespace

absl::Status Engine::SetComputeParts(const std::vector<DeviceShares>& plans,
                                     const std::vector<DeviceShares>& before) {
  if (options_.isolation != EngineOptions::Isolation::kDevice) return absl::OkStatus();
  auto cut = [this](size_t i, std::vector<port::ComputePart> parts) {
    // A port always answers (a worker that stops is restarted, failing
    // what it had not answered); the answer's state outlives this frame.
    struct Answer {
      absl::Notification done;
      absl::Status status;
    };
    auto answer = std::make_shared<Answer>();
    devices_[i]->SetComputeParts(std::move(parts), [answer](absl::Status s) {
      answer->status = std::move(s);
      answer->done.Notify();
    });
    answer->done.WaitForNotification();
    return answer->status;
  };
  // One device at a time, only those whose parts change: a refusal puts
  // the ones cut before it back.
  std::vector<size_t> cut_so_far;
  for (size_t i = 0; i < devices_.size(); ++i) {
    std::vector<port::ComputePart> parts = PartsOf(plans, i);
    if (parts == PartsOf(before, i)) continue;
    absl::Status s = cut(i, std::move(parts));
    if (s.ok()) {
      cut_so_far.push_back(i);
      continue;
    }
    for (size_t j : cut_so_far) {
      if (absl::Status back = cut(j, PartsOf(before, j)); !back.ok()) {
        log::Warning("device ", j,
                     " could not be cut back into the compute shares in force: ", back.message(),
                     "; it is cut again before its next session's stream");
      }
    }
    return absl::Status(s.code(), absl::StrCat("device ", i,
                                               " cannot be cut into the tenants' compute "
                                               "shares: ",
                                               s.message()));
  }
  // A stream keeps the green context it was made on: the sessions of a
  // device cut again go, rather than run beside the new parts on the old.
  for (size_t i : cut_so_far) {
    const size_t closed = CloseDeviceSessions(
        static_cast<int>(i),
        absl::StrCat("the compute shares of device ", i,
                     " changed (the tenants file was reloaded); open a new session, whose "
                     "streams run on the new ones"));
    if (closed != 0) {
      log::Info("compute shares: closed ", closed, " session(s) on device ", i,
                ", whose streams ran on its old shares");
    }
  }
  return absl::OkStatus();
}

bool Engine::AnyDeviceHealthy() const {
  for (const auto& d : devices_) {
    if (d->healthy()) return true;
  }
  return false;
}

void Engine::SetHealthListener(std::function<void()> listener) {
  absl::MutexLock lock(&health_mu_);
  health_listener_ = std::move(listener);
}

size_t Engine::session_count() const {
  absl::MutexLock lock(&sessions_mu_);
  return sessions_.size();
}

EngineStats Engine::Stats() const {
  EngineStats st;
  st.devices.resize(devices_.size());
  std::vector<std::shared_ptr<Session>> all;
  {
    absl::MutexLock lock(&sessions_mu_);
    all.reserve(sessions_.size());
    for (const auto& [token, s] : sessions_) all.push_back(s);
  }
  st.sessions_open = static_cast<uint32_t>(all.size());
  absl::flat_hash_map<const TenantUsage*, uint32_t> untimed;  // open, by tenant
  for (const auto& s : all) {
    if (s->untimed) ++untimed[&s->usage()];
    absl::MutexLock lock(&s->mu);
    EngineStats::PerDevice& d = st.devices[s->device()];
    d.buffers += static_cast<uint32_t>(s->buffers.size());
    d.memory_held += s->memory_used;
  }
  for (size_t i = 0; i < devices_.size(); ++i) {
    st.devices[i].resets = devices_[i]->resets();
    st.devices[i].healthy = devices_[i]->healthy();
    st.devices[i].launches = traffic_[i].launches.load();
    st.devices[i].bytes_written = traffic_[i].bytes_written.load();
    st.devices[i].bytes_read = traffic_[i].bytes_read.load();
  }
  {
    absl::MutexLock lock(&sessions_mu_);
    for (const auto& [name, u] : tenants_) {
      EngineStats::PerTenant t;
      t.name = name;
      t.sessions = u->sessions.load();
      if (auto it = untimed.find(u.get()); it != untimed.end()) t.sessions_untimed = it->second;
      t.memory_held = u->memory.load();
      t.sessions_opened = u->sessions_opened.load();
      t.launches = u->traffic.launches.load();
      t.bytes_written = u->traffic.bytes_written.load();
      t.bytes_read = u->traffic.bytes_read.load();
      t.gpu_ns = u->traffic.gpu_ns.load();
      {
        absl::MutexLock ulock(&u->mu);
        t.module_bytes = u->module_bytes;
      }
      st.tenants.push_back(std::move(t));
    }
  }
  {
    absl::MutexLock lock(&ports_mu_);
    for (auto& t : st.tenants) {
      for (const auto& on_device : tenant_ports_) {
        auto it = on_device.find(t.name);
        if (it != on_device.end() && it->second.port != nullptr) ++t.workers;
      }
    }
    for (size_t i = 0; i < tenant_ports_.size() && i < st.devices.size(); ++i) {
      st.devices[i].workers = 1 + static_cast<uint32_t>(tenant_ports_[i].size());
    }
  }
  std::sort(st.tenants.begin(), st.tenants.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  st.strikes = strikes_total_.load();
  st.strike_refusals = strike_refusals_.load();
  st.session_lines_left_out = session_lines_left_out_.load();
  st.sessions_opened = sessions_opened_.load();
  st.sessions_closed = sessions_closed_.load();
  st.sessions_expired = sessions_expired_.load();
  st.module_uploads = module_uploads_.load();
  st.module_upload_bytes = module_upload_bytes_.load();
  {
    absl::MutexLock lock(&modules_mu_);
    st.modules_stored = static_cast<uint32_t>(module_store_.size());
    st.module_store_bytes = module_store_used_;
    st.module_upload_bytes_in_flight = uploading_;
    st.pinned_bytes = daemon_pinned_used_.load();
  }
  return st;
}

void Engine::ReaperLoop() {
  while (!stop_reaper_.WaitForNotificationWithTimeout(options_.reaper_interval)) {
    std::vector<std::shared_ptr<Session>> expired;
    const absl::Time now = absl::Now();
    {
      absl::MutexLock lock(&sessions_mu_);
      for (auto& [token, s] : sessions_) {
        absl::MutexLock slock(&s->mu);
        if (s->deadline < now && s->waiting == 0) expired.push_back(s);
      }
    }
    for (auto& s : expired) {
      Close(s, CloseReason::kExpired, absl::StrCat("its lease of ", s->lease_ms(), " ms lapsed"),
            [](absl::Status) {});
    }
    RetireIdlePorts(now);
    TickDrain(now);
  }
}

DrainState Engine::StartDrain(absl::Duration grace, std::string by) {
  const DrainState st = drain_.Start(absl::Now(), grace, std::move(by));
  log::Warning("drain: ", st.Describe(), "; ", session_count(),
               " session(s) open, new ones refused");
  return st;
}

DrainState Engine::ResumeFromDrain() {
  const bool was = drain_.draining();
  DrainState st = drain_.Resume();
  if (was) log::Warning("drain: resumed; new sessions are served again");
  return st;
}

void Engine::TickDrain(absl::Time now) {
  if (!drain_.Tick(now, session_count())) return;
  const DrainState st = drain_.state();
  std::vector<std::shared_ptr<Session>> open;
  {
    absl::MutexLock lock(&sessions_mu_);
    for (auto& [token, s] : sessions_) open.push_back(s);
  }
  const std::string why = absl::StrCat("the daemon was drained (", st.by,
                                       ") and the drain's deadline passed; open a new session "
                                       "on another daemon of the pool");
  for (auto& s : open) Close(s, CloseReason::kRevoked, why, [](absl::Status) {});
  drain_.Closed(open.size());
  log::Warning("drain: the deadline passed; closed ", open.size(), " session(s) still open");
  // The waiters hear of it at once, not a tick later.
  drain_.Tick(now, session_count());
}

absl::StatusOr<std::shared_ptr<Session>> Engine::FindSession(const Caller& caller,
                                                             const std::string& token) {
  std::shared_ptr<Session> s;
  {
    absl::MutexLock lock(&sessions_mu_);
    auto it = sessions_.find(token);
    // Another tenant's session is answered as one never opened, and does
    // not have its lease renewed.
    if (it != sessions_.end() && it->second->tenant() == caller.tenant_name()) s = it->second;
  }
  if (s == nullptr) {
    if (token.empty()) return absl::NotFoundError("the request names no session");
    {
      absl::MutexLock lock(&closed_mu_);
      auto it = closed_why_.find(token);
      if (it != closed_why_.end() && it->second.first == caller.tenant_name()) {
        return absl::NotFoundError(
            absl::StrCat("session ", ShortToken(token), " was closed: ", it->second.second));
      }
    }
    return absl::NotFoundError(
        absl::StrCat("session ", ShortToken(token),
                     " does not exist (never opened, closed, or its lease lapsed)"));
  }
  absl::MutexLock lock(&s->mu);
  s->Touch();
  return s;
}

std::shared_ptr<TenantUsage> Engine::UsageOf(const std::string& name) {
  std::shared_ptr<TenantUsage>& u = tenants_[name];
  if (u == nullptr) u = std::make_shared<TenantUsage>(name);
  return u;
}

absl::StatusOr<bool> Engine::ReserveModule(Session& s, const std::string& sha256, uint64_t size,
                                           const TenantLimits& limits) {
  {
    absl::MutexLock lock(&s.mu);
    for (const auto& [handle, held] : s.modules) {
      if (held->sha256 == sha256) return false;  // counted when it got it
    }
  }
  TenantUsage& u = s.usage();
  absl::MutexLock lock(&u.mu);
  auto it = u.modules.find(sha256);
  if (it != u.modules.end()) {
    ++it->second.second;
    return true;
  }
  if (limits.module_bytes != 0 &&
      size > limits.module_bytes - std::min(u.module_bytes, limits.module_bytes)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tenant '", u.name, "' module limit: its sessions hold ",
                     ByteSize(u.module_bytes), " of its ", ByteSize(limits.module_bytes),
                     " of module images; module ", sha256.substr(0, 12), " (", ByteSize(size),
                     ") does not fit (its module_bytes in the tenants file)"));
  }
  u.modules.emplace(sha256, std::make_pair(size, 1u));
  u.module_bytes += size;
  return true;
}

void Engine::ReleaseModule(Session& s, const std::string& sha256) {
  TenantUsage& u = s.usage();
  absl::MutexLock lock(&u.mu);
  auto it = u.modules.find(sha256);
  if (it == u.modules.end()) return;
  if (--it->second.second == 0) {
    u.module_bytes -= it->second.first;
    u.modules.erase(it);
  }
}

absl::StatusOr<BufferEntry*> Engine::FindBuffer(Session& s, uint64_t handle) {
  if (s.closed) return s.ClosedError();
  auto it = s.buffers.find(handle);
  if (it == s.buffers.end()) {
    return absl::NotFoundError(
        absl::StrCat("buffer ", HandleName(handle), " not found in ", s.name()));
  }
  if (absl::Status st = CheckAlive(s, it->second); !st.ok()) return st;
  return &it->second;
}

absl::Status Engine::CheckAlive(Session& s, BufferEntry& b) {
  port::DevicePort* dev = DeviceOf(s);
  if (!b.lost && b.epoch == dev->epoch()) return absl::OkStatus();
  MarkLost(s, b);
  return LostTo(s, b.epoch, dev->LostError(b.epoch, s.Describe(b)));
}

bool Engine::MarkLost(Session& s, BufferEntry& b) {
  if (b.lost) return false;
  b.lost = true;
  ReleaseMemory(s, b.charged());
  return true;
}

void Engine::NoteWork(Session& s) {
  // The oldest epoch is kept: work of an earlier worker is still unreported.
  if (s.work_epoch == 0) s.work_epoch = DeviceOf(s)->epoch();
}

}  // namespace gpuexec::core
