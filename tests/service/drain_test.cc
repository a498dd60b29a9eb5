// A drain of a whole daemon, as an operator and a pool's clients see it:
// only root or the daemon's own user on its Unix socket may start one; new
// sessions are refused with UNAVAILABLE naming it, ListDevices, /readyz and
// gpuexec_draining report it, open sessions are served until the deadline
// and then closed, each told why; a resume serves again. And the daemon's
// readiness as systemd hears it (READY=1, the drain, STOPPING=1).

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon_process.h"
#include "service_test_fixture.h"
#include "tests/support/http_exchange.h"

namespace gpuexec::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// GET `path` of the metrics endpoint: the status line and the body.
std::pair<std::string, std::string> Get(int port, const std::string& path) {
  const std::string response =
      HttpExchange(port, absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: localhost\r\n\r\n"))
          .value_or("");
  const size_t line = response.find("\r\n");
  const size_t body = response.find("\r\n\r\n");
  return {response.substr(0, line), body == std::string::npos ? "" : response.substr(body + 4)};
}

class DrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.allow_unauthenticated = true;
    options.unix_socket = absl::StrCat(::testing::TempDir(), "gpuexecd-drain-", getpid(), ".sock");
    options.metrics_address = "127.0.0.1:0";
    options.metrics_cache_ms = 0;
    options.reaper_interval = absl::Milliseconds(20);
    auto server = StartServer(options);
    if (!server.ok()) GTEST_SKIP() << "backend cannot serve: " << server.status();
    server_ = *std::move(server);
    if (server_->device_count() == 0) GTEST_SKIP() << "no device";
    GX_ASSERT_OK_AND_ASSIGN(local_, Client::Connect(absl::StrCat("unix:", options.unix_socket)));
    GX_ASSERT_OK_AND_ASSIGN(remote_, Client::Connect(absl::StrCat("127.0.0.1:", server_->port())));
  }

  std::unique_ptr<Server> server_;
  std::optional<Client> local_, remote_;
};

TEST_F(DrainTest, OnlyTheDaemonsOwnUserOnItsSocketMayDrainIt) {
  EXPECT_THAT(remote_->Drain({}), StatusIs(absl::StatusCode::kPermissionDenied,
                                           AllOf(HasSubstr("operator's call"),
                                                 HasSubstr("Unix socket"), HasSubstr("SIGUSR1"))));
  EXPECT_EQ(Get(server_->metrics_port(), "/readyz").first, "HTTP/1.1 200 OK");
  DrainOptions too_long;
  too_long.deadline = absl::Hours(25);
  EXPECT_THAT(local_->Drain(too_long),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("24h")));
}

TEST_F(DrainTest, NewSessionsGoElsewhereOpenOnesRunUntilTheDeadlineThenCloseWithTheReason) {
  const int port = server_->metrics_port();
  EXPECT_EQ(Get(port, "/healthz").first, "HTTP/1.1 200 OK");
  EXPECT_EQ(Get(port, "/readyz"),
            std::make_pair(std::string("HTTP/1.1 200 OK"), std::string("ready\n")));
  GX_ASSERT_OK_AND_ASSIGN(Session open, remote_->OpenSession({}));

  DrainOptions drain;
  drain.deadline = absl::Seconds(30);
  GX_ASSERT_OK_AND_ASSIGN(DrainStatus st, local_->Drain(drain));
  EXPECT_TRUE(st.draining);
  EXPECT_EQ(st.sessions_open, 1u);
  EXPECT_THAT(st.description,
              AllOf(HasSubstr("draining since"), HasSubstr("the Drain call of unix:uid=")));

  // Ready no more, and said everywhere a client or an operator looks.
  const auto [status, body] = Get(port, "/readyz");
  EXPECT_EQ(status, "HTTP/1.1 503 Service Unavailable");
  EXPECT_THAT(body, HasSubstr("not ready: draining since"));
  EXPECT_EQ(Get(port, "/healthz").first, "HTTP/1.1 200 OK") << "the process still serves";
  EXPECT_THAT(Get(port, "/metrics").second, HasSubstr("\ngpuexec_draining 1\n"));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> devices, remote_->ListDevices());
  ASSERT_FALSE(devices.empty());
  EXPECT_THAT(devices[0].daemon_draining, HasSubstr("draining since"));
  EXPECT_THAT(remote_->OpenSession({}),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr("draining"), HasSubstr("another daemon of the pool"))));
  // The open session is served.
  EXPECT_THAT(open.Allocate(4096), IsOk());

  // Waiting with a short deadline: the session is closed, and told why.
  drain.deadline = absl::Milliseconds(200);
  drain.wait = true;
  const absl::Time asked = absl::Now();
  GX_ASSERT_OK_AND_ASSIGN(st, local_->Drain(drain));
  EXPECT_LT(absl::Now() - asked, absl::Seconds(10));
  EXPECT_EQ(st.sessions_open, 0u);
  EXPECT_EQ(st.closed_at_deadline, 1u);
  EXPECT_THAT(open.Allocate(4096), StatusIs(absl::StatusCode::kNotFound,
                                            AllOf(HasSubstr("was closed"), HasSubstr("drained"))));

  // Resumed: ready, and serving new sessions again.
  DrainOptions resume;
  resume.resume = true;
  GX_ASSERT_OK_AND_ASSIGN(st, local_->Drain(resume));
  EXPECT_FALSE(st.draining);
  EXPECT_EQ(Get(port, "/readyz").first, "HTTP/1.1 200 OK");
  EXPECT_THAT(Get(port, "/metrics").second, HasSubstr("\ngpuexec_draining 0\n"));
  EXPECT_THAT(remote_->OpenSession({}), IsOk());
}

TEST_F(DrainTest, AWaitingDrainIsAnsweredWhenTheLastSessionEnds) {
  GX_ASSERT_OK_AND_ASSIGN(Session open, remote_->OpenSession({}));
  DrainOptions drain;
  drain.deadline = absl::Hours(1);
  drain.wait = true;
  absl::StatusOr<DrainStatus> answer;
  std::thread waiter([&] { answer = local_->Drain(drain); });
  absl::SleepFor(absl::Milliseconds(200));
  ASSERT_THAT(open.Close(), IsOk());
  waiter.join();
  ASSERT_THAT(answer, IsOk());
  EXPECT_EQ(answer->sessions_open, 0u);
  EXPECT_EQ(answer->closed_at_deadline, 0u);
}

// systemd's side: a datagram socket where NOTIFY_SOCKET points.
class NotifySocket {
 public:
  NotifySocket() {
    path_ = absl::StrCat(::testing::TempDir(), "notify-", getpid(), ".sock");
    ::unlink(path_.c_str());
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof addr.sun_path - 1);
    bound_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    timeval tv{20, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~NotifySocket() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  bool bound() const { return bound_; }
  const std::string& path() const { return path_; }
  // The next datagram ("" after 20 s without one).
  std::string Next() {
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
};

TEST(DrainProcessTest, SystemdHearsReadyTheDrainOfSigusr1AndStopping) {
  NotifySocket systemd;
  ASSERT_TRUE(systemd.bound());
  DaemonProcess::Options o;
  o.env = {{"NOTIFY_SOCKET", systemd.path()}};
  DaemonProcess daemon({}, o);
  EXPECT_EQ(systemd.Next(), "READY=1\nSTATUS=serving");
  ClientOptions options;
  options.connect_timeout = absl::Seconds(20);
  GX_ASSERT_OK_AND_ASSIGN(Client client, Client::Connect(daemon.target(), options));
  ::kill(daemon.pid(), SIGUSR1);
  EXPECT_THAT(systemd.Next(), HasSubstr("STATUS=draining"));
  EXPECT_THAT(client.OpenSession({}), StatusIs(absl::StatusCode::kUnavailable,
                                               AllOf(HasSubstr("draining"), HasSubstr("SIGUSR1"))));
  GX_ASSERT_OK_AND_ASSIGN(std::vector<DeviceInfo> devices, client.ListDevices());
  if (!devices.empty()) {
    EXPECT_THAT(devices[0].daemon_draining, HasSubstr("(SIGUSR1)"));
  }
  EXPECT_EQ(daemon.Stop(), 0);
  EXPECT_EQ(systemd.Next(), "STOPPING=1");
}

}  // namespace
}  // namespace gpuexec::testing
