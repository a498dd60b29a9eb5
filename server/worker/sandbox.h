#ifndef GPUEXEC_SERVER_WORKER_SANDBOX_H_
#define GPUEXEC_SERVER_WORKER_SANDBOX_H_

// The worker's confinement, and what the front does so that a worker that
// runs an attacker's code (through the driver's loader or JIT, or a kernel
// that reaches host memory) gets no further than its own device.
//
// In the front (gpuexecd), before any thread starts:
//   ConfineFront()   PR_SET_DUMPABLE 0: another process of the daemon's uid
//                    (a worker) can no longer open /proc/<front>/fd/N (other
//                    tenants' staging memfds), /proc/<front>/mem, or ptrace
//                    it, unless it holds CAP_SYS_PTRACE.
//
// In RemoteDevice::Spawn, for each worker: the child gets exactly the
// descriptors worker_main.h lists (everything above kRegionFd is closed in
// the child before exec), stdin from /dev/null, and stdout (device printf)
// on a pipe that WorkerOutput reads (below).
//
// In the worker, first thing in RunWorker, ConfineWorker():
//   - PR_SET_DUMPABLE 0 (nor can one worker reach another's /proc);
//   - the capabilities a worker never needs are dropped from every set and
//     from the bounding set (CAP_SYS_PTRACE, CAP_SYS_ADMIN, CAP_SETUID, ...;
//     only what a root-run driver may use on its device nodes stays: see
//     kKeptCapabilities in sandbox.cc);
//   - PR_SET_NO_NEW_PRIVS 1;
//   - a seccomp filter that refuses with EPERM the calls a worker never
//     makes (ptrace, process_vm_*, module and kexec loading, mount and
//     namespace calls, bpf, perf_event_open, keyrings, userfaultfd,
//     io_uring, handles to files by number, ...; the list is in sandbox.cc).
//     It is a deny list, not an allow list: NVIDIA's closed driver makes
//     many ioctls, maps memory, starts threads and talks to MPS through
//     pipes, and which of those it needs changes between releases.
// The filter, the capability drop and no_new_privs can be turned off for
// diagnosis (a profiler needs perf_event_open and ptrace):
// GPUEXEC_WORKER_SANDBOX=off in the daemon's environment (gpuexecd
// --worker_sandbox=off sets it). Dumpable 0 and the descriptor hygiene stay.
//
// Not done here: a uid per tenant. Workers run as the daemon's uid; where
// the daemon runs as root, a worker keeps root's file access (it can read
// what root can read, the TLS key among it) though not its capabilities to
// trace, mount or load modules. Run the daemon as a uid of its own (the
// shipped unit and images do).

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gpuexec::worker::sandbox {

// Where a worker's sandbox stands; what ConfineWorker did.
struct Confinement {
  bool dumpable_off = false;
  bool no_new_privs = false;
  bool seccomp = false;
  int capabilities_dropped = 0;
};

// Called by the front before any thread starts. Fails only if the kernel
// refuses PR_SET_DUMPABLE, which it never does for 0.
absl::Status ConfineFront();

// Whether the daemon's environment asks for workers without the filter
// (GPUEXEC_WORKER_SANDBOX=off, 0 or false).
bool WorkerSandboxOff();

// Called by the worker before it loads the driver. With the sandbox off,
// only dumpable 0. An error names the step the kernel refused; the worker
// then reports it as a start that failed (a kernel without seccomp filters
// is no place to run other tenants' code).
absl::StatusOr<Confinement> ConfineWorker(bool sandbox_off);

// Reads workers' stdout (device printf) in the front: one thread for all
// of them. Each line is logged as
//   device 0 worker (pid 123) printed: "text\x1b..."
// escaped and cut to 512 bytes, at most kBurst lines at once and
// kLinesPerSecond after that per worker; lines past the budget are counted
// and their number logged when the budget allows again or the pipe ends.
class WorkerOutput {
 public:
  static constexpr int kLinesPerSecond = 20;
  static constexpr int kBurst = 200;
  static constexpr size_t kLineBytes = 512;

  // The one reader of this process; its thread starts on the first Add.
  static WorkerOutput& Get();

  // Takes `fd` (the read end of a worker's stdout pipe); reads it until
  // its end, then closes it. `label` names the worker in each line.
  void Add(int fd, std::string label);

  // Lines logged and left out so far, over every worker (for tests).
  uint64_t lines_logged() const;
  uint64_t lines_left_out() const;

  struct State;

 private:
  WorkerOutput();
  std::unique_ptr<State> state_;
};

}  // namespace gpuexec::worker::sandbox

#endif  // GPUEXEC_SERVER_WORKER_SANDBOX_H_
