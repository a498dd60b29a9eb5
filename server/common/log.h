#ifndef GPUEXEC_SERVER_COMMON_LOG_H_
#define GPUEXEC_SERVER_COMMON_LOG_H_

// One line per event on stderr: "2026-11-30T04:36:24.123Z I device 0: ...".
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
// A message longer than this is cut (the line says how much was).
inline constexpr size_t kMaxLogMessageBytes = 16 << 10;
// Writes one line: control characters in `message` are escaped (\xNN), so
// no part of it can pass for a line of its own.
void Write(Level level, absl::string_view message);

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

}  // namespace gpuexec::log

#endif  // GPUEXEC_SERVER_COMMON_LOG_H_
