// A pool of daemons on the loopback range, placed by the client: four
// gpuexecd processes on 127.0.0.1 to 127.0.0.4 (one port), each on the test
// double with a different amount of device memory, the fourth without a
// usable device. Sessions go where their memory fits and never to the
// daemon without a device; a daemon killed mid-way fails its sessions with
// UNAVAILABLE naming it, and new sessions go to the others.

#include "gpuexec/pool.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "service_test_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// A port free on 127.0.0.1 now (the daemons bind it on each address).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return 0;
  }
  close(fd);
  return ntohs(a.sin_port);
}

// gpuexecd on `address`, its test double given `env`.
class PoolDaemon {
 public:
  PoolDaemon(const std::string& address, std::map<std::string, std::string> env)
      : address_(address) {
    std::vector<std::string> args = {DaemonProgram(), absl::StrCat("--listen=", address),
                                     absl::StrCat("--driver=", TestBackend().driver),
                                     "--log_level=warning"};
    pid_ = fork();
    if (pid_ == 0) {
      for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~PoolDaemon() { Kill(); }
  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  const std::string& address() const { return address_; }

 private:
  std::string address_;
  pid_t pid_ = -1;
};

TEST(PoolTest, SessionsArePlacedWhereTheyFitAndMoveOnWhenADaemonDies) {
  if (!TestBackend().fake) GTEST_SKIP() << "the pool test runs on the test double";
  const int port = FreePort();
  ASSERT_GT(port, 0);
  auto at = [&](int host) { return absl::StrCat("127.0.0.", host, ":", port); };
  // 256 MiB, 2 GiB and 4 GiB of device memory; the fourth has no device.
  std::vector<std::unique_ptr<PoolDaemon>> daemons;
  daemons.push_back(std::make_unique<PoolDaemon>(
      at(1), std::map<std::string, std::string>{{"GXFAKE_MEMORY_BYTES", "268435456"}}));
  daemons.push_back(std::make_unique<PoolDaemon>(
      at(2), std::map<std::string, std::string>{{"GXFAKE_MEMORY_BYTES", "2147483648"}}));
  daemons.push_back(std::make_unique<PoolDaemon>(
      at(3), std::map<std::string, std::string>{{"GXFAKE_MEMORY_BYTES", "4294967296"}}));
  daemons.push_back(std::make_unique<PoolDaemon>(
      at(4), std::map<std::string, std::string>{{"GXFAKE_FAIL_INIT", "1"}}));
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
