#include "server/common/log.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <initializer_list>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gpuexec::log {
namespace {
std::atomic<int> g_level{static_cast<int>(Level::kInfo)};
}  // namespace

void SetLevel(Level level) { g_level.store(static_cast<int>(level)); }
Level GetLevel() { return static_cast<Level>(g_level.load(std::memory_order_relaxed)); }

bool ParseLevel(absl::string_view text, Level* level) {
  if (text == "debug")
    *level = Level::kDebug;
  else if (text == "info")
    *level = Level::kInfo;
  else if (text == "warning" || text == "warn")
    *level = Level::kWarning;
  else if (text == "error")
    *level = Level::kError;
  else
    return false;
  return true;
}

LineBudget::LineBudget(double per_second, double burst)
    : per_second_(per_second), burst_(burst), tokens_(burst) {}

bool LineBudget::Take(absl::Time now, uint64_t* left_out) {
  absl::MutexLock lock(&mu_);
  if (last_ != absl::InfinitePast() && now > last_) {
    tokens_ = std::min(burst_, tokens_ + absl::ToDoubleSeconds(now - last_) * per_second_);
  }
  if (now > last_ || last_ == absl::InfinitePast()) last_ = now;
  if (tokens_ < 1) {
    ++left_out_;
    left_out_total_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  tokens_ -= 1;
  *left_out = left_out_;
  left_out_ = 0;
  return true;
}

namespace {

std::atomic<int> g_format{static_cast<int>(Format::kText)};

// The length of the valid UTF-8 sequence at the start of `s` (RFC 3629:
// no overlong forms, no surrogates, nothing past U+10FFFF), or 0.
size_t Utf8Length(absl::string_view s) {
  const auto at = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const auto tail = [&](size_t i) { return i < s.size() && (at(i) & 0xc0) == 0x80; };
  const unsigned char b = at(0);
  if (b < 0x80) return 1;
  if (b < 0xc2) return 0;  // a continuation byte, or the start of an overlong form
  if (b < 0xe0) return tail(1) ? 2 : 0;
  if (b < 0xf0) {
    if (s.size() < 2) return 0;
    const unsigned char lo = b == 0xe0 ? 0xa0 : 0x80;  // overlong
    const unsigned char hi = b == 0xed ? 0x9f : 0xbf;  // surrogates
    return at(1) >= lo && at(1) <= hi && tail(2) ? 3 : 0;
  }
  if (b < 0xf5) {
    if (s.size() < 2) return 0;
    const unsigned char lo = b == 0xf0 ? 0x90 : 0x80;  // overlong
    const unsigned char hi = b == 0xf4 ? 0x8f : 0xbf;  // past U+10FFFF
    return at(1) >= lo && at(1) <= hi && tail(2) && tail(3) ? 4 : 0;
  }
  return 0;
}

// `s` as the inside of a JSON string (RFC 8259 section 7): quote and
// backslash escaped, control characters and DEL as \u00XX (\n and the like
// included: one spelling is easier to search for), valid UTF-8 kept as it
// is. A byte that does not start a valid UTF-8 sequence becomes U+FFFD
// (\ufffd), one for each such byte: the line stays valid JSON for any
// reader, at the cost of the byte's value, which the text format keeps.
void AppendJsonString(std::string* out, absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char u = static_cast<unsigned char>(s[i]);
    if (u == '"' || u == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(u));
      ++i;
    } else if (u < 0x20 || u == 0x7f) {
      absl::StrAppendFormat(out, "\\u%04x", u);
      ++i;
    } else if (const size_t n = Utf8Length(s.substr(i)); n == 0) {
      out->append("\\ufffd");
      ++i;
    } else {
      out->append(s.data() + i, n);
      i += n;
    }
  }
}

void AppendJsonField(std::string* out, absl::string_view key, absl::string_view value) {
  if (value.empty()) return;
  absl::StrAppend(out, ",\"", key, "\":\"");
  // A sequence cut in two becomes U+FFFD, as any broken one does.
  AppendJsonString(out, value.substr(0, kMaxLogFieldBytes));
  if (value.size() > kMaxLogFieldBytes) out->append("...");
  out->push_back('"');
}

std::string TextLine(Level level, absl::string_view message) {
  static constexpr char kLetters[] = {'D', 'I', 'W', 'E'};
  std::string line = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  line.push_back(' ');
  line.push_back(kLetters[static_cast<int>(level)]);
  line.push_back(' ');
  // One event, one line: a control character in the message (client input
  // quoted carelessly, say) is escaped rather than allowed to start a line
  // of its own, and a message is cut at kMaxLogMessageBytes.
  const absl::string_view kept = message.substr(0, kMaxLogMessageBytes);
  for (const char c : kept) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      absl::StrAppendFormat(&line, "\\x%02x", u);
    } else {
      line.push_back(c);
    }
  }
  if (message.size() > kept.size()) {
    absl::StrAppend(&line, "... (", message.size() - kept.size(), " bytes more)");
  }
  line.push_back('\n');
  return line;
}

// The keys in a fixed order, time first, so that lines sort and diff alike.
std::string JsonLine(Level level, const Fields& f, absl::string_view message) {
  static constexpr const char* kNames[] = {"debug", "info", "warning", "error"};
  std::string line = absl::StrCat(
      "{\"time\":\"", absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
      "\",\"level\":\"", kNames[static_cast<int>(level)], "\",\"message\":\"");
  // The same cut and note as the text format's, inside the string.
  const absl::string_view kept = message.substr(0, kMaxLogMessageBytes);
  AppendJsonString(&line, kept);
  if (message.size() > kept.size()) {
    absl::StrAppend(&line, "... (", message.size() - kept.size(), " bytes more)");
  }
  line.push_back('"');
  AppendJsonField(&line, "source", f.source);
  AppendJsonField(&line, "method", f.method);
  AppendJsonField(&line, "code", f.code);
  AppendJsonField(&line, "tenant", f.tenant);
  AppendJsonField(&line, "session", f.session);
  AppendJsonField(&line, "peer", f.peer);
  AppendJsonField(&line, "device", f.device);
  AppendJsonField(&line, "kernel", f.kernel);
  line.append("}\n");
  return line;
}

}  // namespace

void SetFormat(Format format) { g_format.store(static_cast<int>(format)); }
Format GetFormat() { return static_cast<Format>(g_format.load(std::memory_order_relaxed)); }

bool ParseFormat(absl::string_view text, Format* format) {
  if (text == "text")
    *format = Format::kText;
  else if (text == "json")
    *format = Format::kJson;
  else
    return false;
  return true;
}

void WriteWith(Level level, const Fields& fields, absl::string_view message) {
  const std::string line =
      GetFormat() == Format::kJson ? JsonLine(level, fields, message) : TextLine(level, message);
  // One fwrite per line keeps lines whole across threads.
  std::fwrite(line.data(), 1, line.size(), stderr);
}

namespace {

absl::string_view Basename(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == absl::string_view::npos ? path : path.substr(slash + 1);
}

bool HasAny(absl::string_view text, std::initializer_list<absl::string_view> needles) {
  for (absl::string_view n : needles) {
    if (absl::StrContains(text, n)) return true;
  }
  return false;
}

// The peer of a socket error: `target_address:"ipv4:10.0.0.7:41174"`.
std::string PeerOf(absl::string_view error) {
  constexpr absl::string_view kKey = "target_address:\"";
  const size_t at = error.find(kKey);
  if (at == absl::string_view::npos) return "";
  absl::string_view peer = error.substr(at + kKey.size());
  peer = peer.substr(0, peer.find('"'));
  if (!absl::ConsumePrefix(&peer, "ipv4:")) absl::ConsumePrefix(&peer, "ipv6:");
  return std::string(peer.substr(0, 96));
}

// The TLS library's reason: "... SSL routines::wrong version number {...}".
std::string ReasonOf(absl::string_view error) {
  if (const size_t at = error.find("routines::"); at != absl::string_view::npos) {
    error = error.substr(at + 10);
  }
  error = error.substr(0, error.find(" {"));
  if (absl::EndsWith(error, ".")) error.remove_suffix(1);
  return std::string(error.substr(0, 200));
}

std::string CauseOf(absl::string_view error) {
  if (HasAny(error, {"wrong version number", "http request", "packet length too long",
                     "unknown protocol", "record layer failure"})) {
    return "the client spoke plain text, not TLS: it needs the CA that signed --tls_cert "
           "(gpuexec --tls_ca)";
  }
  if (HasAny(error, {"peer did not return a certificate", "certificate required"})) {
    return "the client sent no certificate, and --tls_client_ca requires one (gpuexec "
           "--tls_cert, --tls_key)";
  }
  if (HasAny(error, {"certificate verify failed"})) {
    return "the client's certificate is not signed by the CA of --tls_client_ca, or has expired";
  }
  if (HasAny(error, {"alert unknown ca", "alert bad certificate", "alert certificate unknown"})) {
    return "the client does not trust the daemon's certificate: its --tls_ca must be the CA "
           "that signed --tls_cert";
  }
  if (HasAny(error, {"Handshake read failed", "Socket closed", "Connection reset"})) {
    return "the client closed the connection during the handshake (most often it does not "
           "trust the daemon's certificate: its --tls_ca must be the CA that signed --tls_cert)";
  }
  if (HasAny(error, {"no shared cipher", "unsupported protocol", "no protocols available",
                     "version too low"})) {
    return "the client offers no TLS version or cipher this daemon takes (TLS 1.2 or 1.3)";
  }
  if (HasAny(error, {"Timeout", "timed out", "Deadline Exceeded"})) {
    return "the client did not finish the handshake in time";
  }
  return absl::StrCat("the TLS handshake failed: ", ReasonOf(error));
}

// Two budgets: failed handshakes come from anyone who reaches the port, with
// no credentials, and must not use up the lines of gRPC's own errors.
LineBudget& HandshakeBudget() {
  static LineBudget* budget = new LineBudget(5, 20);  // never destroyed: gRPC logs at exit
  return *budget;
}
LineBudget& GrpcBudget() {
  static LineBudget* budget = new LineBudget(5, 20);  // never destroyed: gRPC logs at exit
  return *budget;
}

std::string LeftOut(uint64_t n) {
  return n == 0 ? "" : absl::StrCat(" (", n, " such line(s) left out before this one)");
}

}  // namespace

HandshakeFailure DescribeHandshakeFailure(absl::string_view file, absl::string_view message,
                                          bool handshake_details_follow) {
  file = Basename(file);
  HandshakeFailure out;
  absl::string_view error;
  if (file == "chttp2_server.cc" && absl::ConsumePrefix(&message, "Handshaking failed: ")) {
    error = message;
  } else if (file == "ssl_transport_security.cc" &&
             absl::StartsWith(message, "Handshake failed with fatal error")) {
    out.is_handshake_line = true;
    if (handshake_details_follow) return out;  // the server's line says it with more
    error = message;
  } else if (file == "security_handshaker.cc" &&
             absl::StartsWith(message, "Security handshake failed")) {
    out.is_handshake_line = true;  // the server's line says the same
    return out;
  } else {
    return out;
  }
  out.is_handshake_line = true;
  // The daemon stopping ends handshakes under way: nobody's mistake.
  if (HasAny(error, {"Shutdown", "shutdown", "Listener stopped"})) return out;
  out.peer = PeerOf(error);
  out.line = absl::StrCat("TLS handshake with ",
                          out.peer.empty() ? std::string("a client (gRPC does not name its peer)")
                                           : absl::StrCat("client ", out.peer),
                          " failed: ", CauseOf(error));
  return out;
}

void WriteGrpcLine(const GrpcLine& g, bool handshake_details_follow, bool operator_verbosity) {
  const absl::string_view file = Basename(g.file);
  const HandshakeFailure h = DescribeHandshakeFailure(file, g.message, handshake_details_follow);
  uint64_t left_out = 0;
  if (h.is_handshake_line) {
    if (!h.line.empty() && GetLevel() <= Level::kWarning &&
        HandshakeBudget().Take(absl::Now(), &left_out)) {
      Fields fields;
      fields.source = "grpc";
      fields.peer = h.peer;
      WriteWith(Level::kWarning, fields, absl::StrCat(h.line, LeftOut(left_out)));
    }
    return;
  }
  Level level = Level::kDebug;
  if (g.severity == GrpcSeverity::kError) {
    level = Level::kError;
  } else if (operator_verbosity) {
    level = Level::kInfo;
  } else if (g.severity == GrpcSeverity::kDebug) {
    return;
  }
  if (GetLevel() > level) return;
  if (level == Level::kError && !GrpcBudget().Take(absl::Now(), &left_out)) return;
  Fields fields;
  fields.source = "grpc";
  WriteWith(level, fields,
            absl::StrCat("grpc: ", g.message, " (", file, ":", g.line, ")", LeftOut(left_out)));
}

}  // namespace gpuexec::log
