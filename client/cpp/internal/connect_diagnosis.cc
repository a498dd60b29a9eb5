#include "internal/connect_diagnosis.h"

#include <arpa/inet.h>

#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"

namespace gpuexec::internal {
namespace {

constexpr absl::string_view kTargetHint = "(--target, $GPUEXEC_TARGET)";

bool AnyLineHas(const ConnectFacts& f, absl::string_view needle) {
  for (const std::string& line : f.grpc_lines) {
    if (absl::StrContains(line, needle)) return true;
  }
  return false;
}

// The cause of the last failed attempt in gRPC's words, from a subchannel
// line "... connect failed (UNKNOWN:Failed to connect to remote host:
// Connection timed out {...}), backing off ...": "Failed to connect to
// remote host: Connection timed out".
std::string LastAttempt(const ConnectFacts& f) {
  for (auto it = f.grpc_lines.rbegin(); it != f.grpc_lines.rend(); ++it) {
    const size_t at = it->find("connect failed (");
    if (at == std::string::npos) continue;
    absl::string_view cause = absl::string_view(*it).substr(at + 16);
    if (const size_t colon = cause.find(':'); colon != absl::string_view::npos && colon < 24) {
      cause.remove_prefix(colon + 1);  // the status code's name
    }
    cause = cause.substr(0, cause.find(" {"));
    if (absl::EndsWith(cause, ")")) cause.remove_suffix(1);
    // The innermost child says more than "Endpoint read failed".
    if (absl::StrContains(*it, "Socket closed")) return "the daemon closed the connection";
    return Printable(cause, 160);
  }
  return "";
}

std::string How(const ConnectFacts& f) {
  if (!f.tls) return "plain text";
  return absl::StrCat(
      "TLS, ",
      f.tls_root_ca_file.empty() ? std::string("the system's CAs")
                                 : absl::StrCat("the CA in ", Printable(f.tls_root_ca_file)),
      f.tls_cert_file.empty() ? ""
                              : absl::StrCat(", client certificate ", Printable(f.tls_cert_file)));
}

Diagnosis Make(const ConnectFacts& f, ConnectFailure failure, absl::string_view what) {
  return Diagnosis{failure, absl::UnavailableError(absl::StrCat("cannot connect to ",
                                                                Printable(f.target), ": ", what))};
}

// Every attempt that failed was refused (the lines say no other cause).
bool EveryAttemptRefused(const ConnectFacts& f) {
  bool any = false;
  for (const std::string& line : f.grpc_lines) {
    if (!absl::StrContains(line, "connect failed (")) continue;
    if (!absl::StrContains(line, "Connection refused")) return false;
    any = true;
  }
  return any;
}

// "10.0.0.7" and "::1" as bytes, so that "::1" and "0:0::1" compare equal.
std::string AddressBytes(const std::string& host) {
  in6_addr v6;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1)
    return std::string(reinterpret_cast<char*>(&v4), 4);
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    return std::string(reinterpret_cast<char*>(&v6), 16);
  }
  return "";
}

}  // namespace

bool ParseTargetAddress(absl::string_view t, TargetAddress* out) {
  if (absl::ConsumePrefix(&t, "unix-abstract:")) {
    out->unix_socket = out->abstract = true;
    out->path = std::string(t);
    return !t.empty();
  }
  if (absl::ConsumePrefix(&t, "unix:")) {
    // "unix:///abs" and "unix:/abs" name the same path.
    if (absl::StartsWith(t, "//")) t.remove_prefix(2);
    out->unix_socket = true;
    out->path = std::string(t);
    return !t.empty();
  }
  absl::ConsumePrefix(&t, "dns:///") || absl::ConsumePrefix(&t, "dns:") ||
      absl::ConsumePrefix(&t, "ipv4:") || absl::ConsumePrefix(&t, "ipv6:");
  t = t.substr(0, t.find(','));  // a list: its first
  if (absl::ConsumePrefix(&t, "[")) {
    const size_t close = t.find(']');
    if (close == absl::string_view::npos) return false;
    out->host = std::string(t.substr(0, close));
    t.remove_prefix(close + 1);
    out->port = absl::ConsumePrefix(&t, ":") ? std::string(t) : "443";
  } else {
    const size_t colon = t.rfind(':');
    out->host = std::string(t.substr(0, colon));
    out->port = colon == absl::string_view::npos ? "443" : std::string(t.substr(colon + 1));
  }
  return !out->host.empty() && !out->port.empty();
}

bool LineIsAbout(absl::string_view line, const TargetAddress& target) {
  if (!absl::StrContains(line, "connect failed (")) return false;
  const size_t at = line.find("{address=");
  if (at == absl::string_view::npos) return false;
  absl::string_view a = line.substr(at + 9);
  a = a.substr(0, a.find_first_of(", }"));
  if (target.unix_socket) return !target.path.empty() && absl::StrContains(a, target.path);
  const std::string address = absl::StrReplaceAll(a, {{"%5B", "["}, {"%5D", "]"}});
  TargetAddress seen;
  if (!ParseTargetAddress(address, &seen) || seen.unix_socket || seen.port != target.port) {
    return false;
  }
  const std::string want = AddressBytes(target.host);
  return want.empty() || want == AddressBytes(seen.host);  // a name: any address
}

std::string Printable(absl::string_view text, size_t max) {
  std::string out;
  for (const char c : text.substr(0, max)) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) {  // controls, and bytes of C1 controls or bidi marks
      absl::StrAppendFormat(&out, "\\x%02x", u);
    } else {
      out.push_back(c);
    }
  }
  if (text.size() > max) absl::StrAppend(&out, "...");
  return out;
}

Wire ClassifyFirstBytes(absl::string_view b) {
  if (b.empty()) return Wire::kNothing;
  const auto byte = [&b](size_t i) { return static_cast<uint8_t>(b[i]); };
  // A TLS record: content type handshake (22) or alert (21), version 3.x.
  if ((byte(0) == 0x16 || byte(0) == 0x15) && (b.size() < 2 || byte(1) == 0x03)) {
    return Wire::kTls;
  }
  if (absl::StartsWith(b, "HTTP/1.")) return Wire::kHttp1;
  // An HTTP/2 frame header: 24-bit length, type, flags, stream 0. A gRPC
  // server's first frame is SETTINGS (4), or GOAWAY (7) once it has read
  // what was not a preface.
  if (b.size() >= 9 && (byte(3) == 0x04 || byte(3) == 0x07) && byte(5) == 0 && byte(6) == 0 &&
      byte(7) == 0 && byte(8) == 0) {
    return Wire::kHttp2;
  }
  return Wire::kOther;
}

Diagnosis DiagnoseConnectFailure(const ConnectFacts& f) {
  if (f.no_socket_file) {
    return Make(f, ConnectFailure::kRefused,
                absl::StrCat("no socket there: is gpuexecd running? ", kTargetHint));
  }
  if (f.refused || (f.loopback && EveryAttemptRefused(f))) {
    return Make(f, ConnectFailure::kRefused,
                f.loopback ? absl::StrCat("connection refused: is gpuexecd running? ", kTargetHint)
                           : absl::StrCat("connection refused: is gpuexecd running there, on that "
                                          "port? ",
                                          kTargetHint));
  }
  if (f.tls) {
    // The client's own verdict on the daemon's certificate.
    if (AnyLineHas(f, "certificate verify failed")) {
      return Make(
          f, ConnectFailure::kWrongCa,
          f.tls_root_ca_file.empty()
              ? "the daemon's certificate is not signed by a CA this system trusts (or has "
                "expired): give --tls_ca (or $GPUEXEC_TLS_CA), the CA that signed the daemon's "
                "--tls_cert"
              : absl::StrCat("the daemon's certificate is not signed by the CA in ",
                             Printable(f.tls_root_ca_file),
                             " (or has expired): give --tls_ca (or $GPUEXEC_TLS_CA), the CA that "
                             "signed the daemon's --tls_cert"));
    }
    if (AnyLineHas(f, "is not in peer certificate")) {
      return Make(f, ConnectFailure::kWrongName,
                  "the daemon's certificate does not carry the name connected to: connect by a "
                  "name it carries, or give --tls_server_name");
    }
    if (f.probe == Wire::kHttp2 || AnyLineHas(f, "wrong version number") ||
        AnyLineHas(f, "packet length too long") || AnyLineHas(f, "record layer failure")) {
      return Make(f, ConnectFailure::kTlsToPlain,
                  "the client speaks TLS and the daemon plain text: connect without --tls_ca, "
                  "--tls_cert, --tls_key (and $GPUEXEC_TLS_*), or start gpuexecd with "
                  "--tls_cert and --tls_key");
    }
    // The handshake ended well for the client, then the daemon closed the
    // connection, or its alert named the certificate: TLS 1.3 asks for the
    // client's certificate after the client thinks it is done.
    const bool certificate_alert =
        AnyLineHas(f, "alert certificate required") || AnyLineHas(f, "alert bad certificate") ||
        AnyLineHas(f, "alert unknown ca") || AnyLineHas(f, "alert certificate expired");
    if (certificate_alert || AnyLineHas(f, "Secure read failed")) {
      if (f.tls_cert_file.empty()) {
        return Make(f, ConnectFailure::kNeedsClientCertificate,
                    "the daemon wants a client certificate (mutual TLS): give --tls_cert and "
                    "--tls_key (or $GPUEXEC_TLS_CERT, $GPUEXEC_TLS_KEY), signed by the CA of "
                    "the daemon's --tls_client_ca");
      }
      return Make(
          f, ConnectFailure::kClientCertificateRefused,
          absl::StrCat("the daemon refused the client certificate ", Printable(f.tls_cert_file),
                       ": it must be signed by the CA of the daemon's --tls_client_ca, "
                       "and not expired"));
    }
  } else if (f.probe == Wire::kTls ||
             (f.probe == Wire::kNothing && AnyLineHas(f, "Socket closed"))) {
    // A TLS daemon closes a plain-text connection without a byte; a gRPC
    // server would have sent its SETTINGS first.
    return Make(f, ConnectFailure::kPlainToTls,
                "the daemon speaks TLS and the client plain text: give --tls_ca (or "
                "$GPUEXEC_TLS_CA), the CA that signed the daemon's certificate");
  }
  if (f.probe == Wire::kHttp1) {
    return Make(f, ConnectFailure::kNotGrpc,
                absl::StrCat("what answers there speaks HTTP/1, not gRPC: is that a metrics port "
                             "(--metrics_listen) rather than gpuexecd's? ",
                             kTargetHint));
  }
  std::string last = LastAttempt(f);
  if (last.empty()) {
    // No line of gRPC's (an application that set GRPC_VERBOSITY keeps them
    // from the library): what the probe found.
    switch (f.probe) {
      case Wire::kTls:
        last = "a TLS server answers there, and the handshake did not complete";
        break;
      case Wire::kHttp2:
        last = "a plain-text gRPC server answers there";
        break;
      case Wire::kNothing:
        last = "the connection was accepted, then closed without a byte";
        break;
      default:
        last = f.raw_error.empty() ? "no answer" : Printable(f.raw_error, 160);
    }
  }
  return Make(f, ConnectFailure::kUnknown,
              absl::StrCat(f.deadline_passed ? absl::StrCat("no connection within ",
                                                            absl::FormatDuration(f.timeout))
                                             : std::string("no connection"),
                           " (", How(f), "; last attempt: ", last,
                           "): is gpuexecd running there, and reachable from here? ", kTargetHint));
}

}  // namespace gpuexec::internal
