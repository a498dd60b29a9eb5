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

namespace {

KernelReset FactsOf(const port::ResetInfo& info) {
  KernelReset f;
  f.device = info.device;
  f.at = info.at;
  f.hang = info.hang;
  f.result = info.result;
  f.limit_ms = info.limit_ms;
  f.ran_ms = info.ran_ms;
  f.launches = info.launches;
  return f;
}

}  // namespace

void Engine::OnDeviceReset(int index, const port::DevicePort* port, const port::ResetInfo& info) {
  std::vector<std::shared_ptr<Session>> affected;
  std::vector<std::shared_ptr<Session>> named;
  // Under MPS the first reset of a device opens a fault window; every reset
  // within it (the fault's reach, or the fault itself found late) adds the
  // sessions it names, and the charge is settled when it closes.
  bool opened = false;
  {
    absl::MutexLock lock(&sessions_mu_);
    ResetNames names;
    names.epoch = info.epoch;
    names.facts = FactsOf(info);
    names.unknown = info.kernels.size();
    for (auto& [token, s] : sessions_) {
      // Only the sessions this port served: a tenant's own worker takes
      // its tenant's buffers with it and nobody else's.
      if (s->device() != index || s->port() != port) continue;
      affected.push_back(s);
      // The reset names kernels by the stream they were launched on (a
      // session's own on its port) and their id: for a fault, every
      // kernel not yet synchronized; for a hang, the one that hung.
      std::vector<std::string> own;
      {
        absl::MutexLock session_lock(&s->mu);
        own = OwnKernels(info, *s);
      }
      names.unknown -= own.size();
      for (std::string& label : own) {
        names.kernels.push_back(NamedKernel{s->tenant(), s->token(), s->name(), std::move(label)});
      }
      if (!own.empty()) named.push_back(s);
    }
    reset_names_[port] = std::move(names);
    if (options_.mps) {
      MpsWindow& w = mps_windows_[index];
      if (!w.open) {
        w.open = true;
        w.first = info;
        w.first_named = named;
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

namespace {

// The quoted name of `s`'s function `function_handle`, or (0) of the one
// whose kernel is `kernel`; "?" for none. A handle is one lookup.
std::string QuotedName(const Session& s, uint64_t function_handle, port::KernelId kernel)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  if (function_handle != 0) {
    auto it = s.functions.find(function_handle);
    return it != s.functions.end() ? it->second.quoted_name : "?";
  }
  for (const auto& [handle, f] : s.functions) {
    if (f.kernel.id == kernel) return f.quoted_name;
  }
  return "?";
}

}  // namespace

std::vector<std::string> Engine::OwnKernels(const port::ResetInfo& info, Session& s) {
  // Runs under sessions_mu_: each distinct kernel of a graph named once.
  std::vector<std::string> own;
  for (const port::ResetKernel& k : info.kernels) {
    if (k.stream != s.stream()) continue;
    const GraphEntry* graph = nullptr;
    if (k.graph != 0) {
      for (const auto& [handle, g] : s.graphs) {
        if (g.id == k.graph) graph = &g;
      }
    }
    if (graph == nullptr) {
      own.push_back(KernelLabel(QuotedName(s, 0, k.kernel)));
      continue;
    }
    // A replay: any of its kernel nodes may be the one.
    std::vector<std::string> names;
    absl::flat_hash_set<uint64_t> seen;
    for (const std::optional<GraphKernel>& node : graph->kernels) {
      if (node.has_value() && seen.insert(node->spec.function).second) {
        names.push_back(QuotedName(s, node->spec.function, 0));
      }
    }
    own.push_back(ReplayLabel(absl::StrCat("graph ", HandleName(graph->handle)), names));
  }
  return own;
}

absl::Status Engine::LostTo(Session& s, uint64_t epoch, absl::Status lost) {
  // Under MPS another client's fault reaches this one's kernels in flight:
  // the fault window settles whose it was, not this.
  // A closed session's functions are gone: its kernels have no names here.
  if (options_.mps || s.closed) return lost;
  std::optional<port::ResetInfo> info = DeviceOf(s)->last_reset();
  if (!info.has_value() || info->epoch != epoch + 1) return lost;
  std::vector<std::string> own = OwnKernels(*info, s);
  if (own.empty()) return lost;
  return absl::AbortedError(KernelFaultMessage(FactsOf(*info), own, s.name(), /*closed=*/false));
}

bool Engine::RecordedNames(const Session& s, uint64_t epoch, KernelReset* facts,
                           std::vector<std::string>* own) {
  absl::MutexLock lock(&sessions_mu_);
  auto it = reset_names_.find(s.port());
  if (it == reset_names_.end() || (epoch != 0 && it->second.epoch != epoch)) return false;
  for (const NamedKernel& k : it->second.kernels) {
    if (k.token == s.token()) own->push_back(k.label);
  }
  *facts = it->second.facts;
  return true;
}

absl::Status Engine::FaultFor(absl::Status st, Session& s, bool closed, uint64_t work_epoch) {
  if (st.code() != absl::StatusCode::kAborted) return st;
  // Work queued before a reset, refused once the device's epoch moved on:
  // the words of the reset that ended the epoch it waited for, or none.
  const bool lost = absl::StrContains(st.message(), " was lost: ");
  if (lost && work_epoch == 0) return st;
  KernelReset facts;
  std::vector<std::string> own;
  // OnDeviceReset's names, where it has run (a closed session's own
  // functions are gone by then).
  if (RecordedNames(s, lost ? work_epoch + 1 : 0, &facts, &own)) {
    if (own.empty() || (lost && options_.mps)) return st;
    return absl::AbortedError(KernelFaultMessage(facts, own, s.name(), closed));
  }
  // Work of an epoch the reset ended, refused ("was lost") or failed with
  // the reset's own words ("was reset at"): not yet named by
  // OnDeviceReset, but the device records the reset (and the kernels it
  // names) before the new epoch shows, so this needs no wait for it.
  if (work_epoch == 0) return st;
  absl::MutexLock lock(&s.mu);
  return LostTo(s, work_epoch, std::move(st));
}

absl::Status Engine::FaultFor(absl::Status st, Session& s) {
  bool closed;
  {
    absl::MutexLock lock(&s.mu);
    closed = s.closed;
  }
  return FaultFor(std::move(st), s, closed);
}

std::string Engine::ResetTextFor(const Caller& caller, const port::DevicePort* port,
                                 const port::ResetInfo& r) {
  std::string text = absl::StrCat(
      absl::FormatTime("%Y-%m-%d %H:%M:%E3S UTC", r.at, absl::UTCTimeZone()), ": ", r.why);
  auto it = reset_names_.find(port);
  if (it == reset_names_.end() || it->second.epoch != r.epoch) return text;
  const ResetNames& names = it->second;
  // The reader's own kernels by name; every other tenant's only counted.
  std::vector<std::string> shown;
  size_t others = names.unknown;
  for (const NamedKernel& k : names.kernels) {
    if (caller.sees_all || k.tenant == caller.tenant_name()) {
      shown.push_back(absl::StrCat(k.label, " of ", k.session_name));
    } else {
      ++others;
    }
  }
  if (others != 0) {
    shown.push_back(others == 1 ? std::string("another tenant's kernel")
                                : absl::StrCat(others,
                                               " kernels of other tenants or closed "
                                               "sessions"));
  }
  if (shown.empty()) return text;
  return absl::StrCat(text, names.facts.hang ? "; the kernel: " : "; kernels in flight: ",
                      absl::StrJoin(shown, ", "));
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
  std::vector<std::shared_ptr<Session>> first_named;
  {
    absl::MutexLock lock(&sessions_mu_);
    MpsWindow& w = mps_windows_[index];
    first = w.first;
    named.swap(w.named);
    first_named.swap(w.first_named);
    w = MpsWindow();
  }
  // Each client the fault reached sees the same error, and a busy
  // bystander's worker names its own kernels: the tenant charged is the
  // one whose worker reported the fault first (the reaching faults come
  // later), as without MPS. Where that report named no kernel (an idle
  // worker found it first), the window's named sessions, if they are of
  // one tenant (or peer); several: none (Strike says so in the log).
  if (!first_named.empty()) return Strike(index, first, std::move(first_named));
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
  // Each session's later calls read what its kernel did (the reset names
  // it), not only that the device was reset.
  const KernelReset facts = FactsOf(info);
  for (auto& s : named) {
    std::vector<std::string> own;
    {
      absl::MutexLock lock(&s->mu);
      own = OwnKernels(info, *s);
    }
    Close(s, CloseReason::kFaulted,
          absl::StrCat(ClosedByResetWords(facts, own, info.kernels.size()), strike,
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
  if (offset > b.size) {
    return absl::OutOfRangeError(
        absl::StrCat(op, " at offset ", offset, " starts past the end of ", s.Describe(b)));
  }
  if (size > b.size - offset) {
    return absl::OutOfRangeError(absl::StrCat(op, " of ", ByteSize(size), " at offset ", offset,
                                              " goes past the end of ", s.Describe(b)));
  }
  return absl::OkStatus();
}

}  // namespace gpuexec::core
