#ifndef GPUEXEC_TESTS_SERVICE_TENANTS_FIXTURE_H_
#define GPUEXEC_TESTS_SERVICE_TENANTS_FIXTURE_H_

// The tenants suites' fixture: a tenants file and a real server in this
// process that reads it, on loopback plain TCP (optionally TLS and a Unix
// socket), on the test double or the driver.

#include <dlfcn.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gpuexec/sha256.h"
#include "service_test_fixture.h"
#include "tests/support/tls_files.h"

namespace gpuexec::testing {

#define GPUEXEC_TEST_ASSIGN(lhs, expr)                                          \
  auto GX_CONCAT_(r_, __LINE__) = (expr);                                       \
  if (!GX_CONCAT_(r_, __LINE__).ok()) return GX_CONCAT_(r_, __LINE__).status(); \
  lhs = *std::move(GX_CONCAT_(r_, __LINE__))

inline constexpr char kTokenA[] = "token-of-team-a-0123456789abcdef";
inline constexpr char kTokenB[] = "token-of-team-b-fedcba9876543210";

inline std::string Digest(const std::string& token) { return Sha256Hex(token); }

// A tenants file and a server that reads it, on loopback plain TCP (and
// optionally TLS and a Unix socket).
class TenantsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // On a real driver, a host without one skips (the double always loads).
    void* driver = dlopen(TestBackend().driver.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (driver == nullptr) {
      const char* why = dlerror();
      GTEST_SKIP() << "driver " << TestBackend().driver
                   << " cannot be loaded: " << (why != nullptr ? why : "");
    }
    dlclose(driver);
    ASSERT_FALSE(files_.dir().empty());
    tenants_file_ = files_.Path("tenants.textproto");
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(10));
  }

  void WriteTenants(const std::string& text) {
    std::ofstream out(tenants_file_ + ".new");
    out << text;
    out.close();
    ASSERT_EQ(rename((tenants_file_ + ".new").c_str(), tenants_file_.c_str()), 0);
  }

  // team-a (token A, certificate name team-a.clients) with the limits
  // given, team-b (token B, and this process's uid when `with_uid`).
  std::string TwoTenants(const std::string& a_limits = "", bool with_uid = false) {
    return absl::StrCat("tenant {\n  name: \"team-a\"\n  token_sha256: \"", Digest(kTokenA),
                        "\"\n  certificate_name: \"team-a.clients\"\n", a_limits,
                        "}\n"
                        "tenant {\n  name: \"team-b\"\n  token_sha256: \"",
                        Digest(kTokenB), "\"\n",
                        with_uid ? absl::StrCat("  uid: ", getuid(), "\n") : "", "}\n");
  }

  void Start(ServerOptions options = {}) {
    options.tenants_file = tenants_file_;
    auto server = StartServer(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_GE(server_->device_count(), 1);
  }

  std::string target() const { return TargetOf(*server_); }

  absl::StatusOr<Client> As(const std::string& token, ClientOptions options = {}) {
    options.token = token;
    return Client::Connect(target(), options);
  }

  // A client and a session of each tenant.
  struct Both {
    Client a, b;
    Session sa, sb;
  };
  absl::StatusOr<Both> OpenBoth() {
    GPUEXEC_TEST_ASSIGN(Client a, As(kTokenA));
    GPUEXEC_TEST_ASSIGN(Client b, As(kTokenB));
    GPUEXEC_TEST_ASSIGN(Session sa, a.OpenSession({kDevice}));
    GPUEXEC_TEST_ASSIGN(Session sb, b.OpenSession({kDevice}));
    return Both{std::move(a), std::move(b), std::move(sa), std::move(sb)};
  }

  TlsFiles files_;
  std::string tenants_file_;
  std::unique_ptr<Server> server_;
};

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_SERVICE_TENANTS_FIXTURE_H_
