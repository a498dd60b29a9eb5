// The tenants file and which tenant credentials name, alone: no server.

#include <string>

#include "gmock/gmock.h"
#include "gpuexec/sha256.h"
#include "gtest/gtest.h"
#include "server/tenants/tenants.h"

namespace gpuexec::tenants {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kFile[] = R"(
# two tenants and a peer
tenant {
  name: "team-a"
  token_sha256: "%A1%"
  token_sha256: "%A2%"
  certificate_name: "spiffe://example/team-a"
  certificate_name: "team-a.clients"
  memory_limit_bytes: 1024
  devices: 1
}
tenant {
  name: "team-b"
  token_sha256: "%B%"
  uid: 1000
  gid: 2000
}
)";

std::string File() {
  std::string text = kFile;
  auto put = [&text](const std::string& key, const std::string& token) {
    text.replace(text.find(key), key.size(), Sha256Hex(token));
  };
  put("%A1%", "alpha-1");
  put("%A2%", "alpha-2");
  put("%B%", "bravo");
  return text;
}

class DirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = Directory::Parse(File(), "tenants.textproto");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
  }
  absl::StatusOr<std::string> Who(const Credentials& c, Refusal* why = nullptr) {
    Refusal ignored;
    auto t = dir_->Identify(c, why != nullptr ? why : &ignored);
    if (!t.ok()) return t.status();
    return (*t)->name;
  }
  std::shared_ptr<const Directory> dir_;
};

Credentials Token(const std::string& authorization) {
  Credentials c;
  c.authorization = authorization;
  return c;
}

TEST_F(DirectoryTest, ParsesTenantsAndTheirLimits) {
  EXPECT_EQ(dir_->size(), 2u);
  auto a = dir_->Find("team-a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->limits.memory_bytes, 1024u);
  EXPECT_EQ(a->limits.devices, std::vector<uint32_t>{1});
  EXPECT_EQ(dir_->Find("team-c"), nullptr);
}

TEST_F(DirectoryTest, EveryTokenOfATenantNamesIt) {
  EXPECT_EQ(Who(Token("Bearer alpha-1")).value(), "team-a");
  EXPECT_EQ(Who(Token("Bearer alpha-2")).value(), "team-a");
  EXPECT_EQ(Who(Token("bearer bravo")).value(), "team-b");  // the scheme in any case
  EXPECT_EQ(Who(Token("BEARER   bravo ")).value(), "team-b");
}

TEST_F(DirectoryTest, RefusalsSayWhatWasWrongNotWhoExists) {
  Refusal why;
  auto unknown = Who(Token("Bearer alpha-3"), &why);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(why, Refusal::kUnknownToken);
  EXPECT_THAT(unknown.status().message(), Not(HasSubstr("team")));
  for (const char* bad : {"alpha-1", "Basic YWxhZGRpbg==", "Bearer", "Bearer ", ""}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(Who(Token(bad), &why).status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(why, Refusal::kMalformedAuthorization);
  }
  EXPECT_EQ(Who(Credentials{}, &why).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(why, Refusal::kNoCredentials);
}

TEST_F(DirectoryTest, CertificateNamesAndPeersNameTenants) {
  Credentials cert;
  cert.certificate_names = {"unrelated.example", "spiffe://example/team-a"};
  EXPECT_EQ(Who(cert).value(), "team-a");
  Credentials stranger;
  stranger.certificate_names = {"nobody"};
  Refusal why;
  EXPECT_EQ(Who(stranger, &why).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(why, Refusal::kUnknownCertificate);

  Credentials by_uid;
  by_uid.unix_peer = PeerCredentials{1000, 5, 42};
  EXPECT_EQ(Who(by_uid).value(), "team-b");
  Credentials by_gid;
  by_gid.unix_peer = PeerCredentials{7, 2000, 42};
  EXPECT_EQ(Who(by_gid).value(), "team-b");
  Credentials nobody;
  nobody.unix_peer = PeerCredentials{7, 8, 42};
  auto refused = Who(nobody, &why);
  EXPECT_EQ(why, Refusal::kUnknownPeer);
  EXPECT_THAT(refused.status().message(), HasSubstr("uid 7 (gid 8)"));
}

TEST_F(DirectoryTest, CredentialsThatNameTwoTenantsAreRefused) {
  Credentials both = Token("Bearer bravo");
  both.certificate_names = {"team-a.clients"};
  Refusal why;
  EXPECT_EQ(Who(both, &why).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(why, Refusal::kConflictingCredentials);
  // A token and a certificate of the same tenant agree.
  Credentials agree = Token("Bearer alpha-2");
  agree.certificate_names = {"team-a.clients"};
  EXPECT_EQ(Who(agree).value(), "team-a");
  // A CA-signed certificate that names no tenant does not spoil a token.
  Credentials token_and_stranger = Token("Bearer bravo");
  token_and_stranger.certificate_names = {"nobody"};
  EXPECT_EQ(Who(token_and_stranger).value(), "team-b");
}

TEST(DirectoryParseTest, MistakesNameTheLineAndTheField) {
  auto error = [](const std::string& text) {
    return std::string(Directory::Parse(text, "t.textproto").status().message());
  };
  EXPECT_THAT(error("tenant {\n name: \"a\"\n uid: 1\n devices: x\n}"),
              HasSubstr("t.textproto:4:"));
  EXPECT_THAT(error("tenant {\n name: \"a\"\n token_sha256: \"ABC\"\n}"),
              HasSubstr("t.textproto:3: tenant 'a' token_sha256"));
  EXPECT_THAT(
      error(absl::StrCat("tenant { name: \"a\" token_sha256: \"", Sha256Hex("x"),
                         "\" }\ntenant { name: \"b\"\n token_sha256: \"", Sha256Hex("x"), "\" }")),
      HasSubstr("t.textproto:3: tenant 'b' token_sha256: is listed twice"));
  EXPECT_THAT(error("tenant {\n uid: 3\n}"), HasSubstr("tenant #1 name"));
  // A name is quoted escaped and cut short in messages.
  EXPECT_THAT(error(absl::StrCat("tenant { name: \"", std::string(300, 'x'), "\\n\" uid: 1 }")),
              HasSubstr("..."));
  EXPECT_TRUE(Directory::Parse("", "empty").ok());
  // What protobuf quotes of the file comes back cut and escaped.
  const std::string quoted =
      error(absl::StrCat("tenant { uid: \"", std::string(5000, 'y'), "\r\x1b[2Kforged\" }"));
  EXPECT_LT(quoted.size(), 300u);
  EXPECT_EQ(quoted.find('\r'), std::string::npos);
  EXPECT_EQ(quoted.find('\x1b'), std::string::npos);
}

// A dedicated device is its tenant's (added to its devices when it lists
// any) and every other tenant's excluded; two tenants cannot both have it.
TEST(DirectoryParseTest, ADedicatedDeviceIsKeptFromEveryOtherTenant) {
  auto dir = Directory::Parse(
      "tenant { name: \"a\" uid: 1 devices: 0 dedicated_devices: 2 }\n"
      "tenant { name: \"b\" uid: 2 }\n"
      "tenant { name: \"c\" uid: 3 dedicated_devices: 1 }\n",
      "t.textproto");
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto a = (*dir)->Find("a");
  auto b = (*dir)->Find("b");
  auto c = (*dir)->Find("c");
  EXPECT_THAT(a->limits.devices, ::testing::ElementsAre(0u, 2u));
  EXPECT_THAT(a->limits.excluded_devices, ::testing::ElementsAre(1u));
  EXPECT_THAT(b->limits.devices, ::testing::IsEmpty());
  EXPECT_THAT(b->limits.excluded_devices, ::testing::ElementsAre(1u, 2u));
  EXPECT_THAT(c->limits.excluded_devices, ::testing::ElementsAre(2u));
  EXPECT_THAT(std::string(Directory::Parse("tenant { name: \"a\" uid: 1 dedicated_devices: 0 }\n"
                                           "tenant { name: \"b\" uid: 2\n dedicated_devices: 0 }",
                                           "t.textproto")
                              .status()
                              .message()),
              HasSubstr("t.textproto:3: tenant 'b' dedicated_devices: device 0 is dedicated to "
                        "tenant 'a' already"));
}

TEST(DirectoryParseTest, ComputeSharesAreReadAndChecked) {
  auto dir = Directory::Parse(
      "tenant { name: \"a\" uid: 1\n compute_share { fraction: 0.25 } }\n"
      "tenant { name: \"b\" uid: 2 compute_share { sms: 16 } }\n"
      "tenant { name: \"c\" uid: 3 }\n",
      "t.textproto");
  ASSERT_TRUE(dir.ok()) << dir.status();
  const auto a = (*dir)->Find("a");
  EXPECT_EQ(a->limits.compute_share.fraction, 0.25);
  EXPECT_EQ(a->limits.compute_share.sms, 0u);
  // Where a device that cannot honour it will say the share was written.
  EXPECT_EQ(a->limits.compute_share.where, "t.textproto:2: tenant 'a' compute_share");
  EXPECT_EQ((*dir)->Find("b")->limits.compute_share.sms, 16u);
  EXPECT_TRUE((*dir)->Find("c")->limits.compute_share.empty());
  auto error = [](const std::string& text) {
    return std::string(Directory::Parse(text, "t.textproto").status().message());
  };
  EXPECT_THAT(error("tenant { name: \"a\" uid: 1\n compute_share { fraction: 1.5 } }"),
              HasSubstr("t.textproto:2: tenant 'a' compute_share: the fraction 1.5 is not in "
                        "(0, 1]"));
  EXPECT_THAT(error("tenant { name: \"a\" uid: 1 compute_share { sms: 0 } }"),
              HasSubstr("compute_share: 0 SMs is no share"));
  EXPECT_THAT(error("tenant { name: \"a\" uid: 1 compute_share { } }"),
              HasSubstr("compute_share: says neither a fraction nor sms"));
}

TEST(DirectoryParseTest, APriorityIsReadByName) {
  auto dir = Directory::Parse(
      "tenant { name: \"batch\" uid: 1 priority: LOW }\n"
      "tenant { name: \"web\" uid: 2 priority: NORMAL }\n"
      "tenant { name: \"other\" uid: 3 }\n",
      "t.textproto");
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_TRUE((*dir)->Find("batch")->limits.low_priority);
  EXPECT_FALSE((*dir)->Find("web")->limits.low_priority);
  EXPECT_FALSE((*dir)->Find("other")->limits.low_priority);
  EXPECT_FALSE(
      Directory::Parse("tenant { name: \"a\" uid: 1 priority: HIGHEST }", "t.textproto").ok());
}

TEST(DirectoryParseTest, ATenantsCompilesAreBoundedByHalfTheQueue) {
  auto dir = Directory::Parse(
      "tenant { name: \"ci\" uid: 1 max_compiles: 4 }\n"
      "tenant { name: \"web\" uid: 2 }\n",
      "t.textproto");
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ((*dir)->Find("ci")->limits.max_compiles, 4u);
  EXPECT_EQ((*dir)->Find("web")->limits.max_compiles, 0u);
  EXPECT_EQ(std::string(
                Directory::Parse("tenant { name: \"a\" uid: 1\n max_compiles: 33 }", "t.textproto")
                    .status()
                    .message()),
            "t.textproto:2: tenant 'a' max_compiles: is 33, over 32 (half the daemon's queue of "
            "compiles); give at most 32");
}

TEST(DirectoryParseTest, WithoutAFileACertificateIsATenantOfItsOwn) {
  Credentials none;
  EXPECT_EQ(IdentifyWithoutFile(none).value()->name, core::kDefaultTenant);
  Credentials cert;
  cert.certificate_names = {"svc-1.example"};
  EXPECT_EQ(IdentifyWithoutFile(cert).value()->name, "cert:svc-1.example");
  // Never the implicit tenant, however the certificate is named.
  cert.certificate_names = {core::kDefaultTenant};
  EXPECT_EQ(IdentifyWithoutFile(cert).value()->name, "cert:default");
  cert.certificate_names = {std::string(300, 'n')};
  EXPECT_EQ(IdentifyWithoutFile(cert).status().code(), absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace gpuexec::tenants
