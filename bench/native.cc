// The native baseline: the driver called in this process, no daemon.
#include "bench.h"

namespace gpuexec::bench {

NativeFigures RunNative(const Plan& plan, const std::string& driver_lib, const std::string& cubin) {
  Section("native CUDA (this process)");
  NativeFigures out;
  auto driver = Must(cuda::Driver::Load(driver_lib), "load the driver");
  constexpr int kDev = 0;
  const auto t_ctx = Clock::now();
  auto ctx = Must(driver->RetainPrimaryContext(kDev), "retain the primary context");
  Must(driver->SetCurrent(ctx.get(), kDev), "set the context");
  Note(absl::StrFormat("primary context: %.0f ms", Seconds(t_ctx, Clock::now()) * 1e3));
  const std::string image = ReadFileOrDie(cubin);
  const auto t_mod = Clock::now();
  auto module = Must(driver->LoadModule(image, false, "gx_kernels"), "load the module");
  Note(absl::StrFormat("cuModuleLoadData, %zu bytes: %.0f us", image.size(),
                       Seconds(t_mod, Clock::now()) * 1e6));
  cuda::Function empty = Must(driver->GetFunction(module, "gx_empty", "gx_empty"), "gx_empty");
  auto stream = Must(driver->CreateStream("bench"), "create a stream");
  cuda::LaunchGeometry one;

  out.launch_sync = Measure(plan.latency_iters, [&] {
    Must(driver->Launch(empty, one, nullptr, stream.get(), "gx_empty"), "launch");
    Must(driver->SynchronizeStream(stream.get(), "sync"), "sync");
  });
  Note(absl::StrFormat("launch + cuStreamSynchronize: p50 %.1f us, p99 %.1f us",
                       out.launch_sync.p50, out.launch_sync.p99));
  {
    // As a worker runs a launch that synchronizes and reports its GPU time:
    // a timing event before and after the kernel, the end polled (a worker
    // never blocks in the driver), then the time between the two. What
    // this row adds to the one above is the price of the GPU time, paid by
    // every path through the daemon.
    // A launch with an event recorded after it and polled; `start`, if
    // given, recorded before it, and the time between the two read when
    // `elapsed`.
    auto between = [&](const cuda::Event* start, const cuda::Event& end, bool elapsed) {
      return Measure(plan.latency_iters, [&] {
        if (start != nullptr) Must(driver->Record(*start, stream.get(), "start"), "record");
        Must(driver->Launch(empty, one, nullptr, stream.get(), "gx_empty"), "launch");
        Must(driver->Record(end, stream.get(), "end"), "record");
        while (!Must(driver->EventDone(end, "end"), "query")) {
        }
        if (elapsed) Must(driver->ElapsedMs(*start, end, "elapsed"), "elapsed");
      });
    };
    auto start = Must(driver->CreateEvent(true, "start"), "create an event");
    auto end = Must(driver->CreateEvent(true, "end"), "create an event");
    out.launch_timed = between(&start, end, /*elapsed=*/true);
    Note(absl::StrFormat(
        "timing event + launch + timing event, the end polled, elapsed read: p50 %.1f us, p99 "
        "%.1f us",
        out.launch_timed.p50, out.launch_timed.p99));
    // As an untimed worker would: events that only mark (no timestamps),
    // the start one for a watched launch's clock, the end one polled.
    auto plain_start = Must(driver->CreateEvent(false, "start"), "create an event");
    auto plain_end = Must(driver->CreateEvent(false, "end"), "create an event");
    out.launch_plain = between(&plain_start, plain_end, /*elapsed=*/false);
    out.launch_end_only = between(nullptr, plain_end, /*elapsed=*/false);
    Note(absl::StrFormat(
        "plain (untimed) event + launch + plain event, the end polled: p50 %.1f us, p99 %.1f us; "
        "launch + plain event polled: p50 %.1f us, p99 %.1f us",
        out.launch_plain.p50, out.launch_plain.p99, out.launch_end_only.p50,
        out.launch_end_only.p99));
    // Async launches as a worker queues them: each with an event after it
    // (a timing one today: the stream's work end and the launch's watch).
    auto per_launch = [&](const cuda::Event& e) {
      const auto t0 = Clock::now();
      for (int i = 0; i < plan.async_launches; ++i) {
        Must(driver->Launch(empty, one, nullptr, stream.get(), "gx_empty"), "launch");
        Must(driver->Record(e, stream.get(), "end"), "record");
      }
      Must(driver->SynchronizeStream(stream.get(), "sync"), "sync");
      return Seconds(t0, Clock::now()) * 1e6 / plan.async_launches;
    };
    out.async_timed_us = per_launch(end);
    out.async_plain_us = per_launch(plain_end);
    Note(absl::StrFormat(
        "async launches, each followed by an event: timing %.2f us per launch (%.0fk/s), plain "
        "%.2f us (%.0fk/s)",
        out.async_timed_us, 1e3 / out.async_timed_us, out.async_plain_us,
        1e3 / out.async_plain_us));
  }

  {
    const auto t0 = Clock::now();
    for (int i = 0; i < plan.async_launches; ++i) {
      Must(driver->Launch(empty, one, nullptr, stream.get(), "gx_empty"), "launch");
    }
    Must(driver->SynchronizeStream(stream.get(), "sync"), "sync");
    out.async_launch_us = Seconds(t0, Clock::now()) * 1e6 / plan.async_launches;
    Note(absl::StrFormat("%d async launches: %.2f us per launch (%.0fk/s)", plan.async_launches,
                         out.async_launch_us, 1e3 / out.async_launch_us));
  }

  Must(driver->ConfigureMemoryPool(kDev), "memory pool");
  out.alloc_async_us = Measure(plan.alloc_iters, [&] {
                         auto p = Must(driver->AllocAsync(1 << 20, stream.get(), "a"), "alloc");
                         Must(driver->FreeAsync(p, stream.get(), "a"), "free");
                         Must(driver->SynchronizeStream(stream.get(), "sync"), "sync");
                       }).p50;
  auto alloc_clear = [&](uint64_t bytes, bool clear) {
    return Measure(plan.alloc_iters,
                   [&] {
                     auto p = Must(driver->AllocAsync(bytes, stream.get(), "a"), "alloc");
                     if (clear) Must(driver->MemsetAsync(p, 0, bytes, stream.get(), "a"), "memset");
                     Must(driver->FreeAsync(p, stream.get(), "a"), "free");
                     Must(driver->SynchronizeStream(stream.get(), "sync"), "sync");
                   })
        .p50;
  };
  out.alloc_clear_us = alloc_clear(1 << 20, true);
  out.alloc_64_us = alloc_clear(64 << 20, false);
  out.alloc_clear_64_us = alloc_clear(64 << 20, true);
  Note(absl::StrFormat(
      "cuMemAllocAsync+MemsetD8Async+FreeAsync+sync p50: 1 MiB %.1f us; 64 MiB %.1f us (%.1f "
      "without the memset)",
      out.alloc_clear_us, out.alloc_clear_64_us, out.alloc_64_us));
  out.alloc_sync_us = Measure(plan.alloc_iters, [&] {
                        auto p = Must(driver->Alloc(1 << 20, "a"), "alloc");
                        Must(driver->Free(p, "a"), "free");
                      }).p50;
  Note(absl::StrFormat(
      "1 MiB cuMemAllocAsync+FreeAsync+sync p50 %.1f us; cuMemAlloc+Free p50 %.1f us",
      out.alloc_async_us, out.alloc_sync_us));

  const uint64_t n = plan.copy_bytes;
  auto dev = Must(driver->Alloc(n, "copy target"), "alloc");
  auto copy = [&](void* host, bool to_device) {
    const auto t0 = Clock::now();
    if (to_device) {
      Must(driver->CopyHtoDAsync(dev, host, n, stream.get(), "h2d"), "h2d");
    } else {
      Must(driver->CopyDtoHAsync(host, dev, n, stream.get(), "d2h"), "d2h");
    }
    Must(driver->SynchronizeStream(stream.get(), "sync"), "sync");
    return n / Seconds(t0, Clock::now()) / 1e9;
  };
  {
    std::vector<uint8_t> pageable = HostData(n);
    copy(pageable.data(), true);  // warm-up
    out.h2d_pageable = copy(pageable.data(), true);
    out.d2h_pageable = copy(pageable.data(), false);
  }
  {
    auto pinned = Must(driver->AllocPinned(n, "pinned"), "pinned");
    std::memset(pinned.get(), 1, n);
    copy(pinned.get(), true);
    out.h2d_pinned = copy(pinned.get(), true);
    out.d2h_pinned = copy(pinned.get(), false);
  }
  Must(driver->Free(dev, "copy target"), "free");
  Note(absl::StrFormat("%llu MiB H2D / D2H: pageable %.1f / %.1f GB/s, pinned %.1f / %.1f GB/s",
                       static_cast<unsigned long long>(n >> 20), out.h2d_pageable, out.d2h_pageable,
                       out.h2d_pinned, out.d2h_pinned));
  return out;
}

}  // namespace gpuexec::bench
