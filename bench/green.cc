// Green contexts on the driver itself, in this process, no daemon: the facts
// the shared worker's compute shares rest on (--green_only). Whether a
// kernel of a module loaded in the primary context runs on a green
// context's stream; how many SMs a part's kernels reach; what a launch +
// synchronize costs on a part alone and beside a neighbour that fills the
// rest of the GPU.
#include <set>

#include "bench.h"

namespace gpuexec::bench {
namespace {

// Distinct SMs gx_sm_ids's `blocks` blocks ran on, on `stream`.
int SmsReached(const cuda::Driver& d, cuda::Function sm_ids, CUstream_st* stream, unsigned blocks) {
  const uint64_t bytes = uint64_t{blocks} * 4;
  const port::DevicePtr out = Must(d.Alloc(bytes, "sm ids"), "alloc");
  uint64_t spin_ns = 20000;
  void* params[] = {const_cast<port::DevicePtr*>(&out), &spin_ns};
  cuda::LaunchGeometry g;
  g.grid[0] = blocks;
  g.block[0] = 128;
  Must(d.Launch(sm_ids, g, params, stream, "gx_sm_ids"), "launch gx_sm_ids");
  std::vector<uint32_t> ids(blocks);
  Must(d.CopyDtoHAsync(ids.data(), out, bytes, stream, "sm ids"), "copy");
  Must(d.SynchronizeStream(stream, "sm ids"), "sync");
  Must(d.Free(out, "sm ids"), "free");
  return static_cast<int>(std::set<uint32_t>(ids.begin(), ids.end()).size());
}

}  // namespace

void RunGreenNative(const Plan& plan, const std::string& driver_lib, const std::string& cubin,
                    uint32_t part_sms, int neighbour_us) {
  Section("green contexts (the driver in this process)");
  auto driver = Must(cuda::Driver::Load(driver_lib), "load the driver");
  const cuda::Driver& d = *driver;
  constexpr int kDev = 0;
  auto ctx = Must(d.RetainPrimaryContext(kDev), "retain the primary context");
  Must(d.SetCurrent(ctx.get(), kDev), "set the context");
  if (!d.has_green_contexts()) {
    Note(absl::StrFormat("driver %d has no green contexts", d.version()));
    return;
  }
  const cuda::SmResources sms = Must(d.DeviceSms(kDev), "the device's SMs");
  Note(absl::StrFormat("device 0: %u SMs, parts of at least %u, a multiple of %u (driver %d)",
                       sms.sms, sms.min_part, sms.step, d.version()));
  auto t0 = Clock::now();
  std::vector<cuda::GreenPart> parts =
      Must(d.CreateGreenContexts(kDev, {part_sms}, "device 0"), "green contexts");
  Note(absl::StrFormat("split into %zu parts (%u and %u SMs): %.0f us", parts.size(), parts[0].sms,
                       parts.size() > 1 ? parts[1].sms : 0, Seconds(t0, Clock::now()) * 1e6));
  const std::string image = ReadFileOrDie(cubin);
  auto module = Must(d.LoadModule(image, false, "gx_kernels"), "load the module");
  cuda::Function empty = Must(d.GetFunction(module, "gx_empty", "gx_empty"), "gx_empty");
  cuda::Function spin = Must(d.GetFunction(module, "gx_spin", "gx_spin"), "gx_spin");
  cuda::Function sm_ids = Must(d.GetFunction(module, "gx_sm_ids", "gx_sm_ids"), "gx_sm_ids");
  auto primary = Must(d.CreateStream("primary"), "stream");
  auto part = Must(d.CreateGreenStream(parts[0].context, 0, "part 1"), "green stream");
  cuda::LaunchGeometry one;
  // The question a shared worker's design turns on: a CUfunction of
  // cuModuleLoadData in the primary context, on a green context's stream.
  if (absl::Status s = d.Launch(empty, one, nullptr, part.get(), "gx_empty on part 1");
      !s.ok() || !(s = d.SynchronizeStream(part.get(), "part 1")).ok()) {
    Note("a primary-context module's kernel on a green stream: REFUSED: " + s.ToString());
    return;
  }
  Note("a primary-context module's kernel on a green stream: runs");
  // What else the device layer does on a session stream, each with the
  // primary context current: its events, stream-ordered memory, copies and
  // host functions.
  {
    auto check = [&](const char* what, const absl::Status& s) {
      Note(absl::StrFormat("  %s on a green stream: %s", what, s.ok() ? "runs" : s.ToString()));
    };
    auto e0 = Must(d.CreateEvent(true, "e0"), "event");
    auto e1 = Must(d.CreateEvent(true, "e1"), "event");
    absl::Status rec = d.Record(e0, part.get(), "e0");
    if (rec.ok()) rec = d.Launch(empty, one, nullptr, part.get(), "gx_empty");
    check("a primary-context event's record", rec);
    uint64_t ns = 100000;
    void* params[] = {&ns};
    absl::Status timed = d.Launch(spin, one, params, part.get(), "gx_spin");
    if (timed.ok()) timed = d.Record(e1, part.get(), "e1");
    if (timed.ok()) timed = d.SynchronizeStream(part.get(), "sync");
    absl::StatusOr<float> ms = timed.ok() ? d.ElapsedMs(e0, e1, "elapsed") : timed;
    check("timing between its events", ms.status());
    if (ms.ok()) Note(absl::StrFormat("  (a 100 us kernel timed at %.3f ms)", *ms));
    Must(d.ConfigureMemoryPool(kDev), "memory pool");
    absl::StatusOr<port::DevicePtr> p = d.AllocAsync(1 << 20, part.get(), "alloc");
    absl::Status mem = p.status();
    if (mem.ok()) mem = d.MemsetAsync(*p, 0, 1 << 20, part.get(), "memset");
    std::vector<uint8_t> host(1 << 20, 1);
    if (mem.ok()) mem = d.CopyHtoDAsync(*p, host.data(), host.size(), part.get(), "h2d");
    if (mem.ok()) mem = d.CopyDtoHAsync(host.data(), *p, host.size(), part.get(), "d2h");
    if (mem.ok()) mem = d.FreeAsync(*p, part.get(), "free");
    if (mem.ok()) mem = d.SynchronizeStream(part.get(), "sync");
    check("cuMemAllocAsync, memset, copies, cuMemFreeAsync", mem);
    static std::atomic<int> ran{0};
    absl::Status host_fn = d.LaunchHostFunc(
        part.get(), [](void*) { ran.fetch_add(1); }, nullptr, "host function");
    if (host_fn.ok()) host_fn = d.SynchronizeStream(part.get(), "sync");
    check(ran.load() == 1 ? "cuLaunchHostFunc (it ran)" : "cuLaunchHostFunc (it did not run)",
          host_fn);
  }
  const unsigned blocks = sms.sms * 4;
  Note(absl::StrFormat("gx_sm_ids, %u blocks: %d SMs on the primary stream, %d on part 1 (%u SMs)",
                       blocks, SmsReached(d, sm_ids, primary.get(), blocks),
                       SmsReached(d, sm_ids, part.get(), blocks), parts[0].sms));
  auto launch_sync = [&](CUstream_st* s) {
    return Measure(plan.latency_iters, [&] {
      Must(d.Launch(empty, one, nullptr, s, "gx_empty"), "launch");
      Must(d.SynchronizeStream(s, "sync"), "sync");
    });
  };
  const Latency alone_primary = launch_sync(primary.get());
  const Latency alone_part = launch_sync(part.get());
  Note(
      absl::StrFormat("launch + sync alone: primary p50 %.1f p99 %.1f us; part 1 p50 %.1f p99 "
                      "%.1f us",
                      alone_primary.p50, alone_primary.p99, alone_part.p50, alone_part.p99));
  if (parts.size() < 2) return;
  // A neighbour on the rest: gx_spin blocks of --neighbour_threads (1024:
  // two fill an SM's 2048 threads) two waves deep on every SM of the rest
  // (and on part 1's too were it not apart), kept queued.
  const unsigned threads = NeighbourThreads();
  auto rest = Must(d.CreateGreenStream(parts[1].context, 0, "the rest"), "green stream");
  auto whole = Must(d.CreateStream("whole"), "stream");
  for (auto [name, neighbour] : {std::pair<const char*, CUstream_st*>{"the rest", rest.get()},
                                 {"the primary context", whole.get()}}) {
    std::atomic<bool> stop{false};
    std::thread flood([&, neighbour = neighbour] {
      Must(d.SetCurrent(ctx.get(), kDev), "set the context");
      uint64_t ns = uint64_t(neighbour_us) * 1000;
      void* params[] = {&ns};
      cuda::LaunchGeometry g;
      g.grid[0] = sms.sms * 4;
      g.block[0] = threads;
      while (!stop.load()) {
        for (int i = 0; i < 4; ++i) Must(d.Launch(spin, g, params, neighbour, "gx_spin"), "spin");
        Must(d.SynchronizeStream(neighbour, "flood"), "sync");
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const Latency beside = launch_sync(part.get());
    stop = true;
    flood.join();
    Note(
        absl::StrFormat("launch + sync on part 1 beside %u-block %d us kernels of %u threads "
                        "a block on %s: p50 %.1f p99 %.1f us (%.2fx / %.2fx alone)",
                        sms.sms * 4, neighbour_us, threads, name, beside.p50, beside.p99,
                        beside.p50 / alone_part.p50, beside.p99 / alone_part.p99));
  }
}

}  // namespace gpuexec::bench
