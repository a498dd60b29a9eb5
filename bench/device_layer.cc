// The device layer alone (`gpuexec_bench --device_only`): async launches
// through a device::Device in this process, as a worker makes them, against
// the same launches straight to the driver. No daemon, no worker process,
// no ring: what is left is the device's own work per operation (its queue
// of turns, the launch's events and watch, the completion), and its
// thread's CPU time says how much of each launch it is.
#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "bench.h"
#include "server/common/cpu_relax.h"
#include "server/device/device.h"

namespace gpuexec::bench {
namespace {

// The CPU time a thread of this process named `name` has used so far, in
// seconds (its schedstat's nanoseconds on a CPU); -1 if there is none.
double ThreadCpuSeconds(const std::string& name) {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  double seconds = -1;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const std::string base = absl::StrCat("/proc/self/task/", e->d_name);
    std::string comm;
    std::ifstream(base + "/comm") >> comm;
    if (comm != name) continue;
    uint64_t on_cpu_ns = 0;
    if (std::ifstream(base + "/schedstat") >> on_cpu_ns) seconds = on_cpu_ns * 1e-9;
    break;
  }
  closedir(dir);
  return seconds;
}

struct LayerRun {
  double wall_us = 0;  // per launch, posting the first to the last's enqueue
  double cpu_us = 0;   // the device thread's CPU per launch
  double call_us = 0;  // the driver's launch call, timed on the device's thread
};

// `n` async launches of `kernel` on `stream` posted from this thread, as a
// worker posts them, then a Synchronize; returns once every launch is
// enqueued and the stream is idle.
LayerRun PostLaunches(device::Device& dev, device::StreamId stream, device::KernelId kernel, int n,
                      const std::string& thread, bool paced = false) {
  std::atomic<int> left{n};
  std::atomic<bool> failed{false};
  absl::Notification enqueued;
  const double cpu0 = ThreadCpuSeconds(thread);
  const device::Device::LaunchCalls calls0 = dev.launch_calls();
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    port::LaunchOp op;
    op.kernel = kernel;
    op.what = "a launch of gx_empty in session bench";
    dev.Launch(stream, std::move(op), [&](absl::Status st) {
      if (!st.ok()) failed = true;
      if (left.fetch_sub(1) == 1) enqueued.Notify();
    });
    // Paced: the next is posted once this one is enqueued, as a worker that
    // keeps up with its requests has one at a time (a poll between each).
    while (paced && left.load(std::memory_order_acquire) > n - i - 1) CpuRelax();
  }
  enqueued.WaitForNotification();
  const auto t1 = Clock::now();
  const double cpu1 = ThreadCpuSeconds(thread);
  const device::Device::LaunchCalls calls1 = dev.launch_calls();
  absl::Notification synced;
  dev.Synchronize(stream, [&](absl::StatusOr<uint64_t> ns) {
    if (!ns.ok()) failed = true;
    synced.Notify();
  });
  synced.WaitForNotification();
  if (failed) Die("a launch through the device layer failed");
  LayerRun r;
  r.wall_us = Seconds(t0, t1) * 1e6 / n;
  r.cpu_us = cpu0 < 0 || cpu1 < 0 ? -1 : (cpu1 - cpu0) * 1e6 / n;
  if (calls1.calls > calls0.calls) {
    r.call_us = static_cast<double>(calls1.ns - calls0.ns) * 1e-3 /
                static_cast<double>(calls1.calls - calls0.calls);
  }
  return r;
}

// What the driver calls the device makes around each launch cost by
// themselves: the launch with an event recorded after it (timed, as a
// timed session's watch; plain, as an untimed one's), and with a query of
// the newest event after each (as a poll between launches does). Each row
// beside the bare launch's `native_us`.
void NativeParts(const cuda::Driver& driver, cuda::Function empty, CUstream_st* stream, int n,
                 double native_us) {
  cuda::LaunchGeometry one;
  constexpr int kEvents = 64;  // reused round the ring, as the device's spares are
  for (const bool timing : {true, false}) {
    std::vector<cuda::Event> events;
    for (int i = 0; i < kEvents; ++i) {
      events.push_back(Must(driver.CreateEvent(timing, "bench"), "create an event"));
    }
    for (const bool query : {false, true}) {
      double us = 0;
      for (int round = 0; round < 2; ++round) {  // the first warms up
        const auto t0 = Clock::now();
        for (int i = 0; i < n; ++i) {
          Must(driver.Launch(empty, one, nullptr, stream, "gx_empty"), "launch");
          const cuda::Event& e = events[i % kEvents];
          Must(driver.Record(e, stream, "bench"), "record");
          if (query) (void)driver.EventDone(e, "bench");
        }
        us = Seconds(t0, Clock::now()) * 1e6 / n;
        Must(driver.SynchronizeStream(stream, "sync"), "sync");
      }
      Note(absl::StrFormat(
          "native: a launch and a %s event recorded after it%s: %.2f us (+%.2f us on the launch "
          "alone)",
          timing ? "timed" : "plain", query ? ", then queried" : "", us, us - native_us));
    }
  }
  // A query alone (of an event long done), as each poll pays per stream.
  const cuda::Event e = Must(driver.CreateEvent(false, "bench"), "create an event");
  Must(driver.Record(e, stream, "bench"), "record");
  Must(driver.SynchronizeStream(stream, "sync"), "sync");
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) (void)driver.EventDone(e, "bench");
  Note(absl::StrFormat("native: a query of a done event: %.3f us",
                       Seconds(t0, Clock::now()) * 1e6 / n));
}

}  // namespace

void RunDeviceLayer(const Plan& plan, const std::string& driver_lib, const std::string& cubin) {
  Section("the device layer alone (a device::Device in this process)");
  const int n = plan.async_launches;
  auto driver = Must(cuda::Driver::Load(driver_lib), "load the driver");
  const std::string image_bytes = ReadFileOrDie(cubin);

  // The baseline: the same launches straight to the driver, on a context
  // and stream of their own (the primary context, as the device's).
  double native_us = 0;
  {
    auto ctx = Must(driver->RetainPrimaryContext(0), "retain the primary context");
    Must(driver->SetCurrent(ctx.get(), 0), "set the context");
    auto module = Must(driver->LoadModule(image_bytes, false, "gx_kernels"), "load the module");
    cuda::Function empty = Must(driver->GetFunction(module, "gx_empty", "gx_empty"), "gx_empty");
    auto stream = Must(driver->CreateStream("bench"), "create a stream");
    cuda::LaunchGeometry one;
    for (int round = 0; round < 2; ++round) {  // the first warms up
      const auto t0 = Clock::now();
      for (int i = 0; i < n; ++i) {
        Must(driver->Launch(empty, one, nullptr, stream.get(), "gx_empty"), "launch");
      }
      native_us = Seconds(t0, Clock::now()) * 1e6 / n;
      Must(driver->SynchronizeStream(stream.get(), "sync"), "sync");
    }
    NativeParts(*driver, empty, stream.get(), n, native_us);
  }

  Note(
      absl::StrFormat("%d async launches of gx_empty straight to the driver: %.2f us a launch "
                      "(%.0fk/s)",
                      n, native_us, 1e3 / native_us));
  // The watches looked at on every pass of the executor, and every 20 us
  // while nothing waits on them (DeviceOptions::watch_poll_every, the
  // default); a watch for every launch, and one for every eight of a run
  // (DeviceOptions::launches_per_watch, the default).
  struct Setting {
    int poll_us;
    int launches_per_watch;
  };
  for (const Setting setting : {Setting{0, 1}, Setting{20, 1}, Setting{20, 8}}) {
    Note(absl::StrFormat("watches looked at %s, one for every %d launch%s of a run:",
                         setting.poll_us == 0 ? std::string("on every pass")
                                              : absl::StrFormat("every %d us", setting.poll_us),
                         setting.launches_per_watch, setting.launches_per_watch == 1 ? "" : "es"));
    device::DeviceOptions options;
    options.watch_poll_every = absl::Microseconds(setting.poll_us);
    options.launches_per_watch = setting.launches_per_watch;
    options.time_launch_calls = true;
    auto dev = Must(device::Device::Open(driver.get(), 0, options), "open the device");
    const std::string thread = "device-0";
    auto image = std::make_shared<port::ModuleImage>();
    image->sha256 = "bench";
    image->bytes = image_bytes;
    constexpr device::KernelId kKernel = 1;
    {
      absl::Notification got;
      absl::Status st;
      dev->GetKernel(image, "gx_empty", kKernel, "gx_empty",
                     [&](absl::StatusOr<port::KernelInfo> k) {
                       st = k.status();
                       got.Notify();
                     });
      got.WaitForNotification();
      Must(st, "resolve gx_empty through the device");
    }
    // A session's stream as the daemon makes it: the kernel time limit's
    // watch on (the default 60 s), timed or not.
    for (const bool untimed : {false, true}) {
      const device::StreamId stream = untimed ? 2 : 1;
      port::StreamOwner owner;
      owner.untimed = untimed;
      absl::Notification created;
      absl::Status st;
      dev->CreateStream(stream, absl::Seconds(60), owner, [&](absl::Status s) {
        st = s;
        created.Notify();
      });
      created.WaitForNotification();
      Must(st, "create a stream on the device");
      PostLaunches(*dev, stream, kKernel, n / 4 + 1, thread);  // warm-up
      for (const bool paced : {false, true}) {
        LayerRun best;
        best.wall_us = 1e9;
        for (int round = 0; round < 3; ++round) {
          const LayerRun r = PostLaunches(*dev, stream, kKernel, n, thread, paced);
          if (r.wall_us < best.wall_us) best = r;
        }
        Note(absl::StrFormat(
            "%s stream, %d async launches through the device layer%s: %.2f us a launch (%.0fk/s, "
            "%.2fx native); its thread's CPU %.2f us a launch, %.2f us above the driver's launch; "
            "the launch call itself %.2f us there",
            untimed ? "an untimed" : "a timed", n, paced ? " one at a time" : "", best.wall_us,
            1e3 / best.wall_us, native_us / best.wall_us, best.cpu_us, best.cpu_us - native_us,
            best.call_us));
      }
      absl::Notification destroyed;
      dev->DestroyStream(stream, [&](absl::Status) { destroyed.Notify(); });
      destroyed.WaitForNotification();
    }
  }
}

}  // namespace gpuexec::bench
