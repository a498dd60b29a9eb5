// A timed stream's GPU time at the cost of one timing event a run of
// launches: async launches record plain events for their watches, and the
// end of the run is recorded once, right after its last launch (when
// anything else runs, a Synchronize comes, or nothing more is posted to
// the executor), not once a launch. And one watch for a few launches of a
// run: an event after every few of them, its time limit theirs together.
// And a launch answered as failed never ran, whatever event the driver
// could not make around it.
#include <dlfcn.h>

#include <atomic>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/device_fixture.h"

namespace gpuexec::device {
namespace {

using ::testing::HasSubstr;

class DeviceTimingTest : public DeviceFixture {
 protected:
  void Configure(DeviceOptions& options) override {
    options.on_hung = [this](const HungReport& r) {
      absl::MutexLock lock(&mu_);
      hung_.push_back(r);
    };
  }

  void SetUp() override {
    DeviceFixture::SetUp();
    void* lib = dlopen(GXFAKE_LIBRARY_PATH, RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(lib, nullptr);
    timing_records_ = reinterpret_cast<uint64_t (*)()>(dlsym(lib, "gxfake_timing_event_records"));
    ASSERT_NE(timing_records_, nullptr);
    records_ = reinterpret_cast<uint64_t (*)()>(dlsym(lib, "gxfake_event_records"));
    ASSERT_NE(records_, nullptr);
    fail_event_create_ =
        reinterpret_cast<void (*)(uint64_t)>(dlsym(lib, "gxfake_fail_event_create"));
    ASSERT_NE(fail_event_create_, nullptr);
    kernels_run_ = reinterpret_cast<uint64_t (*)()>(dlsym(lib, "gxfake_kernels_run"));
    ASSERT_NE(kernels_run_, nullptr);
  }

  std::vector<HungReport> Hung() {
    absl::MutexLock lock(&mu_);
    return hung_;
  }

  // Holds the executor until the returned notification is notified, so
  // that what is posted meanwhile runs in one turn.
  std::shared_ptr<absl::Notification> HoldExecutor() {
    auto release = std::make_shared<absl::Notification>();
    auto held = std::make_shared<absl::Notification>();
    device_->Post([release, held] {
      held->Notify();
      release->WaitForNotification();
    });
    held->WaitForNotification();
    return release;
  }

  // What `post` posts, then a Synchronize of `stream`, all run in one turn
  // of the executor; the Synchronize's GPU time.
  absl::StatusOr<uint64_t> SynchronizeAfter(StreamId stream, const std::function<void()>& post) {
    auto release = HoldExecutor();
    post();
    absl::Notification synced;
    absl::StatusOr<uint64_t> ns = absl::UnknownError("no answer");
    device_->Synchronize(stream, [&](absl::StatusOr<uint64_t> got) {
      ns = std::move(got);
      synced.Notify();
    });
    release->Notify();
    if (!synced.WaitForNotificationWithTimeout(absl::Seconds(20))) {
      return absl::DeadlineExceededError("the Synchronize never answered");
    }
    return ns;
  }

  // `n` async launches of `spin` on `stream` and a Synchronize, all run in
  // one turn of the executor; the Synchronize's GPU time.
  absl::StatusOr<uint64_t> RunOfLaunches(StreamId stream, const LaunchOp& spin, int n) {
    std::vector<std::shared_ptr<absl::StatusOr<bool>>> launched;
    absl::StatusOr<uint64_t> ns = SynchronizeAfter(stream, [&] {
      for (int i = 0; i < n; ++i) {
        auto st = std::make_shared<absl::StatusOr<bool>>(absl::UnknownError("no answer"));
        device_->Launch(stream, spin, [st](absl::Status s) {
          if (s.ok()) {
            *st = true;
          } else {
            *st = s;
          }
        });
        launched.push_back(st);
      }
    });
    if (!ns.ok()) return ns;
    for (const auto& st : launched) {
      if (!st->ok()) return st->status();
    }
    return ns;
  }

  uint64_t (*timing_records_)() = nullptr;
  uint64_t (*records_)() = nullptr;
  void (*fail_event_create_)(uint64_t) = nullptr;
  uint64_t (*kernels_run_)() = nullptr;
  absl::Mutex mu_;
  std::vector<HungReport> hung_ ABSL_GUARDED_BY(mu_);
};

// Five 2 ms launches in a run, watched (a kernel time limit) or not: three
// timed events, not one a launch; the time covers all five.
TEST_F(DeviceTimingTest, ARunOfAsyncLaunchesRecordsOneTimedEnd) {
  const LaunchOp spin = Spin(Image("GXFAKE1\ngx_spin\n"), 2);
  for (const absl::Duration limit : {absl::ZeroDuration(), absl::Seconds(30)}) {
    SCOPED_TRACE(absl::StrCat("kernel time limit ", absl::FormatDuration(limit)));
    const StreamId id = limit == absl::ZeroDuration() ? 31 : 32;
    ASSERT_TRUE(AwaitDone([&](Done d) { device_->CreateStream(id, limit, {}, d); }).ok());
    const uint64_t before = timing_records_();
    auto ns = RunOfLaunches(id, spin, 5);
    ASSERT_TRUE(ns.ok()) << ns.status();
    EXPECT_GE(*ns, 5 * 2'000'000u);
    EXPECT_LT(*ns, 5 * 2'000'000u + 80'000'000u);
    // Not one a launch (6): the GPU time's start, the run's first launch
    // (timed, as a launch alone is) and the run's end.
    EXPECT_EQ(timing_records_() - before, 3u);
    ASSERT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(id, d); }).ok());
  }
}

// A run's end is recorded before another stream's operation runs, so the
// first stream's time does not take in the other's work: stream A's two
// 2 ms launches, then stream B's 60 ms launch, then A's Synchronize,
// all in one turn.
TEST_F(DeviceTimingTest, AnotherStreamsOperationEndsTheRun) {
  const LaunchOp spin = Spin(Image("GXFAKE1\ngx_spin\n"), 2);
  const LaunchOp slow = Spin(Image("GXFAKE1\ngx_spin\n"), 60);
  constexpr StreamId a = 33, b = 34;
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->CreateStream(a, absl::Seconds(30), {}, d); }).ok());
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->CreateStream(b, absl::Seconds(30), {}, d); }).ok());
  auto ns = SynchronizeAfter(a, [&] {
    for (int i = 0; i < 2; ++i) device_->Launch(a, spin, [](absl::Status) {});
    device_->Launch(b, slow, [](absl::Status) {});
  });
  ASSERT_TRUE(ns.ok()) << ns.status();
  EXPECT_GE(*ns, 2 * 2'000'000u);
  EXPECT_LT(*ns, 50'000'000u) << "stream B's launch was counted in stream A's time";
  auto other = Await<uint64_t>([&](Callback<uint64_t> cb) { device_->Synchronize(b, cb); });
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_GE(*other, 60'000'000u);
  for (StreamId id : {a, b}) {
    ASSERT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(id, d); }).ok());
  }
}

// Nor the time of an operation of no stream that runs between (a session's
// pool trimmed as it closes, a region unmapped; here a 30 ms wait).
TEST_F(DeviceTimingTest, AnOperationOfNoStreamEndsTheRun) {
  const LaunchOp spin = Spin(Image("GXFAKE1\ngx_spin\n"), 1);
  constexpr StreamId id = 36;
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->CreateStream(id, absl::Seconds(30), {}, d); }).ok());
  auto ns = SynchronizeAfter(id, [&] {
    for (int i = 0; i < 2; ++i) device_->Launch(id, spin, [](absl::Status) {});
    device_->Post([] { absl::SleepFor(absl::Milliseconds(30)); });
  });
  ASSERT_TRUE(ns.ok()) << ns.status();
  EXPECT_GE(*ns, 2 * 1'000'000u);
  EXPECT_LT(*ns, 25'000'000u) << "the operation between was counted in the stream's time";
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(id, d); }).ok());
}

// A run left without a Synchronize ends once nothing more is posted to the
// executor: a Synchronize long after it reports the launches' time, not
// the wait.
TEST_F(DeviceTimingTest, ARunEndsWhenTheExecutorIdles) {
  const LaunchOp spin = Spin(Image("GXFAKE1\ngx_spin\n"), 2);
  constexpr StreamId id = 35;
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->CreateStream(id, absl::Seconds(30), {}, d); }).ok());
  {
    auto release = HoldExecutor();
    for (int i = 0; i < 3; ++i) device_->Launch(id, spin, [](absl::Status) {});
    release->Notify();
  }
  absl::SleepFor(absl::Milliseconds(200));
  auto ns = Await<uint64_t>([&](Callback<uint64_t> cb) { device_->Synchronize(id, cb); });
  ASSERT_TRUE(ns.ok()) << ns.status();
  EXPECT_GE(*ns, 3 * 2'000'000u);
  EXPECT_LT(*ns, 100'000'000u) << "the 200 ms before the Synchronize were counted";
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(id, d); }).ok());
}

// A run of 17 watched async launches records an event after every eighth
// (DeviceOptions::launches_per_watch), not one after each: the GPU time's
// start, the run's first launch (watched alone, as a launch alone is),
// the watches of launches 2-9 and 10-17, and the run's end. The time still
// covers all 17, timed or not.
TEST_F(DeviceTimingTest, ARunOfLaunchesSharesAWatchAmongEight) {
  const LaunchOp spin = Spin(Image("GXFAKE1\ngx_spin\n"), 1);
  for (const bool untimed : {false, true}) {
    SCOPED_TRACE(untimed ? "untimed" : "timed");
    const StreamId id = untimed ? 38 : 37;
    port::StreamOwner owner;
    owner.untimed = untimed;
    ASSERT_TRUE(
        AwaitDone([&](Done d) { device_->CreateStream(id, absl::Seconds(30), owner, d); }).ok());
    const uint64_t before = records_();
    auto ns = RunOfLaunches(id, spin, 17);
    ASSERT_TRUE(ns.ok()) << ns.status();
    EXPECT_GE(*ns, 17 * 1'000'000u);
    // Timed: start, first, two watches, the run's end (which the
    // Synchronize waits on). Untimed: no start, and the Synchronize
    // records the event it waits on (the second watch's would do; it is
    // the end of the run's last launch either way).
    EXPECT_LE(records_() - before, 5u) << "an event per launch would be 18 or more";
    EXPECT_GE(records_() - before, 3u);
    ASSERT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(id, d); }).ok());
  }
}

// A watch shared by launches has their time limits together: three 60 ms
// launches after the run's first (each under the stream's 100 ms limit,
// 180 ms together) are no hang. (40 ms of room a launch for the watcher's
// polls on a loaded host.)
TEST_F(DeviceTimingTest, ASharedWatchsLimitIsItsLaunchesTogether) {
  const LaunchOp spin = Spin(Image("GXFAKE1\ngx_spin\n"), 60);
  constexpr StreamId id = 39;
  ASSERT_TRUE(
      AwaitDone([&](Done d) { device_->CreateStream(id, absl::Milliseconds(100), {}, d); }).ok());
  auto ns = RunOfLaunches(id, spin, 4);
  ASSERT_TRUE(ns.ok()) << ns.status();
  EXPECT_GE(*ns, 4 * 60'000'000u);
  EXPECT_TRUE(Hung().empty()) << Hung()[0].detail;
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(id, d); }).ok());
}

// A kernel that runs on in a shared watch is still reported, past the
// launches' limits together, naming the run's last launch and saying the
// hung one may be any of them.
TEST_F(DeviceTimingTest, AHangInASharedWatchIsReportedPastTheirLimitsTogether) {
  const LaunchOp quick = Spin(Image("GXFAKE1\ngx_spin\n"), 1);
  LaunchOp hung = Spin(Image("GXFAKE1\ngx_spin\n"), 400);
  hung.what = "kernel 'gx_spin' (the hung one)";
  constexpr StreamId id = 40;
  ASSERT_TRUE(
      AwaitDone([&](Done d) { device_->CreateStream(id, absl::Milliseconds(50), {}, d); }).ok());
  {
    // The run's first launch is watched alone; the other three share one.
    auto release = HoldExecutor();
    for (int i = 0; i < 3; ++i) device_->Launch(id, quick, [](absl::Status) {});
    device_->Launch(id, hung, [](absl::Status) {});
    release->Notify();
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (Hung().empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  const std::vector<HungReport> reports = Hung();
  ASSERT_FALSE(reports.empty()) << "the 400 ms kernel was never reported";
  EXPECT_EQ(reports[0].stream, id);
  EXPECT_EQ(reports[0].limit_ms, 150u);
  EXPECT_EQ(reports[0].launches, 3u);
  EXPECT_GE(reports[0].ran_ms, 150u);
  EXPECT_THAT(reports[0].detail, HasSubstr("kernel 'gx_spin' (the hung one) (or one of the 2 "
                                           "launches queued right before it"));
  EXPECT_THAT(reports[0].detail, HasSubstr("50 ms each"));
  EXPECT_THAT(reports[0].detail, HasSubstr("past its kernel time limit of 150 ms"));
  ASSERT_TRUE(Await<uint64_t>([&](Callback<uint64_t> cb) { device_->Synchronize(id, cb); }).ok());
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(id, d); }).ok());
}

// The operator's limit for a stream (the daemon's or its tenant's, before
// the session lowers it) bounds what a shared watch's limits add up to: a
// stream with an eighth of it or less shares among eight, one with a
// quarter among four, one with half among two, one with the operator's
// limit itself (a session that kept it) has a watch for every launch, so
// no hang is reported later than that limit.
TEST_F(DeviceTimingTest, ARunSharesOnlyAsFarAsTheOperatorsLimitAllows) {
  const LaunchOp spin = Spin(Image("GXFAKE1\ngx_spin\n"), 1);
  struct Case {
    absl::Duration limit;
    uint64_t operator_limit_ms;
    uint64_t at_least, at_most;  // events recorded for 17 launches and a Synchronize
  };
  // The GPU time's start and the run's first launch; then a watch for
  // every eight, four, two or one of the other 16; the run's end.
  const Case cases[] = {{absl::Milliseconds(25), 200, 4, 5},
                        {absl::Milliseconds(50), 200, 6, 7},
                        {absl::Milliseconds(25), 50, 10, 12},
                        {absl::Milliseconds(200), 200, 18, 20}};
  StreamId id = 41;
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat("the stream's limit ", absl::FormatDuration(c.limit),
                              ", the operator's ", c.operator_limit_ms, " ms"));
    port::StreamOwner owner;
    owner.operator_limit_ms = c.operator_limit_ms;
    ASSERT_TRUE(AwaitDone([&](Done d) { device_->CreateStream(id, c.limit, owner, d); }).ok());
    const uint64_t before = records_();
    auto ns = RunOfLaunches(id, spin, 17);
    ASSERT_TRUE(ns.ok()) << ns.status();
    EXPECT_GE(records_() - before, c.at_least);
    EXPECT_LE(records_() - before, c.at_most);
    ASSERT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(id, d); }).ok());
    ++id;
  }
}

// A run that ends in a launch the Synchronize follows (the usual end of a
// batch) is no hang: two async 60 ms launches and a third with its
// Synchronize, each under the 100 ms limit. (The run's second launch was
// once covered by an event after the third, counted as one launch: 120 ms
// against 100.) The 40 ms between a launch and its limit leave room for
// the watcher's polls on a loaded host: 20 ms did not, once, in CI.
TEST_F(DeviceTimingTest, ARunEndingInALaunchAndSynchronizeIsNoHang) {
  const LaunchOp spin = Spin(Image("GXFAKE1\ngx_spin\n"), 60);
  constexpr StreamId id = 47;
  ASSERT_TRUE(
      AwaitDone([&](Done d) { device_->CreateStream(id, absl::Milliseconds(100), {}, d); }).ok());
  absl::Notification synced;
  absl::StatusOr<uint64_t> ns = absl::UnknownError("no answer");
  {
    auto release = HoldExecutor();
    for (int i = 0; i < 2; ++i) device_->Launch(id, spin, [](absl::Status) {});
    device_->LaunchAndSynchronize(id, spin, [&](absl::StatusOr<uint64_t> got, bool) {
      ns = std::move(got);
      synced.Notify();
    });
    release->Notify();
  }
  ASSERT_TRUE(synced.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(ns.ok()) << ns.status();
  EXPECT_GE(*ns, 3 * 60'000'000u);
  absl::SleepFor(absl::Milliseconds(50));  // a poll or two after the end
  EXPECT_TRUE(Hung().empty()) << Hung()[0].detail;
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(id, d); }).ok());
}

// Launches that fail (refused on the device, costing their tenant
// nothing) end the run, so that a hung launch queued before them is
// watched at once, against its own limit, however busy they keep the
// device's thread.
TEST_F(DeviceTimingTest, FailingLaunchesDoNotKeepAHungOneUnwatched) {
  const LaunchOp quick = Spin(Image("GXFAKE1\ngx_spin\n"), 1);
  const LaunchOp hung = Spin(Image("GXFAKE1\ngx_spin\n"), 400);
  LaunchOp refused = quick;
  refused.kernel = 99;  // not loaded: refused before the driver
  constexpr StreamId id = 48;
  ASSERT_TRUE(
      AwaitDone([&](Done d) { device_->CreateStream(id, absl::Milliseconds(50), {}, d); }).ok());
  std::atomic<int> failed{0};
  {
    auto release = HoldExecutor();
    device_->Launch(id, quick, [](absl::Status) {});
    device_->Launch(id, hung, [](absl::Status) {});
    for (int i = 0; i < 2000; ++i) {
      device_->Launch(id, refused, [&](absl::Status st) {
        if (!st.ok()) ++failed;
      });
    }
    release->Notify();
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (Hung().empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  const std::vector<HungReport> reports = Hung();
  ASSERT_FALSE(reports.empty()) << "the 400 ms kernel was never reported";
  EXPECT_EQ(reports[0].limit_ms, 50u) << reports[0].detail;
  EXPECT_EQ(reports[0].launches, 1u);
  ASSERT_TRUE(Await<uint64_t>([&](Callback<uint64_t> cb) { device_->Synchronize(id, cb); }).ok());
  EXPECT_EQ(failed.load(), 2000);
  ASSERT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(id, d); }).ok());
}

// A launch the driver refuses is no work: a Synchronize 200 ms after it
// reports no GPU time, timed or untimed (the stream's time once started
// at the refused launch and ran to the Synchronize).
TEST_F(DeviceTimingTest, ARefusedLaunchIsNoWork) {
  LaunchOp refused = Spin(Image("GXFAKE1\ngx_spin\n"), 1);
  refused.geometry.block[0] = 4096;  // more threads than a block may have
  for (const bool untimed : {false, true}) {
    SCOPED_TRACE(untimed ? "untimed" : "timed");
    const StreamId id = untimed ? 50 : 49;
    port::StreamOwner owner;
    owner.untimed = untimed;
    ASSERT_TRUE(
        AwaitDone([&](Done d) { device_->CreateStream(id, absl::Seconds(30), owner, d); }).ok());
    EXPECT_FALSE(AwaitDone([&](Done d) { device_->Launch(id, refused, d); }).ok());
    absl::SleepFor(absl::Milliseconds(200));
    auto ns = Await<uint64_t>([&](Callback<uint64_t> cb) { device_->Synchronize(id, cb); });
    ASSERT_TRUE(ns.ok()) << ns.status();
    EXPECT_LT(*ns, 20'000'000u) << "the wait after a refused launch was charged";
    ASSERT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(id, d); }).ok());
  }
}

// A launch answered as failed never ran: the events its watch and its end
// take after it is made are in hand before it is, so a driver that cannot
// make one has the launch refused, not queued on the GPU with no watch.
// Each event the driver makes around a watched launch fails in turn, on a
// fresh device (no spares yet), for an async launch and a launch +
// synchronize.
TEST_F(DeviceTimingTest, ALaunchAnsweredAsFailedNeverRan) {
  const auto image = Image("GXFAKE1\ngx_spin\n");
  int refused = 0;
  for (const bool sync : {false, true}) {
    for (uint64_t nth = 1; nth <= 4; ++nth) {
      SCOPED_TRACE(absl::StrCat(sync ? "launch + synchronize" : "async launch", ": event creation ",
                                nth, " fails"));
      auto opened = Device::Open(driver_, 0, DeviceOptions{});
      ASSERT_TRUE(opened.ok()) << opened.status();
      std::unique_ptr<Device> dev = std::move(opened).value();
      const LaunchOp op = Spin(image, 1, dev.get());
      constexpr StreamId id = 51;
      ASSERT_TRUE(
          AwaitDone([&](Done d) { dev->CreateStream(id, absl::Milliseconds(50), {}, d); }).ok());
      const uint64_t before = kernels_run_();
      fail_event_create_(nth);
      absl::Status answer;
      bool launched = false;
      if (sync) {
        struct Answer {
          absl::Notification done;
          absl::Status status;
          bool launched = false;
        };
        auto got = std::make_shared<Answer>();
        dev->LaunchAndSynchronize(id, op, [got](absl::StatusOr<uint64_t> r, bool made) {
          got->status = r.status();
          got->launched = made;
          got->done.Notify();
        });
        const bool answered = got->done.WaitForNotificationWithTimeout(absl::Seconds(20));
        fail_event_create_(0);
        ASSERT_TRUE(answered) << "the launch + synchronize never answered";
        answer = got->status;
        launched = got->launched;
      } else {
        answer = AwaitDone([&](Done d) { dev->Launch(id, op, d); });
        launched = answer.ok();
      }
      fail_event_create_(0);
      (void)Await<uint64_t>([&](Callback<uint64_t> cb) { dev->Synchronize(id, cb); });
      const uint64_t ran = kernels_run_() - before;
      EXPECT_EQ(ran, launched ? 1u : 0u) << "answered " << answer;
      if (!launched) {
        ++refused;
        EXPECT_THAT(answer.message(), HasSubstr("cuEventCreate failed")) << answer;
      }
      ASSERT_TRUE(AwaitDone([&](Done d) { dev->DestroyStream(id, d); }).ok());
    }
  }
  EXPECT_GT(refused, 0) << "no event creation around the launches failed";
}

}  // namespace
}  // namespace gpuexec::device
