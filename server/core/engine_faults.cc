// Device resets: the buffers they take, the MPS fault window, strikes.
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
#include "server/core/engine_internal.h"
#include "server/core/fault_words.h"
#include "server/core/image_check.h"
#include "server/core/launch_check.h"

namespace gpuexec::core {

using internal::NamesKernelOf;

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
    // Host memory regions went with the process that had them pinned.
    for (auto& [handle, r] : s->regions) {
      if (r.epoch >= info.epoch || r.lost) continue;
      r.lost = true;
      ReleasePinned(*s, r.bytes);
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
  const std::string strike =
      absl::StrCat(" (strike ", count,
                   options_.strike_limit != 0 ? absl::StrCat(" of ", options_.strike_limit) : "",
                   " for ", key, " within ", absl::ToInt64Seconds(options_.strike_window), " s)");
  if (until != absl::InfinitePast()) {
    log::Warning("strike limit: the kernels of ", key, " reset devices ", count, " times within ",
                 absl::ToInt64Seconds(options_.strike_window),
                 " s; its launches are refused until ",
                 absl::FormatTime("%Y-%m-%d %H:%M:%E3S UTC", until, absl::UTCTimeZone()));
  }
  // Each session's later calls read what its kernel did (the reason names
  // it), not only that the device was reset.
  for (auto& s : named) {
    Close(s, CloseReason::kFaulted,
          absl::StrCat(ClosedByResetWords(info.why, s->name(), index, info.at), strike,
                       ": open a new session"),
          [](absl::Status) {});
  }
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
  // When it lifts and how to lift it sooner: strikes live in the daemon's
  // memory only, and the limit is the daemon's flag.
  const int64_t left_s =
      std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(until - absl::Now(), absl::Seconds(1))));
  return absl::FailedPreconditionError(absl::StrCat(
      "launches of ", s.strike_key, " are refused until ",
      absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", until, absl::UTCTimeZone()), " (in ", left_s,
      " s): its kernels reset devices ", count, " times within ",
      absl::ToInt64Seconds(options_.strike_window), " s (--strike_limit=", options_.strike_limit,
      "); to lift it now, restart gpuexecd, or run it with --strike_limit=0 "
      "(no limit) or a higher one"));
}

absl::Status Engine::CheckRange(const Session& s, const BufferEntry& b, uint64_t offset,
                                uint64_t size, absl::string_view op) {
  if (offset > b.size || size > b.size - offset) {
    return absl::OutOfRangeError(absl::StrCat(op, " of ", ByteSize(size), " at offset ", offset,
                                              " goes past the end of ", s.Describe(b)));
  }
  return absl::OkStatus();
}

}  // namespace gpuexec::core
