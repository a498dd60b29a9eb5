// A device's streams: their creation and end, the events that time and
// watch their work, the launches held behind the bound on queued ones, and
// Synchronize.
#include <algorithm>
#include <optional>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "server/common/log.h"
#include "server/common/status_macros.h"
#include "server/common/trace.h"
#include "server/device/device.h"
#include "server/device/device_internal.h"

namespace gpuexec::device {

using internal::kSmallOpBytes;

bool Device::PollEvents() {
  const bool watching = PollWatches();  // may release held launches
  // Nothing more posted: the run of launches whose end is due has ended
  // (under a flood of launches, the next turn's operations are posted
  // already, and the next other operation or Synchronize settles it).
  // Before the loop may pause, so the end is not recorded a pause late.
  if (executor_.backlog() == 0) SettleDueEnd();
  if (event_waits_.empty()) return watching;
  // Completions may add waits (a new Synchronize): take the list first.
  std::vector<EventWait> waits;
  waits.swap(event_waits_);
  std::vector<EventWait> still;
  for (EventWait& w : waits) {
    absl::StatusOr<bool> done = driver_->EventDone(*w.event, *w.what);
    if (done.ok() && !*done) {
      still.push_back(std::move(w));
      continue;
    }
    w.fn(done.ok() ? absl::OkStatus() : Check(done.status()));
  }
  for (EventWait& w : still) event_waits_.push_back(std::move(w));
  return watching || !event_waits_.empty();
}

bool Device::PollWatches() {
  if (watched_.empty() || faulted_.load()) return false;
  const absl::Time now = absl::Now();
  if (options_.watch_poll_every > absl::ZeroDuration() && held_bytes_ == 0) {
    // Nothing waits on them: a look now and then is enough for the time
    // limit (seconds) and an untimed stream's end (microseconds off).
    if (now - last_watch_poll_ < options_.watch_poll_every) return true;
  }
  last_watch_poll_ = now;
  // Streams whose held operations may run now (after the loop: they may
  // launch, which changes watched_).
  absl::InlinedVector<StreamId, 4> release;
  for (auto it = watched_.begin(); it != watched_.end();) {
    auto sit = streams_.find(*it);
    if (sit == streams_.end()) {
      watched_.erase(it++);
      continue;
    }
    StreamState& s = *sit->second;
    if (!s.held.empty()) release.push_back(*it);
    if (!s.watches.empty() && s.watches.front().start != nullptr) {
      // The head launch's clock starts once the work ahead of it is done.
      StreamState::Watch& head = s.watches.front();
      absl::StatusOr<bool> started = driver_->EventDone(*head.start, *head.what);
      if (!started.ok()) {
        (void)Check(started.status());
        return false;
      }
      if (!*started) {
        ++it;
        continue;
      }
      head.start.reset();
      s.head_since = now;
    }
    const uint64_t newest = s.watches.empty() ? 0 : s.watches.back().work;
    if (s.watches.size() > 1) {
      // In stream order: once the newest is done, every one is. Under a
      // stream of short launches this is one query per poll, not one per
      // launch.
      absl::StatusOr<bool> done =
          driver_->EventDone(*s.watches.back().done, *s.watches.back().what);
      if (!done.ok()) {
        (void)Check(done.status());
        return false;
      }
      if (*done) {
        s.watches.clear();  // their events go back to the spares
        s.queued = s.uncovered;
        s.head_since = now;
      }
    }
    while (!s.watches.empty()) {
      absl::StatusOr<bool> done =
          driver_->EventDone(*s.watches.front().done, *s.watches.front().what);
      if (!done.ok()) {
        (void)Check(done.status());
        return false;
      }
      if (!*done) break;
      s.queued -= s.watches.front().launches;
      s.watches.pop_front();
      // The next launch could start only now. (Only a launch watched
      // when nothing else was has a start event: never one behind another.)
      s.head_since = now;
    }
    if (s.watches.empty()) {
      if (s.untimed && newest != 0) {
        // Where an untimed Synchronize's interval ends (UntimedNs), if no
        // work came after this launch.
        s.done_seen_work = newest;
        s.done_seen_at = std::chrono::steady_clock::now();
      }
      watched_.erase(it++);
      continue;
    }
    const absl::Duration running = now - s.head_since;
    const StreamState::Watch& head = s.watches.front();
    const absl::Duration limit = s.time_limit * head.launches;
    if (s.time_limit > absl::ZeroDuration() && running > limit &&
        now - s.last_hung_report >= absl::Seconds(1)) {
      s.last_hung_report = now;
      HungReport hung;
      hung.stream = *it;
      hung.kernel = head.kernel;
      hung.graph = head.graph;
      hung.ran_ms = static_cast<uint64_t>(absl::ToInt64Milliseconds(running));
      hung.limit_ms = static_cast<uint64_t>(absl::ToInt64Milliseconds(limit));
      const std::string past =
          absl::StrCat(" has run for ", hung.ran_ms, " ms, past its kernel time limit of ",
                       hung.limit_ms, " ms");
      // A watch shared by a run's launches cannot tell which of them runs.
      const std::string of_run =
          head.launches == 1
              ? std::string()
              : absl::StrCat(" (or one of the ", head.launches - 1,
                             " launches queued right before it; the limit is theirs together, ",
                             absl::ToInt64Milliseconds(s.time_limit), " ms each)");
      hung.detail = absl::StrCat(*head.what, of_run, past);
      hung.reason = absl::StrCat("a kernel on device ", props_.ordinal, past);
      if (options_.on_hung) {
        options_.on_hung(hung);
      } else {
        log::Error(hung.detail);
      }
    }
    ++it;
  }
  for (StreamId id : release) ReleaseHeld(id);
  return !watched_.empty();
}

bool Device::Watched(const StreamState& s) const {
  return s.time_limit > absl::ZeroDuration() || options_.max_queued_launches > 0;
}

bool Device::QueueFull(const StreamState& s) const {
  return options_.max_queued_launches > 0 && !stopping_ && !faulted_.load() &&
         s.queued >= static_cast<size_t>(options_.max_queued_launches);
}

void Device::OnStream(StreamId stream, OpKind kind, size_t bytes, std::function<void()> op,
                      std::function<void(absl::Status)> refuse) {
  const TurnKeys::Turn turn = options_.stream_turns ? turn_keys_.Of(stream) : TurnKeys::Turn{};
  executor_.Post(
      [this, stream, kind, bytes, op = std::move(op), refuse = std::move(refuse)]() mutable {
        auto it = streams_.find(stream);
        if (it != streams_.end()) {
          StreamState& s = *it->second;
          if (!s.held.empty() || (kind == OpKind::kLaunch && QueueFull(s))) {
            if (kind != OpKind::kRelease && (s.held.size() >= options_.max_held_per_stream ||
                                             held_bytes_ + bytes > options_.max_held_bytes)) {
              return refuse(absl::ResourceExhaustedError(absl::StrCat(
                  "device ", props_.ordinal, ": the session's stream has ", s.held.size(),
                  " operations waiting behind its ", s.queued,
                  " queued launches, the most it may hold (", options_.max_held_per_stream,
                  " a stream, ", options_.max_held_bytes >> 20,
                  " MiB on the device); wait for its work (Synchronize) and retry")));
            }
            held_bytes_ += bytes;
            s.held.push_back(StreamState::Held{kind, bytes, std::move(op), std::move(refuse)});
            return;
          }
        }
        RunOnStream(stream, kind, op);
      },
      // Its own key in its tenant's group: tenants take turns, and each
      // tenant's streams its turns. (The driver orders nothing across
      // streams either.)
      turn.key, turn.group);  // key 0 (a barrier each) with turns off
}

void Device::ReleaseHeld(StreamId stream) {
  for (;;) {
    // Looked up each time: an operation run here may end the stream.
    auto it = streams_.find(stream);
    if (it == streams_.end() || it->second->held.empty()) return;
    StreamState& s = *it->second;
    if (s.held.front().kind == OpKind::kLaunch && QueueFull(s)) return;
    std::function<void()> op = std::move(s.held.front().op);
    const OpKind kind = s.held.front().kind;
    held_bytes_ -= s.held.front().bytes;
    s.held.pop_front();
    RunOnStream(stream, kind, op);
  }
}

void Device::ReleaseAllHeld() {
  std::vector<StreamId> ids;
  for (const auto& [id, s] : streams_) {
    if (!s->held.empty()) ids.push_back(id);
  }
  for (StreamId id : ids) ReleaseHeld(id);
}

void Device::QueueDepthOf(StreamId stream, Callback<QueueDepth> done) {
  executor_.Post([this, stream, done = std::move(done)] {
    auto it = streams_.find(stream);
    if (it == streams_.end()) {
      return done(absl::NotFoundError(absl::StrCat("stream ", stream, " does not exist")));
    }
    done(QueueDepth{it->second->queued, it->second->held.size()});
  });
}

void Device::HostTrampoline(void* data) {
  auto* task = static_cast<HostTask*>(data);
  Device* device = task->device;
  std::function<void(absl::Status)> fn;
  {
    absl::MutexLock lock(&device->pending_mu_);
    if (device->pending_.erase(task) == 1) fn = std::move(task->fn);
  }
  delete task;
  if (!fn) return;  // a fault failed it already
  fn(absl::OkStatus());
  // This is a driver callback thread, where no driver call may be made; the
  // completion's captures (events, say) are released on the executor. That
  // touches no stream's work, so it takes a turn of its own rather than
  // barring every stream's (a barrier would put them back in arrival order).
  device->executor_.Post([fn = std::move(fn)] {}, device->options_.stream_turns ? kReleaseTurn : 0);
}

absl::Status Device::WhenDone(StreamState& s, std::function<void(absl::Status)> fn,
                              const std::string& what) {
  auto* task = new HostTask{this, std::move(fn)};
  {
    absl::MutexLock lock(&pending_mu_);
    pending_.insert(task);
  }
  absl::Status st = driver_->LaunchHostFunc(s.stream.get(), &Device::HostTrampoline, task, what);
  if (!st.ok()) {
    {
      absl::MutexLock lock(&pending_mu_);
      pending_.erase(task);
    }
    delete task;
    return Check(st);
  }
  return absl::OkStatus();
}

absl::StatusOr<Device::StreamState*> Device::ReadyStream(StreamId id) {
  GPUEXEC_RETURN_IF_ERROR(Usable());
  if (stopping_) {
    return absl::UnavailableError(absl::StrCat("device ", props_.ordinal, " is shutting down"));
  }
  auto it = streams_.find(id);
  if (it == streams_.end()) {
    if (auto unmade = unmade_streams_.find(id); unmade != unmade_streams_.end()) {
      return unmade->second;
    }
    return absl::InternalError(
        absl::StrCat("stream ", id, " does not exist on device ", props_.ordinal));
  }
  return it->second.get();
}

std::vector<cuda::Event>& Device::Spares(bool timing) {
  return timing ? spare_timing_events_ : spare_plain_events_;
}

absl::StatusOr<cuda::Event> Device::SpareEvent(bool timing, const std::string& what) {
  std::vector<cuda::Event>& spares = Spares(timing);
  if (spares.empty()) return driver_->CreateEvent(timing, what);
  cuda::Event e = std::move(spares.back());
  spares.pop_back();
  return e;
}

absl::StatusOr<std::shared_ptr<cuda::Event>> Device::SharedEvent(bool timing,
                                                                 const std::string& what) {
  absl::StatusOr<cuda::Event> e = SpareEvent(timing, what);
  if (!e.ok()) return Check(e.status());
  std::vector<cuda::Event>* spares = &Spares(timing);
  // Released on the executor (holders live in its state and its
  // operations); the spares outlive every holder.
  return std::shared_ptr<cuda::Event>(new cuda::Event(std::move(e).value()),
                                      [spares](cuda::Event* p) {
                                        spares->push_back(std::move(*p));
                                        delete p;
                                      });
}

void Device::RunOnStream(StreamId stream, OpKind kind, const std::function<void()>& op) {
  if (kind != OpKind::kLaunch || run_stream_ != stream) SettleDueEnd();
  op();
}

bool Device::InRun(StreamId stream, const StreamState& s) const {
  return !s.untimed && run_stream_ == stream;
}

void Device::MarkEndDue(StreamId stream, StreamState& s) {
  s.end_due = true;
  MarkDue(stream);
}

void Device::MarkDue(StreamId stream) {
  if (due_end_stream_ != 0 && due_end_stream_ != stream) SettleDueEnd();
  due_end_stream_ = stream;
}

void Device::SettleDueEnd() {
  run_stream_ = 0;  // whatever runs next is no launch in a run
  if (due_end_stream_ == 0) return;
  const StreamId id = std::exchange(due_end_stream_, 0);
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  StreamState& s = *it->second;
  std::shared_ptr<cuda::Event> end;
  if (s.end_due) {
    s.end_due = false;
    // Where a Synchronize's time ends; if it cannot be recorded (a fault),
    // the Synchronize records its own end, or reports the fault.
    auto e = SharedEvent(/*timing=*/true, timing_what_);
    if (e.ok() && Check(driver_->Record(**e, s.stream.get(), timing_what_)).ok()) {
      s.work_end = std::move(e).value();
      end = s.work_end;
    }
  }
  // The same event watches the run's last launches. (If none can be
  // recorded, the device has faulted: its watches are done with.)
  if (s.uncovered > 0) (void)Cover(id, s, std::move(end));
}

uint32_t Device::LaunchesPerWatch() const {
  int n = std::max(options_.launches_per_watch, 1);
  if (options_.max_queued_launches > 0)
    n = std::min(n, std::max(options_.max_queued_launches / 4, 1));
  return static_cast<uint32_t>(n);
}

absl::Status Device::Cover(StreamId id, StreamState& s, std::shared_ptr<cuda::Event> end) {
  // Named by the run's last launch (always set while launches are
  // uncovered: a Synchronize settles them before it may drop the name).
  std::shared_ptr<const std::string> what =
      s.last_launch != nullptr ? s.last_launch : std::make_shared<const std::string>(timing_what_);
  if (end == nullptr) {
    // Plain: it times nothing. For an untimed stream it is where the work
    // ends, as a watch's own event is (Watch).
    GPUEXEC_ASSIGN_OR_RETURN(end, SharedEvent(/*timing=*/false, *what));
    GPUEXEC_RETURN_IF_ERROR(Check(driver_->Record(*end, s.stream.get(), *what)));
    if (s.untimed) s.work_end = end;
  }
  if (s.watches.empty()) s.head_since = absl::Now();
  s.watches.push_back(StreamState::Watch{std::move(end), std::move(what),
                                         std::move(s.uncovered_start), s.last_kernel, s.last_graph,
                                         s.work_count, s.uncovered});
  s.uncovered = 0;
  s.uncovered_start.reset();
  watched_.insert(id);
  return absl::OkStatus();
}

absl::Status Device::MarkWork(StreamState& s) {
  // The work about to be queued ends the time now, once it records its end.
  s.work_end.reset();
  s.work_end_passed = false;
  s.end_due = false;  // due after the new work instead, or recorded by it
  if (s.untimed) {
    ++s.work_count;
    if (!s.busy_since.has_value()) s.busy_since = std::chrono::steady_clock::now();
    return absl::OkStatus();
  }
  if (s.timing_start != nullptr) return absl::OkStatus();
  GPUEXEC_ASSIGN_OR_RETURN(std::shared_ptr<cuda::Event> e, SharedEvent(true, timing_what_));
  GPUEXEC_RETURN_IF_ERROR(Check(driver_->Record(*e, s.stream.get(), timing_what_)));
  s.timing_start = std::move(e);
  return absl::OkStatus();
}

absl::Status Device::EndWork(StreamState& s, const std::string& what) {
  // Untimed: a Synchronize records the event it waits for itself.
  if (s.untimed) return absl::OkStatus();
  GPUEXEC_ASSIGN_OR_RETURN(std::shared_ptr<cuda::Event> e, SharedEvent(true, what));
  GPUEXEC_RETURN_IF_ERROR(Check(driver_->Record(*e, s.stream.get(), what)));
  s.work_end = std::move(e);
  return absl::OkStatus();
}

void Device::CreateStream(StreamId id, absl::Duration kernel_time_limit, port::StreamOwner owner,
                          Done done) {
  // Before any of the stream's operations is posted (the front names
  // streams before they are made).
  if (options_.stream_turns) turn_keys_.Add(id, owner);
  GPUEXEC_ON_EXECUTOR({
    absl::Status u = Usable();
    if (!u.ok()) return done(u);
    if (streams_.contains(id)) {
      return done(absl::InternalError(
          absl::StrCat("stream ", id, " already exists on device ", props_.ordinal)));
    }
    auto state = std::make_unique<StreamState>();
    const std::string what = absl::StrCat("a session stream on device ", props_.ordinal);
    // A stream that cannot be made says why to every operation on it (the
    // front names streams before they are made, and does not wait).
    auto unmade = [this, id, &done](absl::Status why) {
      unmade_streams_[id] = why;
      done(std::move(why));
    };
    if (!parts_refused_.ok()) return unmade(parts_refused_);
    const int priority = owner.low_priority ? priorities_.least : priorities_.greatest;
    absl::StatusOr<cuda::Stream> stream;
    if (parts_.has_value()) {
      auto own = parts_->of_tenant.find(owner.tenant);
      state->part = own != parts_->of_tenant.end() ? own->second : parts_->rest;
      if (state->part == nullptr) {
        return unmade(absl::FailedPreconditionError(absl::StrCat(
            "device ", props_.ordinal,
            " has no SMs left for this tenant's sessions: the compute shares in force take them "
            "all; ask the operator to give this tenant a share")));
      }
      stream = driver_->CreateGreenStream(*state->part, priority, what);
    } else {
      stream = driver_->CreateStream(priority, what);
    }
    if (!stream.ok()) return unmade(Check(stream.status()));
    state->stream = std::move(stream).value();
    state->time_limit = kernel_time_limit;
    state->untimed = owner.untimed;
    streams_.emplace(id, std::move(state));
    done(absl::OkStatus());
  });
}

void Device::SetComputeParts(std::vector<port::ComputePart> parts, Done done) {
  GPUEXEC_ON_EXECUTOR({
    absl::Status u = Usable();
    if (!u.ok()) return done(u);
    if (parts.empty()) {
      parts_.reset();
      parts_refused_ = absl::OkStatus();
      return done(absl::OkStatus());
    }
    std::vector<uint32_t> sms;
    sms.reserve(parts.size());
    for (const port::ComputePart& p : parts) sms.push_back(p.sms);
    auto made = driver_->CreateGreenContexts(
        props_.ordinal, sms, absl::StrCat("the compute shares of device ", props_.ordinal));
    if (!made.ok()) {
      absl::Status why = Check(made.status());
      // With parts in force they stay; with none (a new worker), its
      // streams must not run on every SM instead.
      if (!parts_.has_value()) {
        parts_refused_ = absl::FailedPreconditionError(absl::StrCat(
            "device ", props_.ordinal,
            " could not be cut into the compute shares in force, so no session stream is made "
            "there until it is: ",
            why.message()));
      }
      return done(std::move(why));
    }
    ComputeParts next;
    for (size_t i = 0; i < parts.size(); ++i) {
      next.of_tenant[parts[i].tenant] =
          std::make_shared<cuda::GreenContext>(std::move((*made)[i].context));
    }
    if (made->size() > parts.size()) {
      next.rest = std::make_shared<cuda::GreenContext>(std::move(made->back().context));
    }
    parts_ = std::move(next);
    parts_refused_ = absl::OkStatus();
    done(absl::OkStatus());
  });
}

void Device::DestroyStream(StreamId stream, Done done) {
  turn_keys_.Remove(stream);
  // Not behind the stream's held operations: those never run now (the
  // session is gone), except its frees, which run at once (stream-ordered
  // after the launches already queued).
  executor_.Post([=, this]() mutable {
    SettleDueEnd();
    unmade_streams_.erase(stream);
    auto it = streams_.find(stream);
    if (it == streams_.end()) return done(absl::OkStatus());  // already gone
    StreamState* s = it->second.get();
    std::deque<StreamState::Held> held;
    held.swap(s->held);
    for (StreamState::Held& h : held) {
      held_bytes_ -= h.bytes;
      if (h.kind == OpKind::kRelease) {
        h.op();
      } else {
        h.refuse(absl::AbortedError(absl::StrCat("device ", props_.ordinal,
                                                 ": the session's stream ended before this ran")));
      }
    }
    it = streams_.find(stream);
    if (it == streams_.end()) return done(absl::OkStatus());
    s = it->second.get();
    auto erase = [this, stream, done](absl::Status st) {
      executor_.Post([this, stream, done, st] {
        SettleDueEnd();  // (StreamState::end_due)
        std::deque<StreamState::Held> held;
        auto it = streams_.find(stream);
        if (it != streams_.end()) {
          held.swap(it->second->held);
          // The stream's work is done; waiting on it lets the pool see its
          // frees complete, so that the trim below can release them.
          if (healthy())
            (void)driver_->SynchronizeStream(it->second->stream.get(), "a session's frees");
          streams_.erase(it);
        }
        // What arrived after the stream's end finds no stream.
        for (StreamState::Held& h : held) {
          held_bytes_ -= h.bytes;
          h.op();
        }
        // Give the session's freed memory back to the device, so that free
        // memory reads as it did before the session.
        GiveBackFreed(nullptr);
        done(st);
      });
    };
    if (faulted_.load()) return erase(Usable());
    absl::Status st =
        WhenDone(*s, erase, absl::StrCat("closing a session stream on device ", props_.ordinal));
    if (!st.ok()) erase(st);
  });
}

void Device::GiveBackFreed(CUstream_st* stream) {
  if (!props_.memory_pools || !healthy()) return;
  // The pool keeps a free whose completion the host has not seen as
  // allocated, and a trim cannot release it: wait for `stream` first (the
  // legacy stream when null: it holds only the frees of sessions already
  // gone, as every session stream is non-blocking).
  (void)driver_->SynchronizeStream(stream, "the memory pool's frees");
  (void)driver_->TrimMemoryPool(props_.ordinal);
}

void Device::AfterQueued(StreamId stream, std::string what, Done done) {
  OnStream(
      stream, OpKind::kOther, kSmallOpBytes + what.size(),
      [=, this]() mutable {
        auto ready = ReadyStream(stream);
        if (!ready.ok()) return done(ready.status());
        absl::Status st = WhenDone(**ready, done, what);
        if (!st.ok()) done(st);
      },
      done);
}

void Device::Synchronize(StreamId stream, Callback<uint64_t> gpu_ns) {
  OnStream(
      stream, OpKind::kOther, kSmallOpBytes,
      [this, stream, gpu_ns]() mutable {
        auto ready = ReadyStream(stream);
        if (!ready.ok()) return gpu_ns(ready.status());
        SynchronizeOn(stream, **ready, std::move(gpu_ns));
      },
      [gpu_ns](absl::Status st) { gpu_ns(st); });
}

void Device::SynchronizeOn(StreamId stream, StreamState& s, Callback<uint64_t> gpu_ns,
                           std::shared_ptr<cuda::Event>* recorded) {
  if (due_end_stream_ == stream) SettleDueEnd();
  if (run_stream_ == stream) run_stream_ = 0;
  const std::string& what = sync_what_;
  std::shared_ptr<cuda::Event> start = std::move(s.timing_start);
  const std::optional<StreamState::SteadyTime> busy_since =
      std::exchange(s.busy_since, std::nullopt);
  const uint64_t covered = s.work_count;  // the untimed work it waits for
  // The time ends where the last work did (its end event), however long
  // after it this Synchronize came.
  std::shared_ptr<cuda::Event> work_end = std::move(s.work_end);
  const bool passed = s.work_end_passed;
  s.work_end_passed = false;
  // The event waited on: the work's end, unless something was queued after
  // it or none was recorded; then one recorded now (timed only when it ends
  // the time). With no work since the last Synchronize it still waits for
  // the stream, in case that one's wait was abandoned.
  std::shared_ptr<cuda::Event> end = work_end;
  if (end == nullptr || passed) {
    auto e = SharedEvent(/*timing=*/start != nullptr && work_end == nullptr, what);
    if (!e.ok()) return gpu_ns(e.status());
    end = std::move(e).value();
    absl::Status st = Check(driver_->Record(*end, s.stream.get(), what));
    if (!st.ok()) return gpu_ns(st);
  }
  if (recorded != nullptr) *recorded = end;
  std::shared_ptr<cuda::Event> timed_end = work_end != nullptr ? std::move(work_end) : end;
  const absl::Time requested = absl::Now();
  event_waits_.push_back(
      EventWait{end,
                [this, stream, requested, start, busy_since, covered, end = std::move(timed_end),
                 gpu_ns = std::move(gpu_ns)](absl::Status done) {
                  const std::string& what = sync_what_;
                  GPUEXEC_TRACE(kWorkerDone);
                  if (!done.ok()) return gpu_ns(done);
                  auto it = streams_.find(stream);
                  StreamState* live = it != streams_.end() ? it->second.get() : nullptr;
                  uint64_t ns = 0;
                  if (start != nullptr) {
                    auto ms = driver_->ElapsedMs(*start, *end, what);
                    if (!ms.ok()) return gpu_ns(Check(ms.status()));
                    ns = static_cast<uint64_t>(static_cast<double>(*ms) * 1e6);
                  } else if (busy_since.has_value()) {
                    ns = UntimedNs(live, *busy_since, covered);
                  } else {
                    return gpu_ns(uint64_t{0});  // no work since the last one
                  }
                  // Kernels launched before this Synchronize are known to be done.
                  if (live != nullptr && live->last_launch_at <= requested) {
                    live->last_launch.reset();
                  }
                  gpu_ns(ns);
                },
                &sync_what_});
}

uint64_t Device::UntimedNs(StreamState* s, StreamState::SteadyTime busy_since, uint64_t covered) {
  // From the first work's queueing to the first sight of the last one done:
  // the watches' sight where a launch was the last work (the moment they
  // saw it), else now (this Synchronize's poll); never before the end of
  // the interval charged last. An upper bound of the GPU time.
  StreamState::SteadyTime end = std::chrono::steady_clock::now();
  StreamState::SteadyTime begin = busy_since;
  if (s != nullptr) {
    if (s->done_seen_work == covered && s->done_seen_at >= busy_since) {
      end = std::min(end, s->done_seen_at);
    }
    begin = std::max(begin, s->charged_until);
    s->charged_until = std::max(s->charged_until, end);
  }
  if (end <= begin) return 0;
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(end - begin).count());
}

absl::Status Device::Watch(StreamId id, StreamState& s, std::shared_ptr<const std::string> what,
                           std::shared_ptr<cuda::Event> start,
                           std::shared_ptr<cuda::Event> recorded) {
  std::shared_ptr<cuda::Event> e = std::move(recorded);
  if (e == nullptr) {
    // Where the stream's work ends for a Synchronize (timed, unless the
    // stream is untimed); plain in a run of launches, whose end is due
    // instead (end_due).
    const bool in_run = InRun(id, s);
    GPUEXEC_ASSIGN_OR_RETURN(e, SharedEvent(/*timing=*/!s.untimed && !in_run, *what));
    GPUEXEC_RETURN_IF_ERROR(Check(driver_->Record(*e, s.stream.get(), *what)));
    if (in_run) {
      MarkEndDue(id, s);
    } else {
      s.work_end = e;
    }
  }
  // It covers the run's launches queued since the newest watch as well.
  if (s.uncovered > 0) start = std::move(s.uncovered_start);
  if (s.watches.empty()) s.head_since = absl::Now();
  s.watches.push_back(StreamState::Watch{std::move(e), std::move(what), std::move(start),
                                         s.last_kernel, s.last_graph, s.work_count,
                                         s.uncovered + 1});
  ++s.queued;
  s.uncovered = 0;
  s.uncovered_start.reset();
  watched_.insert(id);
  return absl::OkStatus();
}

}  // namespace gpuexec::device
