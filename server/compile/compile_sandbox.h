#ifndef GPUEXEC_SERVER_COMPILE_COMPILE_SANDBOX_H_
#define GPUEXEC_SERVER_COMPILE_COMPILE_SANDBOX_H_

// The compile process's confinement. NVRTC parses a client's C++: a bug in
// it, or a source built to exhaust it, must cost the compile process alone.
// Called in the compile process once NVRTC is loaded, before it sees the
// source:
//   - rlimits: address space (RLIMIT_AS: allocations past it fail), CPU
//     seconds (RLIMIT_CPU: SIGXCPU, then SIGKILL a second later), bytes of
//     a file written (RLIMIT_FSIZE), open descriptors, no core dumps;
//   - PR_SET_DUMPABLE 0 and PR_SET_NO_NEW_PRIVS 1;
//   - every capability dropped (a daemon run as root);
//   - the daemon's seccomp deny list (server/common/seccomp.h), and the
//     network (socket, connect, bind, listen, accept), exec, memfd_create
//     and new processes (fork, vfork, a clone that is not a thread), which
//     a compile never needs: the answer goes back on the socket it
//     inherited; signals, rlimits and scheduling reach no process but this
//     one (other processes of the daemon's uid are out of reach), and no
//     descriptor gets an owner to send its I/O signals to (fcntl F_SETOWN,
//     F_SETOWN_EX, F_SETSIG; ioctl FIOSETOWN, SIOCSPGRP, FIOASYNC);
//   - Landlock (Linux 5.13 and newer): no file of the host may be opened
//     but the files in `readable` (NVRTC's libraries) for reading, and
//     what is beneath `directory` (a private one of this compile, its
//     working directory), also for reading only: nothing may be written;
//     with Landlock ABI 4 and newer, no TCP bind or connect either; with
//     ABI 6 and newer, no signal to a process outside the sandbox and no
//     abstract Unix socket outside it either. A
//     kernel without Landlock gets no compiles (compiler.h): the daemon's
//     check of the source's includes (compile_request.h) is a second line,
//     not the only one.
// The front kills a compile past its wall-clock limit (compiler.h).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gpuexec::compile::sandbox {

struct Limits {
  uint64_t memory_bytes = uint64_t{4} << 30;
  uint32_t cpu_seconds = 60;
  // The hard CPU limit, for a process that compiles more than once (0:
  // cpu_seconds + 1).
  uint32_t cpu_total_seconds = 0;
  uint64_t file_bytes = uint64_t{64} << 20;
  uint32_t open_files = 64;
};

struct Confinement {
  bool no_new_privs = false;
  bool seccomp = false;
  int landlock_abi = 0;  // 0: the kernel has no Landlock
};

// The Landlock ABI this kernel offers; 0 where it has none (and then no
// compiles run: compiler.h).
int LandlockAbi();

// Confines the calling process; an error names the step the kernel
// refused. A kernel without Landlock is not an error (landlock_abi 0).
absl::StatusOr<Confinement> Confine(const Limits& limits, const std::vector<std::string>& readable,
                                    const std::string& directory);

}  // namespace gpuexec::compile::sandbox

#endif  // GPUEXEC_SERVER_COMPILE_COMPILE_SANDBOX_H_
