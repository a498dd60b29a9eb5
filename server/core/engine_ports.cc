// The ports sessions are served by: a tenant's own worker, started on its
// first session on a device and ended when idle.
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
#include "server/core/engine.h"
#include "server/core/image_check.h"
#include "server/core/launch_check.h"

namespace gpuexec::core {

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
          {
            // What its last reset named goes with it (before its address
            // can be another port's).
            absl::MutexLock lock(&sessions_mu_);
            reset_names_.erase(port.get());
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

}  // namespace gpuexec::core
