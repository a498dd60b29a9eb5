// A kernel that faults (illegal address) poisons the device's context for
// the rest of the process. The daemon must report it as ABORTED naming the
// kernel, the device and the CUDA error, mark the device unhealthy, fail
// every later call that needs the device the same way, and keep serving.
// Its own test program: after it, this process has no usable device.

#include "gpuexec/v1/gpuexec.grpc.pb.h"
#include "health_client.h"
#include "service_test_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class FaultTest : public ServiceTest {
 protected:
  // The device is gone for this process: there is no memory to compare.
  void TearDown() override {}
};

TEST_F(FaultTest, IllegalAddressIsAbortedAndTheDaemonKeepsServing) {
  EXPECT_EQ(Health(target(), ""), HealthStatus::SERVING);

  GX_ASSERT_OK_AND_ASSIGN(Session victim, Open());
  GX_ASSERT_OK_AND_ASSIGN(Session bystander, Open());
  GX_ASSERT_OK_AND_ASSIGN(Buffer kept, bystander.Allocate(4096));
  GX_ASSERT_OK_AND_ASSIGN(Function fault, Kernel(victim, "gx_fault"));
  GX_ASSERT_OK_AND_ASSIGN(Function fill, Kernel(bystander, "gx_fill_u32"));

  LaunchConfig one;
  const absl::Time start = absl::Now();
  // Address 16 is never mapped on any device.
  auto faulted = victim.LaunchAndWait(fault, one, {Arg::U64(16)});
  EXPECT_THAT(faulted, StatusIs(absl::StatusCode::kAborted,
                                AllOf(HasSubstr("gx_fault"), HasSubstr("device 0"),
                                      HasSubstr("CUDA_ERROR_ILLEGAL_ADDRESS"),
                                      HasSubstr(victim.token().substr(0, 8)))));
  // The fault is found by the completion or, failing that, by the device's
  // watchdog within a few of its ticks.
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  // Every later call that needs the device says what happened.
  LaunchConfig grid;
  grid.grid.x = 1;
  grid.block.x = 32;
  EXPECT_THAT(bystander.Launch(fill, grid, {Arg::Ptr(kept), Arg::U32(1), Arg::U64(1024)}),
              StatusIs(absl::StatusCode::kAborted,
                       AllOf(HasSubstr("device 0"), HasSubstr("sticky fault"))));
  EXPECT_THAT(kept.Read(0, 16), StatusIs(absl::StatusCode::kAborted, HasSubstr("device 0")));

  // The daemon itself keeps serving: the device is listed as unhealthy,
  // health turns NOT_SERVING, new sessions are refused.
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> devices, client().ListDevices());
  ASSERT_FALSE(devices.empty());
  EXPECT_FALSE(devices[0].healthy);
  EXPECT_TRUE(WaitFor([&] { return Health(target(), "") == HealthStatus::NOT_SERVING; },
                      absl::Seconds(5)));
  EXPECT_EQ(Health(target(), "liveness"), HealthStatus::SERVING);
  EXPECT_THAT(client().OpenSession({}), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("device")));

  // Closing the sessions does not hang on the dead device.
  GX_EXPECT_OK(bystander.Close());
  GX_EXPECT_OK(victim.Close());
}

}  // namespace
}  // namespace gpuexec::testing
