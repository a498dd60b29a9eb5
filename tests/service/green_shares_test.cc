// Compute shares with one worker a device (--isolation=device): the worker
// cuts the device into a green context per tenant with a share and one of
// the rest, and each session's stream runs on its tenant's part alone.
// gx_sm_ids reports the SMs a launch reached: on the test double exactly
// its part's; on a GPU no more than them, and never another part's.

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "tenants_fixture.h"
#include "tests/support/wait.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;

class GreenSharesTest : public TenantsTest {
 protected:
  static ServerOptions OneWorker() {
    ServerOptions o;
    o.isolation = "device";
    o.mps = "off";
    return o;
  }

  // The distinct SMs a launch of gx_sm_ids with four blocks a
  // multiprocessor reached in `session`.
  static absl::StatusOr<std::set<uint32_t>> SmsReached(Session& session, uint32_t device_sms) {
    GPUEXEC_TEST_ASSIGN(Module module,
                        session.LoadModuleFile(TestBackend().kernels_dir + "/gx_kernels.cubin"));
    GPUEXEC_TEST_ASSIGN(Function sm_ids, module.GetFunction("gx_sm_ids"));
    const uint32_t blocks = 4 * device_sms;
    GPUEXEC_TEST_ASSIGN(Buffer out, session.Allocate(uint64_t{blocks} * 4));
    LaunchConfig config;
    config.grid = {blocks, 1, 1};
    config.block = {128, 1, 1};
    absl::StatusOr<absl::Duration> ran =
        session.LaunchAndWait(sm_ids, config, {Arg::Ptr(out), Arg::U64(20000)});
    if (!ran.ok()) return ran.status();
    GPUEXEC_TEST_ASSIGN(std::vector<uint32_t> ids, out.ReadAs<uint32_t>(blocks));
    return std::set<uint32_t>(ids.begin(), ids.end());
  }

  // A part of `sms` SMs reached: all of them on the double, no more on a
  // GPU (whose scheduler need not use every one for a short kernel).
  static void ExpectPart(const std::set<uint32_t>& reached, uint32_t sms) {
    if (TestBackend().fake) {
      EXPECT_EQ(reached.size(), sms);
    } else {
      EXPECT_LE(reached.size(), sms);
      EXPECT_GE(reached.size(), 1u);
    }
  }

  uint32_t DeviceSms() const { return server_device_sms_; }

  void StartOneWorker(const std::string& a_limits) {
    WriteTenants(TwoTenants(a_limits));
    Start(OneWorker());
    if (HasFatalFailure()) return;
    GX_ASSERT_OK_AND_ASSIGN(Client a, As(kTokenA));
    GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> devices, a.ListDevices());
    server_device_sms_ = devices[kDevice].multiprocessor_count;
  }

  uint32_t server_device_sms_ = 0;
};

bool Disjoint(const std::set<uint32_t>& x, const std::set<uint32_t>& y) {
  return std::none_of(x.begin(), x.end(), [&](uint32_t v) { return y.count(v) > 0; });
}

TEST_F(GreenSharesTest, EachTenantsKernelsRunOnItsPartAlone) {
  StartOneWorker("  compute_share { sms: 16 }\n");
  GX_ASSERT_OK_AND_ASSIGN(Both both, OpenBoth());
  GX_ASSERT_OK_AND_ASSIGN(std::set<uint32_t> a_sms, SmsReached(both.sa, DeviceSms()));
  GX_ASSERT_OK_AND_ASSIGN(std::set<uint32_t> b_sms, SmsReached(both.sb, DeviceSms()));
  ExpectPart(a_sms, 16);
  // team-b, without a share, runs on the rest: every SM but team-a's 16.
  ExpectPart(b_sms, DeviceSms() - 16);
  EXPECT_TRUE(Disjoint(a_sms, b_sms));
  // Each tenant is told its own part; the operator sees every part.
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> da, both.a.ListDevices());
  EXPECT_EQ(da[kDevice].compute_share_sms, 16u);
  EXPECT_TRUE(da[kDevice].compute_share_own);
  const std::string metrics = server_->RenderMetrics();
  EXPECT_THAT(metrics,
              HasSubstr("gpuexec_tenant_compute_share_sms{tenant=\"team-a\",device=\"0\"} 16"));
  EXPECT_THAT(metrics,
              HasSubstr(absl::StrCat("gpuexec_device_compute_share_rest_sms{device=\"0\"} ",
                                     DeviceSms() - 16)));
}

TEST_F(GreenSharesTest, WithoutSharesEveryStreamMayUseEverySm) {
  StartOneWorker("");
  GX_ASSERT_OK_AND_ASSIGN(Both both, OpenBoth());
  GX_ASSERT_OK_AND_ASSIGN(std::set<uint32_t> a_sms, SmsReached(both.sa, DeviceSms()));
  if (TestBackend().fake) {
    EXPECT_EQ(a_sms.size(), DeviceSms());
  }
  EXPECT_GT(a_sms.size(), 16u);
}

TEST_F(GreenSharesTest, AReloadCutsTheDeviceAgainAndClosesTheSessionsOnTheOldCut) {
  StartOneWorker("  compute_share { sms: 16 }\n");
  GX_ASSERT_OK_AND_ASSIGN(Both both, OpenBoth());
  GX_ASSERT_OK_AND_ASSIGN(std::set<uint32_t> first, SmsReached(both.sa, DeviceSms()));
  ExpectPart(first, 16);

  WriteTenants(TwoTenants("  compute_share { sms: 32 }\n"));
  GX_ASSERT_OK(server_->ReloadTenants());
  // Both sessions ran on the old cut (team-b's on the old rest, which
  // overlaps team-a's new part): they are closed, and told why.
  for (Session* old : {&both.sa, &both.sb}) {
    absl::StatusOr<Buffer> refused = old->Allocate(64);
    ASSERT_FALSE(refused.ok());
    EXPECT_THAT(refused.status().message(), HasSubstr("compute shares of device 0 changed"));
  }
  GX_ASSERT_OK_AND_ASSIGN(Session after, both.a.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(std::set<uint32_t> second, SmsReached(after, DeviceSms()));
  ExpectPart(second, 32);
  GX_ASSERT_OK_AND_ASSIGN(Session b_after, both.b.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(std::set<uint32_t> rest, SmsReached(b_after, DeviceSms()));
  ExpectPart(rest, DeviceSms() - 32);
  EXPECT_TRUE(Disjoint(second, rest));

  // A reload that leaves the cut as it is closes nothing.
  GX_ASSERT_OK(server_->ReloadTenants());
  GX_ASSERT_OK(after.Allocate(64).status());

  // Shares taken out: new sessions use every SM again.
  WriteTenants(TwoTenants(""));
  GX_ASSERT_OK(server_->ReloadTenants());
  EXPECT_FALSE(after.Allocate(64).ok());
  GX_ASSERT_OK_AND_ASSIGN(Session whole, both.a.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(std::set<uint32_t> all, SmsReached(whole, DeviceSms()));
  EXPECT_GT(all.size(), 32u);
}

// A worker that restarts (here after a tenant's kernel faulted) is cut
// again before its first stream: no session of the new worker runs on
// every SM.
TEST_F(GreenSharesTest, ARestartedWorkerIsCutAgainBeforeItsFirstStream) {
  StartOneWorker("  compute_share { sms: 16 }\n");
  GX_ASSERT_OK_AND_ASSIGN(Client a, As(kTokenA));
  GX_ASSERT_OK_AND_ASSIGN(Session faulting, a.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(Module module,
                          faulting.LoadModuleFile(TestBackend().kernels_dir + "/gx_kernels.cubin"));
  GX_ASSERT_OK_AND_ASSIGN(Function fault, module.GetFunction("gx_fault"));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> before, a.ListDevices());
  const uint64_t resets = before[kDevice].resets;
  LaunchConfig one;
  // Address 16 is never mapped on any device.
  EXPECT_FALSE(faulting.LaunchAndWait(fault, one, {Arg::U64(16)}).ok());
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<std::vector<DeviceInfo>> all = a.ListDevices();
        return all.ok() && (*all)[kDevice].healthy && (*all)[kDevice].resets > resets;
      },
      absl::Seconds(30)));
  GX_ASSERT_OK_AND_ASSIGN(Session after, a.OpenSession({kDevice}));
  GX_ASSERT_OK_AND_ASSIGN(std::set<uint32_t> sms, SmsReached(after, DeviceSms()));
  ExpectPart(sms, 16);
}

TEST_F(GreenSharesTest, SharesThatLeaveTheOthersNothingAreRefusedAtStart) {
  WriteTenants(TwoTenants("  compute_share { fraction: 1 }\n"));
  ServerOptions o = OneWorker();
  o.tenants_file = tenants_file_;
  auto server = StartServer(o);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("compute_share"));
}

}  // namespace
}  // namespace gpuexec::testing
