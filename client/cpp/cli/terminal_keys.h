#ifndef GPUEXEC_CLIENT_CPP_CLI_TERMINAL_KEYS_H_
#define GPUEXEC_CLIENT_CPP_CLI_TERMINAL_KEYS_H_

// Keys pressed on the terminal, for a command that redraws while it waits
// (`gpuexec top`). While a TerminalKeys lives, the terminal of its file
// descriptor is in non-canonical mode without echo: a key arrives as it is
// pressed, and is not printed over the frame. Its destructor puts the
// terminal's settings back as they were, and so does an interrupt (Ctrl-C,
// SIGTERM: interrupt.h) before the process ends, so no exit path leaves the
// shell without echo. ISIG stays on: Ctrl-C still interrupts.
//
// One thread uses it; one at a time.

#include <memory>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "cli/interrupt.h"

namespace gpuexec::cli {

class TerminalKeys {
 public:
  // Keys from `fd` (stdin), or nullptr where it is no terminal or its
  // settings cannot be read or changed: the caller then just waits.
  static std::unique_ptr<TerminalKeys> Open(int fd);

  ~TerminalKeys();
  TerminalKeys(const TerminalKeys&) = delete;
  TerminalKeys& operator=(const TerminalKeys&) = delete;

  // Waits until `deadline` for keys; returns the bytes of those pressed as
  // soon as there are any, or "" at the deadline. Once the terminal has hung
  // up, it only waits.
  std::string Wait(absl::Time deadline);

 private:
  struct Saved;
  TerminalKeys(int fd, std::unique_ptr<Saved> saved);

  const int fd_;
  const std::unique_ptr<Saved> saved_;  // the settings to put back
  bool hung_up_ = false;
  std::optional<InterruptRestores> on_interrupt_;
};

}  // namespace gpuexec::cli

#endif  // GPUEXEC_CLIENT_CPP_CLI_TERMINAL_KEYS_H_
