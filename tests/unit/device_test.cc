// The device layer alone, on the libcuda test double: one executor per
// device, operations in, completions out.
#include "server/device/device.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/device_fixture.h"

namespace gpuexec::device {
namespace {

using ::testing::HasSubstr;

class DeviceTest : public DeviceFixture {
 protected:
  // A Synchronize that comes long after the work reports the work's GPU
  // time, not the wait: after a launch, and after a launch and a memset
  // with an allocation (untimed) queued behind them.
  void ExpectSynchronizeTimesTheWorkOnly() {
    const LaunchOp spin = Spin(Image("GXFAKE1\ngx_spin\n"), 2);
    auto sync = [&] {
      return Await<uint64_t>([&](Callback<uint64_t> cb) { device_->Synchronize(stream_, cb); });
    };
    ASSERT_TRUE(AwaitDone([&](Done d) { device_->Launch(stream_, spin, d); }).ok());
    absl::SleepFor(absl::Milliseconds(100));
    auto ns = sync();
    ASSERT_TRUE(ns.ok()) << ns.status();
    EXPECT_GE(*ns, 1500000u);
    EXPECT_LT(*ns, 50000000u) << "the 100 ms before the Synchronize were counted";

    auto buffer = Await<DevicePtr>(
        [&](Callback<DevicePtr> cb) { device_->Allocate(stream_, 4096, "b", cb); });
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    ASSERT_TRUE(sync().ok());
    ASSERT_TRUE(AwaitDone([&](Done d) { device_->Launch(stream_, spin, d); }).ok());
    ASSERT_TRUE(
        AwaitDone([&](Done d) { device_->Memset(stream_, *buffer, 1, 4096, "b", d); }).ok());
    auto later = Await<DevicePtr>(
        [&](Callback<DevicePtr> cb) { device_->Allocate(stream_, 4096, "c", cb); });
    ASSERT_TRUE(later.ok()) << later.status();
    absl::SleepFor(absl::Milliseconds(100));
    ns = sync();
    ASSERT_TRUE(ns.ok()) << ns.status();
    EXPECT_GE(*ns, 1500000u);
    EXPECT_LT(*ns, 50000000u) << "the 100 ms before the Synchronize were counted";

    // A launch with its Synchronize: its own time, as before.
    auto both = Await<uint64_t>([&](Callback<uint64_t> cb) {
      device_->LaunchAndSynchronize(stream_, spin,
                                    [cb](absl::StatusOr<uint64_t> ns, bool) { cb(std::move(ns)); });
    });
    ASSERT_TRUE(both.ok()) << both.status();
    EXPECT_GE(*both, 1500000u);
    EXPECT_LT(*both, 50000000u);
    for (DevicePtr p : {*buffer, *later}) {
      EXPECT_TRUE(AwaitDone([&](Done d) { device_->Free(stream_, p, "b", d); }).ok());
    }
  }
};

TEST_F(DeviceTest, CopiesStreamThroughStagingSlots) {
  EXPECT_EQ(device_->staging().size(), 2u);
  EXPECT_EQ(device_->staging().capacity(), 4096u);
  auto ptr = Await<DevicePtr>(
      [&](Callback<DevicePtr> cb) { device_->Allocate(stream_, 4096, "buffer A", cb); });
  ASSERT_TRUE(ptr.ok()) << ptr.status();

  StagingSlot slot;
  device_->staging().Acquire([&](StagingSlot s) { slot = s; });
  ASSERT_NE(slot.data, nullptr);
  for (int i = 0; i < 4096; ++i) slot.data[i] = static_cast<uint8_t>(i * 3);
  ASSERT_TRUE(
      AwaitDone([&](Done d) { device_->CopyToDevice(stream_, *ptr, slot, 4096, "A", d); }).ok());
  std::memset(slot.data, 0, 4096);
  ASSERT_TRUE(
      AwaitDone([&](Done d) { device_->CopyToHost(stream_, slot, *ptr, 4096, "A", d); }).ok());
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(slot.data[i], static_cast<uint8_t>(i * 3)) << i;
  device_->staging().Release(slot);
  EXPECT_EQ(device_->staging().free_slots(), 2u);
  EXPECT_TRUE(AwaitDone([&](Done d) { device_->Free(stream_, *ptr, "buffer A", d); }).ok());
}

// A memfd of `bytes` sealed as a client must seal it, filled by `fill`.
int SealedMemfd(uint64_t bytes, uint8_t (*fill)(uint64_t)) {
  const int fd = memfd_create("region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  std::vector<uint8_t> data(bytes);
  for (uint64_t i = 0; i < bytes; ++i) data[i] = fill(i);
  EXPECT_EQ(pwrite(fd, data.data(), bytes, 0), static_cast<ssize_t>(bytes));
  EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  return fd;
}

TEST_F(DeviceTest, RegionsCopyBothWaysInStreamOrderAndUnmapAfterTheirCopies) {
  const uint64_t bytes = 8192;
  const int in = SealedMemfd(bytes, [](uint64_t i) { return static_cast<uint8_t>(i * 7); });
  const int out = SealedMemfd(bytes, [](uint64_t) { return uint8_t{0}; });
  const int out_view = dup(out);  // the client's own view of the second region
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->MapRegion(1, in, bytes, "region 1", d); }).ok());
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->MapRegion(2, out, bytes, "region 2", d); }).ok());
  auto ptr = Await<DevicePtr>(
      [&](Callback<DevicePtr> cb) { device_->Allocate(stream_, bytes, "buffer A", cb); });
  ASSERT_TRUE(ptr.ok()) << ptr.status();
  ASSERT_TRUE(AwaitDone([&](Done d) {
                device_->CopyRegion(stream_, 1, 0, *ptr, bytes, /*to_device=*/true, "in", d);
              }).ok());
  ASSERT_TRUE(AwaitDone([&](Done d) {
                device_->CopyRegion(stream_, 2, 4096, *ptr + 4096, 4096, /*to_device=*/false, "out",
                                    d);
              }).ok());
  std::vector<uint8_t> got(bytes);
  ASSERT_EQ(pread(out_view, got.data(), bytes, 0), static_cast<ssize_t>(bytes));
  for (uint64_t i = 0; i < 4096; ++i) ASSERT_EQ(got[i], 0) << i;
  for (uint64_t i = 4096; i < bytes; ++i) ASSERT_EQ(got[i], static_cast<uint8_t>(i * 7)) << i;
  close(out_view);

  // A range past the end never reaches the driver; an id in use is refused.
  EXPECT_EQ(AwaitDone([&](Done d) {
              device_->CopyRegion(stream_, 1, 4096, *ptr, 8192, true, "past the end", d);
            }).code(),
            absl::StatusCode::kInvalidArgument);
  const int again = SealedMemfd(4096, [](uint64_t) { return uint8_t{1}; });
  EXPECT_EQ(AwaitDone([&](Done d) { device_->MapRegion(1, again, 4096, "again", d); }).code(),
            absl::StatusCode::kInvalidArgument);
  // A size other than the declared one is refused.
  const int small = SealedMemfd(4096, [](uint64_t) { return uint8_t{1}; });
  EXPECT_EQ(AwaitDone([&](Done d) { device_->MapRegion(3, small, 8192, "small", d); }).code(),
            absl::StatusCode::kInvalidArgument);

  EXPECT_TRUE(AwaitDone([&](Done d) { device_->UnmapRegion(stream_, 1, d); }).ok());
  EXPECT_TRUE(AwaitDone([&](Done d) { device_->UnmapRegion(stream_, 2, d); }).ok());
  EXPECT_EQ(AwaitDone([&](Done d) {
              device_->CopyRegion(stream_, 1, 0, *ptr, 4096, true, "after unmap", d);
            }).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(AwaitDone([&](Done d) { device_->Free(stream_, *ptr, "buffer A", d); }).ok());
}

TEST_F(DeviceTest, OneDriverLoadPerImage) {
  auto image = Image("GXFAKE1\ngx_saxpy\n");
  const uint64_t before = device_->module_loads_total();
  for (int i = 0; i < 3; ++i) {
    // Only the first call loads it, and says so.
    auto loaded = Await<bool>(
        [&](Callback<bool> d) { device_->LoadModule(image, "module m", std::move(d)); });
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(*loaded, i == 0);
  }
  EXPECT_EQ(device_->module_loads_total(), before + 1);
  auto bad = Await<bool>([&](Callback<bool> d) {
    device_->LoadModule(Image("not an image"), "module bad", std::move(d));
  });
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("module bad"));
  EXPECT_TRUE(device_->healthy());
}

// Compute parts: a green context per part and one of the rest; a stream
// keeps its part's green context alive after the device is cut again.
TEST_F(DeviceTest, StreamsKeepTheirPartWhileTheDeviceIsCutAgain) {
  void* lib = dlopen(GXFAKE_LIBRARY_PATH, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr);
  auto green = reinterpret_cast<uint64_t (*)()>(dlsym(lib, "gxfake_green_contexts"));
  ASSERT_NE(green, nullptr);
  const uint64_t before = green();
  auto cut = [&](std::vector<port::ComputePart> parts) {
    return AwaitDone([&](Done d) { device_->SetComputeParts(parts, d); });
  };
  ASSERT_TRUE(cut({{"a", 16}}).ok());
  EXPECT_EQ(green(), before + 2);  // a's part and the rest
  for (StreamId id : {StreamId{8}, StreamId{9}}) {
    const std::string tenant = id == 8 ? "a" : "b";
    ASSERT_TRUE(AwaitDone([&](Done d) {
                  device_->CreateStream(id, absl::ZeroDuration(), {tenant}, d);
                }).ok());
  }
  // Cut again (no parts): the streams keep theirs.
  ASSERT_TRUE(cut({}).ok());
  EXPECT_EQ(green(), before + 2);
  // A part the driver cannot make is refused by its size; the device serves.
  const absl::Status odd = cut({{"a", 12}});
  EXPECT_EQ(odd.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(odd.message()), HasSubstr("part 1 of 12 SMs"));
  EXPECT_TRUE(device_->healthy());
  for (StreamId id : {StreamId{8}, StreamId{9}}) {
    EXPECT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(id, d); }).ok());
  }
  EXPECT_EQ(green(), before);
  dlclose(lib);
}

// Stream priorities: a low-priority owner's stream gets the driver's least,
// any other its greatest (the double's range is 0 to -5).
TEST_F(DeviceTest, ALowPriorityOwnersStreamYields) {
  void* lib = dlopen(GXFAKE_LIBRARY_PATH, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr);
  auto at = reinterpret_cast<uint64_t (*)(int)>(dlsym(lib, "gxfake_streams_at_priority"));
  ASSERT_NE(at, nullptr);
  const uint64_t least = at(0), greatest = at(-5);
  ASSERT_TRUE(AwaitDone([&](Done d) {
                device_->CreateStream(20, absl::ZeroDuration(), {"b", true}, d);
              }).ok());
  ASSERT_TRUE(AwaitDone([&](Done d) {
                device_->CreateStream(21, absl::ZeroDuration(), {"w", false}, d);
              }).ok());
  EXPECT_EQ(at(0), least + 1);
  EXPECT_EQ(at(-5), greatest + 1);
  // On a part of the SMs too.
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->SetComputeParts({{"b", 16}}, d); }).ok());
  ASSERT_TRUE(AwaitDone([&](Done d) {
                device_->CreateStream(22, absl::ZeroDuration(), {"b", true}, d);
              }).ok());
  EXPECT_EQ(at(0), least + 2);
  for (StreamId id : {StreamId{20}, StreamId{21}, StreamId{22}}) {
    EXPECT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(id, d); }).ok());
  }
  dlclose(lib);
}

// A device with no parts that cannot be cut into those asked for (a new
// worker, say) refuses its streams rather than make them on every SM, and
// each operation on such a stream says why.
TEST_F(DeviceTest, ADeviceThatCannotBeCutRefusesItsStreams) {
  auto cut = [&](std::vector<port::ComputePart> parts) {
    return AwaitDone([&](Done d) { device_->SetComputeParts(parts, d); });
  };
  auto create = [&](StreamId id) {
    return AwaitDone([&](Done d) { device_->CreateStream(id, absl::ZeroDuration(), {"a"}, d); });
  };
  EXPECT_EQ(cut({{"a", 12}}).code(), absl::StatusCode::kInvalidArgument);
  const absl::Status refused = create(10);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("could not be cut into the compute shares in force"));
  auto sync = Await<uint64_t>([&](Callback<uint64_t> cb) { device_->Synchronize(10, cb); });
  EXPECT_EQ(sync.status(), refused);
  EXPECT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(10, d); }).ok());
  // Parts set again (here: none) serve new streams.
  ASSERT_TRUE(cut({}).ok());
  ASSERT_TRUE(create(11).ok());
  EXPECT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(11, d); }).ok());
}

TEST_F(DeviceTest, LaunchesWithPackedParamsAndReportsGpuTime) {
  auto image = Image("GXFAKE1\ngx_saxpy\ngx_bigshared\n");
  auto k = Await<KernelInfo>(
      [&](Callback<KernelInfo> cb) { device_->GetKernel(image, "gx_saxpy", 1, "module m", cb); });
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_EQ(k->params.size(), 4u);
  EXPECT_EQ(k->param_bytes, 32u);

  constexpr uint64_t n = 1000;
  auto x =
      Await<DevicePtr>([&](Callback<DevicePtr> cb) { device_->Allocate(stream_, n * 4, "x", cb); });
  auto y =
      Await<DevicePtr>([&](Callback<DevicePtr> cb) { device_->Allocate(stream_, n * 4, "y", cb); });
  ASSERT_TRUE(x.ok() && y.ok());
  // Byte fills: every x is the float with bits 0x40404040, every y is 0.
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->Memset(stream_, *x, 0x40, n * 4, "x", d); }).ok());
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->Memset(stream_, *y, 0x00, n * 4, "y", d); }).ok());
  LaunchOp op;
  op.kernel = k->id;
  op.geometry.grid[0] = 4;
  op.geometry.block[0] = 256;
  op.param_block.assign(k->param_bytes, '\0');
  const float a = 2.0f;
  std::memcpy(op.param_block.data() + 0, &a, 4);
  std::memcpy(op.param_block.data() + 8, &*x, 8);
  std::memcpy(op.param_block.data() + 16, &*y, 8);
  std::memcpy(op.param_block.data() + 24, &n, 8);
  op.what = "kernel 'gx_saxpy'";
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->Launch(stream_, op, d); }).ok());
  auto ns = Await<uint64_t>([&](Callback<uint64_t> cb) { device_->Synchronize(stream_, cb); });
  ASSERT_TRUE(ns.ok()) << ns.status();
  EXPECT_GT(*ns, 0u);
  // Nothing since: zero.
  auto again = Await<uint64_t>([&](Callback<uint64_t> cb) { device_->Synchronize(stream_, cb); });
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 0u);

  StagingSlot slot;
  device_->staging().Acquire([&](StagingSlot s) { slot = s; });
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->CopyToHost(stream_, slot, *y, 16, "y", d); }).ok());
  float expected_x;
  const uint32_t bits = 0x40404040;
  std::memcpy(&expected_x, &bits, 4);
  float got;
  std::memcpy(&got, slot.data, 4);
  EXPECT_FLOAT_EQ(got, a * expected_x);
  device_->staging().Release(slot);

  // Above 48 KiB of dynamic shared memory the kernel is opted in for us.
  auto big = Await<KernelInfo>([&](Callback<KernelInfo> cb) {
    device_->GetKernel(image, "gx_bigshared", 1, "module m", cb);
  });
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_GT(big->attributes.max_dynamic_shared_bytes, 48 * 1024);
  LaunchOp bs;
  bs.kernel = big->id;
  bs.geometry.grid[0] = 1;
  bs.geometry.block[0] = 128;
  bs.geometry.shared_bytes = 40000 * 4;
  bs.param_block.assign(big->param_bytes, '\0');
  const uint32_t words = 40000;
  std::memcpy(bs.param_block.data() + 0, &*x, 8);
  std::memcpy(bs.param_block.data() + 8, &words, 4);
  bs.what = "kernel 'gx_bigshared'";
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->Launch(stream_, bs, d); }).ok());
  ASSERT_TRUE(
      Await<uint64_t>([&](Callback<uint64_t> cb) { device_->Synchronize(stream_, cb); }).ok());

  EXPECT_TRUE(AwaitDone([&](Done d) { device_->Free(stream_, *x, "x", d); }).ok());
  EXPECT_TRUE(AwaitDone([&](Done d) { device_->Free(stream_, *y, "y", d); }).ok());
}

// An untimed owner's stream queues its work without timing events, watched
// or not, and its Synchronize reports the host's view of its busy time: at
// least the kernel's run, and 0 with nothing since the last one. A timed
// stream beside it still times with events.
TEST_F(DeviceTest, AnUntimedStreamRecordsNoTimingEventsAndReportsItsBusyTime) {
  void* lib = dlopen(GXFAKE_LIBRARY_PATH, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr);
  auto timing_records = reinterpret_cast<uint64_t (*)()>(dlsym(lib, "gxfake_timing_event_records"));
  ASSERT_NE(timing_records, nullptr);
  const LaunchOp spin = Spin(Image("GXFAKE1\ngx_spin\n"), 2);
  port::StreamOwner untimed;
  untimed.untimed = true;
  for (const absl::Duration limit : {absl::ZeroDuration(), absl::Seconds(30)}) {
    SCOPED_TRACE(absl::StrCat("kernel time limit ", absl::FormatDuration(limit)));
    const StreamId id = limit == absl::ZeroDuration() ? 21 : 22;
    ASSERT_TRUE(AwaitDone([&](Done d) { device_->CreateStream(id, limit, untimed, d); }).ok());
    const uint64_t before = timing_records();
    // Async launches, then a Synchronize.
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(AwaitDone([&](Done d) { device_->Launch(id, spin, d); }).ok());
    }
    auto ns = Await<uint64_t>([&](Callback<uint64_t> cb) { device_->Synchronize(id, cb); });
    ASSERT_TRUE(ns.ok()) << ns.status();
    EXPECT_GE(*ns, 3 * 2'000'000u);  // three 2 ms kernels, at least
    // A launch that synchronizes.
    auto both = Await<uint64_t>([&](Callback<uint64_t> cb) {
      device_->LaunchAndSynchronize(id, spin,
                                    [cb](absl::StatusOr<uint64_t> ns, bool) { cb(std::move(ns)); });
    });
    ASSERT_TRUE(both.ok()) << both.status();
    EXPECT_GE(*both, 2'000'000u);
    // Nothing since: zero.
    auto again = Await<uint64_t>([&](Callback<uint64_t> cb) { device_->Synchronize(id, cb); });
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, 0u);
    EXPECT_EQ(timing_records(), before);
    ASSERT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(id, d); }).ok());
  }
  // The timed stream of the fixture, for contrast.
  const uint64_t before = timing_records();
  auto timed = Await<uint64_t>([&](Callback<uint64_t> cb) {
    device_->LaunchAndSynchronize(stream_, spin,
                                  [cb](absl::StatusOr<uint64_t> ns, bool) { cb(std::move(ns)); });
  });
  ASSERT_TRUE(timed.ok()) << timed.status();
  EXPECT_GE(*timed, 1'000'000u);
  EXPECT_GE(timing_records(), before + 2);  // the GPU time's start and end
}

// An untimed stream's charge is not the wait for a Synchronize: with its
// launches watched (a kernel time limit, the default) the interval ends
// where the watch saw the last launch done, not when a late Synchronize
// came; and Synchronizes in flight together never charge a moment twice
// (each one's interval starts where the one before it ended).
TEST_F(DeviceTest, AnUntimedStreamIsChargedItsWorkNotTheWaitsAroundIt) {
  const LaunchOp spin = Spin(Image("GXFAKE1\ngx_spin\n"), 20);
  port::StreamOwner untimed;
  untimed.untimed = true;
  constexpr StreamId id = 23;
  ASSERT_TRUE(
      AwaitDone([&](Done d) { device_->CreateStream(id, absl::Seconds(30), untimed, d); }).ok());
  // 20 ms of work, 400 ms idle, then the Synchronize.
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->Launch(id, spin, d); }).ok());
  absl::SleepFor(absl::Milliseconds(400));
  auto late = Await<uint64_t>([&](Callback<uint64_t> cb) { device_->Synchronize(id, cb); });
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_GE(*late, 20'000'000u);
  EXPECT_LT(*late, 200'000'000u) << "the idle time before the Synchronize was charged";
  // Four 20 ms launches that synchronize, all in flight at once: about 80
  // ms in all, not each one's wait behind the others.
  absl::Mutex mu;
  uint64_t total = 0;
  int answered = 0;
  for (int i = 0; i < 4; ++i) {
    device_->LaunchAndSynchronize(id, spin, [&](absl::StatusOr<uint64_t> ns, bool) {
      absl::MutexLock lock(&mu);
      if (ns.ok()) total += *ns;
      ++answered;
    });
  }
  {
    absl::MutexLock lock(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(
                                        +[](int* n) { return *n == 4; }, &answered),
                                    absl::Seconds(20)));
    EXPECT_GE(total, 80'000'000u);
    EXPECT_LT(total, 170'000'000u) << "pipelined Synchronizes charged a moment twice";
  }
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(id, d); }).ok());
}

// The test double's fault is process-wide (as a real one is): run it in a
// child process.
TEST_F(DeviceTest, SynchronizeTimesTheWorkNotTheWaitForIt) { ExpectSynchronizeTimesTheWorkOnly(); }

TEST_F(DeviceTest, StickyFaultFailsEverythingAfterIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        auto image = Image("GXFAKE1\ngx_fault\n");
        auto k = Await<KernelInfo>([&](Callback<KernelInfo> cb) {
          device_->GetKernel(image, "gx_fault", 1, "module m", cb);
        });
        if (!k.ok()) _exit(2);
        LaunchOp op;
        op.kernel = k->id;
        op.param_block.assign(8, '\0');
        const uint64_t address = 16;
        std::memcpy(op.param_block.data(), &address, 8);
        op.what = "kernel 'gx_fault' of session s";
        // The double's kernel can fault before the launch's own end event
        // is made (a real one can too): then the launch itself reports the
        // fault, in the same words as what follows.
        const absl::Status launched = AwaitDone([&](Done d) { device_->Launch(stream_, op, d); });
        if (!launched.ok() && launched.code() != absl::StatusCode::kAborted) _exit(3);
        if (launched.message().find("gx_fault") != absl::string_view::npos) _exit(10);
        auto ns =
            Await<uint64_t>([&](Callback<uint64_t> cb) { device_->Synchronize(stream_, cb); });
        if (ns.status().code() != absl::StatusCode::kAborted) _exit(4);
        // What every operation fails with names the CUresult and no kernel
        // or session (any session of the device reads it); the kernels in
        // flight go to the fault hook as facts.
        const std::string message(ns.status().message());
        if (message.find("CUDA_ERROR_ILLEGAL_ADDRESS") == std::string::npos) _exit(5);
        if (message.find("gx_fault") != std::string::npos) _exit(8);
        if (message.find("session s") != std::string::npos) _exit(9);
        if (device_->healthy()) _exit(6);
        auto after = Await<DevicePtr>(
            [&](Callback<DevicePtr> cb) { device_->Allocate(stream_, 64, "z", cb); });
        if (after.status().code() != absl::StatusCode::kAborted) _exit(7);
        _exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

class QueuedLaunchTest : public DeviceTest {
 protected:
  int MaxQueuedLaunches() const override { return 3; }
};

// A session that queues launches faster than they run waits on its own
// stream; another stream of the device is served meanwhile (the executor
// never blocks in a full launch queue).
TEST_F(QueuedLaunchTest, LaunchesPastTheBoundWaitWithoutStallingOtherStreams) {
  const StreamId other = 8;
  ASSERT_TRUE(
      AwaitDone([&](Done d) { device_->CreateStream(other, absl::ZeroDuration(), {}, d); }).ok());
  auto buffer = Await<DevicePtr>([&](Callback<DevicePtr> cb) {
    device_->Allocate(other, 4096, "buffer of the other stream", cb);
  });
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  const LaunchOp spin = Spin(Image("GXFAKE1\ngx_spin\n"), 30);

  absl::Mutex mu;
  std::vector<std::string> order;  // completions, as they come
  auto record = [&](std::string what) {
    absl::MutexLock lock(&mu);
    order.push_back(std::move(what));
  };
  constexpr int kLaunches = 12;
  for (int i = 0; i < kLaunches; ++i) {
    device_->Launch(stream_, spin, [&, i](absl::Status st) {
      EXPECT_TRUE(st.ok()) << st;
      record(absl::StrCat("launch ", i));
    });
  }
  // Posted after every launch, on the other stream: it runs before the
  // last launches are even enqueued.
  ASSERT_TRUE(AwaitDone([&](Done d) {
                device_->Memset(other, *buffer, 1, 4096, "the other stream's memset", d);
              }).ok());
  record("other stream");
  auto depth = Await<Device::QueueDepth>(
      [&](Callback<Device::QueueDepth> cb) { device_->QueueDepthOf(stream_, cb); });
  ASSERT_TRUE(depth.ok()) << depth.status();
  EXPECT_LE(depth->launches, 3u);
  EXPECT_GE(depth->held, 1u);

  // The held launches run in order; a Synchronize behind them waits for all.
  ASSERT_TRUE(
      Await<uint64_t>([&](Callback<uint64_t> cb) { device_->Synchronize(stream_, cb); }).ok());
  absl::MutexLock lock(&mu);
  ASSERT_EQ(order.size(), kLaunches + 1u);
  std::vector<std::string> launches;
  for (const std::string& o : order) {
    if (o != "other stream") launches.push_back(o);
  }
  for (int i = 0; i < kLaunches; ++i) EXPECT_EQ(launches[i], absl::StrCat("launch ", i));
  EXPECT_NE(order.back(), "other stream") << "the other stream waited for every launch";
  EXPECT_TRUE(AwaitDone([&](Done d) { device_->Free(other, *buffer, "buffer", d); }).ok());
  EXPECT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(other, d); }).ok());
}

// Watched launches: the watch's event ends the time.
TEST_F(QueuedLaunchTest, SynchronizeTimesTheWorkNotTheWaitForIt) {
  ExpectSynchronizeTimesTheWorkOnly();
}

// Held operations end with the fault instead of waiting for ever.
TEST_F(QueuedLaunchTest, HeldOperationsFailWithTheFault) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        auto image = Image("GXFAKE1\ngx_spin\ngx_fault\n");
        LaunchOp spin = Spin(image, 20);
        auto f = Await<KernelInfo>([&](Callback<KernelInfo> cb) {
          device_->GetKernel(image, "gx_fault", 2, "module m", cb);
        });
        if (!f.ok()) _exit(2);
        LaunchOp fault;
        fault.kernel = 2;
        fault.param_block.assign(8, '\0');
        const uint64_t address = 16;
        std::memcpy(fault.param_block.data(), &address, 8);
        fault.what = "kernel 'gx_fault'";
        for (int i = 0; i < 3; ++i) device_->Launch(stream_, spin, [](absl::Status) {});
        device_->Launch(stream_, fault, [](absl::Status) {});
        for (int i = 0; i < 4; ++i) device_->Launch(stream_, spin, [](absl::Status) {});
        auto ns =
            Await<uint64_t>([&](Callback<uint64_t> cb) { device_->Synchronize(stream_, cb); });
        if (ns.status().code() != absl::StatusCode::kAborted) _exit(3);
        _exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

class HeldBoundTest : public QueuedLaunchTest {
 protected:
  size_t MaxHeld() const override { return 4; }
};

// Past the bound on held operations a new one is refused, naming it; a
// stream that ends refuses what it held, but still frees.
TEST_F(HeldBoundTest, HeldOperationsAreBoundedAndEndWithTheirStream) {
  const LaunchOp spin = Spin(Image("GXFAKE1\ngx_spin\n"), 30);
  absl::Mutex mu;
  std::vector<absl::Status> results(12);
  absl::Notification all;
  int done = 0;
  for (int i = 0; i < 12; ++i) {
    device_->Launch(stream_, spin, [&, i](absl::Status st) {
      absl::MutexLock lock(&mu);
      results[i] = st;
      if (++done == 12) all.Notify();
    });
  }
  ASSERT_TRUE(all.WaitForNotificationWithTimeout(absl::Seconds(20)));
  int refused = 0;
  for (const absl::Status& st : results) {
    if (st.code() == absl::StatusCode::kResourceExhausted) {
      ++refused;
      EXPECT_THAT(std::string(st.message()), HasSubstr("the most it may hold (4 a stream"));
    } else {
      EXPECT_TRUE(st.ok()) << st;
    }
  }
  EXPECT_EQ(refused, 12 - 3 - 4);  // 3 queued, 4 held
  ASSERT_TRUE(
      Await<uint64_t>([&](Callback<uint64_t> cb) { device_->Synchronize(stream_, cb); }).ok());

  const StreamId closing = 9;
  ASSERT_TRUE(
      AwaitDone([&](Done d) { device_->CreateStream(closing, absl::ZeroDuration(), {}, d); }).ok());
  auto buffer = Await<DevicePtr>([&](Callback<DevicePtr> cb) {
    device_->Allocate(closing, 4096, "buffer of the closing stream", cb);
  });
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  for (int i = 0; i < 3; ++i) device_->Launch(closing, spin, [](absl::Status) {});
  absl::Notification held_done;
  absl::Status held_status;
  device_->Launch(closing, spin, [&](absl::Status st) {
    held_status = st;
    held_done.Notify();
  });
  absl::Notification freed;
  absl::Status free_status;
  device_->Free(closing, *buffer, "buffer of the closing stream", [&](absl::Status st) {
    free_status = st;
    freed.Notify();
  });
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(closing, d); }).ok());
  ASSERT_TRUE(held_done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(held_status.code(), absl::StatusCode::kAborted) << held_status;
  EXPECT_THAT(std::string(held_status.message()), HasSubstr("ended before this ran"));
  ASSERT_TRUE(freed.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_TRUE(free_status.ok()) << free_status;
}

}  // namespace
}  // namespace gpuexec::device
