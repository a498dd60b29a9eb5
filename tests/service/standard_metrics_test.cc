// The standard metrics of a real daemon: process_* of its front and of
// each worker (labelled by device, and by tenant for a tenant's own),
// gpuexec_build_info, and with TLS the certificates' expiry dates.
//   * gpuexecd as a process of its own (its front non-dumpable, as in
//     production), scraped over HTTP;
//   * an in-process server with tenants (a worker per tenant) and TLS.

#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon_process.h"
#include "gpuexec/version.h"
#include "service_test_fixture.h"
#include "tenants_fixture.h"
#include "tests/support/free_port.h"
#include "tests/support/http_exchange.h"
#include "tests/support/metrics_text.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::pair<bool, std::string> CheckFormat(const std::string& text) {
  return CheckExposition(text, GPUEXEC_EXPOSITION_CHECKER);
}

double Now() { return static_cast<double>(std::time(nullptr)); }

constexpr const char* kProcessFamilies[] = {"process_cpu_seconds_total",
                                            "process_resident_memory_bytes",
                                            "process_virtual_memory_bytes",
                                            "process_open_fds",
                                            "process_max_fds",
                                            "process_start_time_seconds"};

TEST(StandardMetricsTest, ADaemonExportsItsFrontsAndWorkersProcessesAndItsBuildInfo) {
  const int port = FreePort();
  ASSERT_GT(port, 0);
  const double started = Now();
  DaemonProcess d({absl::StrCat("--metrics_listen=127.0.0.1:", port), "--metrics_cache_ms=0"});
  // The worker is listed once it has started; the front serves metrics
  // before that.
  std::string text;
  const std::string worker = "{process=\"worker\",device=\"0\"}";
  ASSERT_TRUE(WaitFor(
      [&] {
        text = Scrape(port);
        return absl::StrContains(text, "process_start_time_seconds" + worker);
      },
      absl::Seconds(60)))
      << text;
  const std::map<std::string, double> m = Samples(text);
  if (m.count("gpuexec_devices") == 0 || m.at("gpuexec_devices") < 1) GTEST_SKIP() << "no device";

  const std::string front = "{process=\"front\"}";
  for (const std::string& who : {front, worker}) {
    SCOPED_TRACE(who);
    EXPECT_GE(m.at("process_cpu_seconds_total" + who), 0);
    EXPECT_GT(m.at("process_resident_memory_bytes" + who), 0);
    EXPECT_GE(m.at("process_virtual_memory_bytes" + who),
              m.at("process_resident_memory_bytes" + who));
    EXPECT_GT(m.at("process_max_fds" + who), 0);
    // Started by this test, a moment ago (btime is in whole seconds).
    EXPECT_GE(m.at("process_start_time_seconds" + who), started - 2);
    EXPECT_LE(m.at("process_start_time_seconds" + who), Now() + 2);
  }
  // The front counts its own; a worker is non-dumpable, and counted from
  // its /proc/<pid>/fd's size where the kernel gives it (Linux 6.2+).
  EXPECT_GE(m.at("process_open_fds" + front), 3);
  if (m.count("process_open_fds" + worker) != 0) {
    EXPECT_GE(m.at("process_open_fds" + worker), 3);
  }
  EXPECT_GE(m.at("process_start_time_seconds" + worker),
            m.at("process_start_time_seconds" + front));

  // The driver double reports 13000; the compile service's NVRTC is
  // whatever this host has, or none.
  bool build_info = false;
  for (const auto& [sample, value] : m) {
    if (!absl::StartsWith(sample, "gpuexec_build_info{")) continue;
    build_info = true;
    EXPECT_EQ(value, 1);
    EXPECT_THAT(sample, HasSubstr(absl::StrCat("version=\"", kVersion, "\",api=\"", kApiVersion,
                                               "\",driver=\"")));
    if (TestBackend().fake) {
      EXPECT_THAT(sample, HasSubstr("driver=\"13.0\""));
    }
    EXPECT_THAT(sample, HasSubstr(",nvrtc=\""));
  }
  EXPECT_TRUE(build_info) << text;
  // No TLS, no expiry.
  EXPECT_THAT(text, Not(HasSubstr("gpuexec_tls_certificate_expiry_timestamp_seconds{")));
  if (TestBackend().fake) {
    const auto [conforms, verdict] = CheckFormat(text);
    EXPECT_TRUE(conforms) << verdict << "\n" << text;
  }
}

// In this process: the front is this test, each tenant's worker is listed
// with its tenant, and one that ends is no longer.
class StandardMetricsTenantsTest : public TenantsTest {};

TEST_F(StandardMetricsTenantsTest, ATenantsWorkerIsLabelledByItsTenant) {
  WriteTenants(TwoTenants());
  ServerOptions o;
  o.isolation = "tenant";
  Start(o);
  GX_ASSERT_OK_AND_ASSIGN(Client a, As(kTokenA));
  GX_ASSERT_OK_AND_ASSIGN(Session s, a.OpenSession({kDevice}));
  const std::map<std::string, double> m = Samples(server_->RenderMetrics());
  const std::string own = "{process=\"worker\",device=\"0\",tenant=\"team-a\"}";
  for (const char* name : kProcessFamilies) {
    if (absl::string_view(name) == "process_open_fds") continue;  // kernel-dependent
    EXPECT_EQ(m.count(name + own), 1u) << name;
  }
  EXPECT_GT(m.at("process_resident_memory_bytes" + own), 0);
  EXPECT_EQ(m.count("process_resident_memory_bytes{process=\"worker\",device=\"0\"}"), 1u);
  EXPECT_GE(m.at("process_start_time_seconds" + own),
            m.at("process_start_time_seconds{process=\"front\"}"));
  EXPECT_EQ(m.count("process_resident_memory_bytes{process=\"worker\",device=\"0\","
                    "tenant=\"team-b\"}"),
            0u);
  GX_ASSERT_OK(s.Close());
}

class StandardMetricsTlsTest : public TenantsTest {
 protected:
  void SetUp() override {
    TenantsTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_TRUE(files_.MakeCa("ca"));
    ASSERT_TRUE(files_.MakeCert("server", "ca", "IP:127.0.0.1,DNS:localhost", /*days=*/10));
    ASSERT_TRUE(files_.MakeCert("server2", "ca", "IP:127.0.0.1,DNS:localhost", /*days=*/40));
  }
};

TEST_F(StandardMetricsTlsTest, TheExpiryGaugesAreTheCertificatesNotAfter) {
  WriteTenants(TwoTenants());
  ASSERT_TRUE(files_.Replace(files_.Cert("server"), files_.Path("live.crt")));
  ASSERT_TRUE(files_.Replace(files_.Key("server"), files_.Path("live.key")));
  ServerOptions o;
  o.tls_cert = files_.Path("live.crt");
  o.tls_key = files_.Path("live.key");
  o.tls_client_ca = files_.Cert("ca");
  o.tls_reload_interval = absl::Seconds(1);
  Start(o);
  const std::string server_gauge =
      "gpuexec_tls_certificate_expiry_timestamp_seconds{kind=\"server\"}";
  const std::string ca_gauge =
      "gpuexec_tls_certificate_expiry_timestamp_seconds{kind=\"client_ca\"}";
  std::map<std::string, double> m = Samples(server_->RenderMetrics());
  const int64_t server_not_after = OpensslNotAfter(files_.Cert("server"));
  ASSERT_GT(server_not_after, 0);
  EXPECT_EQ(m.at(server_gauge), static_cast<double>(server_not_after));
  EXPECT_EQ(m.at(ca_gauge), static_cast<double>(OpensslNotAfter(files_.Cert("ca"))));
  // A rotated certificate is read at the next scrape.
  ASSERT_TRUE(files_.Replace(files_.Key("server2"), files_.Path("live.key")));
  ASSERT_TRUE(files_.Replace(files_.Cert("server2"), files_.Path("live.crt")));
  m = Samples(server_->RenderMetrics());
  EXPECT_EQ(m.at(server_gauge), static_cast<double>(OpensslNotAfter(files_.Cert("server2"))));
  EXPECT_GT(m.at(server_gauge), static_cast<double>(server_not_after));
}

}  // namespace
}  // namespace gpuexec::testing
