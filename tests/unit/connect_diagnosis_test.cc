// Why a connect failed (client/cpp/internal/connect_diagnosis.h): one row
// per case, from the facts a client gathers (gRPC 1.51's own lines, quoted
// as it writes them, and the raw probe's verdict) to the one line the user
// reads. Each message is checked for its cause and for what it says to do.
#include "internal/connect_diagnosis.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpuexec::internal {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// gRPC 1.51's lines, as a client captured them against real daemons.
constexpr char kVerifyFailed[] =
    "subchannel.cc: subchannel 0x559999db8420 {address=ipv4:127.0.0.1:50051, }: connect failed "
    "(UNKNOWN:Ssl handshake failed: SSL_ERROR_SSL: error:0A000086:SSL routines::certificate "
    "verify failed {file:\"./src/core/lib/security/transport/security_handshaker.cc\", "
    "file_line:393, tsi_error:\"TSI_PROTOCOL_FAILURE\", tsi_code:10}), backing off for 968 ms";
constexpr char kWrongVersion[] =
    "subchannel.cc: subchannel 0x562baa9e9390 {address=ipv4:127.0.0.1:50051, }: connect failed "
    "(UNKNOWN:Ssl handshake failed: SSL_ERROR_SSL: error:0A00010B:SSL routines::wrong version "
    "number {tsi_code:10}), backing off for 981 ms";
constexpr char kRefusedV6[] =
    "subchannel.cc: subchannel 0x55a6f3125c00 {address=ipv6:%5B::1%5D:50051, }: connect failed "
    "(UNKNOWN:Failed to connect to remote host: Connection refused {errno:111, "
    "target_address:\"ipv6:%5B::1%5D:50051\"}), backing off for 984 ms";
constexpr char kSecureReadFailed[] =
    "subchannel.cc: subchannel 0x564cd2749160 {address=ipv4:127.0.0.1:50911, }: connect failed "
    "(UNKNOWN:Endpoint read failed {occurred_during_write:0, children:[UNKNOWN:Secure read failed "
    "{children:[INTERNAL:Socket closed {target_address:\"ipv4:127.0.0.1:50911\", "
    "grpc_status:14, fd:7}]}]}), backing off for 991 ms";
constexpr char kSocketClosed[] =
    "subchannel.cc: subchannel 0x55e974ca1ca0 {address=ipv4:127.0.0.1:50911, }: connect failed "
    "(UNKNOWN:Endpoint read failed {children:[INTERNAL:Socket closed "
    "{target_address:\"ipv4:127.0.0.1:50911\", grpc_status:14, fd:7}]}), backing off for 997 ms";
constexpr char kRefusedLine[] =
    "subchannel.cc: subchannel 0x5589ac52bca0 {address=ipv4:127.0.0.1:50914, }: connect failed "
    "(UNKNOWN:Failed to connect to remote host: Connection refused {syscall:\"connect\", "
    "os_error:\"Connection refused\", errno:111}), backing off for 999 ms";
constexpr char kTimedOutLine[] =
    "subchannel.cc: subchannel 0x1 {address=ipv4:10.9.9.9:50051, }: connect failed "
    "(UNKNOWN:Failed to connect to remote host: Connection timed out {errno:110}), backing off "
    "for 1000 ms";
constexpr char kNameMismatch[] =
    "subchannel.cc: subchannel 0x1 {address=ipv4:127.0.0.1:50051, }: connect failed "
    "(UNKNOWN:Peer name 127.0.0.1 is not in peer certificate {}), backing off for 1000 ms";

struct Row {
  const char* name;
  ConnectFacts facts;
  ConnectFailure failure;
  std::vector<std::string> says;  // each a substring of the message
};

ConnectFacts Facts(const std::string& target, bool tls, std::vector<std::string> lines,
                   Wire probe = Wire::kNotProbed) {
  ConnectFacts f;
  f.target = target;
  f.loopback = target.rfind("127.", 0) == 0 || target.rfind("unix:", 0) == 0;
  f.unix_socket = target.rfind("unix:", 0) == 0;
  f.tls = tls;
  if (tls) f.tls_root_ca_file = "/etc/gx/ca.crt";
  f.grpc_lines = std::move(lines);
  f.probe = probe;
  f.timeout = absl::Seconds(10);
  return f;
}

std::vector<Row> Rows() {
  std::vector<Row> rows;
  {
    ConnectFacts f = Facts("127.0.0.1:50051", false, {kRefusedLine});
    rows.push_back({"refused on loopback, from gRPC's line",
                    f,
                    ConnectFailure::kRefused,
                    {"cannot connect to 127.0.0.1:50051: connection refused: is gpuexecd running? "
                     "(--target, $GPUEXEC_TARGET)"}});
  }
  {
    ConnectFacts f = Facts("127.0.0.1:50051", false, {});
    f.refused = true;
    rows.push_back({"refused on loopback, from the probe",
                    f,
                    ConnectFailure::kRefused,
                    {"cannot connect to 127.0.0.1:50051: connection refused: is gpuexecd running? "
                     "(--target, $GPUEXEC_TARGET)"}});
  }
  {
    ConnectFacts f = Facts("unix:/run/gpuexec.sock", false, {});
    f.no_socket_file = true;
    rows.push_back({"no socket file",
                    f,
                    ConnectFailure::kRefused,
                    {"cannot connect to unix:/run/gpuexec.sock: no socket there: is gpuexecd "
                     "running? (--target, $GPUEXEC_TARGET)"}});
  }
  {
    ConnectFacts f = Facts("gpu7.example:50051", false, {kRefusedLine});
    f.refused = true;
    f.deadline_passed = true;
    rows.push_back({"refused on another host",
                    f,
                    ConnectFailure::kRefused,
                    {"cannot connect to gpu7.example:50051: connection refused",
                     "is gpuexecd running there, on that port?"}});
  }
  rows.push_back({"localhost: ::1 refused, 127.0.0.1 a TLS daemon of another CA",
                  Facts("127.0.0.1:50051", true, {kRefusedV6, kVerifyFailed}, Wire::kNotProbed),
                  ConnectFailure::kWrongCa,
                  {"the daemon's certificate is not signed by the CA in /etc/gx/ca.crt"}});
  rows.push_back({"localhost: ::1 refused, 127.0.0.1 closed a plain-text client",
                  Facts("127.0.0.1:50051", false, {kRefusedV6, kSocketClosed}, Wire::kNothing),
                  ConnectFailure::kPlainToTls,
                  {"the daemon speaks TLS and the client plain text"}});
  rows.push_back({"wrong CA",
                  Facts("127.0.0.1:50051", true, {kVerifyFailed}, Wire::kTls),
                  ConnectFailure::kWrongCa,
                  {"the daemon's certificate is not signed by the CA in /etc/gx/ca.crt",
                   "give --tls_ca (or $GPUEXEC_TLS_CA), the CA that signed the daemon's "
                   "--tls_cert"}});
  {
    ConnectFacts f = Facts("127.0.0.1:50051", true, {kVerifyFailed}, Wire::kTls);
    f.tls_root_ca_file.clear();
    rows.push_back({"system roots do not verify",
                    f,
                    ConnectFailure::kWrongCa,
                    {"not signed by a CA this system trusts", "give --tls_ca"}});
  }
  rows.push_back({"certificate of another name",
                  Facts("127.0.0.1:50051", true, {kNameMismatch}, Wire::kTls),
                  ConnectFailure::kWrongName,
                  {"does not carry the name connected to", "--tls_server_name"}});
  rows.push_back(
      {"plain text to a TLS daemon",
       Facts("127.0.0.1:50051", false, {kSocketClosed}, Wire::kTls),
       ConnectFailure::kPlainToTls,
       {"the daemon speaks TLS and the client plain text", "give --tls_ca (or $GPUEXEC_TLS_CA)"}});
  rows.push_back({"plain text to a TLS daemon, which closed the probe without a byte",
                  Facts("127.0.0.1:50051", false, {kSocketClosed}, Wire::kNothing),
                  ConnectFailure::kPlainToTls,
                  {"the daemon speaks TLS and the client plain text"}});
  rows.push_back({"a plain daemon that closed the connection is not taken for TLS",
                  Facts("127.0.0.1:50051", false, {kSocketClosed}, Wire::kHttp2),
                  ConnectFailure::kUnknown,
                  {"no connection (plain text; last attempt: the daemon closed the connection)"}});
  rows.push_back({"TLS to a plain daemon, from gRPC's line",
                  Facts("127.0.0.1:50051", true, {kWrongVersion}),
                  ConnectFailure::kTlsToPlain,
                  {"the client speaks TLS and the daemon plain text",
                   "or start gpuexecd with --tls_cert and --tls_key"}});
  rows.push_back({"TLS to a plain daemon, from the probe",
                  Facts("127.0.0.1:50051", true, {}, Wire::kHttp2),
                  ConnectFailure::kTlsToPlain,
                  {"the client speaks TLS and the daemon plain text"}});
  rows.push_back(
      {"mutual TLS without a certificate",
       Facts("127.0.0.1:50051", true, {kSecureReadFailed}, Wire::kTls),
       ConnectFailure::kNeedsClientCertificate,
       {"the daemon wants a client certificate (mutual TLS)", "give --tls_cert and --tls_key"}});
  {
    ConnectFacts f = Facts("127.0.0.1:50051", true, {kSecureReadFailed}, Wire::kTls);
    f.tls_cert_file = "/etc/gx/me.crt";
    rows.push_back({"mutual TLS, certificate refused",
                    f,
                    ConnectFailure::kClientCertificateRefused,
                    {"the daemon refused the client certificate /etc/gx/me.crt",
                     "signed by the CA of the daemon's --tls_client_ca"}});
  }
  rows.push_back({"an HTTP/1 server",
                  Facts("127.0.0.1:9400", false, {kSocketClosed}, Wire::kHttp1),
                  ConnectFailure::kNotGrpc,
                  {"speaks HTTP/1, not gRPC", "--metrics_listen"}});
  {
    ConnectFacts f = Facts("10.9.9.9:50051", false, {kTimedOutLine}, Wire::kNothing);
    f.deadline_passed = true;
    f.raw_error = "Connection timed out";
    rows.push_back({"another host, no answer",
                    f,
                    ConnectFailure::kUnknown,
                    {"cannot connect to 10.9.9.9:50051: no connection within 10s",
                     "(plain text; last attempt: Failed to connect to remote host: Connection "
                     "timed out)",
                     "reachable from here? (--target, $GPUEXEC_TARGET)"}});
  }
  {
    ConnectFacts f = Facts("10.9.9.9:50051", true, {}, Wire::kNotProbed);
    f.deadline_passed = true;
    f.raw_error = "No route to host";
    rows.push_back({"another host, what was tried over TLS",
                    f,
                    ConnectFailure::kUnknown,
                    {"TLS, the CA in /etc/gx/ca.crt", "last attempt: No route to host"}});
  }
  rows.push_back({"no line of gRPC's: what the probe found",
                  Facts("127.0.0.1:50051", true, {}, Wire::kTls),
                  ConnectFailure::kUnknown,
                  {"last attempt: a TLS server answers there, and the handshake did not "
                   "complete"}});
  {
    ConnectFacts f = Facts(std::string("evil\nhost:1") + std::string(400, 'x'), false, {});
    f.refused = true;
    rows.push_back({"a target is printable and bounded",
                    f,
                    ConnectFailure::kRefused,
                    {"evil\\x0ahost:1", "xxx...: connection refused"}});
  }
  return rows;
}

TEST(ConnectDiagnosis, EachCaseSaysItsCauseAndWhatToDo) {
  for (const Row& row : Rows()) {
    SCOPED_TRACE(row.name);
    const Diagnosis d = DiagnoseConnectFailure(row.facts);
    EXPECT_EQ(d.failure, row.failure);
    EXPECT_EQ(d.status.code(), absl::StatusCode::kUnavailable);
    for (const std::string& s : row.says) EXPECT_THAT(d.status.message(), HasSubstr(s));
    EXPECT_THAT(d.status.message(), Not(HasSubstr("\n")));
    EXPECT_LE(d.status.message().size(), 700u);
  }
}

TEST(ConnectDiagnosis, RawTlsLinesNeverReachTheMessage) {
  const Diagnosis d =
      DiagnoseConnectFailure(Facts("127.0.0.1:50051", true, {kVerifyFailed}, Wire::kTls));
  EXPECT_THAT(d.status.message(),
              AllOf(Not(HasSubstr("SSL_ERROR_SSL")), Not(HasSubstr("ssl_transport_security"))));
}

TEST(ConnectDiagnosis, LinesAreTakenOnlyAboutTheTarget) {
  struct Case {
    std::string target;
    const char* line;
    bool about;
  };
  const std::vector<Case> cases = {
      {"127.0.0.1:50051", kVerifyFailed, true},
      {"ipv4:127.0.0.1:50051", kVerifyFailed, true},
      {"127.0.0.2:50051", kVerifyFailed, false},  // another daemon's
      {"127.0.0.1:50052", kVerifyFailed, false},
      {"localhost:50051", kVerifyFailed, true},  // a name: any of its addresses
      {"localhost:50051", kRefusedV6, true},
      {"[::1]:50051", kRefusedV6, true},
      {"[0:0::1]:50051", kRefusedV6, true},
      {"[::1]:50051", kVerifyFailed, false},
      {"unix:/run/gx.sock",
       "subchannel.cc: subchannel 0x1 {address=unix:/run/gx.sock, }: connect failed (x)", true},
      {"unix:///run/gx.sock",
       "subchannel.cc: subchannel 0x1 {address=unix:/run/gx.sock, }: connect failed (x)", true},
      {"unix:/run/other.sock",
       "subchannel.cc: subchannel 0x1 {address=unix:/run/gx.sock, }: connect failed (x)", false},
      // Only a subchannel's "connect failed" line names its address.
      {"127.0.0.1:50051",
       "ssl_transport_security.cc: Handshake failed with fatal error SSL_ERROR_SSL: "
       "error:0A000086:SSL routines::certificate verify failed.",
       false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.target + " / " + c.line);
    TargetAddress target;
    ASSERT_TRUE(ParseTargetAddress(c.target, &target));
    EXPECT_EQ(LineIsAbout(c.line, target), c.about);
  }
  TargetAddress t;
  EXPECT_FALSE(ParseTargetAddress("", &t));
  EXPECT_FALSE(ParseTargetAddress("[::1", &t));
  ASSERT_TRUE(ParseTargetAddress("dns:///gpu7.example", &t));
  EXPECT_EQ(t.host, "gpu7.example");
  EXPECT_EQ(t.port, "443");
}

TEST(ConnectDiagnosis, FirstBytesBack) {
  struct Case {
    std::string bytes;
    Wire wire;
  };
  const std::vector<Case> cases = {
      {"", Wire::kNothing},
      {std::string("\x16\x03\x03\x00\x7a\x02", 6), Wire::kTls},      // ServerHello
      {std::string("\x15\x03\x01\x00\x02\x02\x28", 7), Wire::kTls},  // alert
      {std::string("\x16", 1), Wire::kTls},
      // gRPC's SETTINGS frame, then a GOAWAY.
      {std::string("\x00\x00\x24\x04\x00\x00\x00\x00\x00\x00\x03", 11), Wire::kHttp2},
      {std::string("\x00\x00\x08\x07\x00\x00\x00\x00\x00", 9), Wire::kHttp2},
      {"HTTP/1.1 400 Bad Request\r\n", Wire::kHttp1},
      {"SSH-2.0-OpenSSH_9.2\r\n", Wire::kOther},
      {std::string("\x16\x01", 2), Wire::kOther},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::PrintToString(c.bytes));
    EXPECT_EQ(ClassifyFirstBytes(c.bytes), c.wire);
  }
}

}  // namespace
}  // namespace gpuexec::internal
