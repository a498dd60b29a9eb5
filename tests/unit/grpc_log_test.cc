// gRPC's own lines in the daemon's log (server/common/log.h): each failed
// TLS handshake, as gRPC 1.51 logs it, becomes one line with the peer where
// gRPC names it and the cause in words; the other lines keep their level or
// are dropped; a client cannot grow the log at its own pace.
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/common/log.h"

namespace gpuexec::log {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// As gRPC 1.51 logs them on a daemon with --tls_cert (and --tls_client_ca).
constexpr char kServer[] = "./src/core/ext/transport/chttp2/server/chttp2_server.cc";
constexpr char kTsi[] = "./src/core/tsi/ssl_transport_security.cc";
constexpr char kClosed[] =
    "Handshaking failed: UNKNOWN:Handshake read failed {created_time:\"2026-12-03T16:58:48\", "
    "file_line:487, file:\"./src/core/lib/security/transport/security_handshaker.cc\", "
    "children:[INTERNAL:Socket closed {fd:15, grpc_status:14, "
    "target_address:\"ipv4:127.0.0.1:41174\"}]}";
constexpr char kPlain[] =
    "Handshaking failed: UNKNOWN:Tls handshake failed: SSL_ERROR_SSL: error:0A00010B:SSL "
    "routines::wrong version number {file:\"x\", file_line:393, tsi_code:10}";
constexpr char kNoCert[] =
    "Handshaking failed: UNKNOWN:Tls handshake failed: SSL_ERROR_SSL: error:0A0000C7:SSL "
    "routines::peer did not return a certificate {tsi_code:10}";
constexpr char kBadCert[] =
    "Handshaking failed: UNKNOWN:Tls handshake failed: SSL_ERROR_SSL: error:0A000086:SSL "
    "routines::certificate verify failed {tsi_code:10}";
constexpr char kOdd[] =
    "Handshaking failed: UNKNOWN:Tls handshake failed: SSL_ERROR_SSL: error:0A0000FF:SSL "
    "routines::something new {tsi_code:10}";
constexpr char kV6[] =
    "Handshaking failed: UNKNOWN:Handshake read failed {children:[INTERNAL:Connection reset "
    "{target_address:\"ipv6:[::1]:50123\"}]}";

TEST(GrpcLog, EachHandshakeFailureIsOneLineWithItsCause) {
  struct Row {
    const char* file;
    const char* message;
    bool details_follow;
    std::vector<std::string> says;  // empty: a handshake line that writes nothing
  };
  const std::vector<Row> rows = {
      {kServer,
       kClosed,
       true,
       {"TLS handshake with client 127.0.0.1:41174 failed: the client closed the connection",
        "its --tls_ca must be the CA that signed --tls_cert"}},
      {kServer, kV6, true, {"TLS handshake with client [::1]:50123 failed: the client closed"}},
      {kServer,
       kPlain,
       true,
       {"TLS handshake with a client (gRPC does not name its peer) failed",
        "the client spoke plain text, not TLS", "gpuexec --tls_ca"}},
      {kServer,
       kNoCert,
       true,
       {"the client sent no certificate, and --tls_client_ca requires one",
        "gpuexec --tls_cert, --tls_key"}},
      {kServer,
       kBadCert,
       true,
       {"the client's certificate is not signed by the CA of --tls_client_ca"}},
      {kServer, kOdd, true, {"the TLS handshake failed: something new"}},
      // The TLS library's own line: left out when the server's follows...
      {kTsi,
       "Handshake failed with fatal error SSL_ERROR_SSL: error:0A00010B:SSL routines::wrong "
       "version number.",
       true,
       {}},
      // ...and the line when it does not (GRPC_VERBOSITY=ERROR).
      {kTsi,
       "Handshake failed with fatal error SSL_ERROR_SSL: error:0A00010B:SSL routines::wrong "
       "version number.",
       false,
       {"TLS handshake with a client (gRPC does not name its peer) failed: the client spoke "
        "plain text"}},
      {"./src/core/lib/security/transport/security_handshaker.cc",
       "Security handshake failed: UNKNOWN:Tls handshake failed: ...",
       true,
       {}},
      // The daemon stopping is nobody's mistake.
      {kServer, "Handshaking failed: UNKNOWN:Shutdown {}", true, {}},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.message);
    const HandshakeFailure h = DescribeHandshakeFailure(row.file, row.message, row.details_follow);
    EXPECT_TRUE(h.is_handshake_line);
    if (row.says.empty()) {
      EXPECT_EQ(h.line, "");
      continue;
    }
    for (const std::string& s : row.says) EXPECT_THAT(h.line, HasSubstr(s));
    EXPECT_THAT(h.line, Not(HasSubstr("SSL_ERROR_SSL")));
    EXPECT_THAT(h.line, Not(HasSubstr("{")));
  }
}

TEST(GrpcLog, OtherLinesAreNotHandshakes) {
  EXPECT_FALSE(
      DescribeHandshakeFailure("./src/core/lib/surface/server.cc", "Handshaking failed: x", true)
          .is_handshake_line);
  EXPECT_FALSE(DescribeHandshakeFailure(kServer, "Listener started", true).is_handshake_line);
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

TEST(GrpcLog, LevelsAndTheBudget) {
  SetLevel(Level::kInfo);
  GrpcLine debug{"./src/core/lib/config.cc", 113, GrpcSeverity::kDebug, "gRPC EXPERIMENT x"};
  GrpcLine info{"./src/cpp/server/server_builder.cc", 347, GrpcSeverity::kInfo, "Synchronous"};
  GrpcLine error{"./src/core/lib/x.cc", 9, GrpcSeverity::kError, "something broke\nE1203 fake"};
  ::testing::internal::CaptureStderr();
  WriteGrpcLine(debug, true, false);
  WriteGrpcLine(info, true, false);  // debug at info: dropped
  WriteGrpcLine(error, true, false);
  std::vector<std::string> lines = Lines(::testing::internal::GetCapturedStderr());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr(" E grpc: something broke\\x0aE1203 fake (x.cc:9)"));

  // The operator's GRPC_VERBOSITY: what gRPC lets through is written.
  ::testing::internal::CaptureStderr();
  WriteGrpcLine(debug, true, true);
  lines = Lines(::testing::internal::GetCapturedStderr());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr(" I grpc: gRPC EXPERIMENT x (config.cc:113)"));

  // A client failing handshakes as fast as it can: a burst, then a few a
  // second, and the next line says how many were left out.
  GrpcLine handshake{kServer, 448, GrpcSeverity::kDebug, kClosed};
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 200; ++i) WriteGrpcLine(handshake, true, false);
  lines = Lines(::testing::internal::GetCapturedStderr());
  EXPECT_GE(lines.size(), 15u);
  EXPECT_LE(lines.size(), 25u);  // 20 at once, a few more
  for (const std::string& line : lines) {
    EXPECT_THAT(line, HasSubstr(" W TLS handshake with client 127.0.0.1:41174 failed"));
  }
  // Anyone who reaches the port can fail handshakes: that flood has a budget
  // of its own, and gRPC's own errors are still written after it.
  ::testing::internal::CaptureStderr();
  WriteGrpcLine(error, true, false);
  lines = Lines(::testing::internal::GetCapturedStderr());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr(" E grpc: something broke"));
}

}  // namespace
}  // namespace gpuexec::log
