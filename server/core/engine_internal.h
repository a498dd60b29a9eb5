#ifndef GPUEXEC_SERVER_CORE_ENGINE_INTERNAL_H_
#define GPUEXEC_SERVER_CORE_ENGINE_INTERNAL_H_

// Helpers the engine's files share (engine*.cc); not for other users.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/core/engine.h"

namespace gpuexec::core::internal {

// A token as messages quote it: at most its first 8 characters, and only
// when they are hex (a token is the client's input).
inline std::string ShortToken(const std::string& token) {
  std::string out = token.substr(0, 8);
  for (char& c : out) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) c = '?';
  }
  return out;
}

inline std::string TenantLimitError(const Caller& caller, absl::string_view what) {
  return absl::StrCat("tenant '", caller.tenant_name(), "' ", what);
}

// Calls `done` once all `n` parts have reported; the first error wins.
class Join {
 public:
  Join(int n, Done done) : remaining_(n), done_(std::move(done)) {
    if (n == 0) done_(absl::OkStatus());
  }
  void Report(const absl::Status& st) {
    Done done;
    absl::Status result;
    {
      absl::MutexLock lock(&mu_);
      if (!st.ok() && status_.ok()) status_ = st;
      if (--remaining_ != 0) return;
      done = std::move(done_);
      result = status_;
    }
    done(result);
  }

 private:
  absl::Mutex mu_;
  int remaining_;
  absl::Status status_;
  Done done_;
};

// Adds `size` to `used` unless that would pass `limit` (0: none), as one
// step however many threads reserve at once; returns what was held when it
// would not fit.
inline std::optional<uint64_t> Reserve(std::atomic<uint64_t>& used, uint64_t limit, uint64_t size) {
  if (limit == 0) {
    used.fetch_add(size);
    return std::nullopt;
  }
  uint64_t held = used.load();
  do {
    if (size > limit - std::min(held, limit)) return held;
  } while (!used.compare_exchange_weak(held, held + size));
  return std::nullopt;
}

}  // namespace gpuexec::core::internal

#endif  // GPUEXEC_SERVER_CORE_ENGINE_INTERNAL_H_
