// A device's watches of its launches and the runs they come in: the polls
// of the GPU's events (a Synchronize's wait, each watched stream's
// launches against its kernel time limit), the bound on queued launches,
// and a run of async launches' due end and shared watch (StreamState::
// end_due, StreamState::uncovered).
#include <algorithm>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "server/common/log.h"
#include "server/common/status_macros.h"
#include "server/device/device.h"
#include "server/device/device_internal.h"

namespace gpuexec::device {

bool Device::PollEvents() {
  const bool watching = PollWatches();  // may release held launches
  // Nothing more posted: the run of launches whose end is due has ended
  // (under a flood of launches, the next turn's operations are posted
  // already, and the next other operation or Synchronize settles it).
  // Before the loop may pause, so the end is not recorded a pause late.
  if (executor_.backlog() == 0 || (due_end_stream_ != 0 && absl::Now() - due_since_ > kDueAtMost)) {
    SettleDueEnd();
  }
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
      hung.launches = head.launches;
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

bool Device::InRun(StreamId stream, const StreamState& s) const {
  return !s.untimed && run_stream_ == stream;
}

void Device::MarkEndDue(StreamId stream, StreamState& s) {
  s.end_due = true;
  MarkDue(stream);
}

void Device::MarkDue(StreamId stream) {
  if (due_end_stream_ != 0 && due_end_stream_ != stream) SettleDueEnd();
  if (due_end_stream_ != stream) due_since_ = absl::Now();
  due_end_stream_ = stream;
}

void Device::EndRunOnFailure(StreamId stream, const absl::Status& st) {
  if (!st.ok() && (run_stream_ == stream || due_end_stream_ == stream)) SettleDueEnd();
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

uint32_t Device::LaunchesPerWatch(const StreamState& s) const {
  int64_t n = std::max(options_.launches_per_watch, 1);
  if (options_.max_queued_launches > 0) {
    n = std::min<int64_t>(n, std::max(options_.max_queued_launches / 4, 1));
  }
  // Their limits added stay within the operator's limit for the stream
  // (the daemon's or its tenant's, whichever is lower).
  if (s.time_limit > absl::ZeroDuration() && s.operator_limit > absl::ZeroDuration()) {
    n = std::min<int64_t>(n, std::max<int64_t>(1, s.operator_limit / s.time_limit));
  }
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
  AddWatch(id, s, std::move(end), std::move(what), nullptr, /*launches=*/0);
  return absl::OkStatus();
}

void Device::AddWatch(StreamId id, StreamState& s, std::shared_ptr<cuda::Event> done,
                      std::shared_ptr<const std::string> what, std::shared_ptr<cuda::Event> start,
                      uint32_t launches) {
  // It covers the run's launches queued since the newest watch as well,
  // and starts where the first of them started.
  if (s.uncovered > 0) start = std::move(s.uncovered_start);
  if (s.watches.empty()) s.head_since = absl::Now();
  s.watches.push_back(StreamState::Watch{std::move(done), std::move(what), std::move(start),
                                         s.last_kernel, s.last_graph, s.work_count,
                                         s.uncovered + launches});
  s.queued += launches;
  s.uncovered = 0;
  s.uncovered_start.reset();
  watched_.insert(id);
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
  AddWatch(id, s, std::move(e), std::move(what), std::move(start), /*launches=*/1);
  return absl::OkStatus();
}

}  // namespace gpuexec::device
