#ifndef GPUEXEC_SERVER_CORE_FAULT_WORDS_H_
#define GPUEXEC_SERVER_CORE_FAULT_WORDS_H_

// What a kernel's fault or hang did, in words, for the session whose kernel
// it was. The words are made from the reset's facts (port::ResetInfo: the
// kernels it names by stream and id, the CUresult, a hang's limit), never
// parsed out of text: a kernel's name is the client's, and no name can pass
// for another session's. The reset's full text (the driver call, every
// kernel in flight) is the worker's log line.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace gpuexec::core {

// The words of a sticky CUresult's name ("CUDA_ERROR_ILLEGAL_ADDRESS" ->
// "made an illegal memory access"), as the predicate of "kernel 'k' ...";
// "hit a sticky fault" for a name it does not know.
std::string FaultWords(absl::string_view result_name);

// A reset's facts, as the words need them.
struct KernelReset {
  int device = 0;
  absl::Time at;
  bool hang = false;
  std::string result;     // a fault's CUresult name; empty if unknown
  uint64_t limit_ms = 0;  // a hang's
  uint64_t ran_ms = 0;
  uint32_t launches = 1;  // the launches `limit_ms` is for, added
};

// What the kernel did: "made an illegal memory access
// (CUDA_ERROR_ILLEGAL_ADDRESS)", "ran past its kernel time limit of 500 ms".
std::string WhatTheKernelDid(const KernelReset& reset);

// A kernel as the words below name it: "kernel 'saxpy'", the quoted
// (escaped: Session's FunctionEntry::quoted_name) name cut to 40
// characters.
std::string KernelLabel(absl::string_view quoted_name);

// A kernel in a replay of `graph` ("graph 0x1f2e"), whose kernel nodes
// have `quoted_names` (in node order): the driver says neither which node
// ran nor which faulted, so every distinct name is a candidate: "kernel
// 'fill' or 'scale' in a replay of graph 0x1f2e" (at most three names of 24
// characters, then "or another of its 5 kernels").
std::string ReplayLabel(absl::string_view graph, const std::vector<std::string>& quoted_names);

// The message for `session` (its name(), "session 5d629d64") of a reset
// that names `own` of its kernels (each a KernelLabel or ReplayLabel), at
// least one:
//   kernel 'saxpy' of session 5d629d64 made an illegal memory access
//   (CUDA_ERROR_ILLEGAL_ADDRESS); device 0 was reset at 17:00:01.234 UTC.
//   <what to do>
// or, for a hang, "... ran past its kernel time limit of 500 ms (stopped
// after 612 ms); ...". `closed`: whether the daemon closed the session for
// it (the remedy differs).
std::string KernelFaultMessage(const KernelReset& reset, const std::vector<std::string>& own,
                               absl::string_view session, bool closed);

// Why the daemon closed a session for a reset that names `own` of its
// kernels (as above) of `named` in all, as the rest of "session 5d629d64
// was closed: ...", which its client's later calls read (NOT_FOUND):
//   its kernel 'saxpy' made an illegal memory access
//   (CUDA_ERROR_ILLEGAL_ADDRESS) and reset device 0 at 17:00:01.234 UTC
// A hang: "its kernel 'spin' ran past its kernel time limit of 500 ms and
// reset ...". Where the reset names several kernels the driver does not
// say which faulted, so neither does this: "one of its 2 kernels in
// flight", "one of the 3 kernels in flight (1 of them its own)"; where it
// names none of the session's, "a kernel of the session".
std::string ClosedByResetWords(const KernelReset& reset, const std::vector<std::string>& own,
                               size_t named);

}  // namespace gpuexec::core

#endif  // GPUEXEC_SERVER_CORE_FAULT_WORDS_H_
