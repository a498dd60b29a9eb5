// A device's life (its executor, the tick, the stop), its fault state and
// the queries that need no stream. Streams, memory and launches are in the
// device_*.cc files beside it.
#include "server/device/device.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "server/common/log.h"
#include "server/common/status_macros.h"
#include "server/common/trace.h"
#include "server/device/device_internal.h"

namespace gpuexec::device {

namespace {
constexpr absl::Duration kTick = absl::Milliseconds(100);
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
    GPUEXEC_ASSIGN_OR_RETURN(priorities_, driver_->StreamPriorities());
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
  unmade_streams_.clear();
  parts_.reset();  // the green contexts hold the primary context
  parts_refused_ = absl::OkStatus();
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
        report.kernels.push_back(port::ResetKernel{id, s->last_kernel, s->last_graph});
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

void Device::Post(std::function<void()> fn) {
  executor_.Post([this, fn = std::move(fn)] {
    SettleDueEnd();
    fn();
  });
}

void Device::Drain() {
  absl::Notification done;
  executor_.Post([this, &done] {
    SettleDueEnd();
    if (healthy()) (void)driver_->SynchronizeContext(absl::StrCat("device ", props_.ordinal));
    done.Notify();
  });
  done.WaitForNotification();
}

}  // namespace gpuexec::device
