#include "server/device/device.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <tuple>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "server/common/log.h"
#include "server/common/status_macros.h"
#include "server/common/trace.h"

namespace gpuexec::device {

struct Device::StreamState {
  cuda::Stream stream;
  // The last kernel launched on the stream since its last completed
  // Synchronize, and when: what a fault report names.
  // (Shared with the launch's watch: one copy of the name per launch.)
  std::shared_ptr<const std::string> last_launch;
  KernelId last_kernel = 0;
  absl::Time last_launch_at;
  // Recorded before the first work after the last Synchronize; null when
  // no work was enqueued since.
  std::shared_ptr<cuda::Event> timing_start;
  // A timing event recorded right after the latest work since the last
  // Synchronize (a launch's watch, or its own), where a Synchronize's time
  // ends: the GPU time of the work, not of the wait for a Synchronize that
  // came later. Null when none was recorded after it. `work_end_passed`:
  // something untimed (an allocation's clearing, a free) was queued after
  // it, so a Synchronize waits on an event of its own.
  std::shared_ptr<cuda::Event> work_end;
  bool work_end_passed = false;
  // The kernel time limit (zero: none) and the launches watched for it, in
  // stream order: each with an event recorded after it. The first one's
  // clock starts when the launch before it is seen done.
  absl::Duration time_limit;
  struct Watch {
    // Its own event, or the Synchronize's end recorded right after it.
    std::shared_ptr<cuda::Event> done;
    std::shared_ptr<const std::string> what;
    // For a launch with nothing watched ahead of it: recorded just before
    // it, so that its clock starts when it can start (not while copies or
    // unwatched work ahead of it run). The stream's timing start when that
    // was recorded right before it.
    std::shared_ptr<cuda::Event> start;
    KernelId kernel = 0;
  };
  std::deque<Watch> watches;
  absl::Time head_since;
  absl::Time last_hung_report = absl::InfinitePast();
  // Operations that arrived behind a launch held by the bound on queued
  // launches (that launch first), in the order they arrived.
  struct Held {
    OpKind kind;
    size_t bytes;
    std::function<void()> op;
    std::function<void(absl::Status)> refuse;
  };
  std::deque<Held> held;
};

struct Device::KernelEntry {
  cuda::Function function = nullptr;
  KernelInfo info;
  // The dynamic shared memory the kernel is opted in to so far.
  int dynamic_shared_limit = 0;
  // Opted in to clusters of more than 8 blocks.
  bool non_portable_clusters = false;
  // Blocks resident at once, by block, shared memory and cluster shape (the
  // most a cooperative launch may have); a few shapes, so bounded.
  absl::flat_hash_map<std::tuple<uint64_t, uint32_t, uint32_t, uint32_t, uint32_t>, uint64_t>
      co_resident;
};

struct Device::LoadedModule {
  cuda::Module module;
  absl::flat_hash_map<std::string, std::unique_ptr<KernelEntry>> kernels;
};

// A completion handed to the driver with cuLaunchHostFunc. Owned by the
// driver until the trampoline runs; if a fault fails it first, the
// trampoline only frees it.
struct Device::HostTask {
  Device* device;
  std::function<void(absl::Status)> fn;
};

namespace {
constexpr absl::Duration kTick = absl::Milliseconds(100);
// What a held operation is counted as, beside its parameters and name.
constexpr size_t kSmallOpBytes = 256;
}  // namespace

absl::StatusOr<std::unique_ptr<Device>> Device::Open(const cuda::Driver* driver, int ordinal,
                                                     const DeviceOptions& options) {
  GPUEXEC_ASSIGN_OR_RETURN(cuda::DeviceProperties props, driver->Properties(ordinal));
  std::unique_ptr<Device> device(new Device(driver, std::move(props), options));
  absl::Notification started;
  device->started_ = &started;
  Device* d = device.get();
  Executor::Input input;
  if (options.input.fd >= 0) input = options.input;
  d->executor_.Start([d] { d->OnStart(); }, [d] { d->OnTick(); }, [d] { d->OnStop(); }, kTick,
                     [d] { return d->PollEvents(); }, std::move(input));
  started.WaitForNotification();
  d->started_ = nullptr;
  if (!d->start_status_.ok()) return d->start_status_;
  return device;
}

Device::Device(const cuda::Driver* driver, cuda::DeviceProperties props,
               const DeviceOptions& options)
    : driver_(driver),
      props_(std::move(props)),
      options_(options),
      executor_(absl::StrCat("device-", props_.ordinal)),
      timing_what_(absl::StrCat("a timing event on device ", props_.ordinal)),
      sync_what_(absl::StrCat("synchronizing a session stream on device ", props_.ordinal)) {}

Device::~Device() { executor_.Stop(); }

void Device::OnStart() {
  absl::Status status = [&]() -> absl::Status {
    GPUEXEC_ASSIGN_OR_RETURN(context_, driver_->RetainPrimaryContext(props_.ordinal));
    GPUEXEC_RETURN_IF_ERROR(driver_->SetCurrent(context_.get(), props_.ordinal));
    if (props_.memory_pools) {
      GPUEXEC_RETURN_IF_ERROR(driver_->ConfigureMemoryPool(props_.ordinal));
    }
    std::vector<uint8_t*> buffers;
    if (options_.staging_memory != nullptr) {
      const uint64_t bytes = options_.staging_bytes * options_.staging_slots;
      GPUEXEC_RETURN_IF_ERROR(driver_->HostRegister(
          options_.staging_memory, bytes,
          absl::StrCat("the shared staging memory of device ", props_.ordinal)));
      registered_ = true;
      for (int i = 0; i < options_.staging_slots; ++i) {
        buffers.push_back(options_.staging_memory + i * options_.staging_bytes);
      }
    }
    for (int i = 0; options_.staging_memory == nullptr && i < options_.staging_slots; ++i) {
      GPUEXEC_ASSIGN_OR_RETURN(
          cuda::PinnedMemory p,
          driver_->AllocPinned(options_.staging_bytes,
                               absl::StrCat("staging buffer ", i, " of device ", props_.ordinal)));
      buffers.push_back(static_cast<uint8_t*>(p.get()));
      pinned_.push_back(std::move(p));
    }
    staging_.Reset(std::move(buffers), options_.staging_bytes);
    return absl::OkStatus();
  }();
  start_status_ = status;
  started_->Notify();
}

void Device::OnTick() {
  bool pending;
  {
    absl::MutexLock lock(&pending_mu_);
    pending = !pending_.empty();
  }
  if (!pending) return;
  if (faulted_.load()) {
    FailPending(fault());
    return;
  }
  // Completions are waiting. A sticky fault may have stopped the driver from
  // ever running them: any call reports such a fault, so ask a cheap one.
  (void)Check(driver_->MemInfo(props_.ordinal).status());
}

void Device::OnStop() {
  // Held operations fail now (no stream is ready any more).
  stopping_ = true;
  ReleaseAllHeld();
  // Shutdown is the one place that waits for the GPU.
  if (context_.get() != nullptr && healthy()) {
    (void)driver_->SynchronizeContext(absl::StrCat("device ", props_.ordinal));
  }
  FailPending(absl::UnavailableError(absl::StrCat("device ", props_.ordinal, " is shutting down")));
  std::vector<EventWait> waits;
  waits.swap(event_waits_);
  for (EventWait& w : waits) {
    w.fn(absl::UnavailableError(absl::StrCat("device ", props_.ordinal, " is shutting down")));
  }
  waits.clear();  // their events go back to the spares, cleared below
  streams_.clear();
  kernels_.clear();
  modules_.clear();
  pinned_.clear();
  for (auto& [id, r] : regions_) DropRegion(r, "a host memory region");
  regions_.clear();
  spare_timing_events_.clear();
  spare_plain_events_.clear();
  if (registered_ && healthy()) {
    (void)driver_->HostUnregister(options_.staging_memory, "the shared staging memory");
  }
  registered_ = false;
  if (context_.get() != nullptr && props_.memory_pools && healthy()) {
    (void)driver_->TrimMemoryPool(props_.ordinal);
  }
  context_ = cuda::PrimaryContext();
}

bool Device::PollEvents() {
  const bool watching = PollWatches();
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
      s.watches.pop_front();
      // The next launch could start only now. (Only a launch watched
      // when nothing else was has a start event: never one behind another.)
      s.head_since = now;
    }
    if (s.watches.empty()) {
      watched_.erase(it++);
      continue;
    }
    const absl::Duration running = now - s.head_since;
    if (s.time_limit > absl::ZeroDuration() && running > s.time_limit &&
        now - s.last_hung_report >= absl::Seconds(1)) {
      s.last_hung_report = now;
      HungReport hung;
      hung.stream = *it;
      hung.kernel = s.watches.front().kernel;
      hung.ran_ms = static_cast<uint64_t>(absl::ToInt64Milliseconds(running));
      hung.limit_ms = static_cast<uint64_t>(absl::ToInt64Milliseconds(s.time_limit));
      const std::string past =
          absl::StrCat(" has run for ", hung.ran_ms, " ms, past its kernel time limit of ",
                       hung.limit_ms, " ms");
      hung.detail = absl::StrCat(*s.watches.front().what, past);
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
         s.watches.size() >= static_cast<size_t>(options_.max_queued_launches);
}

void Device::OnStream(StreamId stream, OpKind kind, size_t bytes, std::function<void()> op,
                      std::function<void(absl::Status)> refuse) {
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
                  " operations waiting behind its ", s.watches.size(),
                  " queued launches, the most it may hold (", options_.max_held_per_stream,
                  " a stream, ", options_.max_held_bytes >> 20,
                  " MiB on the device); wait for its work (Synchronize) and retry")));
            }
            held_bytes_ += bytes;
            s.held.push_back(StreamState::Held{kind, bytes, std::move(op), std::move(refuse)});
            return;
          }
        }
        op();
      });
}

void Device::ReleaseHeld(StreamId stream) {
  for (;;) {
    // Looked up each time: an operation run here may end the stream.
    auto it = streams_.find(stream);
    if (it == streams_.end() || it->second->held.empty()) return;
    StreamState& s = *it->second;
    if (s.held.front().kind == OpKind::kLaunch && QueueFull(s)) return;
    std::function<void()> op = std::move(s.held.front().op);
    held_bytes_ -= s.held.front().bytes;
    s.held.pop_front();
    op();
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
    done(QueueDepth{it->second->watches.size(), it->second->held.size()});
  });
}

absl::Status Device::fault() const {
  absl::MutexLock lock(&fault_mu_);
  return fault_;
}

absl::Status Device::Check(absl::Status status) {
  if (!cuda::IsSticky(status)) return status;
  bool first = false;
  FaultReport report;
  {
    absl::MutexLock lock(&fault_mu_);
    if (fault_.ok()) {
      // Runs on the executor (every driver call does), so the streams can be
      // read: the kernels that were in flight, for the log and as facts.
      std::string in_flight;
      for (const auto& [id, s] : streams_) {
        if (s->last_launch == nullptr) continue;
        report.kernels.emplace_back(id, s->last_kernel);
        absl::StrAppend(&in_flight, in_flight.empty() ? "" : "; ", *s->last_launch, " (launched ",
                        absl::FormatTime("%H:%M:%E3S", s->last_launch_at, absl::UTCTimeZone()),
                        " UTC)");
      }
      // The driver's message names the call's object (a launch's kernel and
      // session, maybe another session's): the words every operation fails
      // with are the CUresult's, from its name on (the last one: the
      // object comes before it).
      const absl::string_view message = status.message();
      const size_t result_at = message.rfind(": CUDA_ERROR_");
      std::string words = "an unnamed sticky error";
      if (result_at != absl::string_view::npos) {
        words = std::string(message.substr(result_at + 2));
        report.result =
            words.substr(0, words.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789"));
      }
      report.reason = absl::StrCat("device ", props_.ordinal, " hit a sticky fault: ", words,
                                   "; the device's memory and queued work are lost until it is "
                                   "reset");
      report.detail = absl::StrCat(
          "device ", props_.ordinal, " hit a sticky fault: ", message,
          in_flight.empty() ? "" : absl::StrCat("; kernels not yet synchronized then: ", in_flight),
          "; the device's memory and queued work are lost until it is reset");
      fault_ = absl::AbortedError(report.reason);
      first = true;
    }
    status = fault_;
  }
  faulted_.store(true);
  if (first) {
    // Held operations fail now, after the operation that saw the fault.
    executor_.Post([this] { ReleaseAllHeld(); });
    // With a hook, its owner reports the event (one line for it).
    if (options_.on_fault) {
      options_.on_fault(report);
    } else {
      log::Error(report.detail);
    }
  }
  FailPending(status);
  return status;
}

absl::Status Device::Usable() const {
  if (!faulted_.load()) return absl::OkStatus();
  return fault();
}

void Device::FailPending(const absl::Status& status) {
  // The completions are taken out of their tasks under the lock, so a
  // trampoline that runs later finds an empty task and only frees it.
  std::vector<std::function<void(absl::Status)>> fns;
  {
    absl::MutexLock lock(&pending_mu_);
    for (HostTask* t : pending_) fns.push_back(std::move(t->fn));
    pending_.clear();
  }
  for (auto& fn : fns) fn(status);
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
  // completion's captures (events, say) are released on the executor.
  device->executor_.Post([fn = std::move(fn)] {});
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

absl::Status Device::MarkWork(StreamState& s) {
  // The work about to be queued ends the time now, once it records its end.
  s.work_end.reset();
  s.work_end_passed = false;
  if (s.timing_start != nullptr) return absl::OkStatus();
  GPUEXEC_ASSIGN_OR_RETURN(std::shared_ptr<cuda::Event> e, SharedEvent(true, timing_what_));
  GPUEXEC_RETURN_IF_ERROR(Check(driver_->Record(*e, s.stream.get(), timing_what_)));
  s.timing_start = std::move(e);
  return absl::OkStatus();
}

absl::Status Device::EndWork(StreamState& s, const std::string& what) {
  GPUEXEC_ASSIGN_OR_RETURN(std::shared_ptr<cuda::Event> e, SharedEvent(true, what));
  GPUEXEC_RETURN_IF_ERROR(Check(driver_->Record(*e, s.stream.get(), what)));
  s.work_end = std::move(e);
  return absl::OkStatus();
}

// Every public operation below runs its body on the executor.
#define GPUEXEC_ON_EXECUTOR(...) executor_.Post([=, this]() mutable { __VA_ARGS__ })

void Device::QueryMemory(Callback<cuda::MemoryInfo> done) {
  GPUEXEC_ON_EXECUTOR({
    absl::Status u = Usable();
    if (!u.ok()) return done(u);
    auto info = driver_->MemInfo(props_.ordinal);
    if (!info.ok()) return done(Check(info.status()));
    done(*info);
  });
}

void Device::Probe(std::function<void()> done) {
  GPUEXEC_ON_EXECUTOR({
    if (Usable().ok()) {
      if (auto info = driver_->MemInfo(props_.ordinal); !info.ok()) (void)Check(info.status());
    }
    done();
  });
}

void Device::CreateStream(StreamId id, absl::Duration kernel_time_limit, Done done) {
  GPUEXEC_ON_EXECUTOR({
    absl::Status u = Usable();
    if (!u.ok()) return done(u);
    if (streams_.contains(id)) {
      return done(absl::InternalError(
          absl::StrCat("stream ", id, " already exists on device ", props_.ordinal)));
    }
    auto stream =
        driver_->CreateStream(absl::StrCat("a session stream on device ", props_.ordinal));
    if (!stream.ok()) return done(Check(stream.status()));
    auto state = std::make_unique<StreamState>();
    state->stream = std::move(stream).value();
    state->time_limit = kernel_time_limit;
    streams_.emplace(id, std::move(state));
    done(absl::OkStatus());
  });
}

void Device::DestroyStream(StreamId stream, Done done) {
  // Not behind the stream's held operations: those never run now (the
  // session is gone), except its frees, which run at once (stream-ordered
  // after the launches already queued).
  executor_.Post([=, this]() mutable {
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

void Device::Allocate(StreamId stream, uint64_t size, std::string what, Callback<DevicePtr> done) {
  OnStream(
      stream, OpKind::kOther, kSmallOpBytes + what.size(),
      [=, this]() mutable {
        auto ready = ReadyStream(stream);
        if (!ready.ok()) return done(ready.status());
        StreamState* s = *ready;
        auto ptr = driver_->AllocAsync(size, s->stream.get(), what);
        if (!ptr.ok()) return done(Check(ptr.status()));
        // The pool hands on memory another stream freed: clear it in stream
        // order before the session can see it, so a fresh buffer never holds
        // another session's bytes. Not timed as the session's work.
        if (absl::Status st = Check(driver_->MemsetAsync(*ptr, 0, size, s->stream.get(), what));
            !st.ok()) {
          (void)driver_->FreeAsync(*ptr, s->stream.get(), what);
          return done(st);
        }
        s->work_end_passed = s->work_end != nullptr;
        done(*ptr);
      },
      [done](absl::Status st) { done(st); });
}

void Device::Free(StreamId stream, DevicePtr ptr, std::string what, Done done) {
  OnStream(
      stream, OpKind::kRelease, kSmallOpBytes + what.size(),
      [=, this]() mutable {
        absl::Status u = Usable();
        if (!u.ok()) return done(u);
        // A session that closed while an allocation was in flight frees that
        // allocation after its stream is gone: the legacy stream orders it then.
        auto it = streams_.find(stream);
        CUstream_st* s = it == streams_.end() ? nullptr : it->second->stream.get();
        if (s != nullptr) it->second->work_end_passed = it->second->work_end != nullptr;
        absl::Status st = Check(driver_->FreeAsync(ptr, s, what));
        // No session's close trims the pool after this free: do it here.
        if (s == nullptr && st.ok()) GiveBackFreed(nullptr);
        done(st);
      },
      done);
}

void Device::EnqueueWork(StreamId stream, std::string what, bool wait, Done done,
                         std::function<absl::Status(CUstream_st*)> enqueue) {
  const size_t bytes = kSmallOpBytes + what.size();
  OnStream(
      stream, OpKind::kOther, bytes,
      [this, stream, what = std::move(what), wait, done, enqueue = std::move(enqueue)] {
        auto ready = ReadyStream(stream);
        if (!ready.ok()) return done(ready.status());
        StreamState* s = *ready;
        absl::Status st = MarkWork(*s);
        if (st.ok()) st = Check(enqueue(s->stream.get()));
        if (st.ok()) st = EndWork(*s, what);
        if (st.ok() && wait) {
          st = WhenDone(*s, done, what);
          if (st.ok()) return;  // `done` runs when the work has finished
        }
        done(st);
      },
      done);
}

void Device::Memset(StreamId stream, DevicePtr ptr, uint8_t value, uint64_t size, std::string what,
                    Done done) {
  EnqueueWork(stream, what, false, std::move(done),
              [=](CUstream_st* s) { return driver_->MemsetAsync(ptr, value, size, s, what); });
}

void Device::Copy(StreamId stream, DevicePtr dst, DevicePtr src, uint64_t size, std::string what,
                  Done done) {
  EnqueueWork(stream, what, false, std::move(done),
              [=](CUstream_st* s) { return driver_->CopyDtoDAsync(dst, src, size, s, what); });
}

void Device::MapRegion(RegionId region, int fd, uint64_t bytes, std::string what, Done done) {
  executor_.Post([this, region, fd, bytes, what = std::move(what), done = std::move(done)] {
    struct stat st;
    Region r;
    absl::Status status;
    if (bytes == 0 || regions_.contains(region)) {
      status = absl::InvalidArgumentError(absl::StrCat(
          what, ": region ", region, " is in use or empty on device ", props_.ordinal));
    } else if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != bytes) {
      status = absl::InvalidArgumentError(
          absl::StrCat(what, ": the memory is not the ", bytes, " bytes declared"));
    } else {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        // Sealed against writes, or opened read-only, after the front's
        // check: the client's doing, not a lack of memory.
        const int e = errno;
        status = e == EACCES || e == EPERM
                     ? absl::InvalidArgumentError(absl::StrCat(
                           what, ": the memory cannot be mapped writable: ", strerror(e)))
                     : absl::ResourceExhaustedError(
                           absl::StrCat(what, ": cannot map ", bytes, " bytes: ", strerror(e)));
      } else {
        r.addr = static_cast<uint8_t*>(p);
        r.bytes = bytes;
        status = Usable();
        if (status.ok()) status = Check(driver_->HostRegister(r.addr, bytes, what));
        r.registered = status.ok();
        if (!status.ok()) DropRegion(r, what);
      }
    }
    close(fd);
    if (status.ok()) regions_.emplace(region, r);
    done(status);
  });
}

void Device::DropRegion(Region& r, const std::string& what) {
  if (r.registered && healthy()) (void)driver_->HostUnregister(r.addr, what);
  r.registered = false;
  if (r.addr != nullptr) munmap(r.addr, r.bytes);
  r.addr = nullptr;
}

void Device::CopyRegion(StreamId stream, RegionId region, uint64_t offset, DevicePtr ptr,
                        uint64_t size, bool to_device, std::string what, Done done) {
  EnqueueWork(stream, what, true, std::move(done), [=, this](CUstream_st* s) {
    auto it = regions_.find(region);
    // The front checked the range; a wrong one never reaches the driver.
    if (it == regions_.end() || offset > it->second.bytes || size > it->second.bytes - offset) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": region ", region,
                                                     " is not mapped on device ", props_.ordinal,
                                                     " or the range is outside it"));
    }
    uint8_t* host = it->second.addr + offset;
    return to_device ? driver_->CopyHtoDAsync(ptr, host, size, s, what)
                     : driver_->CopyDtoHAsync(host, ptr, size, s, what);
  });
}

void Device::UnmapRegion(StreamId stream, RegionId region, Done done) {
  OnStream(
      stream, OpKind::kRelease, kSmallOpBytes,
      [this, stream, region, done]() mutable {
        const std::string what = absl::StrCat("region ", region, " on device ", props_.ordinal);
        auto drop = [this, region, what, done] {
          auto it = regions_.find(region);
          if (it == regions_.end()) return done(absl::OkStatus());
          DropRegion(it->second, what);
          regions_.erase(it);
          done(absl::OkStatus());
        };
        auto it = streams_.find(stream);
        if (it == streams_.end() || !healthy()) return drop();
        // After the copies queued from it: the completion comes on a driver
        // thread, where no driver call may be made.
        absl::Status st = WhenDone(
            *it->second, [this, drop](absl::Status) { executor_.Post(drop); }, what);
        if (!st.ok()) drop();
      },
      done);
}

void Device::CopyToDevice(StreamId stream, DevicePtr dst, StagingSlot slot, uint64_t size,
                          std::string what, Done done) {
  EnqueueWork(stream, what, true, std::move(done), [=](CUstream_st* s) {
    return driver_->CopyHtoDAsync(dst, slot.data, size, s, what);
  });
}

void Device::CopyToHost(StreamId stream, StagingSlot slot, DevicePtr src, uint64_t size,
                        std::string what, Done done) {
  EnqueueWork(stream, what, true, std::move(done), [=](CUstream_st* s) {
    return driver_->CopyDtoHAsync(slot.data, src, size, s, what);
  });
}

absl::StatusOr<Device::LoadedModule*> Device::EnsureModule(
    const std::shared_ptr<const ModuleImage>& image, const std::string& what) {
  auto it = modules_.find(image->sha256);
  if (it != modules_.end()) return it->second.get();
  auto module = driver_->LoadModule(image->bytes, image->is_ptx, what);
  if (!module.ok()) return Check(module.status());
  auto loaded = std::make_unique<LoadedModule>();
  loaded->module = std::move(module).value();
  LoadedModule* raw = loaded.get();
  modules_.emplace(image->sha256, std::move(loaded));
  modules_loaded_.fetch_add(1);
  module_loads_total_.fetch_add(1);
  log::Debug("device ", props_.ordinal, ": loaded ", what);
  return raw;
}

void Device::LoadModule(std::shared_ptr<const ModuleImage> image, std::string what, Done done) {
  GPUEXEC_ON_EXECUTOR({
    absl::Status u = Usable();
    if (!u.ok()) return done(u);
    done(EnsureModule(image, what).status());
  });
}

void Device::UnloadModule(std::string sha256) {
  executor_.Post([this, sha256 = std::move(sha256)] {
    auto it = modules_.find(sha256);
    if (it == modules_.end()) return;
    for (auto k = kernels_.begin(); k != kernels_.end();) {
      bool ours = false;
      for (const auto& [name, kernel] : it->second->kernels) ours |= k->second == kernel.get();
      if (ours) {
        kernels_.erase(k++);
      } else {
        ++k;
      }
    }
    modules_.erase(it);  // cuModuleUnload
    modules_loaded_.fetch_sub(1);
  });
}

void Device::GetKernel(std::shared_ptr<const ModuleImage> image, std::string name, KernelId id,
                       std::string what, Callback<KernelInfo> done) {
  GPUEXEC_ON_EXECUTOR({
    absl::Status u = Usable();
    if (!u.ok()) return done(u);
    auto module = EnsureModule(image, what);
    if (!module.ok()) return done(module.status());
    ResolveKernel(*module, name, id, what, done);
  });
}

void Device::GetLoadedKernel(std::string sha256, std::string name, KernelId id, std::string what,
                             Callback<KernelInfo> done) {
  GPUEXEC_ON_EXECUTOR({
    absl::Status u = Usable();
    if (!u.ok()) return done(u);
    auto it = modules_.find(sha256);
    if (it == modules_.end()) {
      return done(
          absl::InternalError(absl::StrCat(what, " is not loaded on device ", props_.ordinal)));
    }
    ResolveKernel(it->second.get(), name, id, what, done);
  });
}

void Device::ResolveKernel(LoadedModule* m, const std::string& name, KernelId id,
                           const std::string& what, const Callback<KernelInfo>& done) {
  {
    auto it = m->kernels.find(name);
    if (it != m->kernels.end()) {
      kernels_[id] = it->second.get();
      KernelInfo info = it->second->info;
      info.id = id;
      return done(info);
    }
    const std::string fwhat = absl::StrCat("kernel '", name, "' of ", what);
    auto fn = driver_->GetFunction(m->module, name, what);  // names the module
    if (!fn.ok()) return done(Check(fn.status()));
    auto params = driver_->ParamLayout(*fn, fwhat);
    if (!params.ok()) return done(Check(params.status()));
    auto attrs = driver_->Attributes(*fn, fwhat);
    if (!attrs.ok()) return done(Check(attrs.status()));
    auto entry = std::make_unique<KernelEntry>();
    entry->function = *fn;
    entry->info.id = id;
    entry->info.params = std::move(params).value();
    entry->info.attributes = *attrs;
    for (const cuda::ParamInfo& p : entry->info.params) {
      entry->info.param_bytes = std::max(entry->info.param_bytes, p.offset + p.size);
    }
    entry->dynamic_shared_limit = attrs->max_dynamic_shared_bytes;
    // What a launch may ask for once opted in: the device's opt-in maximum
    // less the kernel's static shared memory.
    entry->info.attributes.max_dynamic_shared_bytes =
        std::max(0, props_.max_shared_per_block_optin - attrs->static_shared_bytes);
    KernelInfo info = entry->info;
    kernels_[id] = entry.get();
    m->kernels.emplace(name, std::move(entry));
    done(info);
  }
}

void Device::Launch(StreamId stream, LaunchOp op, Done done) {
  const size_t bytes = kSmallOpBytes + op.param_block.size() + op.what.size();
  OnStream(
      stream, OpKind::kLaunch, bytes,
      [this, stream, op = std::move(op), done]() mutable {
        auto ready = ReadyStream(stream);
        done(ready.ok() ? LaunchOn(stream, **ready, op) : ready.status());
      },
      done);
}

void Device::LaunchAndSynchronize(StreamId stream, LaunchOp op, LaunchedAndSynchronized done) {
  const size_t bytes = kSmallOpBytes + op.param_block.size() + op.what.size();
  OnStream(
      stream, OpKind::kLaunch, bytes,
      [this, stream, op = std::move(op), done]() mutable {
        auto ready = ReadyStream(stream);
        if (!ready.ok()) return done(ready.status(), false);
        Callback<uint64_t> synchronized = [done](absl::StatusOr<uint64_t> ns) {
          done(std::move(ns), true);
        };
        absl::Status st = LaunchOn(stream, **ready, op, &synchronized);
        if (!st.ok()) return done(st, false);
        GPUEXEC_TRACE(kWorkerRecorded);
      },
      [done](absl::Status st) { done(st, false); });
}

absl::Status Device::LaunchOn(StreamId stream, StreamState& s, LaunchOp& op,
                              Callback<uint64_t>* then_synchronize) {
  auto it = kernels_.find(op.kernel);
  if (it == kernels_.end()) {
    return absl::InternalError(absl::StrCat(op.what, ": its kernel (id ", op.kernel,
                                            ") is not loaded on device ", props_.ordinal));
  }
  KernelEntry& k = *it->second;
  const int shared = static_cast<int>(op.geometry.shared_bytes);
  if (shared > k.dynamic_shared_limit) {
    // Above the default (48 KiB less static) the kernel must be opted in.
    GPUEXEC_RETURN_IF_ERROR(Check(driver_->SetMaxDynamicShared(k.function, shared, op.what)));
    k.dynamic_shared_limit = shared;
  }
  const port::LaunchGeometry& g = op.geometry;
  if (g.non_portable_cluster && !k.non_portable_clusters &&
      uint64_t{g.cluster[0]} * std::max(g.cluster[1], 1u) * std::max(g.cluster[2], 1u) > 8) {
    GPUEXEC_RETURN_IF_ERROR(Check(driver_->AllowNonPortableClusters(k.function, op.what)));
    k.non_portable_clusters = true;
  }
  if (g.cooperative) GPUEXEC_RETURN_IF_ERROR(CheckCoResident(k, op));
  for (const port::TensorMapEncoding& m : op.tensor_maps) {
    // The front placed it; a map that does not fit its block is refused
    // here as well, never written past.
    if (m.param_offset > op.param_block.size() ||
        op.param_block.size() - m.param_offset < port::kTensorMapBytes) {
      return absl::InternalError(absl::StrCat(op.what, ": the tensor map of parameter ",
                                              m.param_index, " lies outside the parameters"));
    }
    absl::Status st = driver_->EncodeTensorMap(
        m, op.param_block.data() + m.param_offset,
        absl::StrCat("the tensor map of parameter ", m.param_index, " for ", op.what));
    GPUEXEC_RETURN_IF_ERROR(Check(st));
  }
  absl::InlinedVector<void*, 16> params(k.info.params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    params[i] = op.param_block.data() + k.info.params[i].offset;
  }
  const bool first_work = s.timing_start == nullptr;
  absl::Status st = MarkWork(s);
  std::shared_ptr<cuda::Event> start;
  if (st.ok() && s.time_limit > absl::ZeroDuration() && s.watches.empty()) {
    if (first_work) {
      start = s.timing_start;  // recorded just now, right before this launch
    } else {
      auto e = SharedEvent(/*timing=*/false, op.what);
      st = e.ok() ? Check(driver_->Record(**e, s.stream.get(), op.what)) : e.status();
      if (e.ok()) start = std::move(e).value();
    }
  }
  if (st.ok()) {
    // Launches of one kernel from one session have the same name: shared.
    if (s.last_launch == nullptr || *s.last_launch != op.what) {
      s.last_launch = std::make_shared<const std::string>(std::move(op.what));
    }
    s.last_kernel = op.kernel;
    s.last_launch_at = absl::Now();
    GPUEXEC_TRACE(kWorkerLaunch);
    st = Check(driver_->Launch(k.function, op.geometry, params.empty() ? nullptr : params.data(),
                               s.stream.get(), *s.last_launch));
    GPUEXEC_TRACE(kWorkerLaunched);
  }
  if (!st.ok()) return st;
  if (then_synchronize == nullptr) {
    // The event after the launch (its watch's, if watched) ends the GPU time.
    return Watched(s) ? Watch(stream, s, s.last_launch, std::move(start))
                      : EndWork(s, *s.last_launch);
  }
  // From here on the Synchronize reports, failures too. Its end event,
  // recorded right after the launch, is the launch's watch as well.
  std::shared_ptr<cuda::Event> end;
  SynchronizeOn(stream, s, std::move(*then_synchronize), &end);
  if (Watched(s)) (void)Watch(stream, s, s.last_launch, std::move(start), std::move(end));
  return absl::OkStatus();
}

absl::Status Device::CheckCoResident(KernelEntry& k, const LaunchOp& op) {
  const port::LaunchGeometry& g = op.geometry;
  const uint64_t threads = uint64_t{g.block[0]} * g.block[1] * g.block[2];
  const auto key =
      std::make_tuple(threads, g.shared_bytes, g.cluster[0], g.cluster[1], g.cluster[2]);
  auto it = k.co_resident.find(key);
  if (it == k.co_resident.end()) {
    auto most = driver_->MaxCoResidentBlocks(k.function, g, props_.multiprocessors, op.what);
    if (!most.ok()) return Check(most.status());
    if (k.co_resident.size() >= 64) k.co_resident.clear();
    it = k.co_resident.emplace(key, *most).first;
  }
  const uint64_t blocks = uint64_t{g.grid[0]} * g.grid[1] * g.grid[2];
  if (blocks > it->second) {
    return absl::InvalidArgumentError(
        absl::StrCat(op.what, ": a cooperative grid of ", blocks, " blocks (", g.grid[0], ", ",
                     g.grid[1], ", ", g.grid[2], ") is more than device ", props_.ordinal,
                     " can hold at once for this kernel: at most ", it->second, " blocks of ",
                     threads, " threads with ", g.shared_bytes, " bytes of dynamic shared memory",
                     g.cluster[0] != 0 ? ", in clusters" : ""));
  }
  return absl::OkStatus();
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
  const std::string& what = sync_what_;
  std::shared_ptr<cuda::Event> start = std::move(s.timing_start);
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
  event_waits_.push_back(EventWait{end,
                                   [this, stream, requested, start, end = std::move(timed_end),
                                    gpu_ns = std::move(gpu_ns)](absl::Status done) {
                                     const std::string& what = sync_what_;
                                     GPUEXEC_TRACE(kWorkerDone);
                                     if (!done.ok()) return gpu_ns(done);
                                     if (start == nullptr) return gpu_ns(uint64_t{0});
                                     auto ms = driver_->ElapsedMs(*start, *end, what);
                                     if (!ms.ok()) return gpu_ns(Check(ms.status()));
                                     // Kernels launched before this Synchronize are known to be
                                     // done.
                                     auto it = streams_.find(stream);
                                     if (it != streams_.end() &&
                                         it->second->last_launch_at <= requested) {
                                       it->second->last_launch.reset();
                                     }
                                     gpu_ns(static_cast<uint64_t>(static_cast<double>(*ms) * 1e6));
                                   },
                                   &sync_what_});
}

absl::Status Device::Watch(StreamId id, StreamState& s, std::shared_ptr<const std::string> what,
                           std::shared_ptr<cuda::Event> start,
                           std::shared_ptr<cuda::Event> recorded) {
  std::shared_ptr<cuda::Event> e = std::move(recorded);
  if (e == nullptr) {
    // Timed: it is also where the stream's work ends for a Synchronize.
    GPUEXEC_ASSIGN_OR_RETURN(e, SharedEvent(/*timing=*/true, *what));
    GPUEXEC_RETURN_IF_ERROR(Check(driver_->Record(*e, s.stream.get(), *what)));
    s.work_end = e;
  }
  if (s.watches.empty()) s.head_since = absl::Now();
  s.watches.push_back(
      StreamState::Watch{std::move(e), std::move(what), std::move(start), s.last_kernel});
  watched_.insert(id);
  return absl::OkStatus();
}

void Device::Post(std::function<void()> fn) { executor_.Post(std::move(fn)); }

void Device::Drain() {
  absl::Notification done;
  executor_.Post([this, &done] {
    if (healthy()) (void)driver_->SynchronizeContext(absl::StrCat("device ", props_.ordinal));
    done.Notify();
  });
  done.WaitForNotification();
}

}  // namespace gpuexec::device
