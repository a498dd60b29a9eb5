#ifndef GPUEXEC_CLIENT_CPP_CLI_INTERRUPT_H_
#define GPUEXEC_CLIENT_CPP_CLI_INTERRUPT_H_

// Ctrl-C and SIGTERM close the open session at once: a thread of its own
// waits for the signals (blocked in every other thread), closes the session
// the command registered (CloseSession, which frees all it holds on the
// daemon) and ends the process with status 130, within a second even when
// the daemon does not answer. Without a session it ends the process at
// once. The command's own thread never sees the signal: it may be in the
// middle of a call that the close makes fail, and it says nothing of that.
// What the command changed outside the process (a terminal's settings) it
// puts back through InterruptRestores, first of all.

#include <functional>

#include "gpuexec/client.h"

namespace gpuexec::cli {

inline constexpr int kExitInterrupted = 130;

// Blocks SIGINT and SIGTERM and starts the thread that waits for them.
// Called by main() before any other thread starts (threads inherit the
// mask); without it, the signals end the process as they always do.
void HandleInterrupts();

// While it lives, an interrupt closes `session` before the process ends.
// One at a time; made after the session opened, destroyed before it is.
class InterruptCloses {
 public:
  explicit InterruptCloses(Session* session);
  ~InterruptCloses();
  InterruptCloses(const InterruptCloses&) = delete;
  InterruptCloses& operator=(const InterruptCloses&) = delete;
};

// While it lives, an interrupt runs `restore` before the process ends, on
// the interrupt's thread and before the session closes; `restore` must not
// wait for the command's thread. One at a time.
class InterruptRestores {
 public:
  explicit InterruptRestores(std::function<void()> restore);
  ~InterruptRestores();
  InterruptRestores(const InterruptRestores&) = delete;
  InterruptRestores& operator=(const InterruptRestores&) = delete;
};

// True once an interrupt arrived: the process is about to end, and the
// command's thread should print nothing more.
bool Interrupted();

}  // namespace gpuexec::cli

#endif  // GPUEXEC_CLIENT_CPP_CLI_INTERRUPT_H_
