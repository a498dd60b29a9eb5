// A device's streams: their creation and end, the events that time
// their work, the launches held behind the bound on queued ones, and
// Synchronize (device_watches.cc: the watches of their launches).
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

absl::Status Device::KeepSpareEvents(const StreamState& s, const std::string& what) {
  for (const bool timing : {true, false}) {
    // An untimed stream takes no timing event after a launch.
    if (timing && s.untimed) continue;
    std::vector<cuda::Event>& spares = Spares(timing);
    if (!spares.empty()) continue;
    absl::StatusOr<cuda::Event> e = driver_->CreateEvent(timing, what);
    if (!e.ok()) return Check(e.status());
    spares.push_back(std::move(e).value());
  }
  return absl::OkStatus();
}

void Device::RunOnStream(StreamId stream, OpKind kind, const std::function<void()>& op) {
  if (kind != OpKind::kLaunch || run_stream_ != stream) SettleDueEnd();
  op();
}

Device::WorkMarks Device::MarksOf(const StreamState& s) {
  return {s.work_end, s.work_end_passed, s.end_due, s.work_count, s.busy_since};
}

void Device::Restore(StreamState& s, const WorkMarks& marks) {
  s.work_end = marks.work_end;
  s.work_end_passed = marks.work_end_passed;
  s.end_due = marks.end_due;
  s.work_count = marks.work_count;
  s.busy_since = marks.busy_since;
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
    state->operator_limit = absl::Milliseconds(owner.operator_limit_ms);
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

}  // namespace gpuexec::device
