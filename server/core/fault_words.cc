#include "server/core/fault_words.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace gpuexec::core {
namespace {

struct Words {
  const char* result;
  const char* words;
};

// Each sticky CUresult the driver table knows (server/cuda/driver.cc).
constexpr Words kWords[] = {
    {"CUDA_ERROR_ILLEGAL_ADDRESS", "made an illegal memory access"},
    {"CUDA_ERROR_MISALIGNED_ADDRESS", "made a misaligned memory access"},
    {"CUDA_ERROR_INVALID_ADDRESS_SPACE", "accessed memory in the wrong address space"},
    {"CUDA_ERROR_ILLEGAL_INSTRUCTION", "ran an illegal instruction"},
    {"CUDA_ERROR_INVALID_PC", "jumped to an invalid program counter"},
    {"CUDA_ERROR_HARDWARE_STACK_ERROR", "overflowed or corrupted its call stack"},
    {"CUDA_ERROR_ASSERT", "failed a device-side assert"},
    {"CUDA_ERROR_LAUNCH_TIMEOUT", "ran past the driver's launch timeout"},
    {"CUDA_ERROR_LAUNCH_FAILED", "failed while it ran (an unspecified launch failure)"},
    {"CUDA_ERROR_ECC_UNCORRECTABLE", "hit an uncorrectable ECC memory error"},
};

// A quoted (escaped) name cut to `max` characters (never inside an
// escape), with "..." when cut.
std::string CutName(absl::string_view name, size_t max) {
  if (name.size() <= max) return std::string(name);
  // An escape is at most 4 characters ("\xNN"); a run of backslashes is
  // escapes of two: cut before the escape the cut would split.
  size_t keep = max;
  size_t escape_start = std::string::npos;
  for (size_t i = 0; i < keep;) {
    if (name[i] == '\\') {
      const size_t len = i + 1 < name.size() && name[i + 1] == 'x' ? 4 : 2;
      if (i + len > keep) {
        escape_start = i;
        break;
      }
      i += len;
    } else {
      ++i;
    }
  }
  if (escape_start != std::string::npos) keep = escape_start;
  return absl::StrCat(name.substr(0, keep), "...");
}

}  // namespace

std::string KernelLabel(absl::string_view quoted_name) {
  return absl::StrCat("kernel '", CutName(quoted_name, 40), "'");
}

std::string ReplayLabel(absl::string_view graph, const std::vector<std::string>& quoted_names) {
  if (quoted_names.empty()) return absl::StrCat("a kernel in a replay of ", graph);
  // Distinct names, in node order, at most three shown.
  std::vector<absl::string_view> names;
  absl::flat_hash_set<absl::string_view> seen;
  for (const std::string& q : quoted_names) {
    if (seen.insert(q).second) names.push_back(q);
  }
  std::string label = "kernel ";
  const size_t shown = std::min<size_t>(names.size(), 3);
  for (size_t i = 0; i < shown; ++i) {
    const char* sep = i == 0 ? "" : (i + 1 == shown && names.size() == shown ? " or " : ", ");
    absl::StrAppend(&label, sep, "'", CutName(names[i], 24), "'");
  }
  if (names.size() > shown)
    absl::StrAppend(&label, " or another of its ", names.size(), " kernels");
  return absl::StrCat(label, " in a replay of ", graph);
}

std::string FaultWords(absl::string_view result_name) {
  for (const Words& w : kWords) {
    if (result_name == w.result) return w.words;
  }
  return "hit a sticky fault";
}

std::string WhatTheKernelDid(const KernelReset& reset) {
  if (reset.hang && reset.launches > 1) {
    // A run's launches watched together: their limits added.
    return absl::StrCat("ran past the limit of ", reset.launches, " queued launches (",
                        reset.launches, " x ", reset.limit_ms / reset.launches, " ms)");
  }
  if (reset.hang) {
    return absl::StrCat("ran past its kernel time limit of ", reset.limit_ms, " ms");
  }
  if (reset.result.empty()) return FaultWords("");
  return absl::StrCat(FaultWords(reset.result), " (", reset.result, ")");
}

std::string KernelFaultMessage(const KernelReset& reset, const std::vector<std::string>& own,
                               absl::string_view session, bool closed) {
  std::string who;
  if (own.size() <= 1) {
    who = absl::StrCat(own.empty() ? KernelLabel("?") : own.front(), " of ", session);
  } else {
    who = absl::StrCat("one of the ", own.size(), " kernels of ", session, " in flight (",
                       own.front(), ", ...)");
  }
  std::string what = WhatTheKernelDid(reset);
  if (reset.hang && reset.ran_ms != 0) {
    absl::StrAppend(&what, " (stopped after ", reset.ran_ms, " ms)");
  }
  // The time of day, as the ABORTED of the same reset gives it.
  return absl::StrCat(who, " ", what, "; device ", reset.device, " was reset at ",
                      absl::FormatTime("%H:%M:%E3S UTC", reset.at, absl::UTCTimeZone()), ". ",
                      closed ? "The session was closed: open a new session"
                             : "Allocate and write its buffers again");
}

std::string ClosedByResetWords(const KernelReset& reset, const std::vector<std::string>& own,
                               size_t named) {
  std::string who;
  if (own.size() == 1 && named == 1) {
    who = absl::StrCat("its ", own.front());
  } else if (!own.empty() && own.size() == named) {
    who = absl::StrCat("one of its ", own.size(), " kernels in flight");
  } else if (!own.empty()) {
    who =
        absl::StrCat("one of the ", named, " kernels in flight (", own.size(), " of them its own)");
  } else {
    who = "a kernel of the session";
  }
  return absl::StrCat(who, " ", WhatTheKernelDid(reset), " and reset device ", reset.device, " at ",
                      absl::FormatTime("%H:%M:%E3S UTC", reset.at, absl::UTCTimeZone()));
}

}  // namespace gpuexec::core
