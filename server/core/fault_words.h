#ifndef GPUEXEC_SERVER_CORE_FAULT_WORDS_H_
#define GPUEXEC_SERVER_CORE_FAULT_WORDS_H_

// What a kernel's fault or hang did, in words, for the session whose kernel
// it was. The reset's full reason (the driver call, every kernel in flight)
// is the worker's log line; the session reads what happened to its kernel
// first, then what to do.

#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace gpuexec::core {

// The words of a sticky CUresult's name ("CUDA_ERROR_ILLEGAL_ADDRESS" ->
// "made an illegal memory access"), as the predicate of "kernel 'k' ...";
// "hit a sticky fault" for a name it does not know.
std::string FaultWords(absl::string_view result_name);

// The message for `session` (its name(), "session 5d629d64") of a device
// reset whose reason, `why`, names one of its kernels ("kernel 'k' of
// session 5d629d64 on device 0"):
//   kernel 'saxpy' of session 5d629d64 made an illegal memory access
//   (CUDA_ERROR_ILLEGAL_ADDRESS); device 0 was reset at <time> UTC. <todo>
// or, for a hang, "... ran past its kernel time limit of 500 ms (it ran 612
// ms); ...". `closed`: whether the daemon closed the session for it (the
// remedy differs). nullopt when `why` names no kernel of the session.
std::optional<std::string> KernelFaultMessage(absl::string_view why, absl::string_view session,
                                              bool closed);

// Why the daemon closed `session` (its name()) for the reset of device
// `device` at `at` whose reason is `why`, as the rest of "session 5d629d64
// was closed: ...", which its client's later calls read (NOT_FOUND):
//   its kernel 'saxpy' made an illegal memory access
//   (CUDA_ERROR_ILLEGAL_ADDRESS) and reset device 0 at 17:00:01.234 UTC
// A hang: "its kernel 'spin' ran past its kernel time limit of 500 ms and
// reset ...". Where `why` names several kernels in flight the driver does
// not say which faulted, so neither does this: "one of its 2 kernels in
// flight", "one of the 3 kernels in flight (1 of them its own)"; where it
// names none of the session's, "a kernel of the session". The kernel's
// name, as `why` quotes it, is cut to 40 characters: at most 200 in all.
std::string ClosedByResetWords(absl::string_view why, absl::string_view session, int device,
                               absl::Time at);

}  // namespace gpuexec::core

#endif  // GPUEXEC_SERVER_CORE_FAULT_WORDS_H_
