#ifndef GPUEXEC_CLIENT_CPP_INTERNAL_CONNECT_DIAGNOSIS_H_
#define GPUEXEC_CLIENT_CPP_INTERNAL_CONNECT_DIAGNOSIS_H_

// Why a connect failed, in one line that says what to do. Pure: the facts
// are gathered by connect.cc (a raw probe of the target, and gRPC's own
// log lines captured during the connect); this file only reads them, so
// that each case is a row of a table test (tests/unit/connect_diagnosis_test.cc).
//
// gRPC 1.51 tells a client little: a refused connect and a failed TLS
// handshake both leave the channel in TRANSIENT_FAILURE. What it does say
// comes as log lines: "Handshake failed with fatal error SSL_ERROR_SSL:
// ...certificate verify failed" (ssl_transport_security.cc, ERROR), and
// "connect failed (...Connection refused...)" or "(...Secure read
// failed...Socket closed...)" (subchannel.cc, INFO). A daemon that speaks
// TLS closes a plain-text client's connection without a byte, where a
// plain-text gRPC server sends its SETTINGS frame first: the probe's answer
// to an HTTP/2 preface (connect_internal.h) tells that case apart.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace gpuexec::internal {

// What the first bytes a daemon sent back to a probe say it speaks.
enum class Wire {
  kNotProbed,
  kNothing,  // closed, or silent, without a byte
  kTls,      // a TLS record (a ServerHello or an alert)
  kHttp2,    // an HTTP/2 frame: a plain-text gRPC server
  kHttp1,    // "HTTP/1.x ...": not a gRPC server (a metrics port?)
  kOther,
};
Wire ClassifyFirstBytes(absl::string_view bytes);

// A target as the probe reaches it: "host:port", "[v6]:port" (dns:///,
// ipv4:, ipv6: prefixes allowed; a list: its first), "unix:PATH",
// "unix-abstract:NAME". False if it is none of these.
struct TargetAddress {
  bool unix_socket = false;
  bool abstract = false;
  std::string path;  // unix
  std::string host;
  std::string port;  // 443 when the target names none, as gRPC's default
};
bool ParseTargetAddress(absl::string_view target, TargetAddress* out);

// Whether a gRPC line is a subchannel's "connect failed" line about
// `target`: its address has the target's port, and its host when the
// target names an IP address (a name may resolve to any). gRPC's other
// connect lines (the TLS library's) name no address: with several Connect
// calls at once they cannot be told apart, and the subchannel's line says
// the same (its status carries the TLS library's reason).
bool LineIsAbout(absl::string_view line, const TargetAddress& target);

// What a client saw of one failed connect.
struct ConnectFacts {
  std::string target;
  bool loopback = false;  // IsLoopbackAddress(target): this host
  bool unix_socket = false;
  // How the client connected.
  bool tls = false;
  std::string tls_root_ca_file;  // empty with tls: the system's roots
  std::string tls_cert_file;     // empty: no client certificate
  // A raw connect() to the target: refused (or no socket file), and the
  // cause in words when it failed otherwise ("No route to host").
  bool refused = false;
  bool no_socket_file = false;
  std::string raw_error;
  Wire probe = Wire::kNotProbed;
  // gRPC's lines about this target during the connect (LineIsAbout), each
  // "FILE: MESSAGE".
  std::vector<std::string> grpc_lines;
  // Whether the whole connect_timeout passed, and what it was.
  bool deadline_passed = false;
  absl::Duration timeout;
};

enum class ConnectFailure {
  kUnknown,  // nothing says why: the deadline is what failed
  kRefused,
  kWrongCa,
  kWrongName,
  kPlainToTls,
  kTlsToPlain,
  kNeedsClientCertificate,
  kClientCertificateRefused,
  kNotGrpc,
};

struct Diagnosis {
  ConnectFailure failure = ConnectFailure::kUnknown;
  absl::Status status;  // not OK
};

Diagnosis DiagnoseConnectFailure(const ConnectFacts& facts);

// `text` cut to `max` bytes and made printable (for a target or a line of
// gRPC's that goes into a message).
std::string Printable(absl::string_view text, size_t max = 256);

}  // namespace gpuexec::internal

#endif  // GPUEXEC_CLIENT_CPP_INTERNAL_CONNECT_DIAGNOSIS_H_
