#include "server/worker/worker_main.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "server/common/log.h"
#include "server/cuda/driver.h"
#include "server/device/device.h"
#include "server/worker/channel.h"
#include "server/worker/convert.h"
#include "server/worker/request_handler.h"
#include "server/worker/request_reader.h"
#include "server/worker/sandbox.h"
#include "worker.pb.h"

namespace gpuexec::worker {
namespace {

struct Args {
  int device = 0;
  std::string driver = "libcuda.so.1";
  uint64_t staging_bytes = 1 << 20;
  int staging_slots = 8;
  int max_queued_launches = 0;
  std::string log_level = "info";
  std::string log_format = "text";
  int64_t busy_poll_us = 0;
  uint64_t ring_bytes = 0;
  bool stream_turns = true;
  bool read_thread = false;
};

bool ParseArgs(int argc, char** argv, Args* args) {
  for (int i = 2; i < argc; ++i) {
    absl::string_view a = argv[i];
    auto value = [&](absl::string_view flag, absl::string_view* out) {
      if (!absl::StartsWith(a, flag)) return false;
      *out = a.substr(flag.size());
      return true;
    };
    absl::string_view v;
    if (value("--device=", &v)) {
      if (!absl::SimpleAtoi(v, &args->device)) return false;
    } else if (value("--driver=", &v)) {
      args->driver = std::string(v);
    } else if (value("--staging_bytes=", &v)) {
      if (!absl::SimpleAtoi(v, &args->staging_bytes)) return false;
    } else if (value("--staging_slots=", &v)) {
      if (!absl::SimpleAtoi(v, &args->staging_slots)) return false;
    } else if (value("--max_queued_launches=", &v)) {
      if (!absl::SimpleAtoi(v, &args->max_queued_launches)) return false;
    } else if (value("--busy_poll_us=", &v)) {
      if (!absl::SimpleAtoi(v, &args->busy_poll_us)) return false;
    } else if (value("--ring_bytes=", &v)) {
      if (!absl::SimpleAtoi(v, &args->ring_bytes)) return false;
    } else if (value("--stream_turns=", &v)) {
      if (!absl::SimpleAtob(v, &args->stream_turns)) return false;
    } else if (value("--read_thread=", &v)) {
      if (!absl::SimpleAtob(v, &args->read_thread)) return false;
    } else if (value("--log_level=", &v)) {
      args->log_level = std::string(v);
    } else if (value("--log_format=", &v)) {
      args->log_format = std::string(v);
    } else {
      return false;
    }
  }
  return args->staging_bytes > 0 && args->staging_slots > 0 && args->max_queued_launches >= 0;
}

void SendEvent(Channel* channel, const Event& e) {
  FromWorker m;
  *m.mutable_event() = e;
  (void)channel->Send(m);
}

}  // namespace

int RunWorker(int argc, char** argv) {
  // The front process decides when workers end: it closes their sockets at
  // shutdown, and a terminal's Ctrl-C must not take a device away first.
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  Args args;
  if (!ParseArgs(argc, argv, &args)) {
    log::Error("gpuexecd __worker: bad arguments (this mode is started by gpuexecd itself)");
    return 2;
  }
  log::Level level;
  if (log::ParseLevel(args.log_level, &level)) log::SetLevel(level);
  log::Format format;
  if (log::ParseFormat(args.log_format, &format)) log::SetFormat(format);
  std::unique_ptr<RingPair> rings;
  if (args.ring_bytes > 0) {
    RingFds fds;
    fds.memory = kRingMemoryFd;
    fds.in_data = kRingInDataFd;
    fds.in_space = kRingInSpaceFd;
    fds.out_data = kRingOutDataFd;
    fds.out_space = kRingOutSpaceFd;
    auto opened = RingPair::Open(fds, args.ring_bytes, /*front=*/false);
    if (!opened.ok()) {
      // Nothing can be reported where the front process would read it.
      log::Error("gpuexecd __worker: ", opened.status().message());
      return 2;
    }
    rings = std::move(*opened);
  }
  // Nothing the driver starts inherits it (nor the rings: Open saw to those).
  (void)fcntl(kSocketFd, F_SETFD, FD_CLOEXEC);
  // Read only when a MapRegion request says its descriptor is there.
  (void)fcntl(kRegionFd, F_SETFD, FD_CLOEXEC);
  (void)fcntl(kRegionFd, F_SETFL, O_NONBLOCK);
  Channel channel(kSocketFd, /*never_block=*/false, std::move(rings));
  const uint64_t staging_size = args.staging_bytes * static_cast<uint64_t>(args.staging_slots);
  void* mapped = mmap(nullptr, staging_size, PROT_READ | PROT_WRITE, MAP_SHARED, kStagingFd, 0);
  close(kStagingFd);

  Event ready_event;
  Ready* ready = ready_event.mutable_ready();
  auto fail = [&](const absl::Status& st) {
    ToProto(st, ready->mutable_status());
    ready->set_retry_soon(cuda::NotReadyYet(st));
    SendEvent(&channel, ready_event);
    return 1;
  };
  // Confined before the driver (and whatever an image makes it run) is
  // loaded; device printf reaches the front's reader line by line.
  (void)setvbuf(stdout, nullptr, _IOLBF, 0);
  const bool sandbox_off = sandbox::WorkerSandboxOff();
  absl::StatusOr<sandbox::Confinement> confined = sandbox::ConfineWorker(sandbox_off);
  if (!confined.ok()) {
    return fail(absl::Status(confined.status().code(), absl::StrCat("device ", args.device, ": ",
                                                                    confined.status().message())));
  }
  if (sandbox_off) {
    log::Warning("device ", args.device,
                 " worker: no sandbox (GPUEXEC_WORKER_SANDBOX=off): no seccomp filter, "
                 "capabilities kept");
  }
  if (mapped == MAP_FAILED) {
    return fail(absl::InternalError(
        absl::StrCat("device ", args.device, ": cannot map the shared staging memory")));
  }
  auto driver = cuda::Driver::Load(args.driver);
  if (!driver.ok()) return fail(driver.status());
  ready->set_driver_version((*driver)->version());
  ready->set_test_double((*driver)->is_test_double());
  ready->set_green_contexts((*driver)->has_green_contexts());
  auto count = (*driver)->DeviceCount();
  if (!count.ok()) return fail(count.status());
  ready->set_device_count(*count);

  device::DeviceOptions options;
  options.staging_bytes = args.staging_bytes;
  options.staging_slots = args.staging_slots;
  options.max_queued_launches = args.max_queued_launches;
  options.input.busy_poll = absl::Microseconds(args.busy_poll_us);
  options.stream_turns = args.stream_turns;
  options.staging_memory = static_cast<uint8_t*>(mapped);
  options.on_fault = [&channel](const device::FaultReport& report) {
    Event e;
    Fault* f = e.mutable_fault();
    f->set_message(report.detail);
    f->set_reason(report.reason);
    f->set_result(report.result);
    for (const port::ResetKernel& in_flight : report.kernels) {
      InFlight* k = f->add_kernels();
      k->set_stream(in_flight.stream);
      k->set_kernel(in_flight.kernel);
      k->set_graph(in_flight.graph);
    }
    SendEvent(&channel, e);
  };
  options.on_hung = [&channel](const device::HungReport& report) {
    Event e;
    Hung* h = e.mutable_hung();
    h->set_stream(report.stream);
    h->set_message(report.detail);
    h->set_kernel(report.kernel);
    h->set_reason(report.reason);
    h->set_limit_ms(report.limit_ms);
    h->set_ran_ms(report.ran_ms);
    h->set_graph(report.graph);
    h->set_launches(report.launches);
    SendEvent(&channel, e);
  };
  // Requests are read by the device's executor itself, between its
  // operations, while it keeps up; a thread of the reader's own takes over
  // while it has a backlog (request_reader.h).
  std::atomic<RequestHandler*> serving{nullptr};
  absl::Notification ended;
  Request request;  // parsed under the reader's lock, one reader at a time
  RequestReader reader(
      &channel,
      [&](std::string& frame) {
        if (!request.ParseFromString(frame)) {
          log::Error("device ", args.device, " worker: unreadable request; ending");
          return false;
        }
        serving.load()->Handle(request);
        return true;
      },
      [&ended] { ended.Notify(); });
  options.input.fd = channel.wait_fds().first;
  options.input.fd2 = channel.wait_fds().second;
  options.input.park = [&reader] { return reader.Park(); };
  options.input.unpark = [&reader] { reader.Unpark(); };
  options.input.on_readable = [&] {
    RequestHandler* worker = serving.load();
    if (worker == nullptr) return;
    worker->FlushReplies();
    reader.ReadOnExecutor();
  };
  // Between a turn's operations only requests are read; what is done is
  // sent every few operations (input.flush) and at the turn's end.
  if (args.stream_turns) {
    options.input.between_ops = [&] {
      if (serving.load() != nullptr) reader.ReadOnExecutor();
    };
  }
  options.input.flush = [&] {
    if (RequestHandler* worker = serving.load(); worker != nullptr) worker->FlushReplies();
  };
  auto dev = device::Device::Open(driver->get(), args.device, options);
  if (!dev.ok()) return fail(dev.status());
  ToProto((*dev)->properties(), ready->mutable_properties());
  {
    RequestHandler worker(&channel, dev->get(), static_cast<uint8_t*>(mapped), args.staging_bytes);
    reader.SetLoad([d = dev->get()] { return RequestReader::Load{d->backlog(), d->ops_run()}; });
    if (args.read_thread) reader.StartHelper();
    serving.store(&worker);
    SendEvent(&channel, ready_event);
    // Until the front process closes the socket; then shut down. A kernel
    // that never ends would hold the drain forever: the process ends
    // regardless after 10 s.
    ended.WaitForNotification();
    std::thread([] {
      sleep(10);
      _exit(0);
    }).detach();
    reader.Stop();  // it queues work on the device
    dev->reset();
  }
  return 0;
}

}  // namespace gpuexec::worker
