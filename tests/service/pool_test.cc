// A pool of daemons on the loopback range, placed by the client: four
// gpuexecd processes on 127.0.0.1 to 127.0.0.4 (one port), each on the test
// double with a different amount of device memory, the fourth without a
// usable device. Sessions go where their memory fits and never to the
// daemon without a device; a daemon killed mid-way fails its sessions with
// UNAVAILABLE naming it, and new sessions go to the others.

#include "gpuexec/pool.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon_process.h"
#include "service_test_fixture.h"
#include "tests/support/free_port.h"
#include "tests/support/tls_files.h"

namespace gpuexec::testing {
namespace {

using ::testing::_;
using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// gpuexecd on `address` (which it advertises), its test double given
// `env`.
std::unique_ptr<DaemonProcess> StartDaemon(const std::string& address,
                                           std::map<std::string, std::string> env,
                                           std::vector<std::string> args = {}) {
  DaemonProcess::Options o;
  o.listen = address;
  o.env = std::move(env);
  args.push_back(absl::StrCat("--advertise_address=", address));
  return std::make_unique<DaemonProcess>(args, o);
}

TEST(PoolTest, SessionsArePlacedWhereTheyFitAndMoveOnWhenADaemonDies) {
  if (!TestBackend().fake) GTEST_SKIP() << "the pool test runs on the test double";
  const int port = FreePort();
  ASSERT_GT(port, 0);
  auto at = [&](int host) { return absl::StrCat("127.0.0.", host, ":", port); };
  // 256 MiB, 2 GiB and 4 GiB of device memory; the fourth has no device.
  std::vector<std::unique_ptr<DaemonProcess>> daemons;
  daemons.push_back(
      StartDaemon(at(1), std::map<std::string, std::string>{{"GXFAKE_MEMORY_BYTES", "268435456"}}));
  daemons.push_back(StartDaemon(
      at(2), std::map<std::string, std::string>{{"GXFAKE_MEMORY_BYTES", "2147483648"}}));
  daemons.push_back(StartDaemon(
      at(3), std::map<std::string, std::string>{{"GXFAKE_MEMORY_BYTES", "4294967296"}}));
  daemons.push_back(
      StartDaemon(at(4), std::map<std::string, std::string>{{"GXFAKE_FAIL_INIT", "1"}}));
  for (int host = 1; host <= 4; ++host) {
    ClientOptions o;
    o.connect_timeout = absl::Seconds(30);
    ASSERT_TRUE(Client::Connect(at(host), o).ok()) << "daemon " << at(host) << " did not start";
  }

  PoolOptions options;
  options.choices = 4;
  GX_ASSERT_OK_AND_ASSIGN(
      Pool pool,
      Pool::Connect(absl::StrCat("pool://", at(1), ",", at(2), ",", at(3), ",", at(4)), options));
  EXPECT_EQ(pool.daemons().size(), 4u);

  // 30 sessions: 10 large ones (300 MiB, used at once) and 20 small ones.
  std::vector<Session> sessions;
  std::vector<Buffer> held;
  std::map<std::string, int> large_on, small_on;
  for (int i = 0; i < 30; ++i) {
    const bool large = i % 3 == 0;
    PoolSessionOptions s;
    s.session.memory_limit_bytes = large ? 300 * kMiB : 16 * kMiB;
    GX_ASSERT_OK_AND_ASSIGN(Session session, pool.OpenSession(s));
    GX_ASSERT_OK_AND_ASSIGN(Buffer b, session.Allocate(s.session.memory_limit_bytes));
    ++(large ? large_on : small_on)[session.daemon()];
    held.push_back(std::move(b));
    sessions.push_back(std::move(session));
  }
  EXPECT_EQ(large_on.count(at(1)), 0u) << "a 300 MiB session on the 256 MiB daemon";
  EXPECT_EQ(large_on.count(at(4)) + small_on.count(at(4)), 0u)
      << "a session on the daemon without a device";
  EXPECT_GT(large_on[at(3)], large_on[at(2)]) << "the most free memory draws the large ones";

  // The whole pool's listing: each daemon names itself; the fourth has no
  // device.
  GX_ASSERT_OK_AND_ASSIGN(std::vector<PoolDaemonDevices> listed, pool.ListDevices());
  ASSERT_EQ(listed.size(), 4u);
  for (int host = 1; host <= 4; ++host) {
    const PoolDaemonDevices& d = listed[host - 1];
    EXPECT_EQ(d.daemon, at(host));
    ASSERT_TRUE(d.status.ok()) << d.status;
    EXPECT_EQ(d.devices.size(), host == 4 ? 0u : 1u) << d.daemon;
    for (const DeviceInfo& device : d.devices) EXPECT_EQ(device.daemon_address, at(host));
  }

  // A session on a daemon that dies gets UNAVAILABLE naming it.
  daemons[2]->Kill();  // 127.0.0.3
  bool found = false;
  for (Session& s : sessions) {
    if (s.daemon() != at(3)) continue;
    found = true;
    EXPECT_THAT(s.Allocate(kMiB).status(), StatusIs(absl::StatusCode::kUnavailable,
                                                    HasSubstr(absl::StrCat("daemon ", at(3)))));
    break;
  }
  EXPECT_TRUE(found);
  GX_ASSERT_OK_AND_ASSIGN(listed, pool.ListDevices());
  ASSERT_EQ(listed.size(), 4u);
  EXPECT_THAT(listed[2].status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr(at(3))));
  EXPECT_TRUE(listed[1].status.ok()) << listed[1].status;
  // New sessions go to the others.
  for (int i = 0; i < 5; ++i) {
    PoolSessionOptions s;
    s.session.memory_limit_bytes = 16 * kMiB;
    GX_ASSERT_OK_AND_ASSIGN(Session session, pool.OpenSession(s));
    EXPECT_NE(session.daemon(), at(3));
    EXPECT_NE(session.daemon(), at(4));
    sessions.push_back(std::move(session));
  }
  // Nothing fits 8 GiB: refused, saying why.
  PoolSessionOptions huge;
  huge.session.memory_limit_bytes = 8192 * kMiB;
  EXPECT_THAT(pool.OpenSession(huge).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("no device with 8589934592 bytes free")));
}

// Over TLS, a daemon found under a DNS name is held to that name: a pod's
// certificate names the Service, not the pod's address.
TEST(PoolTest, OverTlsEachDaemonCarriesTheNameItWasFoundUnder) {
  if (!TestBackend().fake) GTEST_SKIP() << "the pool test runs on the test double";
  TlsFiles tls;
  ASSERT_TRUE(tls.MakeCa("ca"));
  ASSERT_TRUE(tls.MakeCert("server", "ca", "DNS:localhost"));  // no IP address
  const int port = FreePort();
  ASSERT_GT(port, 0);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  auto daemon = StartDaemon(address, {},
                            {absl::StrCat("--tls_cert=", tls.Cert("server")),
                             absl::StrCat("--tls_key=", tls.Key("server"))});
  ClientOptions client;
  client.tls_root_ca_file = tls.Cert("ca");
  {
    ClientOptions named = client;
    named.tls_server_name = "localhost";
    named.connect_timeout = absl::Seconds(30);
    ASSERT_TRUE(Client::Connect(address, named).ok()) << "the daemon did not start";
  }
  // By address, the certificate does not match.
  ClientOptions by_address = client;
  by_address.connect_timeout = absl::Seconds(2);
  EXPECT_THAT(Client::Connect(address, by_address).status(),
              StatusIs(absl::StatusCode::kUnavailable, _));

  PoolOptions options;
  options.client = client;
  GX_ASSERT_OK_AND_ASSIGN(Pool pool,
                          Pool::Connect(absl::StrCat("pool://localhost:", port), options));
  GX_ASSERT_OK_AND_ASSIGN(Session session, pool.OpenSession());
  EXPECT_EQ(session.daemon(), address);
  GX_ASSERT_OK_AND_ASSIGN(Buffer b, session.Allocate(kMiB));
  ASSERT_TRUE(session.Close().ok());

  // The same daemon listed by address: no name to hold it to, refused.
  GX_ASSERT_OK_AND_ASSIGN(Pool by_ip, Pool::Connect(absl::StrCat("pool://", address), options));
  EXPECT_THAT(by_ip.OpenSession().status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no daemon answered")));
}

TEST(PoolTest, TargetsAreCheckedAndNamesResolved) {
  EXPECT_THAT(Pool::Connect("pool://").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not HOST:PORT")));
  EXPECT_THAT(Pool::Connect("pool://a:1,b").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'b' is not HOST:PORT")));
  EXPECT_THAT(Pool::Connect("127.0.0.1:1").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pool://")));
  EXPECT_THAT(Pool::Connect("pool://no-such-host.invalid:50051").status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot resolve")));
  GX_ASSERT_OK_AND_ASSIGN(Pool pool, Pool::Connect("pool://localhost:50051"));
  EXPECT_THAT(pool.daemons(), ::testing::Contains("127.0.0.1:50051"));
  EXPECT_TRUE(IsPoolTarget("pool://x:1"));
  EXPECT_FALSE(IsPoolTarget("x:1"));
}

}  // namespace
}  // namespace gpuexec::testing
