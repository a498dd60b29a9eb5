#include "server/core/engine.h"

#include <unistd.h>

#include <algorithm>
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
#include "server/core/image_check.h"
#include "server/core/launch_check.h"

namespace gpuexec::core {
namespace {

// A token as messages quote it: at most its first 8 characters, and only
// when they are hex (a token is the client's input).
std::string ShortToken(const std::string& token) {
  std::string out = token.substr(0, 8);
  for (char& c : out) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) c = '?';
  }
  return out;
}

// Whether a reset's reason names session `name` as the owner of a kernel
// ("kernel '<name>' of session 3f2a91c0 on device 0"). The kernel's name
// is the client's and comes quoted, its quote marks escaped: text in it
// that looks the same is preceded by a backslash, and does not count.
bool NamesKernelOf(absl::string_view why, absl::string_view name) {
  const std::string owner = absl::StrCat("' of ", name, " on device ");
  for (size_t at = why.find(owner); at != absl::string_view::npos; at = why.find(owner, at + 1)) {
    if (at == 0 || why[at - 1] != '\\') return true;
  }
  return false;
}

std::string TenantLimitError(const Caller& caller, absl::string_view what) {
  return absl::StrCat("tenant '", caller.tenant_name(), "' ", what);
}

// Calls `done` once all `n` parts have reported; the first error wins.
class Join {
 public:
  Join(int n, Done done) : remaining_(n), done_(std::move(done)) {
    if (n == 0) done_(absl::OkStatus());
  }
  void Report(const absl::Status& st) {
    Done done;
    absl::Status result;
    {
      absl::MutexLock lock(&mu_);
      if (!st.ok() && status_.ok()) status_ = st;
      if (--remaining_ != 0) return;
      done = std::move(done_);
      result = status_;
    }
    done(result);
  }

 private:
  absl::Mutex mu_;
  int remaining_;
  absl::Status status_;
  Done done_;
};

// Adds `size` to `used` unless that would pass `limit` (0: none), as one
// step however many threads reserve at once; returns what was held when it
// would not fit.
std::optional<uint64_t> Reserve(std::atomic<uint64_t>& used, uint64_t limit, uint64_t size) {
  if (limit == 0) {
    used.fetch_add(size);
    return std::nullopt;
  }
  uint64_t held = used.load();
  do {
    if (size > limit - std::min(held, limit)) return held;
  } while (!used.compare_exchange_weak(held, held + size));
  return std::nullopt;
}

}  // namespace

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
              info.device_count, " device(s)");
    engine->test_double_ = info.test_double;
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
    engine->reset_culprit_.assign(engine->devices_.size(), "");
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
  for (const auto& s : all) {
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
  }
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
        absl::StrCat("tenant '", u.name, "' module limit: its sessions hold ", u.module_bytes,
                     " of its ", limits.module_bytes, " bytes of module images; module ",
                     sha256.substr(0, 12), " (", size, " bytes) does not fit"));
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
  return dev->LostError(b.epoch, s.Describe(b));
}

bool Engine::MarkLost(Session& s, BufferEntry& b) {
  if (b.lost) return false;
  b.lost = true;
  ReleaseMemory(s, b.size);
  return true;
}

void Engine::NoteWork(Session& s) {
  // The oldest epoch is kept: work of an earlier worker is still unreported.
  if (s.work_epoch == 0) s.work_epoch = DeviceOf(s)->epoch();
}

void Engine::OnDeviceReset(int index, const port::DevicePort* port, const port::ResetInfo& info) {
  std::vector<std::shared_ptr<Session>> affected;
  std::vector<std::shared_ptr<Session>> named;
  // Under MPS the first reset of a device opens a fault window; every reset
  // within it (the fault's reach, or the fault itself found late) adds the
  // sessions it names, and the charge is settled when it closes.
  bool opened = false;
  {
    absl::MutexLock lock(&sessions_mu_);
    std::string culprit;
    for (auto& [token, s] : sessions_) {
      // Only the sessions this port served: a tenant's own worker takes
      // its tenant's buffers with it and nobody else's.
      if (s->device() != index || s->port() != port) continue;
      affected.push_back(s);
      // The reason names the session whose kernel faulted or hung, if any
      // (for a fault: every session with kernels not yet synchronized).
      if (NamesKernelOf(info.why, s->name())) {
        culprit = s->tenant();
        named.push_back(s);
      }
    }
    // A session named but gone: no tenant reads the reason.
    if (culprit.empty() && absl::StrContains(info.why, "session ")) culprit = "?";
    if (port == devices_[index].get()) reset_culprit_[index] = culprit;
    if (options_.mps) {
      MpsWindow& w = mps_windows_[index];
      if (!w.open) {
        w.open = true;
        w.first = info;
        opened = true;
      }
      w.named.insert(w.named.end(), named.begin(), named.end());
    }
  }
  size_t buffers = 0;
  uint64_t bytes = 0;
  for (auto& s : affected) {
    absl::MutexLock lock(&s->mu);
    for (auto& [handle, b] : s->buffers) {
      if (b.epoch >= info.epoch || !MarkLost(*s, b)) continue;
      ++buffers;
      bytes += b.size;
    }
  }
  log::Debug("device ", index, " reset: ", buffers, " buffer(s) of ", affected.size(),
             " session(s), ", bytes, " bytes, lost; their next calls on them say so");
  if (options_.mps) {
    if (opened) WatchMpsWindow(index, port);
    return;
  }
  if (!named.empty()) Strike(index, info, std::move(named));
}

void Engine::WatchMpsWindow(int index, const port::DevicePort* reset) {
  absl::MutexLock lock(&ports_mu_);
  if (ports_closed_) return;
  // The fault reaches the other clients within milliseconds; a hung
  // kernel's worker, killed, can take longer to take them down.
  RunPortThread([this, index, reset] {
    const absl::Duration window = options_.mps_fault_window;
    const absl::Duration checks[] = {absl::ZeroDuration(), absl::Milliseconds(100),
                                     absl::Milliseconds(400), absl::Milliseconds(1500), window};
    absl::Duration slept;
    for (absl::Duration at : checks) {
      at = std::min(at, window);
      std::vector<std::shared_ptr<port::DevicePort>> others;
      while (slept < at) {
        {
          absl::MutexLock lock(&ports_mu_);
          if (ports_closed_) return;
        }
        absl::SleepFor(absl::Milliseconds(20));
        slept += absl::Milliseconds(20);
      }
      if (at == window) break;
      {
        // Taken from the tables each time, under the lock: a port being
        // ended is no longer there, so this thread never holds its last
        // reference.
        absl::MutexLock lock(&ports_mu_);
        if (ports_closed_) return;
        if (devices_[index].get() != reset) others.push_back(devices_[index]);
        for (const auto& [tenant, tp] : tenant_ports_[index]) {
          if (tp.port != nullptr && tp.port.get() != reset) others.push_back(tp.port);
        }
      }
      for (const auto& p : others) p->QueryMemory([](absl::StatusOr<port::MemoryInfo>) {});
    }
    SettleMpsWindow(index);
  });
}

void Engine::SettleMpsWindow(int index) {
  port::ResetInfo first;
  std::vector<std::shared_ptr<Session>> named;
  {
    absl::MutexLock lock(&sessions_mu_);
    MpsWindow& w = mps_windows_[index];
    first = w.first;
    named.swap(w.named);
    w = MpsWindow();
  }
  // One tenant (or peer) named: it is charged, as without MPS. Several:
  // which kernel faulted first, MPS does not say (each client it reached
  // sees the same error), so none is (Strike says so in the log).
  if (!named.empty()) Strike(index, first, std::move(named));
}

void Engine::Strike(int index, const port::ResetInfo& info,
                    std::vector<std::shared_ptr<Session>> named) {
  absl::flat_hash_set<std::string> keys;
  for (const auto& s : named) keys.insert(s->strike_key);
  if (keys.size() != 1) {
    // Which of several kernels in flight faulted, the driver does not say:
    // nobody is charged (each tenant's own worker will tell them apart).
    log::Info("device ", index, " reset with kernels of ", keys.size(),
              " tenants or peers in flight; no strike charged");
    return;
  }
  const std::string& key = *keys.begin();
  const absl::Time now = absl::Now();
  size_t count = 0;
  absl::Time until = absl::InfinitePast();
  {
    absl::MutexLock lock(&strikes_mu_);
    // Keys whose window is empty and whose cooldown is over are forgotten.
    for (auto it = strikes_.begin(); it != strikes_.end();) {
      Strikes& old = it->second;
      while (!old.at.empty() && now - old.at.front() > options_.strike_window) old.at.pop_front();
      if (old.at.empty() && old.refused_until <= now) {
        strikes_.erase(it++);
      } else {
        ++it;
      }
    }
    Strikes& st = strikes_[key];
    st.at.push_back(now);
    while (!st.at.empty() && now - st.at.front() > options_.strike_window) st.at.pop_front();
    count = st.at.size();
    if (options_.strike_limit != 0 && count >= options_.strike_limit) {
      st.refused_until = now + options_.strike_cooldown;
      until = st.refused_until;
    }
  }
  strikes_total_.fetch_add(1);
  const std::string why = absl::StrCat(
      "its kernel reset device ", index, " at ",
      absl::FormatTime("%Y-%m-%d %H:%M:%E3S UTC", info.at, absl::UTCTimeZone()), " (strike ", count,
      options_.strike_limit != 0 ? absl::StrCat(" of ", options_.strike_limit) : "", " for ", key,
      " within ", absl::ToInt64Seconds(options_.strike_window), " s)");
  if (until != absl::InfinitePast()) {
    log::Warning("strike limit: the kernels of ", key, " reset devices ", count, " times within ",
                 absl::ToInt64Seconds(options_.strike_window),
                 " s; its launches are refused until ",
                 absl::FormatTime("%Y-%m-%d %H:%M:%E3S UTC", until, absl::UTCTimeZone()));
  }
  for (auto& s : named) Close(s, CloseReason::kFaulted, why, [](absl::Status) {});
}

void Engine::RememberClosed(const Session& s, const std::string& why) {
  absl::MutexLock lock(&closed_mu_);
  if (closed_why_.emplace(s.token(), std::make_pair(s.tenant(), why)).second) {
    closed_order_.push_back(s.token());
  }
  while (closed_order_.size() > kClosedRemembered) {
    closed_why_.erase(closed_order_.front());
    closed_order_.pop_front();
  }
}

absl::Status Engine::CheckStrikes(const Session& s) {
  if (options_.strike_limit == 0) return absl::OkStatus();
  absl::Time until;
  size_t count = 0;
  {
    absl::MutexLock lock(&strikes_mu_);
    auto it = strikes_.find(s.strike_key);
    if (it == strikes_.end() || it->second.refused_until <= absl::Now()) return absl::OkStatus();
    until = it->second.refused_until;
    count = it->second.at.size();
  }
  strike_refusals_.fetch_add(1);
  return absl::FailedPreconditionError(
      absl::StrCat("launches of ", s.strike_key, " are refused until ",
                   absl::FormatTime("%Y-%m-%d %H:%M:%E3S UTC", until, absl::UTCTimeZone()),
                   ": its kernels reset devices ", count, " times within ",
                   absl::ToInt64Seconds(options_.strike_window),
                   " s (the daemon's strike limit is ", options_.strike_limit, ")"));
}

absl::Status Engine::CheckRange(const Session& s, const BufferEntry& b, uint64_t offset,
                                uint64_t size, absl::string_view op) {
  if (offset > b.size || size > b.size - offset) {
    return absl::OutOfRangeError(absl::StrCat(op, " of ", size, " bytes at offset ", offset,
                                              " goes past the end of ", s.Describe(b)));
  }
  return absl::OkStatus();
}

void Engine::ListDevices(const Caller& caller, Callback<std::vector<DeviceStatus>> done) {
  auto result = std::make_shared<std::vector<DeviceStatus>>(devices_.size());
  // The caller's tenant's own workers, and how many each device runs.
  std::vector<std::shared_ptr<port::DevicePort>> own(devices_.size());
  std::vector<uint32_t> workers(devices_.size(), 1);
  // Modules loaded by the tenants' workers, which count on the device too.
  std::vector<uint32_t> tenant_modules(devices_.size(), 0);
  std::vector<uint64_t> tenant_module_loads(devices_.size(), 0);
  {
    absl::MutexLock lock(&ports_mu_);
    for (size_t i = 0; i < tenant_ports_.size(); ++i) {
      workers[i] += static_cast<uint32_t>(tenant_ports_[i].size());
      for (const auto& [tenant, tp] : tenant_ports_[i]) {
        if (tp.port == nullptr) continue;
        tenant_modules[i] += tp.port->modules_loaded();
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
      st.modules_loaded = d.modules_loaded() + tenant_modules[i];
      st.module_loads_total = d.module_loads_total() + tenant_module_loads[i];
      st.sessions = mine[i];
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
          st.last_reset =
              absl::StrCat(absl::FormatTime("%Y-%m-%d %H:%M:%E3S UTC", r->at, absl::UTCTimeZone()),
                           ": ", r->why);
        }
      } else if (auto r = d.last_reset(); r.has_value()) {
        // The reason names a kernel and a session: only their tenant
        // reads it.
        const std::string& culprit = reset_culprit_[i];
        st.last_reset = absl::StrCat(
            absl::FormatTime("%Y-%m-%d %H:%M:%E3S UTC", r->at, absl::UTCTimeZone()), ": ",
            caller.sees_all || culprit.empty() || culprit == caller.tenant_name()
                ? r->why
                : std::string("a kernel of another tenant faulted or ran past its time limit"));
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

void Engine::OpenSession(const Caller& caller, std::optional<uint32_t> device, uint64_t lease_ms,
                         uint64_t memory_limit, uint64_t kernel_time_limit_ms,
                         Callback<SessionInfo> done) {
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
  auto allowed = [&limits, &excluded](size_t i) {
    return !excluded(i) &&
           (limits.devices.empty() ||
            std::find(limits.devices.begin(), limits.devices.end(), i) != limits.devices.end());
  };
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
  if (limit == 0 && options_.session_memory_share > 0) {
    // No session may take the whole of a shared device by default.
    limit = static_cast<uint64_t>(options_.session_memory_share *
                                  static_cast<double>(devices_[index]->properties().total_memory));
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
    if (options_.max_sessions_per_peer != 0) {
      auto it = sessions_per_peer_.find(PeerHost(caller.peer));
      if (it != sessions_per_peer_.end() && it->second >= options_.max_sessions_per_peer) {
        return done(absl::ResourceExhaustedError(absl::StrCat(
            "peer session limit: ", it->second, " sessions are open from ", Quoted(it->first, 80),
            " (at most ", options_.max_sessions_per_peer, ")")));
      }
    }
    usage = UsageOf(caller.tenant_name());
    if (limits.max_sessions != 0 && usage->sessions.load() >= limits.max_sessions) {
      return done(absl::ResourceExhaustedError(TenantLimitError(
          caller, absl::StrCat("session limit: ", usage->sessions.load(), " of its ",
                               limits.max_sessions, " sessions are open"))));
    }
    // Counted now, so that concurrent opens cannot pass the limits together.
    usage->sessions.fetch_add(1);
    ++opening_;
    ++sessions_per_peer_[PeerHost(caller.peer)];
  }
  AcquirePort(caller, index,
              [this, caller, index, lease_ms, limit, time_limit, usage,
               done](absl::StatusOr<std::shared_ptr<port::DevicePort>> port) {
                if (!port.ok()) {
                  {
                    absl::MutexLock lock(&sessions_mu_);
                    usage->sessions.fetch_sub(1);
                    --opening_;
                    if (auto peer = sessions_per_peer_.find(PeerHost(caller.peer));
                        peer != sessions_per_peer_.end() && --peer->second == 0) {
                      sessions_per_peer_.erase(peer);
                    }
                  }
                  return done(port.status());
                }
                // The stream comes to be in the worker with the session's first work.
                const port::StreamId stream = (*port)->CreateStream(absl::Milliseconds(time_limit));
                auto session = std::make_shared<Session>(NewSessionToken(), usage, index, *port,
                                                         stream, lease_ms, limit);
                session->peer_host = PeerHost(caller.peer);
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
                log::Info(
                    session->name(), " of tenant '", caller.tenant_name(), "' from ", caller.peer,
                    " opened on device ", index, " (lease ", lease_ms, " ms, memory limit ",
                    limit == 0 ? std::string("none") : absl::StrCat(limit, " bytes"),
                    ", kernel time limit ",
                    time_limit == 0 ? std::string("none") : absl::StrCat(time_limit, " ms"), ")");
                done(SessionInfo{session->token(), static_cast<uint32_t>(index), lease_ms, limit,
                                 time_limit});
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
    if (auto peer = sessions_per_peer_.find(s->peer_host);
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
  {
    absl::MutexLock lock(&s->mu);
    s->closed = true;
    for (auto& [handle, b] : s->buffers) {
      if (b.lost) continue;  // went with its device's worker
      dev->Free(s->stream(), b.ptr, b.epoch, s->Describe(b), [](absl::Status) {});
      freed += b.size;
      ++buffers;
    }
    ReleaseMemory(*s, s->memory_used);
    s->buffers.clear();
    s->functions.clear();
    for (const auto& [handle, image] : s->modules) ReleaseModule(*s, image->sha256);
    s->modules.clear();
  }
  log::Info(s->name(), " of tenant '", s->tenant(), "' closed: ", why, "; freed ", buffers,
            " buffer(s), ", freed, " bytes");
  dev->DestroyStream(s->stream(), [done](absl::Status st) { done(absl::OkStatus()); });
  ReleasePort(*s);
}

void Engine::AcquirePort(
    const Caller& caller, int index,
    std::function<void(absl::StatusOr<std::shared_ptr<port::DevicePort>>)> done) {
  if (options_.isolation == EngineOptions::Isolation::kDevice || caller.tenant == nullptr ||
      caller.tenant == DefaultTenant()) {
    return done(devices_[index]);
  }
  const std::string& tenant = caller.tenant_name();
  std::shared_ptr<port::DevicePort> ready;
  absl::Status refused;
  {
    absl::MutexLock lock(&ports_mu_);
    auto& on_device = tenant_ports_[index];
    auto it = on_device.find(tenant);
    if (ports_closed_) {
      refused = absl::UnavailableError("the daemon is shutting down");
    } else if (it != on_device.end() && it->second.port != nullptr) {
      ++it->second.sessions;
      ready = it->second.port;
    } else if (it != on_device.end()) {
      it->second.waiting.push_back(std::move(done));  // it is starting
      return;
    } else if (options_.max_workers_per_device != 0 &&
               on_device.size() + draining_[index] >= options_.max_workers_per_device) {
      // (How many other tenants use the device is not this caller's to know.)
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "device ", index, " runs the most tenant workers it may (--max_workers_per_device=",
          options_.max_workers_per_device, "); a worker of a tenant with no session there ends ",
          absl::ToInt64Seconds(options_.worker_idle), " s after its last one"));
    } else {
      on_device[tenant].waiting.push_back(std::move(done));
      RunPortThread([this, index, tenant] { StartTenantPort(index, tenant); });
      return;
    }
  }
  if (!refused.ok()) return done(refused);
  done(std::move(ready));
}

void Engine::StartTenantPort(int index, const std::string& tenant) {
  const absl::Time start = absl::Now();
  port::DriverInfo ignored;
  absl::StatusOr<std::unique_ptr<port::DevicePort>> opened = open_device_(index, tenant, &ignored);
  std::shared_ptr<port::DevicePort> port;
  absl::Status status = opened.status();
  if (opened.ok()) {
    port = std::move(opened).value();
    const port::DevicePort* p = port.get();
    port->SetListeners([this, index, p](const port::ResetInfo& r) { OnDeviceReset(index, p, r); },
                       [] {});
    log::Info("device ", index, ": a worker of tenant '", tenant, "' of its own, started in ",
              absl::ToInt64Milliseconds(absl::Now() - start), " ms");
  } else {
    status = absl::UnavailableError(absl::StrCat("device ", index, ": a worker of tenant '", tenant,
                                                 "' did not start: ", status.message()));
    log::Error(status.message());
  }
  std::vector<std::function<void(absl::StatusOr<std::shared_ptr<port::DevicePort>>)>> waiting;
  {
    absl::MutexLock lock(&ports_mu_);
    auto& on_device = tenant_ports_[index];
    auto it = on_device.find(tenant);
    waiting.swap(it->second.waiting);
    if (port != nullptr && !ports_closed_) {
      it->second.port = port;
      it->second.sessions += static_cast<uint32_t>(waiting.size());
      it->second.idle_since = absl::Now();
    } else {
      on_device.erase(it);
      if (status.ok()) status = absl::UnavailableError("the daemon is shutting down");
    }
  }
  for (auto& w : waiting) {
    if (status.ok()) {
      w(port);
    } else {
      w(status);
    }
  }
}

void Engine::ReleasePort(const Session& s) {
  if (s.port() == devices_[s.device()].get()) return;
  absl::MutexLock lock(&ports_mu_);
  if (tenant_ports_.empty()) return;
  auto& on_device = tenant_ports_[s.device()];
  auto it = on_device.find(s.tenant());
  if (it == on_device.end() || it->second.port.get() != s.port()) return;
  if (--it->second.sessions == 0) it->second.idle_since = absl::Now();
}

void Engine::RunPortThread(std::function<void()> fn) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  port_threads_.push_back(PortThread{std::thread([fn = std::move(fn), done] {
                                       fn();
                                       done->store(true);
                                     }),
                                     done});
}

void Engine::RetireIdlePorts(absl::Time now) {
  std::vector<PortThread> finished;
  {
    absl::MutexLock lock(&ports_mu_);
    for (size_t i = 0; i < tenant_ports_.size(); ++i) {
      auto& on_device = tenant_ports_[i];
      for (auto it = on_device.begin(); it != on_device.end();) {
        TenantPort& tp = it->second;
        if (tp.port == nullptr || tp.sessions != 0 || now - tp.idle_since < options_.worker_idle) {
          ++it;
          continue;
        }
        log::Info("device ", i, ": the worker of tenant '", it->first, "' ends, idle for ",
                  absl::ToInt64Seconds(now - tp.idle_since), " s");
        // Ended off the reaper's thread (a worker may take a while to
        // drain), and only there: once every other holder (a call still
        // finishing on a closed session) has let go, since the port's own
        // threads must never be the ones to end it. Counted against the
        // bound until then.
        ++draining_[i];
        RunPortThread([this, i, port = std::move(tp.port)]() mutable {
          absl::Time closed_at = absl::InfiniteFuture();
          while (port.use_count() > 1) {
            absl::SleepFor(absl::Milliseconds(10));
            absl::MutexLock lock(&ports_mu_);
            if (ports_closed_ && closed_at == absl::InfiniteFuture()) closed_at = absl::Now();
            if (absl::Now() - closed_at > absl::Seconds(10)) break;  // shutting down
          }
          port.reset();
          absl::MutexLock lock(&ports_mu_);
          --draining_[i];
        });
        on_device.erase(it++);
      }
    }
    for (auto it = port_threads_.begin(); it != port_threads_.end();) {
      if (it->done->load()) {
        finished.push_back(std::move(*it));
        it = port_threads_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (PortThread& t : finished) t.thread.join();
}

// ---------------------------------------------------------------- modules

absl::StatusOr<std::unique_ptr<ModuleUpload>> Engine::BeginModuleUpload(const Caller& caller,
                                                                        const std::string& token,
                                                                        const std::string& sha256,
                                                                        uint64_t size,
                                                                        ModuleKind kind) {
  GPUEXEC_ASSIGN_OR_RETURN(std::shared_ptr<Session> s, FindSession(caller, token));
  if (!IsSha256Hex(sha256)) {
    return absl::InvalidArgumentError(
        absl::StrCat("module header: sha256 must be 64 lower-case hex digits (",
                     std::min<size_t>(sha256.size(), 10000), " characters were sent)"));
  }
  if (kind == ModuleKind::kUnspecified) {
    return absl::InvalidArgumentError(absl::StrCat("module ", sha256.substr(0, 12),
                                                   ": kind is unspecified (cubin, ptx or fatbin)"));
  }
  if (size > options_.max_module_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("module ", sha256.substr(0, 12), " is ", size,
                                                   " bytes; the daemon accepts at most ",
                                                   options_.max_module_bytes));
  }
  const TenantLimits& limits =
      caller.tenant != nullptr ? caller.tenant->limits : DefaultTenant()->limits;
  if (limits.module_bytes != 0 && size > limits.module_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(TenantLimitError(caller, "module limit: module "), sha256.substr(0, 12),
                     " is ", size, " bytes; the tenant's sessions may hold at most ",
                     limits.module_bytes, " bytes of module images"));
  }
  return std::unique_ptr<ModuleUpload>(
      new ModuleUpload(this, std::move(s), limits, sha256, size, kind));
}

absl::Status Engine::ChargeUpload(const Session& s, uint64_t bytes, absl::string_view what) {
  const uint64_t budget = options_.module_upload_budget_bytes;
  if (budget == 0) return absl::OkStatus();
  absl::MutexLock lock(&modules_mu_);
  uint64_t& mine = uploading_by_[s.strike_key];
  const uint64_t share = budget / 2;
  if (bytes > budget - std::min(uploading_, budget) || bytes > share - std::min(mine, share)) {
    const uint64_t held = mine;
    if (mine == 0) uploading_by_.erase(s.strike_key);
    return absl::ResourceExhaustedError(
        absl::StrCat("module uploads in flight: the uploads of ", s.strike_key, " under way hold ",
                     held, " of the ", share, " bytes one may (the daemon receives at most ",
                     budget, " at once); ", what, " must wait: retry"));
  }
  uploading_ += bytes;
  mine += bytes;
  return absl::OkStatus();
}

void Engine::UnchargeUpload(const Session& s, uint64_t bytes) {
  if (options_.module_upload_budget_bytes == 0 || bytes == 0) return;
  absl::MutexLock lock(&modules_mu_);
  uploading_ -= bytes;
  auto it = uploading_by_.find(s.strike_key);
  if (it != uploading_by_.end() && (it->second -= bytes) == 0) uploading_by_.erase(it);
}

ModuleUpload::~ModuleUpload() { engine_->UnchargeUpload(*session_, charged_); }

ModuleUpload::ModuleUpload(Engine* engine, std::shared_ptr<Session> session, TenantLimits limits,
                           std::string sha256, uint64_t size, ModuleKind kind)
    : engine_(engine),
      session_(std::move(session)),
      limits_(std::move(limits)),
      sha256_(std::move(sha256)),
      size_(size),
      kind_(kind) {}

absl::Status ModuleUpload::AddChunk(absl::string_view chunk) {
  if (bytes_.size() + chunk.size() > size_) {
    return absl::InvalidArgumentError(absl::StrCat("module ", sha256_.substr(0, 12),
                                                   ": received more than the ", size_,
                                                   " bytes its header announced"));
  }
  // Counted as it arrives (not at the header's figure, which a client that
  // never sends would hold for nothing), and held until the upload ends.
  if (absl::Status st = engine_->ChargeUpload(*session_, chunk.size(),
                                              absl::StrCat("module ", sha256_.substr(0, 12)));
      !st.ok()) {
    return st;
  }
  charged_ += chunk.size();
  bytes_.append(chunk.data(), chunk.size());
  hasher_.Update(chunk.data(), chunk.size());
  return absl::OkStatus();
}

void ModuleUpload::Finish(Callback<ModuleResult> done) {
  const std::string name = absl::StrCat("module ", sha256_.substr(0, 12));
  std::shared_ptr<const port::ModuleImage> image;
  bool newly_stored = false;
  const bool uploaded = !bytes_.empty();
  const std::string& tenant = session_->tenant();
  bool reserved = false;
  if (!uploaded) {
    absl::MutexLock lock(&engine_->modules_mu_);
    auto it = engine_->module_store_.find(sha256_);
    // An image another tenant uploaded is answered as one never uploaded:
    // a tenant proves it has the bytes once, and cannot learn what others
    // run by asking for hashes.
    if (it == engine_->module_store_.end() || !it->second.tenants.contains(tenant)) {
      return done(absl::NotFoundError(absl::StrCat(
          name, " (sha256 ", sha256_, ") is not held by the daemon; upload its bytes")));
    }
    auto r = engine_->ReserveModule(*session_, sha256_, it->second.image->bytes.size(), limits_);
    if (!r.ok()) return done(r.status());
    reserved = *r;
    it->second.last_used = ++engine_->module_store_clock_;
    image = it->second.image;
  } else {
    if (bytes_.size() != size_) {
      return done(absl::InvalidArgumentError(
          absl::StrCat(name, ": upload ended after ", bytes_.size(), " of ", size_, " bytes")));
    }
    const std::string got = hasher_.HexDigest();
    if (got != sha256_) {
      return done(absl::DataLossError(absl::StrCat(
          name, ": the ", size_, " bytes received hash to sha256 ", got, ", not ", sha256_)));
    }
    // The driver's loader takes no length: make sure every offset the
    // image's headers declare lies inside it before the driver sees it.
    const ImageKind kind = kind_ == ModuleKind::kPtx      ? ImageKind::kPtx
                           : kind_ == ModuleKind::kFatbin ? ImageKind::kFatbin
                                                          : ImageKind::kCubin;
    if (absl::Status st = CheckModuleImage(
            bytes_, kind, name,
            engine_->test_double_ ? TestDoubleImages::kAccept : TestDoubleImages::kReject);
        !st.ok()) {
      return done(st);
    }
    // Counted against the tenant before the image takes room in the store
    // or on the device.
    auto r = engine_->ReserveModule(*session_, sha256_, bytes_.size(), limits_);
    if (!r.ok()) return done(r.status());
    reserved = *r;
    engine_->module_uploads_.fetch_add(1);
    engine_->module_upload_bytes_.fetch_add(bytes_.size());
    auto img = std::make_shared<port::ModuleImage>();
    img->sha256 = sha256_;
    img->bytes = std::move(bytes_);
    img->is_ptx = kind_ == ModuleKind::kPtx;
    absl::MutexLock lock(&engine_->modules_mu_);
    auto it = engine_->module_store_.find(sha256_);
    if (it == engine_->module_store_.end()) {
      if (absl::Status st = engine_->MakeRoom(img->bytes.size(), name); !st.ok()) {
        if (reserved) engine_->ReleaseModule(*session_, sha256_);
        return done(st);
      }
      it = engine_->module_store_.emplace(sha256_, Engine::StoredModule{img, 0, {}}).first;
      engine_->module_store_used_ += img->bytes.size();
      newly_stored = true;
    }
    it->second.tenants.insert(tenant);
    it->second.last_used = ++engine_->module_store_clock_;
    image = it->second.image;
  }
  engine_->FinishModule(session_, image, uploaded, newly_stored, reserved, std::move(done));
}

absl::Status Engine::MakeRoom(uint64_t bytes, absl::string_view what) {
  const uint64_t budget = options_.module_store_bytes;
  if (budget == 0) return absl::OkStatus();
  if (bytes > budget) {
    return absl::ResourceExhaustedError(absl::StrCat("module store: ", what, " is ", bytes,
                                                     " bytes; the daemon keeps at most ", budget,
                                                     " bytes of module images"));
  }
  while (module_store_used_ + bytes > budget) {
    // The least recently used image that no session holds (the store's
    // own reference is then the only one).
    const std::string* victim = nullptr;
    uint64_t oldest = UINT64_MAX;
    for (const auto& [sha, stored] : module_store_) {
      if (stored.image.use_count() == 1 && stored.last_used < oldest) {
        oldest = stored.last_used;
        victim = &sha;
      }
    }
    if (victim == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "module store: ", what, " (", bytes, " bytes) does not fit: open sessions hold ",
          module_store_used_, " of the ", budget, " bytes of module images the daemon keeps"));
    }
    log::Info("module ", victim->substr(0, 12), " evicted from the module store");
    Unstore(*victim);
  }
  return absl::OkStatus();
}

void Engine::Unstore(const std::string& sha256) {
  auto it = module_store_.find(sha256);
  if (it == module_store_.end()) return;
  module_store_used_ -= it->second.image->bytes.size();
  // Posted under the store's lock: a later upload of the same image is
  // queued on each device after this unload.
  for (auto& d : devices_) d->UnloadModule(sha256);
  {
    absl::MutexLock lock(&ports_mu_);
    for (auto& on_device : tenant_ports_) {
      for (auto& [tenant, tp] : on_device) {
        if (tp.port != nullptr) tp.port->UnloadModule(sha256);
      }
    }
  }
  module_store_.erase(it);
}

void Engine::FinishModule(std::shared_ptr<Session> s,
                          std::shared_ptr<const port::ModuleImage> image, bool uploaded,
                          bool newly_stored, bool reserved, Callback<ModuleResult> done) {
  const std::string what = absl::StrCat("module ", image->sha256.substr(0, 12), " (",
                                        image->bytes.size(), " bytes) of ", s->name());
  DeviceOf(*s)->LoadModule(
      image, what, [this, s, image, uploaded, newly_stored, reserved, done](absl::Status st) {
        if (!st.ok()) {
          if (reserved) ReleaseModule(*s, image->sha256);
          // An image the driver rejects as such is not kept. (Other failures,
          // out of memory or a faulted device, say nothing about the image.)
          if (newly_stored && st.code() == absl::StatusCode::kFailedPrecondition) {
            absl::MutexLock lock(&modules_mu_);
            auto it = module_store_.find(image->sha256);
            if (it != module_store_.end() && it->second.image == image) Unstore(image->sha256);
          }
          return done(st);
        }
        absl::MutexLock lock(&s->mu);
        if (s->closed) {
          // Close gave back what the session's handles held, not this.
          if (reserved) ReleaseModule(*s, image->sha256);
          return done(s->ClosedError());
        }
        ModuleResult r;
        r.sha256 = image->sha256;
        r.uploaded = uploaded;
        // One handle per image per session, however often it is loaded.
        for (const auto& [handle, held] : s->modules) {
          if (held->sha256 == image->sha256) r.handle = handle;
        }
        if (r.handle == 0) {
          r.handle = s->NewHandle();
          s->modules.emplace(r.handle, image);
          // A session that loaded the image meanwhile holds it already.
        } else if (reserved) {
          ReleaseModule(*s, image->sha256);
        }
        done(r);
      });
}

void Engine::GetFunction(const Caller& caller, const std::string& token, uint64_t module,
                         const std::string& name, Callback<FunctionResult> done) {
  auto s = FindSession(caller, token);
  if (!s.ok()) return done(s.status());
  std::shared_ptr<Session> session = *s;
  std::shared_ptr<const port::ModuleImage> image;
  {
    absl::MutexLock lock(&session->mu);
    auto it = session->modules.find(module);
    if (it == session->modules.end()) {
      return done(absl::NotFoundError(
          absl::StrCat("module ", HandleName(module), " not found in ", session->name())));
    }
    image = it->second;
  }
  if (name.empty()) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("GetFunction: the kernel name is empty (module ", HandleName(module), ")")));
  }
  // The driver takes a C string: a NUL would end the name early and find
  // another kernel than the one asked for.
  if (const size_t nul = name.find('\0'); nul != std::string::npos) {
    return done(absl::InvalidArgumentError(absl::StrCat(
        "GetFunction: the kernel name '", Quoted(name), "' has a NUL byte at offset ", nul)));
  }
  if (name.size() > kMaxKernelNameBytes) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("GetFunction: the kernel name is ", name.size(), " bytes; at most ",
                     kMaxKernelNameBytes, " ('", Quoted(name), "')")));
  }
  const std::string sha = image->sha256;
  const std::string what = absl::StrCat("module ", HandleName(module), " (sha256 ",
                                        sha.substr(0, 12), ") of ", session->name());
  DeviceOf(*session)->GetKernel(image, name, what,
                                [session, sha, name, done](absl::StatusOr<port::KernelInfo> k) {
                                  if (!k.ok()) return done(k.status());
                                  absl::MutexLock lock(&session->mu);
                                  if (session->closed) return done(session->ClosedError());
                                  // One handle per kernel per session, however often it is asked
                                  // for.
                                  for (const auto& [handle, held] : session->functions) {
                                    if (held.kernel.id == k->id)
                                      return done(FunctionResult{handle, *k});
                                  }
                                  FunctionEntry f;
                                  f.handle = session->NewHandle();
                                  f.module_sha256 = sha;
                                  f.name = name;
                                  f.kernel = *k;
                                  session->functions.emplace(f.handle, f);
                                  done(FunctionResult{f.handle, *k});
                                });
}

// ---------------------------------------------------------------- memory

void Engine::Allocate(const Caller& caller, const std::string& token, uint64_t size,
                      Callback<BufferInfo> done) {
  auto found = FindSession(caller, token);
  if (!found.ok()) return done(found.status());
  std::shared_ptr<Session> s = *found;
  if (size == 0) return done(absl::InvalidArgumentError("Allocate: size must be positive"));
  absl::MutexLock lock(&s->mu);
  if (s->closed) return done(s->ClosedError());
  {
    if (s->memory_limit() != 0 && size > s->memory_limit() - s->memory_used) {
      return done(absl::ResourceExhaustedError(
          absl::StrCat("session memory limit: ", s->name(), " holds ", s->memory_used, " of its ",
                       s->memory_limit(), " bytes; ", size, " more do not fit")));
    }
    // The tenant's limit, reserved as the daemon's is (its sessions
    // allocate concurrently).
    const uint64_t tenant_limit = caller.tenant != nullptr ? caller.tenant->limits.memory_bytes : 0;
    std::atomic<uint64_t>& tenant_used = s->usage().memory;
    if (auto held = Reserve(tenant_used, tenant_limit, size); held.has_value()) {
      return done(absl::ResourceExhaustedError(TenantLimitError(
          caller, absl::StrCat("memory limit: its sessions hold ", *held, " of its ", tenant_limit,
                               " bytes; ", size, " more for ", s->name(), " do not fit"))));
    }
    if (auto held = Reserve(daemon_memory_used_, options_.daemon_memory_bytes, size);
        held.has_value()) {
      tenant_used.fetch_sub(size);
      return done(absl::ResourceExhaustedError(absl::StrCat(
          "daemon memory limit: sessions hold ", *held, " of the daemon's ",
          options_.daemon_memory_bytes, " bytes; ", size, " more for ", s->name(), " do not fit")));
    }
    s->memory_used += size;  // reserved; given back if the device says no
  }
  const std::string what =
      absl::StrCat("a buffer of ", size, " bytes for ", s->name(), " on device ", s->device());
  port::DevicePort* dev = DeviceOf(*s);
  // Posted under the session's lock, so that it is queued before the
  // stream's destruction that a concurrent close queues.
  dev->Allocate(
      s->stream(), size, what,
      [this, s, size, dev, what, done](absl::StatusOr<port::Allocation> p) {
        absl::MutexLock lock(&s->mu);
        if (!p.ok()) {
          // A close in between already gave the whole session's memory back.
          if (!s->closed) ReleaseMemory(*s, size);
          absl::Status st = p.status();
          if (st.code() == absl::StatusCode::kResourceExhausted) {
            st = absl::ResourceExhaustedError(absl::StrCat("device memory: ", st.message()));
          }
          return done(st);
        }
        if (s->closed) {
          // Closed while the allocation was in flight (its memory was already
          // given back by Close): free it again at once.
          dev->Free(s->stream(), p->ptr, p->epoch, what, [](absl::Status) {});
          return done(s->ClosedError());
        }
        BufferEntry b;
        b.handle = s->NewHandle();
        b.ptr = p->ptr;
        b.epoch = p->epoch;
        b.size = size;
        s->buffers.emplace(b.handle, b);
        done(BufferInfo{b.handle, size});
      });
}

void Engine::Free(const Caller& caller, const std::string& token, uint64_t buffer, Done done) {
  auto found = FindSession(caller, token);
  if (!found.ok()) return done(found.status());
  std::shared_ptr<Session> s = *found;
  absl::MutexLock lock(&s->mu);
  if (s->closed) return done(s->ClosedError());
  if (auto it = s->buffers.find(buffer); it != s->buffers.end()) {
    // Freeing a buffer lost with its device's memory just forgets it.
    if (!CheckAlive(*s, it->second).ok()) {
      s->buffers.erase(it);
      return done(absl::OkStatus());
    }
  }
  auto b = FindBuffer(*s, buffer);
  if (!b.ok()) return done(b.status());
  if ((*b)->streams_in_use > 0) {
    return done(absl::FailedPreconditionError(
        absl::StrCat(s->Describe(**b), " is in use by a Write or Read in progress")));
  }
  BufferEntry entry = **b;
  s->buffers.erase(buffer);
  ReleaseMemory(*s, entry.size);
  DeviceOf(*s)->Free(s->stream(), entry.ptr, entry.epoch, s->Describe(entry), std::move(done));
}

void Engine::Memset(const Caller& caller, const std::string& token, uint64_t buffer,
                    uint64_t offset, uint64_t size, uint32_t value, Done done) {
  auto found = FindSession(caller, token);
  if (!found.ok()) return done(found.status());
  std::shared_ptr<Session> s = *found;
  if (value > 255) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("Memset: value ", value, " is not a byte (0..255)")));
  }
  absl::MutexLock lock(&s->mu);
  auto b = FindBuffer(*s, buffer);
  if (!b.ok()) return done(b.status());
  if (size == 0 && offset <= (*b)->size) size = (*b)->size - offset;
  if (auto st = CheckRange(*s, **b, offset, size, "Memset"); !st.ok()) return done(st);
  if (size == 0) return done(absl::OkStatus());
  NoteWork(*s);
  DeviceOf(*s)->Memset(s->stream(), (*b)->ptr + offset, (*b)->epoch, static_cast<uint8_t>(value),
                       size, absl::StrCat("Memset of ", s->Describe(**b)), std::move(done));
}

void Engine::CopyBuffer(const Caller& caller, const std::string& token, uint64_t dst,
                        uint64_t dst_offset, uint64_t src, uint64_t src_offset, uint64_t size,
                        Done done) {
  auto found = FindSession(caller, token);
  if (!found.ok()) return done(found.status());
  std::shared_ptr<Session> s = *found;
  absl::MutexLock lock(&s->mu);
  auto d = FindBuffer(*s, dst);
  if (!d.ok()) return done(d.status());
  auto from = FindBuffer(*s, src);
  if (!from.ok()) return done(from.status());
  if (auto st = CheckRange(*s, **d, dst_offset, size, "CopyBuffer destination"); !st.ok())
    return done(st);
  if (auto st = CheckRange(*s, **from, src_offset, size, "CopyBuffer source"); !st.ok())
    return done(st);
  if (size == 0) return done(absl::OkStatus());
  NoteWork(*s);
  DeviceOf(*s)->Copy(
      s->stream(), (*d)->ptr + dst_offset, (*from)->ptr + src_offset, (*d)->epoch, size,
      absl::StrCat("CopyBuffer from ", s->Describe(**from), " to ", s->Describe(**d)),
      std::move(done));
}

// ---------------------------------------------------------------- Write

absl::StatusOr<std::shared_ptr<WriteSink>> Engine::BeginWrite(const Caller& caller,
                                                              const std::string& token,
                                                              uint64_t buffer, uint64_t offset) {
  GPUEXEC_ASSIGN_OR_RETURN(std::shared_ptr<Session> s, FindSession(caller, token));
  absl::MutexLock lock(&s->mu);
  GPUEXEC_ASSIGN_OR_RETURN(BufferEntry * b, FindBuffer(*s, buffer));
  GPUEXEC_RETURN_IF_ERROR(CheckRange(*s, *b, offset, 0, "Write"));
  std::shared_ptr<WriteSink> sink(new WriteSink(s, buffer, offset));
  sink->device_ = DeviceOf(*s);
  sink->traffic_ = &traffic_[s->device()];
  sink->base_ = b->ptr;
  sink->epoch_ = b->epoch;
  sink->buffer_size_ = b->size;
  sink->what_ = absl::StrCat("Write to ", s->Describe(*b));
  sink->use_ = std::make_unique<BufferUse>(s.get(), b);
  NoteWork(*s);
  sink->max_in_flight_ = std::max<int>(2, static_cast<int>(sink->device_->staging().size() / 4));
  // Staging buffers are taken only once the work queued before this Write
  // is done: none waits behind a long kernel while other sessions need it.
  sink->device_->AfterQueued(s->stream(), b->epoch, sink->what_,
                             [sink](absl::Status st) { sink->OpenGate(st); });
  return sink;
}

WriteSink::WriteSink(std::shared_ptr<Session> session, uint64_t buffer, uint64_t offset)
    : session_(std::move(session)), buffer_(buffer), next_offset_(offset) {}

void WriteSink::Push(ByteSpans data, Done more) {
  {
    absl::MutexLock lock(&session_->mu);
    session_->Touch();  // a long transfer keeps its session alive
  }
  absl::Status error;
  {
    absl::MutexLock lock(&mu_);
    error = error_;
  }
  if (error.ok() && data.size() > buffer_size_ - next_offset_) {
    BufferEntry b;
    b.handle = buffer_;
    b.size = buffer_size_;
    error = absl::OutOfRangeError(absl::StrCat("Write of ", data.size(), " more bytes at offset ",
                                               next_offset_, " goes past the end of ",
                                               session_->Describe(b)));
  }
  if (!error.ok()) {
    // The call ends here and enqueues no more copies; those already queued
    // come before any Free in stream order, so the buffer can be freed now.
    // `more` may drop the last reference to this sink: no lock held.
    use_->Release();
    return more(error);
  }
  PushFrom(std::move(data), std::move(more));
}

void WriteSink::OpenGate(absl::Status status) {
  ByteSpans data;
  Done more;
  {
    absl::MutexLock lock(&mu_);
    gate_open_ = true;
    if (!status.ok() && error_.ok()) error_ = status;
    std::swap(more, parked_more_);
    data = std::move(parked_data_);
    parked_data_.Clear();
  }
  if (more) PushFrom(std::move(data), std::move(more));
}

void WriteSink::PushFrom(ByteSpans data, Done more) {
  {
    absl::ReleasableMutexLock lock(&mu_);
    if (data.empty() || !error_.ok()) {
      absl::Status error = error_;
      lock.Release();
      return more(error);
    }
    if (!gate_open_ || in_flight_ >= max_in_flight_) {
      // Resumed by the gate or by the next copy that completes.
      parked_data_ = std::move(data);
      parked_more_ = std::move(more);
      return;
    }
    ++in_flight_;
  }
  auto self = shared_from_this();
  session_->staging.Acquire(
      device_->staging(), [self, data = std::move(data), more](port::StagingSlot slot) {
        const size_t n = std::min<uint64_t>(data.size(), slot.capacity);
        data.CopyPrefix(slot.data, n);
        const uint64_t dst_offset = self->next_offset_;
        self->next_offset_ += n;
        bool closed;
        {
          // Under the session lock, so that the copy is queued before any free
          // that a concurrent close queues.
          absl::MutexLock slock(&self->session_->mu);
          closed = self->session_->closed;
          if (!closed) {
            self->device_->CopyToDevice(
                self->session_->stream(), self->base_ + dst_offset, self->epoch_, slot, n,
                self->what_, [self, slot, n](absl::Status st) {
                  self->session_->staging.Release(self->device_->staging(), slot);
                  if (st.ok()) {
                    self->traffic_->bytes_written.fetch_add(n);
                    self->session_->usage().traffic.bytes_written.fetch_add(n);
                    absl::MutexLock lock(&self->mu_);
                    self->written_ += n;
                  }
                  self->OnCopyDone(st);
                });
          }
        }
        if (closed) {
          self->session_->staging.Release(self->device_->staging(), slot);
          self->OnCopyDone(self->session_->ClosedError());
        }
        self->PushFrom(data.Suffix(n), more);
      });
}

void WriteSink::OnCopyDone(absl::Status status) {
  Callback<uint64_t> finish;
  absl::StatusOr<uint64_t> result;
  {
    absl::ReleasableMutexLock lock(&mu_);
    if (!status.ok() && error_.ok()) error_ = status;
    --in_flight_;
    if (parked_more_) {
      Done more = std::move(parked_more_);
      parked_more_ = nullptr;
      ByteSpans data = std::move(parked_data_);
      parked_data_.Clear();
      lock.Release();
      return PushFrom(std::move(data), std::move(more));
    }
    if (in_flight_ != 0 || !finish_) return;
    finish = std::move(finish_);
    finish_ = nullptr;
    result = ResultLocked();
  }
  // The buffer is free for other calls before the caller hears back.
  use_->Release();
  finish(result);
}

absl::StatusOr<uint64_t> WriteSink::ResultLocked() const {
  if (!error_.ok()) return error_;
  return written_;
}

void WriteSink::Finish(Callback<uint64_t> done) {
  absl::StatusOr<uint64_t> result;
  {
    absl::MutexLock lock(&mu_);
    if (in_flight_ != 0) {
      finish_ = std::move(done);
      return;
    }
    result = ResultLocked();
  }
  use_->Release();
  done(result);
}

// ---------------------------------------------------------------- Read

absl::StatusOr<std::shared_ptr<ReadSource>> Engine::BeginRead(const Caller& caller,
                                                              const std::string& token,
                                                              uint64_t buffer, uint64_t offset,
                                                              uint64_t size, uint32_t chunk) {
  GPUEXEC_ASSIGN_OR_RETURN(std::shared_ptr<Session> s, FindSession(caller, token));
  absl::MutexLock lock(&s->mu);
  GPUEXEC_ASSIGN_OR_RETURN(BufferEntry * b, FindBuffer(*s, buffer));
  if (size == 0 && offset <= b->size) size = b->size - offset;
  GPUEXEC_RETURN_IF_ERROR(CheckRange(*s, *b, offset, size, "Read"));
  port::DevicePort* dev = DeviceOf(*s);
  if (chunk == 0) chunk = options_.chunk_bytes;
  chunk = static_cast<uint32_t>(std::min<uint64_t>(chunk, dev->staging().capacity()));
  std::shared_ptr<ReadSource> src(new ReadSource(s, buffer, offset, size, chunk));
  src->device_ = dev;
  src->traffic_ = &traffic_[s->device()];
  src->chunks_ = read_chunks_;
  src->base_ = b->ptr;
  src->epoch_ = b->epoch;
  src->what_ = absl::StrCat("Read of ", s->Describe(*b));
  src->use_ = std::make_unique<BufferUse>(s.get(), b);
  // As for Write: no staging buffer waits behind work queued before.
  dev->AfterQueued(s->stream(), b->epoch, src->what_,
                   [src](absl::Status st) { src->OpenGate(st); });
  return src;
}

ReadSource::ReadSource(std::shared_ptr<Session> session, uint64_t buffer, uint64_t offset,
                       uint64_t size, uint32_t chunk)
    : session_(std::move(session)),
      buffer_(buffer),
      end_(offset + size),
      chunk_(chunk),
      fetch_offset_(offset),
      deliver_offset_(offset) {}

uint64_t ReadSource::remaining() const {
  absl::MutexLock lock(&mu_);
  return end_ - deliver_offset_;
}

void ReadSource::Next(std::function<void(absl::StatusOr<ReadChunk>)> done) {
  // `done` can run within this call (a chunk ready at once), and its caller
  // may then let go of this source: it lives until the call returns.
  auto self = shared_from_this();
  {
    absl::MutexLock lock(&session_->mu);
    session_->Touch();  // a long transfer keeps its session alive
  }
  {
    absl::MutexLock lock(&mu_);
    waiter_ = std::move(done);
  }
  FetchAhead();
  Deliver();
}

void ReadSource::OpenGate(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    gate_open_ = true;
    if (!status.ok()) {
      // Everything queued before failed: so does this Read.
      ready_.emplace(deliver_offset_, status);
      fetch_offset_ = end_;
      ++fetching_;
    }
  }
  FetchAhead();
  Deliver();
}

void ReadSource::FetchAhead() {
  // Two chunks ahead of the one being delivered keep the copy engine busy
  // while the network drains the last one.
  constexpr int kAhead = 2;
  std::vector<std::pair<uint64_t, uint64_t>> fetches;
  {
    absl::MutexLock lock(&mu_);
    if (!gate_open_) return;
    while (fetching_ < kAhead && fetch_offset_ < end_) {
      const uint64_t n = std::min<uint64_t>(chunk_, end_ - fetch_offset_);
      fetches.emplace_back(fetch_offset_, n);
      fetch_offset_ += n;
      ++fetching_;
    }
  }
  for (const auto& [offset, n] : fetches) Fetch(offset, n);
}

void ReadSource::Fetch(uint64_t offset, uint64_t n) {
  auto self = shared_from_this();
  session_->staging.Acquire(device_->staging(), [self, offset, n](port::StagingSlot slot) {
    bool closed;
    {
      // Under the session lock, so that the copy is queued before any free
      // that a concurrent close queues.
      absl::MutexLock slock(&self->session_->mu);
      closed = self->session_->closed;
      if (!closed) {
        self->device_->CopyToHost(
            self->session_->stream(), slot, self->base_ + offset, self->epoch_, n, self->what_,
            [self, slot, offset, n](absl::Status st) {
              if (!st.ok()) {
                self->session_->staging.Release(self->device_->staging(), slot);
                return self->Ready(offset, st);
              }
              // Copied out at once, so that the staging buffer goes back
              // now: a chunk waits here for the caller for as long as its
              // client takes to read, and a stalled Read must not hold
              // buffers every session of the device copies through.
              std::shared_ptr<char> bytes = self->chunks_->Take(n);
              std::memcpy(bytes.get(), slot.data, n);
              self->session_->staging.Release(self->device_->staging(), slot);
              ReadChunk chunk;
              chunk.offset = offset;
              chunk.bytes = absl::string_view(bytes.get(), n);
              chunk.hold = std::move(bytes);
              self->Ready(offset, std::move(chunk));
            });
      }
    }
    if (closed) {
      self->session_->staging.Release(self->device_->staging(), slot);
      self->Ready(offset, self->session_->ClosedError());
    }
  });
}

void ReadSource::Ready(uint64_t offset, absl::StatusOr<ReadChunk> chunk) {
  if (chunk.ok()) {
    traffic_->bytes_read.fetch_add(chunk->bytes.size());
    session_->usage().traffic.bytes_read.fetch_add(chunk->bytes.size());
  }
  {
    absl::MutexLock lock(&mu_);
    ready_.emplace(offset, std::move(chunk));
  }
  Deliver();
}

void ReadSource::Deliver() {
  std::function<void(absl::StatusOr<ReadChunk>)> waiter;
  absl::StatusOr<ReadChunk> result;
  bool last;
  {
    absl::MutexLock lock(&mu_);
    if (!waiter_) return;
    auto it = ready_.find(deliver_offset_);
    if (it == ready_.end()) return;
    if (it->second.ok()) {
      deliver_offset_ += it->second->bytes.size();
      result = std::move(it->second);
    } else {
      result = it->second.status();
      deliver_offset_ = end_;  // nothing more after an error
    }
    ready_.erase(it);
    --fetching_;
    waiter = std::move(waiter_);
    waiter_ = nullptr;
    last = deliver_offset_ == end_;
  }
  // The buffer is free for other calls before the caller hears the end.
  if (last) use_->Release();
  waiter(std::move(result));
}

// ---------------------------------------------------------------- launch

void Engine::Launch(const Caller& caller, LaunchSpec spec, Callback<uint64_t> gpu_ns) {
  auto found = FindSession(caller, spec.session);
  if (!found.ok()) return gpu_ns(found.status());
  std::shared_ptr<Session> s = *found;
  if (absl::Status st = CheckStrikes(*s); !st.ok()) return gpu_ns(st);
  port::DevicePort* dev = DeviceOf(*s);
  const port::DeviceProperties& p = dev->properties();
  port::LaunchOp op;
  uint64_t epoch = 0;  // of the buffers passed
  {
    absl::MutexLock lock(&s->mu);
    auto fit = s->functions.find(spec.function);
    if (fit == s->functions.end()) {
      return gpu_ns(absl::NotFoundError(
          absl::StrCat("function ", HandleName(spec.function), " not found in ", s->name())));
    }
    const FunctionEntry& f = fit->second;
    const std::string kname = absl::StrCat("kernel '", Quoted(f.name), "'");
    const LaunchShape shape{{spec.grid.x, spec.grid.y, spec.grid.z},
                            {spec.block.x, spec.block.y, spec.block.z},
                            {spec.cluster.x, spec.cluster.y, spec.cluster.z},
                            spec.shared_bytes};
    if (absl::Status st = CheckLaunchShape(shape, f.kernel.attributes, p, kname); !st.ok()) {
      return gpu_ns(st);
    }
    auto resolve = [&](size_t index, const ArgValue& a) -> absl::StatusOr<port::DevicePtr> {
      s->mu.AssertHeld();  // called by PackArgs below, under the lock taken above
      auto it = s->buffers.find(a.buffer);
      if (it == s->buffers.end()) {
        return absl::NotFoundError(absl::StrCat("parameter ", index, " of ", kname, ": buffer ",
                                                HandleName(a.buffer), " not found in ", s->name()));
      }
      if (absl::Status st = CheckAlive(*s, it->second); !st.ok()) {
        return absl::Status(st.code(),
                            absl::StrCat("parameter ", index, " of ", kname, ": ", st.message()));
      }
      epoch = it->second.epoch;
      if (a.offset >= it->second.size) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter ", index, " of ", kname, ": offset ", a.offset,
                         " is past the end of ", s->Describe(it->second)));
      }
      return it->second.ptr + a.offset;
    };
    auto block_bytes = PackArgs(f.name, f.kernel.params, f.kernel.param_bytes, spec.args, resolve);
    if (!block_bytes.ok()) return gpu_ns(block_bytes.status());
    op.kernel = f.kernel.id;
    op.param_block = std::move(block_bytes).value();
    const bool clustered = shape.cluster[0] != 0 || shape.cluster[1] != 0 || shape.cluster[2] != 0;
    for (int i = 0; i < 3; ++i) {
      op.geometry.grid[i] = shape.grid[i];
      op.geometry.block[i] = shape.block[i];
      op.geometry.cluster[i] = clustered ? (shape.cluster[i] == 0 ? 1 : shape.cluster[i]) : 0;
    }
    op.geometry.shared_bytes = spec.shared_bytes;
    op.what = absl::StrCat(kname, " of ", s->name(), " on device ", p.ordinal);
    TrafficCounters* traffic = &traffic_[s->device()];
    TrafficCounters* tenant_traffic = &s->usage().traffic;
    NoteWork(*s);
    if (!spec.synchronize) {
      dev->Launch(s->stream(), std::move(op), epoch,
                  [gpu_ns, traffic, tenant_traffic](absl::Status st) {
                    if (!st.ok()) return gpu_ns(st);
                    traffic->launches.fetch_add(1);
                    tenant_traffic->launches.fetch_add(1);
                    gpu_ns(uint64_t{0});
                  });
      return;
    }
    // The synchronize goes with the launch, in one request and one answer.
    ++s->waiting;
    const uint64_t work_epoch = s->work_epoch;
    s->work_epoch = 0;
    dev->LaunchAndSynchronize(
        s->stream(), std::move(op), epoch, work_epoch,
        [s, traffic, gpu_ns, work_epoch](absl::StatusOr<uint64_t> ns, bool launched) {
          if (launched) {
            traffic->launches.fetch_add(1);
            s->usage().traffic.launches.fetch_add(1);
          }
          if (ns.ok()) s->usage().traffic.gpu_ns.fetch_add(*ns);
          {
            absl::MutexLock lock(&s->mu);
            --s->waiting;
            s->Touch();
            // Refused before it reached the device: as Synchronize below.
            if (!launched && !ns.ok()) RestoreWorkEpoch(*s, work_epoch, ns.status());
          }
          gpu_ns(std::move(ns));
        });
  }
}

void Engine::Synchronize(const Caller& caller, const std::string& token,
                         Callback<uint64_t> gpu_ns) {
  auto found = FindSession(caller, token);
  if (!found.ok()) return gpu_ns(found.status());
  Synchronize(*found, std::move(gpu_ns));
}

void Engine::RestoreWorkEpoch(Session& s, uint64_t work_epoch, const absl::Status& status) {
  // A Synchronize refused before it reached the device (a worker that has
  // not taken its requests, say) settled nothing: the work it would have
  // waited for is still unreported. (ABORTED reported its loss.)
  if (work_epoch == 0 || status.code() == absl::StatusCode::kAborted) return;
  if (s.work_epoch == 0 || work_epoch < s.work_epoch) s.work_epoch = work_epoch;
}

void Engine::Synchronize(std::shared_ptr<Session> s, Callback<uint64_t> gpu_ns) {
  absl::MutexLock lock(&s->mu);
  if (s->closed) return gpu_ns(s->ClosedError());
  ++s->waiting;
  const uint64_t work_epoch = s->work_epoch;
  s->work_epoch = 0;
  DeviceOf(*s)->Synchronize(s->stream(), work_epoch,
                            [s, gpu_ns, work_epoch](absl::StatusOr<uint64_t> ns) {
                              if (ns.ok()) s->usage().traffic.gpu_ns.fetch_add(*ns);
                              {
                                absl::MutexLock lock(&s->mu);
                                --s->waiting;
                                s->Touch();
                                if (!ns.ok()) RestoreWorkEpoch(*s, work_epoch, ns.status());
                              }
                              gpu_ns(std::move(ns));
                            });
}

}  // namespace gpuexec::core
