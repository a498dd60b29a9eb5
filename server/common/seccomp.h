#ifndef GPUEXEC_SERVER_COMMON_SECCOMP_H_
#define GPUEXEC_SERVER_COMMON_SECCOMP_H_

// The seccomp deny list the daemon's sandboxed processes share (a device
// worker, a compile process): calls none of them makes (process_vm_*,
// module and kexec loading, mount and namespace calls, bpf,
// perf_event_open, keyrings, userfaultfd, io_uring, handles to files by
// number, ptrace, ...) answer EPERM, as do the `extra` calls a process adds
// (a compile process: the network and exec). clone with a new namespace is
// refused; clone3, whose flags the filter cannot read, answers ENOSYS so
// that the C library falls back to clone.
//
// It is written as a few lines of classic BPF rather than through
// libseccomp: a deny list of about fifty calls is two instructions each,
// and the daemon, its image and its CI then need no library beyond the C
// library for it.

#include <sys/types.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace gpuexec::seccomp {

// What a process adds to the shared list.
struct Rules {
  std::vector<int> extra;  // denied outright
  // Allowed only on the process itself (the first argument, a process id,
  // is `self`): kill, tgkill, rt_sigqueueinfo ...
  std::vector<int> own_pid_only;
  // Allowed only on the caller (0) or the process itself: prlimit64,
  // sched_setaffinity ...
  std::vector<int> zero_or_own_pid;
  pid_t self = 0;
  // Calls refused for some values of their second argument (its low 32
  // bits, all the kernel reads of an fcntl or ioctl command): fcntl's
  // F_SETOWN, which would let a descriptor's signals reach another
  // process.
  struct ByCommand {
    int call;
    std::vector<uint32_t> commands;
  };
  std::vector<ByCommand> denied_commands;
  // No new processes: fork, vfork and a clone without CLONE_THREAD are
  // refused; threads may still be made.
  bool threads_only = false;
};

absl::Status Install(const Rules& rules);

// Installs the filter on every thread of the process (no_new_privs must be
// set first, or the caller must hold CAP_SYS_ADMIN). An error names the
// kernel's refusal.
absl::Status DenyCalls(const std::vector<int>& extra);

}  // namespace gpuexec::seccomp

#endif  // GPUEXEC_SERVER_COMMON_SECCOMP_H_
