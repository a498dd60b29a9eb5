#include "server/common/log.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

void Write(Level level, absl::string_view message) {
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
  // One fwrite per line keeps lines whole across threads.
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace gpuexec::log
