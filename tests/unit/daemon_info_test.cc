// gpuexec_build_info and the certificates' expiries: the driver version in
// words, the labels bounded and escaped, a certificate's notAfter as
// openssl prints it, a file that does not parse (no sample, one warning).

#include "server/metrics/daemon_info.h"

#include <stdlib.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/tls_files.h"

namespace gpuexec::metrics {
namespace {

using ::gpuexec::testing::OpensslNotAfter;

using ::testing::HasSubstr;
using ::testing::Not;

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(DriverVersionText, MajorDotMinor) {
  EXPECT_EQ(DriverVersionText(13000), "13.0");
  EXPECT_EQ(DriverVersionText(12040), "12.4");
  EXPECT_EQ(DriverVersionText(12090), "12.9");
  EXPECT_EQ(DriverVersionText(0), "none");
  EXPECT_EQ(DriverVersionText(-1), "none");
}

TEST(BuildInfo, OneSampleOfOneWithBoundedEscapedLabels) {
  Registry registry;
  AddBuildInfoCollector(&registry, [] {
    return BuildInfo{"0.1.0", "gpuexec.v1", "", std::string(100, 'x') + "\"\n"};
  });
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("# TYPE gpuexec_build_info gauge\n"));
  EXPECT_THAT(text,
              HasSubstr(absl::StrCat("gpuexec_build_info{version=\"0.1.0\",api=\"gpuexec.v1\","
                                     "driver=\"none\",nvrtc=\"",
                                     std::string(64, 'x'), "\"} 1\n")));
}

class TlsExpiryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tls_.dir().empty());
    ASSERT_TRUE(tls_.MakeCa("ca")) << "openssl failed";
    ASSERT_TRUE(tls_.MakeCert("server", "ca", "DNS:localhost", /*days=*/30)) << "openssl failed";
  }
  testing::TlsFiles tls_;
};

TEST_F(TlsExpiryTest, NotAfterIsWhatOpensslSays) {
  const int64_t expected = OpensslNotAfter(tls_.Cert("server"));
  ASSERT_GT(expected, 0);
  absl::StatusOr<int64_t> got = CertificateNotAfter(tls_.Cert("server"));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, expected);
  // About 30 days from now.
  EXPECT_NEAR(static_cast<double>(*got), static_cast<double>(std::time(nullptr)) + 30 * 86400,
              86400);
}

TEST_F(TlsExpiryTest, ABundleAnswersItsEarliest) {
  ASSERT_TRUE(tls_.MakeCa("ca2"));  // 2 days: expires first
  const std::string bundle = tls_.Path("bundle.pem");
  ASSERT_EQ(std::system(absl::StrCat("cat '", tls_.Cert("server"), "' '", tls_.Cert("ca2"), "' > '",
                                     bundle, "'")
                            .c_str()),
            0);
  EXPECT_EQ(CertificateNotAfter(bundle, /*earliest=*/true).value_or(-1),
            OpensslNotAfter(tls_.Cert("ca2")));
  EXPECT_EQ(CertificateNotAfter(bundle).value_or(-1), OpensslNotAfter(tls_.Cert("server")));
}

TEST_F(TlsExpiryTest, AFileThatDoesNotParseHasNoSampleAndOneWarning) {
  const std::string bad = tls_.Path("bad.pem");
  std::ofstream(bad) << "-----BEGIN CERTIFICATE-----\nnot base64 at all\n"
                        "-----END CERTIFICATE-----\n";
  EXPECT_EQ(CertificateNotAfter(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CertificateNotAfter(tls_.Path("missing.pem")).status().code(),
            absl::StatusCode::kUnavailable);

  Registry registry;
  AddTlsExpiryCollector(&registry, {{"server", tls_.Cert("server")}, {"client_ca", bad}});
  ::testing::internal::CaptureStderr();
  std::string text;
  for (int i = 0; i < 3; ++i) text = registry.Render();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(Count(log, "no expiry of the client_ca certificate"), 1u) << log;
  EXPECT_THAT(text, HasSubstr(absl::StrCat(
                        "gpuexec_tls_certificate_expiry_timestamp_seconds{kind=\"server\"} ",
                        OpensslNotAfter(tls_.Cert("server")), "\n")));
  EXPECT_THAT(text, Not(HasSubstr("{kind=\"client_ca\"}")));

  // Fixed: its sample comes back; broken again: one more warning.
  ASSERT_TRUE(tls_.Replace(tls_.Cert("ca"), bad));
  EXPECT_THAT(registry.Render(), HasSubstr("{kind=\"client_ca\"} "));
  ::testing::internal::CaptureStderr();
  std::ofstream(bad) << "garbage\n";
  registry.Render();
  registry.Render();
  EXPECT_EQ(Count(::testing::internal::GetCapturedStderr(), "no expiry"), 1u);
}

TEST(TlsExpiry, NothingWithoutTls) {
  Registry registry;
  AddTlsExpiryCollector(&registry, {});
  EXPECT_THAT(registry.Render(), Not(HasSubstr("gpuexec_tls_certificate")));
}

}  // namespace
}  // namespace gpuexec::metrics
