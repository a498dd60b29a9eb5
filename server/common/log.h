#ifndef GPUEXEC_SERVER_COMMON_LOG_H_
#define GPUEXEC_SERVER_COMMON_LOG_H_

// One line per event on stderr: "2026-11-30T04:36:24.123Z I device 0: ...".
// Abseil 20220623 ships no logging library; this is the smallest thing that
// gives levels and whole lines from several threads.

#include <atomic>
#include <cstddef>
#include <cstdint>

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
