// Faults, hangs and crashes: each device is served by a worker process, so
// a kernel that hits an illegal address, a kernel that never ends or a
// worker that dies takes down that worker only. The daemon restarts it and
// keeps serving: the faulting session gets ABORTED naming the kernel, the
// device and the CUDA error; buffers of the device answer ABORTED saying
// when and why it was reset; module and function handles keep working; the
// device serves new work within 2 seconds; other devices never notice.
//
// Recovery times are printed ("recovery: ...") for the record.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fault_test_fixture.h"
#include "gpuexec/v1/gpuexec.grpc.pb.h"
#include "health_client.h"

namespace gpuexec::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST_F(FaultTest, IllegalAddressResetsTheDeviceWhichServesAgainWithinTwoSeconds) {
  const DeviceInfo before = DeviceAt(kDevice);
  GX_ASSERT_OK_AND_ASSIGN(Session victim, Open());
  GX_ASSERT_OK_AND_ASSIGN(Session bystander, Open());
  GX_ASSERT_OK_AND_ASSIGN(Buffer kept, bystander.Allocate(4096));
  GX_ASSERT_OK_AND_ASSIGN(Function fault, Kernel(victim, "gx_fault"));
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Kernel(bystander, "gx_fill_u32"));
  const int worker = server().worker_pid(kDevice);
  ASSERT_GT(worker, 0);

  // Address 16 is never mapped on any device.
  auto faulted = victim.LaunchAndWait(fault, Config(1, 1), {Arg::U64(16)});
  const absl::Time fault_seen = absl::Now();
  // What happened to the kernel comes first, then what to do; the driver
  // call is the log's.
  EXPECT_THAT(faulted,
              StatusIs(absl::StatusCode::kAborted,
                       AllOf(::testing::StartsWith(absl::StrCat(
                                 "kernel 'gx_fault' of session ", victim.token().substr(0, 8),
                                 " made an illegal memory access (CUDA_ERROR_ILLEGAL_ADDRESS); "
                                 "device 0 was reset at ")),
                             HasSubstr("The session was closed: open a new session"))));
  EXPECT_LE(faulted.status().message().size(), 200u) << faulted.status();

  // The bystander's buffer went with the worker: its next use says when and
  // why, and Free forgets it.
  // (A Read that reaches the worker after the fault and before the reset
  // fails with the reset itself, which is the same news.)
  EXPECT_THAT(kept.Read(0, 16),
              StatusIs(absl::StatusCode::kAborted, AllOf(HasSubstr("device 0 was reset at"),
                                                         HasSubstr("CUDA_ERROR_ILLEGAL_ADDRESS"))));
  EXPECT_THAT(bystander.Launch(fill, Config(1, 32), {Arg::Ptr(kept), Arg::U32(1), Arg::U64(16)}),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("was lost")));
  GX_EXPECT_OK(kept.Free());

  // Both sessions go on with new buffers, with the function handles they
  // had (the module is reloaded from the daemon's store).
  absl::Status again;
  do {
    again = FillWith(bystander, fill, 7);
  } while (again.code() == absl::StatusCode::kUnavailable &&
           absl::Now() - fault_seen < absl::Seconds(2));
  GX_EXPECT_OK(again);
  const absl::Duration recovered = absl::Now() - fault_seen;
  Record("illegal address, to a launch by a session of before", recovered);
  EXPECT_LT(recovered, absl::Seconds(2));
  // The session whose kernel faulted is closed, and says why.
  EXPECT_THAT(FillAndCheck(victim, 9),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("was closed: its kernel 'gx_fault' made an illegal memory "
                                       "access (CUDA_ERROR_ILLEGAL_ADDRESS) and reset device 0"),
                             HasSubstr("strike 1"), HasSubstr("open a new session"))));
  GX_EXPECT_OK(ServesNewWork(kDevice, 11, fault_seen + absl::Seconds(2)));

  const DeviceInfo after = DeviceAt(kDevice);
  EXPECT_TRUE(after.healthy);
  EXPECT_EQ(after.resets, before.resets + 1);
  EXPECT_EQ(after.epoch, before.epoch + 1);
  EXPECT_THAT(after.last_reset, AllOf(HasSubstr("gx_fault"), HasSubstr("UTC")));
  EXPECT_THAT(
      server().RenderMetrics(),
      HasSubstr(absl::StrCat("gpuexec_device_resets_total{device=\"0\"} ", after.resets, "\n")));
  EXPECT_NE(server().worker_pid(kDevice), worker);
  EXPECT_EQ(kill(worker, 0), -1) << "the faulted worker is gone";
  EXPECT_EQ(Health(target(), ""), HealthStatus::SERVING);
  EXPECT_EQ(Health(target(), "device/0"), HealthStatus::SERVING);

  GX_EXPECT_OK(bystander.Close());
  EXPECT_THAT(victim.Close(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("was closed")));
}

TEST_F(FaultTest, HungKernelPastTheSessionTimeLimitEndsTheWorker) {
  SessionOptions limited;
  limited.kernel_time_limit = absl::Milliseconds(500);
  GX_ASSERT_OK_AND_ASSIGN(Session s, Open(limited));
  EXPECT_EQ(s.kernel_time_limit(), absl::Milliseconds(500));
  // A session may lower the daemon's limit, not raise it.
  SessionOptions greedy;
  greedy.kernel_time_limit = absl::Hours(10);
  GX_ASSERT_OK_AND_ASSIGN(Session other, Open(greedy));
  EXPECT_EQ(other.kernel_time_limit(), absl::Seconds(60));
  GX_EXPECT_OK(other.Close());
  SessionOptions tiny;
  tiny.kernel_time_limit = absl::Milliseconds(5);
  EXPECT_THAT(Open(tiny), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("below the minimum of 100 ms")));

  GX_ASSERT_OK_AND_ASSIGN(Function spin, Kernel(s, "gx_spin"));
  // Work queued ahead of a launch does not count against its limit: a
  // 300 ms kernel, then a 300 ms one, each within 500 ms.
  GX_EXPECT_OK(s.Launch(spin, Config(1, 1), {Arg::U64(300'000'000)}));
  GX_EXPECT_OK(s.LaunchAndWait(spin, Config(1, 1), {Arg::U64(300'000'000)}).status());
  const absl::Time start = absl::Now();
  // About eleven days: forever, as far as this test goes.
  auto hung = s.LaunchAndWait(spin, Config(1, 1), {Arg::U64(uint64_t{1} << 50)});
  const absl::Time seen = absl::Now();
  EXPECT_THAT(hung, StatusIs(absl::StatusCode::kAborted,
                             AllOf(::testing::StartsWith("kernel 'gx_spin' of session "),
                                   HasSubstr(" ran past its kernel time limit of 500 ms"),
                                   HasSubstr("device 0 was reset at"))));
  EXPECT_GE(seen - start, absl::Milliseconds(500));
  EXPECT_LT(seen - start, absl::Seconds(3));
  Record("hung kernel, from its time limit to the ABORTED answer",
         seen - start - absl::Milliseconds(500));

  GX_EXPECT_OK(ServesNewWork(kDevice, 5, seen + absl::Seconds(2)));
  Record("hung kernel, to new work served", absl::Now() - seen);
  EXPECT_LT(absl::Now() - seen, absl::Seconds(2));
  // The hung kernel's session is closed, and says why.
  EXPECT_THAT(FillAndCheck(s, 6),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("was closed: its kernel 'gx_spin' ran past its kernel time limit "
                                 "of 500 ms and reset device 0")));
}

// A launch queued without waiting faults, and nobody waits for it: the
// daemon resets the device and closes the session before its client's next
// call. That call, whichever it meets (the launch's ABORTED or the closed
// session's NOT_FOUND), names the kernel and the CUDA error, and so does
// every call after it.
TEST_F(FaultTest, AQueuedFaultIsNamedByTheNextCallsWhateverTheyMeet) {
  const DeviceInfo before = DeviceAt(kDevice);
  GX_ASSERT_OK_AND_ASSIGN(Session s, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function fault, Kernel(s, "gx_fault"));
  GX_ASSERT_OK(s.LaunchAsync(fault, Config(1, 1), {Arg::U64(16)}));
  EXPECT_TRUE(WaitFor([&] { return DeviceAt(kDevice).resets > before.resets; }, absl::Seconds(10)))
      << "the queued fault did not reset device 0";
  const auto names_the_fault = AllOf(HasSubstr("'gx_fault'"), HasSubstr("illegal memory access"),
                                     HasSubstr("CUDA_ERROR_ILLEGAL_ADDRESS"));
  const absl::Status first = s.Synchronize().status();
  EXPECT_THAT(first.code(),
              ::testing::AnyOf(absl::StatusCode::kAborted, absl::StatusCode::kNotFound))
      << first;
  EXPECT_THAT(std::string(first.message()), names_the_fault);
  const absl::Status later = FillAndCheck(s, 3);
  EXPECT_THAT(later,
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(::testing::StartsWith(absl::StrCat(
                                 "session ", s.token().substr(0, 8),
                                 " was closed: its kernel 'gx_fault' made an illegal memory "
                                 "access (CUDA_ERROR_ILLEGAL_ADDRESS) and reset device 0 at ")),
                             HasSubstr("open a new session"))));
  EXPECT_LE(later.message().size(), 250u) << later;
  EXPECT_THAT(s.Close(), StatusIs(absl::StatusCode::kNotFound, names_the_fault));
}

TEST_F(FaultTest, WorkerKilledMidWriteFailsTheWriteAndTheDeviceComesBack) {
  const DeviceInfo before = DeviceAt(kDevice);
  GX_ASSERT_OK_AND_ASSIGN(Session s, Open());
  constexpr uint64_t kBytes = uint64_t{512} << 20;
  GX_ASSERT_OK_AND_ASSIGN(Buffer buffer, s.Allocate(kBytes));
  const std::vector<uint8_t> data(kBytes, 0x5a);
  const int worker = server().worker_pid(kDevice);
  ASSERT_GT(worker, 0);

  // Kill once the daemon has copied some of the Write to the device.
  auto written_so_far = [&] {
    const std::string m = server().RenderMetrics();
    const std::string key = "gpuexec_write_bytes_total{device=\"0\"} ";
    const size_t at = m.find(key);
    return at == std::string::npos ? uint64_t{0}
                                   : std::strtoull(m.c_str() + at + key.size(), nullptr, 10);
  };
  const uint64_t before_write = written_so_far();
  absl::Status written;
  std::thread writer([&] { written = buffer.Write(0, data); });
  if (!WaitFor([&] { return written_so_far() > before_write; }, absl::Seconds(20))) {
    writer.join();  // a failed assertion must not leave the thread running
    FAIL() << "the Write copied nothing to the device within 20 s: " << written;
  }
  ASSERT_EQ(kill(worker, SIGKILL), 0);
  const absl::Time killed = absl::Now();
  writer.join();
  EXPECT_THAT(written, StatusIs(absl::StatusCode::kAborted,
                                AllOf(HasSubstr("device 0 was reset"), HasSubstr("signal 9"))));
  EXPECT_THAT(buffer.Read(0, 16), StatusIs(absl::StatusCode::kAborted,
                                           AllOf(HasSubstr("was lost"), HasSubstr("signal 9"))));
  // The session's next Synchronize says its queued work was lost, once.
  EXPECT_THAT(s.Synchronize(),
              StatusIs(absl::StatusCode::kAborted,
                       AllOf(HasSubstr("work queued on the session's stream was lost"),
                             HasSubstr("signal 9"))));

  GX_EXPECT_OK(ServesNewWork(kDevice, 3, killed + absl::Seconds(2)));
  Record("worker killed mid-Write, to new work served", absl::Now() - killed);
  // The session goes on: a new buffer takes a whole Write.
  GX_ASSERT_OK_AND_ASSIGN(Buffer fresh, s.Allocate(8 << 20));
  const std::vector<uint8_t> pattern = Pattern(42, 8 << 20);
  GX_EXPECT_OK(fresh.Write(0, pattern));
  auto back = fresh.Read();
  GX_ASSERT_OK(back.status());
  EXPECT_TRUE(*back == pattern);
  GX_EXPECT_OK(s.Synchronize().status());
  EXPECT_EQ(DeviceAt(kDevice).resets, before.resets + 1);
  GX_EXPECT_OK(s.Close());
}

TEST_F(FaultTest, HealthIsNotServingWhileTheWorkerRestarts) {
  GX_ASSERT_OK_AND_ASSIGN(Session s, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function fault, Kernel(s, "gx_fault"));
  // The next worker takes a while to start: a real driver by itself; the
  // test double is told to take a second (it reads this when its driver
  // starts, in the new worker process).
  setenv("GXFAKE_INIT_DELAY_MS", "1000", 1);
  EXPECT_THAT(s.LaunchAndWait(fault, Config(1, 1), {Arg::U64(16)}),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("gx_fault")));
  EXPECT_EQ(Health(target(), "device/0"), HealthStatus::NOT_SERVING);
  // The daemon as a whole serves while another device does.
  EXPECT_EQ(Health(target(), ""),
            server().device_count() > 1 ? HealthStatus::SERVING : HealthStatus::NOT_SERVING);
  EXPECT_EQ(Health(target(), "liveness"), HealthStatus::SERVING);
  GX_ASSERT_OK_AND_ASSIGN(DeviceInfo restarting, Device());
  EXPECT_FALSE(restarting.healthy);
  EXPECT_THAT(client().OpenSession({kDevice}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("restarting")));
  unsetenv("GXFAKE_INIT_DELAY_MS");
  EXPECT_TRUE(WaitServing(kDevice, absl::Seconds(5)));
  EXPECT_EQ(Health(target(), "device/0"), HealthStatus::SERVING);
  EXPECT_EQ(Health(target(), ""), HealthStatus::SERVING);
  // The faulting session went with its fault; new work is served.
  EXPECT_THAT(FillAndCheck(s, 2), StatusIs(absl::StatusCode::kNotFound, HasSubstr("was closed")));
  GX_EXPECT_OK(TryNewWork(kDevice, 2));
}

TEST_F(FaultTest, FaultOnOneDeviceLeavesTheOtherDevicesSessionsRunning) {
  if (server().device_count() < 2) GTEST_SKIP() << "needs two devices";
  SessionOptions on1;
  on1.device = 1;
  GX_ASSERT_OK_AND_ASSIGN(Session other, client().OpenSession(on1));
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Kernel(other, "gx_fill_u32"));
  GX_ASSERT_OK_AND_ASSIGN(Buffer held, other.Allocate(1 << 20));
  const std::vector<uint8_t> pattern = Pattern(7, 1 << 20);
  GX_ASSERT_OK(held.Write(0, pattern));
  const uint64_t resets1 = DeviceAt(1).resets;

  // Device 1 works on, all through the fault on device 0.
  std::atomic<bool> stop{false};
  std::atomic<int> runs{0};
  absl::Status worked;
  std::thread busy([&] {
    while (!stop && worked.ok()) {
      worked = FillWith(other, fill, 100 + runs.load());
      ++runs;
    }
  });
  GX_ASSERT_OK_AND_ASSIGN(Session victim, Open());
  GX_ASSERT_OK_AND_ASSIGN(Function fault, Kernel(victim, "gx_fault"));
  while (runs < 3 && worked.ok()) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_THAT(victim.LaunchAndWait(fault, Config(1, 1), {Arg::U64(16)}),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("device 0")));
  const int at_fault = runs;
  GX_EXPECT_OK(ServesNewWork(kDevice, 1, absl::Now() + absl::Seconds(2)));
  while (runs < at_fault + 3 && worked.ok()) absl::SleepFor(absl::Milliseconds(1));
  stop = true;
  busy.join();
  GX_EXPECT_OK(worked);
  std::printf("device 1 ran %d fill-and-read rounds through device 0's reset\n", runs.load());
  auto back = held.Read();
  GX_ASSERT_OK(back.status());
  EXPECT_TRUE(*back == pattern) << "device 1's buffer kept its bytes";
  EXPECT_EQ(DeviceAt(1).resets, resets1);
  EXPECT_THAT(victim.Close(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("was closed")));
  GX_EXPECT_OK(other.Close());
}

}  // namespace
}  // namespace gpuexec::testing
