// Tenants: what a reload of the tenants file takes away from sessions
// already open (a revoked token, a removed tenant, a device a tenant may no
// longer use). A real server in this process on the test double.

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tenants_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;

TEST_F(TenantsTest, ARevokedTokenEndsTheStreamsItOpenedAndARemovedTenantItsSessions) {
  constexpr char kTokenA2[] = "second-token-of-team-a-00000000";
  WriteTenants(absl::StrCat(TwoTenants(), "tenant { name: \"team-c\" token_sha256: \"",
                            Digest(kTokenA2), "\" }\n"));
  Start();
  GX_ASSERT_OK_AND_ASSIGN(Both both, OpenBoth());
  auto& [a, b, sa, sb] = both;
  // The session's command stream is open (Allocate travels on it).
  GX_ASSERT_OK_AND_ASSIGN(Buffer kept, sa.Allocate(4096));
  GX_ASSERT_OK_AND_ASSIGN(Buffer b_kept, sb.Allocate(4096));
  GX_ASSERT_OK(b_kept.Memset(0x42));

  // team-a's token taken out (team-a itself too): its open stream ends,
  // its sessions close; team-b's go on.
  WriteTenants(
      absl::StrCat("tenant { name: \"team-b\" token_sha256: \"", Digest(kTokenB), "\" }\n"));
  GX_ASSERT_OK(server_->ReloadTenants());
  auto more = sa.Allocate(4096);
  EXPECT_FALSE(more.ok());
  EXPECT_THAT(more.status().code(),
              ::testing::AnyOf(absl::StatusCode::kUnauthenticated, absl::StatusCode::kNotFound));
  EXPECT_TRUE(WaitFor(
      [&] {
        return absl::StrContains(server_->RenderMetrics(),
                                 "gpuexec_tenant_sessions{tenant=\"team-a\"} 0");
      },
      absl::Seconds(5)));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> back, b_kept.Read());
  EXPECT_EQ(std::count(back.begin(), back.end(), 0x42), 4096);
  GX_EXPECT_OK(sb.Allocate(4096).status());
  kept.Release();
}

// A reload that dedicates the device to team-b closes team-a's sessions
// there (saying why), and refuses team-a's new ones; team-b's go on.
TEST_F(TenantsTest, AReloadThatTakesADeviceAwayClosesTheTenantsSessionsThere) {
  WriteTenants(TwoTenants());
  Start();
  GX_ASSERT_OK_AND_ASSIGN(Both both, OpenBoth());
  auto& [a, b, sa, sb] = both;
  GX_ASSERT_OK_AND_ASSIGN(Buffer a_kept, sa.Allocate(4096));
  GX_ASSERT_OK_AND_ASSIGN(Buffer b_kept, sb.Allocate(4096));
  GX_ASSERT_OK(b_kept.Memset(0x42));

  std::string text = TwoTenants();
  text.insert(text.rfind("}\n"), absl::StrCat("  dedicated_devices: ", kDevice, "\n"));
  WriteTenants(text);
  GX_ASSERT_OK(server_->ReloadTenants());
  EXPECT_TRUE(WaitFor(
      [&] {
        return absl::StrContains(server_->RenderMetrics(),
                                 "gpuexec_tenant_sessions{tenant=\"team-a\"} 0");
      },
      absl::Seconds(5)));
  EXPECT_THAT(sa.KeepAlive(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("may no longer use device")));
  EXPECT_THAT(a.OpenSession({kDevice}), StatusIs(absl::StatusCode::kPermissionDenied,
                                                 HasSubstr("it is dedicated to another tenant")));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> back, b_kept.Read());
  EXPECT_EQ(std::count(back.begin(), back.end(), 0x42), 4096);
  a_kept.Release();
}

}  // namespace
}  // namespace gpuexec::testing
