#ifndef GPUEXEC_SERVER_COMMON_LOG_H_
#define GPUEXEC_SERVER_COMMON_LOG_H_

// One line per event on stderr, in one of two formats (SetFormat):
//   text: 2026-11-30T04:36:24.123Z I device 0: ...
//   json: {"time":"2026-11-30T04:36:24.123Z","level":"info","message":"device 0: ..."}
// A JSON line is one object (RFC 8259) with "time", "level" and "message",
// then the line's structured fields (Fields) that are set; the message
// names them in words either way, so the text format shows nothing more.
// Abseil 20220623 ships no logging library; this is the smallest thing that
// gives levels and whole lines from several threads.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gpuexec::log {

enum class Level { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLevel(Level level);
Level GetLevel();
// Parses "debug", "info", "warning", "error".
bool ParseLevel(absl::string_view text, Level* level);

enum class Format { kText, kJson };
// Set once at start-up (--log_format); text until then.
void SetFormat(Format format);
Format GetFormat();
// Parses "text", "json".
bool ParseFormat(absl::string_view text, Format* format);

// A message longer than this is cut (the line says how much was).
inline constexpr size_t kMaxLogMessageBytes = 16 << 10;
// A field longer than this is cut and ends in "...".
inline constexpr size_t kMaxLogFieldBytes = 256;

// What a line is about, for a reader that filters by key: each one set
// (not empty) is a key of a JSON line, under its own name; the text format
// leaves them out, its message saying the same in words. The views need
// only outlive the call.
struct Fields {
  absl::string_view source;   // who wrote the line, where not the daemon: "grpc"
  absl::string_view method;   // the call or command: "Launch", "command ring memcpy"
  absl::string_view code;     // its status code: "INVALID_ARGUMENT"
  absl::string_view tenant;   // the caller's tenant name
  absl::string_view session;  // session id
  absl::string_view peer;     // the caller's address: "ipv4:10.0.0.7:41174", "unix:uid=..."
  absl::string_view device;   // device ordinal: "0"
  absl::string_view kernel;   // kernel name
};

// Writes one line. Text: control characters in `message` are escaped
// (\xNN), so no part of it can pass for a line of its own. JSON: the
// message and each field are JSON strings, escaped so that the line is
// valid JSON and valid UTF-8 whatever the bytes (log.cc says how).
void WriteWith(Level level, const Fields& fields, absl::string_view message);
inline void Write(Level level, absl::string_view message) { WriteWith(level, Fields(), message); }

// A budget of lines for events a client can cause at will (each failed
// command of a stream, say): at most `per_second` on average and `burst`
// at once; the rest are counted, and the next line let through says how
// many were left out, so that no client can grow the log at its own pace.
class LineBudget {
 public:
  LineBudget(double per_second, double burst);
  // True when a line may be written at `now`; `left_out` is then set to the
  // lines refused since the last one let through.
  bool Take(absl::Time now, uint64_t* left_out);
  // Lines refused in all.
  uint64_t left_out_total() const { return left_out_total_.load(std::memory_order_relaxed); }

 private:
  const double per_second_;
  const double burst_;
  absl::Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);
  absl::Time last_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t left_out_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> left_out_total_{0};
};

// gRPC's own lines, handed over by the log function the server installs
// (gpr_set_log_function, grpc/support/log.h; this layer sees no gRPC, so
// the server passes the fields of gpr_log_func_args). Each becomes one
// line of this log, "grpc: MESSAGE (FILE:LINE)": ERROR as an error, INFO
// as debug, DEBUG dropped unless `operator_verbosity` (GRPC_VERBOSITY set
// by whoever started the daemon: then every line gRPC lets through is
// written, at info). A failed TLS handshake, which any client can cause,
// is one warning instead, by DescribeHandshakeFailure; those lines and
// gRPC's errors share a budget (LineBudget: 5 a second, 20 at once).
// In JSON each of these lines has "source":"grpc", and a handshake line the
// peer where gRPC names it.
enum class GrpcSeverity { kDebug, kInfo, kError };
struct GrpcLine {
  absl::string_view file;  // as gRPC names it; only its last part is kept
  int line = 0;
  GrpcSeverity severity = GrpcSeverity::kInfo;
  absl::string_view message;
};
// `handshake_details_follow`: gRPC logs at DEBUG, so the server's
// "Handshaking failed" line, which can name the peer, follows the TLS
// library's error line; that one is then left out.
void WriteGrpcLine(const GrpcLine& line, bool handshake_details_follow, bool operator_verbosity);

struct HandshakeFailure {
  bool is_handshake_line = false;  // a line about a failed handshake
  std::string line;                // what to write; empty: nothing
  std::string peer;                // "127.0.0.1:41174" where gRPC names it; else empty
};
// A gRPC 1.51 line about a failed TLS handshake, in words: "TLS handshake
// with client 10.0.0.7:41174 failed: the client sent no certificate, and
// --tls_client_ca requires one (...)". gRPC names the peer only when the
// socket failed (the client closed it, say); for an error of the TLS
// library it does not, and the line says so rather than guess.
HandshakeFailure DescribeHandshakeFailure(absl::string_view file, absl::string_view message,
                                          bool handshake_details_follow);

template <typename... Args>
void Debug(const Args&... args) {
  if (GetLevel() <= Level::kDebug) Write(Level::kDebug, absl::StrCat(args...));
}
template <typename... Args>
void Info(const Args&... args) {
  if (GetLevel() <= Level::kInfo) Write(Level::kInfo, absl::StrCat(args...));
}
template <typename... Args>
void Warning(const Args&... args) {
  if (GetLevel() <= Level::kWarning) Write(Level::kWarning, absl::StrCat(args...));
}
template <typename... Args>
void Error(const Args&... args) {
  Write(Level::kError, absl::StrCat(args...));
}
// The same with structured fields: log::InfoWith({.tenant = t}, "...").
template <typename... Args>
void DebugWith(const Fields& fields, const Args&... args) {
  if (GetLevel() <= Level::kDebug) WriteWith(Level::kDebug, fields, absl::StrCat(args...));
}
template <typename... Args>
void InfoWith(const Fields& fields, const Args&... args) {
  if (GetLevel() <= Level::kInfo) WriteWith(Level::kInfo, fields, absl::StrCat(args...));
}
template <typename... Args>
void WarningWith(const Fields& fields, const Args&... args) {
  if (GetLevel() <= Level::kWarning) WriteWith(Level::kWarning, fields, absl::StrCat(args...));
}
template <typename... Args>
void ErrorWith(const Fields& fields, const Args&... args) {
  WriteWith(Level::kError, fields, absl::StrCat(args...));
}

}  // namespace gpuexec::log

#endif  // GPUEXEC_SERVER_COMMON_LOG_H_
