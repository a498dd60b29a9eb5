#ifndef GPUEXEC_CLIENT_CPP_CLI_FAILURE_H_
#define GPUEXEC_CLIENT_CPP_CLI_FAILURE_H_

// How a command of the tool fails: an exit status and the one line that
// says what failed ("gpuexec: <line>" on stderr). Commands return
// std::optional<Failure>: none on success.

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "cli/cli.h"

namespace gpuexec::cli {

struct Failure {
  int exit_code;
  std::string message;
};

// A malformed command line (exit 2).
inline Failure Usage(std::string message) { return Failure{kExitUsage, std::move(message)}; }

// `text` with every byte that is not printable ASCII as \xNN, cut to `max`
// bytes: a daemon's message or a name read from a file never moves the
// terminal's cursor, changes its title or forges a line.
inline std::string Printable(absl::string_view text, size_t max = 4096) {
  std::string out;
  for (const char c : text.substr(0, max)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) {
      out.push_back(c);
    } else {
      absl::StrAppend(&out, "\\x", absl::Hex(u, absl::kZeroPad2));
    }
  }
  if (text.size() > max) out += "...";
  return out;
}

// "what: CODE: message" with the daemon's status code and message.
inline Failure Failed(absl::string_view what, const absl::Status& status) {
  return Failure{kExitFailure, absl::StrCat(what, ": ", absl::StatusCodeToString(status.code()),
                                            ": ", Printable(status.message()))};
}

// A failure found here, without a call to the daemon.
inline Failure FailedLocally(std::string message) {
  return Failure{kExitFailure, std::move(message)};
}

}  // namespace gpuexec::cli

#endif  // GPUEXEC_CLIENT_CPP_CLI_FAILURE_H_
