// A connect that fails says why in one line, and what to do: nothing
// listening (at once, on this host), the daemon's certificate not signed by
// the CA given, plain text to a TLS daemon and TLS to a plain one, no client
// certificate for a daemon that wants one. Checked through the C++ client
// and through the gpuexec CLI (which prints Client::Connect's status),
// against gpuexecd processes on the test double: plain, TLS, and mutual TLS
// with a tenants file. Each daemon's log has one line per failed handshake,
// in words, and none of gRPC's raw lines.

#include <stdio.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon_process.h"
#include "gpuexec/pool.h"
#include "service_test_fixture.h"
#include "tests/support/free_port.h"
#include "tests/support/tls_files.h"

namespace gpuexec::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// What the CLI printed (stdout and stderr) and how long it took.
struct CliRun {
  std::string output;
  int exit_code = -1;
  absl::Duration took;
};

CliRun RunCli(const std::vector<std::string>& args) {
  std::string command = GPUEXEC_TEST_CLI;
  for (const std::string& a : args) absl::StrAppend(&command, " '", a, "'");
  absl::StrAppend(&command, " devices 2>&1");
  CliRun run;
  const absl::Time start = absl::Now();
  FILE* out = popen(command.c_str(), "r");
  if (out == nullptr) return run;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), out)) > 0) run.output.append(buf, n);
  const int status = pclose(out);
  run.took = absl::Now() - start;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// gRPC's raw lines, as they reached stderr before ("E1203 16:58:48.67
// 6694 ssl_transport_security.cc:1501] Handshake failed ...").
auto NoRawGrpcLine() {
  return AllOf(Not(HasSubstr("ssl_transport_security")), Not(HasSubstr("SSL_ERROR_SSL")),
               Not(HasSubstr(".cc:")));
}

class ConnectErrorsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tls_ = new TlsFiles;
    ASSERT_TRUE(tls_->MakeCa("ca") && tls_->MakeCa("other") &&
                tls_->MakeCert("server", "ca", "IP:127.0.0.1,DNS:localhost") &&
                tls_->MakeCert("client", "ca", "DNS:team-b.clients"))
        << "openssl failed";
    {
      std::ofstream out(tls_->Path("tenants.textproto"));
      out << "tenant { name: \"team-a\" token_sha256: "
             "\"2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b\" }\n"
             "tenant { name: \"team-b\" certificate_name: \"team-b.clients\" }\n";
    }
    const std::vector<std::string> tls_args = {absl::StrCat("--tls_cert=", tls_->Cert("server")),
                                               absl::StrCat("--tls_key=", tls_->Key("server"))};
    std::vector<std::string> mtls_args = tls_args;
    mtls_args.push_back(absl::StrCat("--tls_client_ca=", tls_->Cert("ca")));
    mtls_args.push_back(absl::StrCat("--tenants=", tls_->Path("tenants.textproto")));
    plain_ = Start("plain", {});
    tls_daemon_ = Start("tls", tls_args);
    mtls_ = Start("mtls", mtls_args);
    ClientOptions o;
    o.connect_timeout = absl::Seconds(20);
    o.wait_for_start = true;
    ASSERT_TRUE(Client::Connect(plain_->target(), o).ok()) << "the plain daemon did not start";
    o.tls_root_ca_file = tls_->Cert("ca");
    ASSERT_TRUE(Client::Connect(tls_daemon_->target(), o).ok()) << "the TLS daemon did not start";
    o.tls_cert_file = tls_->Cert("client");
    o.tls_key_file = tls_->Key("client");
    ASSERT_TRUE(Client::Connect(mtls_->target(), o).ok()) << "the mTLS daemon did not start";
  }
  static void TearDownTestSuite() {
    delete plain_;
    delete tls_daemon_;
    delete mtls_;
    delete tls_;
  }

  static DaemonProcess* Start(const std::string& name, const std::vector<std::string>& args) {
    DaemonProcess::Options o;
    o.listen = absl::StrCat("127.0.0.1:", FreePort());
    o.log_path = tls_->Path(name + ".log");
    std::vector<std::string> all = args;
    all.push_back("--log_level=info");
    return new DaemonProcess(all, o);
  }
  static std::string Log(const std::string& name) {
    return ReadFile(tls_->Path(name + ".log")).value_or("");
  }
  // Waits for `needle` in the daemon's log; the log, whether or not.
  static std::string WaitForLog(const std::string& name, const std::string& needle) {
    std::string log;
    WaitFor(
        [&] {
          log = Log(name);
          return absl::StrContains(log, needle);
        },
        absl::Seconds(10));
    return log;
  }

  static ClientOptions Tls(const std::string& ca) {
    ClientOptions o;
    o.tls_root_ca_file = tls_->Cert(ca);
    return o;
  }

  static TlsFiles* tls_;
  static DaemonProcess* plain_;
  static DaemonProcess* tls_daemon_;
  static DaemonProcess* mtls_;
};

TlsFiles* ConnectErrorsTest::tls_ = nullptr;
DaemonProcess* ConnectErrorsTest::plain_ = nullptr;
DaemonProcess* ConnectErrorsTest::tls_daemon_ = nullptr;
DaemonProcess* ConnectErrorsTest::mtls_ = nullptr;

TEST_F(ConnectErrorsTest, NothingListeningOnThisHostFailsAtOnceWithAHint) {
  const int port = FreePort();
  ASSERT_GT(port, 0);
  for (const std::string& target :
       {absl::StrCat("127.0.0.1:", port), absl::StrCat("localhost:", port)}) {
    SCOPED_TRACE(target);
    const absl::Time start = absl::Now();
    const absl::StatusOr<Client> client = Client::Connect(target);  // 10 s timeout
    EXPECT_LT(absl::Now() - start, absl::Seconds(2));
    EXPECT_THAT(
        client.status(),
        StatusIs(absl::StatusCode::kUnavailable,
                 ::testing::Eq(absl::StrCat("cannot connect to ", target,
                                            ": connection refused: is gpuexecd running? (--target, "
                                            "$GPUEXEC_TARGET)"))));
  }
  const std::string missing = tls_->Path("no-daemon.sock");
  const absl::Time start = absl::Now();
  EXPECT_THAT(Client::Connect(absl::StrCat("unix:", missing)).status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr(absl::StrCat("cannot connect to unix:", missing,
                                              ": no socket there: is gpuexecd running?"))));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));

  // A socket file left behind by a daemon that is gone: refused.
  const std::string stale = tls_->Path("stale.sock");
  {
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", stale.c_str());
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    close(fd);
  }
  const absl::Time stale_start = absl::Now();
  EXPECT_THAT(Client::Connect(absl::StrCat("unix:", stale)).status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr(absl::StrCat("cannot connect to unix:", stale,
                                              ": connection refused: is gpuexecd running?"))));
  EXPECT_LT(absl::Now() - stale_start, absl::Seconds(2));
}

TEST_F(ConnectErrorsTest, TheCliSaysTheSameAtOnce) {
  const std::string target = absl::StrCat("127.0.0.1:", FreePort());
  const CliRun run = RunCli({absl::StrCat("--target=", target)});
  EXPECT_NE(run.exit_code, 0);
  EXPECT_LT(run.took, absl::Seconds(2));
  EXPECT_THAT(run.output,
              HasSubstr(absl::StrCat("cannot connect to ", target,
                                     ": connection refused: is gpuexecd running? (--target, "
                                     "$GPUEXEC_TARGET)")));
}

TEST_F(ConnectErrorsTest, ACertificateNotSignedByTheCaGivenNamesTheCaFile) {
  const absl::Time start = absl::Now();
  EXPECT_THAT(Client::Connect(tls_daemon_->target(), Tls("other")).status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr(absl::StrCat("cannot connect to ", tls_daemon_->target(),
                                                    ": the daemon's certificate is not signed by "
                                                    "the CA in ",
                                                    tls_->Cert("other"))),
                             HasSubstr("give --tls_ca (or $GPUEXEC_TLS_CA)"), NoRawGrpcLine())));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  const CliRun run = RunCli({absl::StrCat("--target=", tls_daemon_->target()),
                             absl::StrCat("--tls_ca=", tls_->Cert("other"))});
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.output, AllOf(HasSubstr("the daemon's certificate is not signed by the CA in"),
                                NoRawGrpcLine()));
  // One line: the CLI's own, nothing of gRPC's.
  EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << run.output;

  // The daemon: one line naming the client's address.
  const std::string log = WaitForLog("tls", "W TLS handshake with client 127.0.0.1:");
  EXPECT_THAT(log, AllOf(HasSubstr("failed: the client closed the connection during the "
                                   "handshake"),
                         NoRawGrpcLine()));
}

TEST_F(ConnectErrorsTest, PlainTextToATlsDaemon) {
  EXPECT_THAT(Client::Connect(tls_daemon_->target()).status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr(absl::StrCat("cannot connect to ", tls_daemon_->target(),
                                                    ": the daemon speaks TLS and the client plain "
                                                    "text: give --tls_ca (or $GPUEXEC_TLS_CA)")),
                             NoRawGrpcLine())));
  const CliRun run = RunCli({absl::StrCat("--target=", tls_daemon_->target())});
  EXPECT_THAT(run.output,
              AllOf(HasSubstr("the daemon speaks TLS and the client plain text"), NoRawGrpcLine()));
  // gRPC does not name the peer of a TLS library error: the line says so.
  const std::string log = WaitForLog("tls", "the client spoke plain text");
  EXPECT_THAT(log, HasSubstr("W TLS handshake with a client (gRPC does not name its peer) "
                             "failed: the client spoke plain text, not TLS"));
}

TEST_F(ConnectErrorsTest, TlsToAPlainDaemon) {
  EXPECT_THAT(
      Client::Connect(plain_->target(), Tls("ca")).status(),
      StatusIs(absl::StatusCode::kUnavailable,
               AllOf(HasSubstr(absl::StrCat("cannot connect to ", plain_->target(),
                                            ": the client speaks TLS and the daemon plain "
                                            "text")),
                     HasSubstr("start gpuexecd with --tls_cert and --tls_key"), NoRawGrpcLine())));
  const CliRun run = RunCli(
      {absl::StrCat("--target=", plain_->target()), absl::StrCat("--tls_ca=", tls_->Cert("ca"))});
  EXPECT_THAT(run.output,
              AllOf(HasSubstr("the client speaks TLS and the daemon plain text"), NoRawGrpcLine()));
}

TEST_F(ConnectErrorsTest, MutualTlsWithoutAClientCertificate) {
  EXPECT_THAT(Client::Connect(mtls_->target(), Tls("ca")).status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr(absl::StrCat("cannot connect to ", mtls_->target(),
                                                    ": the daemon wants a client certificate "
                                                    "(mutual TLS): give --tls_cert and --tls_key")),
                             NoRawGrpcLine())));
  ClientOptions stranger = Tls("ca");
  stranger.tls_cert_file = tls_->Cert("other");  // self-signed: not of the daemon's CA
  stranger.tls_key_file = tls_->Key("other");
  EXPECT_THAT(Client::Connect(mtls_->target(), stranger).status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr(absl::StrCat("the daemon refused the client certificate ",
                                              tls_->Cert("other")))));
  const CliRun run = RunCli(
      {absl::StrCat("--target=", mtls_->target()), absl::StrCat("--tls_ca=", tls_->Cert("ca"))});
  EXPECT_THAT(run.output, AllOf(HasSubstr("the daemon wants a client certificate (mutual TLS)"),
                                NoRawGrpcLine()));
  const std::string log = WaitForLog("mtls", "the client's certificate is not signed");
  EXPECT_THAT(log, AllOf(HasSubstr("W TLS handshake with a client (gRPC does not name its peer) "
                                   "failed: the client sent no certificate, and --tls_client_ca "
                                   "requires one"),
                         HasSubstr("failed: the client's certificate is not signed by the CA of "
                                   "--tls_client_ca"),
                         NoRawGrpcLine()));
}

// A pool says why each daemon was passed over, in the same words, once.
TEST_F(ConnectErrorsTest, APoolSaysWhyItsDaemonsWerePassedOver) {
  PoolOptions options;
  options.client = Tls("other");
  const std::string pool = absl::StrCat("pool://", tls_daemon_->target(), ",", plain_->target());
  GX_ASSERT_OK_AND_ASSIGN(Pool p, Pool::Connect(pool, options));
  const absl::Status opened = p.OpenSession().status();
  EXPECT_THAT(opened,
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr("pool: no daemon answered"),
                             HasSubstr(absl::StrCat("daemon ", tls_daemon_->target(),
                                                    ": the daemon's certificate is not signed by "
                                                    "the CA in ",
                                                    tls_->Cert("other"))),
                             HasSubstr(absl::StrCat("daemon ", plain_->target(),
                                                    ": the client speaks TLS and the daemon plain "
                                                    "text")),
                             NoRawGrpcLine())));
}

TEST_F(ConnectErrorsTest, TheDaemonWarnsOfTokenOnlyTenantsUnderMutualTls) {
  EXPECT_THAT(Log("mtls"),
              AllOf(HasSubstr("W tenants: --tls_client_ca requires a certificate of every TCP "
                              "client, and 1 tenant(s) of "),
                    HasSubstr("have a token and no certificate_name ('team-a'): they can no "
                              "longer connect over TCP")));
  EXPECT_THAT(Log("tls"), Not(HasSubstr("certificate_name")));
}

}  // namespace
}  // namespace gpuexec::testing
