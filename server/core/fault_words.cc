#include "server/core/fault_words.h"

#include <cctype>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
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

// The first "CUDA_ERROR_..." name in `text`; empty when there is none.
absl::string_view ResultName(absl::string_view text) {
  const size_t at = text.find("CUDA_ERROR_");
  if (at == absl::string_view::npos) return "";
  size_t end = at;
  while (end < text.size() &&
         (absl::ascii_isupper(text[end]) || absl::ascii_isdigit(text[end]) || text[end] == '_')) {
    ++end;
  }
  return text.substr(at, end - at);
}

// The digits at the start of `text`.
absl::string_view Digits(absl::string_view text) {
  size_t n = 0;
  while (n < text.size() && absl::ascii_isdigit(text[n])) ++n;
  return text.substr(0, n);
}

// "kernel 'NAME'" as `why` quotes it, NAME cut to `max` characters (never
// inside an escape), with "..." when cut.
std::string CutLabel(absl::string_view name, size_t max) {
  if (name.size() <= max) return absl::StrCat("kernel '", name, "'");
  size_t keep = max;
  // An escape is at most 4 characters ("\xNN"): do not end inside one.
  for (size_t back = 1; back <= 3 && back <= keep; ++back) {
    if (name[keep - back] == '\\') {
      keep -= back;
      break;
    }
  }
  return absl::StrCat("kernel '", name.substr(0, keep), "...'");
}

// A kernel that `why` names with its owner: "kernel 'NAME' of session
// 5d629d64 on device 0".
struct Named {
  absl::string_view name;   // as quoted (escaped)
  absl::string_view owner;  // "session 5d629d64"
};

// Every kernel `why` names with its owner, each once (a fault's reason may
// name the faulting call's kernel and then every kernel in flight).
std::vector<Named> NamedKernels(absl::string_view why) {
  std::vector<Named> found;
  constexpr absl::string_view kLabel = "kernel '";
  constexpr absl::string_view kOf = "' of session ";
  constexpr absl::string_view kOn = " on device ";
  for (size_t at = why.find(kLabel); at != absl::string_view::npos; at = why.find(kLabel, at)) {
    const size_t begin = at + kLabel.size();
    size_t end = begin;
    // The name is escaped (an apostrophe in it is "\\'"): its end is the
    // first apostrophe not escaped.
    while (end < why.size() && why[end] != '\'') end += why[end] == '\\' ? 2 : 1;
    if (end >= why.size()) break;
    at = end;
    if (!absl::StartsWith(why.substr(end), kOf)) continue;
    const size_t on = why.find(kOn, end + kOf.size());
    if (on == absl::string_view::npos || on - end > kOf.size() + 8) continue;
    const Named k{why.substr(begin, end - begin), why.substr(end + 5, on - end - 5)};
    bool seen = false;
    for (const Named& f : found) seen = seen || (f.name == k.name && f.owner == k.owner);
    if (!seen) found.push_back(k);
  }
  return found;
}

}  // namespace

std::string ClosedByResetWords(absl::string_view why, absl::string_view session, int device,
                               absl::Time at) {
  const std::vector<Named> named = NamedKernels(why);
  size_t own = 0;
  absl::string_view own_name;
  for (const Named& k : named) {
    if (k.owner != session) continue;
    own_name = k.name;
    ++own;
  }
  std::string who;
  if (own == 1 && named.size() == 1) {
    who = absl::StrCat("its ", CutLabel(own_name, 40));
  } else if (own != 0 && own == named.size()) {
    who = absl::StrCat("one of its ", own, " kernels in flight");
  } else if (own != 0) {
    who =
        absl::StrCat("one of the ", named.size(), " kernels in flight (", own, " of them its own)");
  } else {
    who = "a kernel of the session";
  }

  std::string what;
  constexpr absl::string_view kPast = "past its kernel time limit of ";
  if (const size_t past = why.find(kPast); past != absl::string_view::npos) {
    what = absl::StrCat("ran past its kernel time limit of ",
                        Digits(why.substr(past + kPast.size())), " ms");
  } else if (absl::string_view result = ResultName(why); !result.empty()) {
    what = absl::StrCat(FaultWords(result), " (", result, ")");
  } else {
    what = FaultWords("");
  }
  // The time of day, as the ABORTED of the same reset gives it.
  return absl::StrCat(who, " ", what, " and reset device ", device, " at ",
                      absl::FormatTime("%H:%M:%E3S UTC", at, absl::UTCTimeZone()));
}

std::string FaultWords(absl::string_view result_name) {
  for (const Words& w : kWords) {
    if (result_name == w.result) return w.words;
  }
  return "hit a sticky fault";
}

std::optional<std::string> KernelFaultMessage(absl::string_view why, absl::string_view session,
                                              bool closed) {
  // "kernel 'NAME' of SESSION on device N": the name is quoted (an
  // apostrophe in it is escaped), so the owner clause is found unescaped.
  const std::string owner = absl::StrCat("' of ", session, " on device ");
  size_t at = why.find(owner);
  while (at != absl::string_view::npos && at > 0 && why[at - 1] == '\\') {
    at = why.find(owner, at + 1);
  }
  if (at == absl::string_view::npos) return std::nullopt;
  const size_t label = why.rfind("kernel '", at);
  if (label == absl::string_view::npos) return std::nullopt;
  const absl::string_view kernel = why.substr(label, at + 1 - label);
  const absl::string_view device = Digits(why.substr(at + owner.size()));

  std::string what;
  constexpr absl::string_view kPast = "past its kernel time limit of ";
  if (const size_t past = why.find(kPast); past != absl::string_view::npos) {
    const absl::string_view limit = Digits(why.substr(past + kPast.size()));
    constexpr absl::string_view kRan = "has run for ";
    const size_t ran = why.find(kRan);
    what = absl::StrCat("ran past its kernel time limit of ", limit, " ms");
    if (ran != absl::string_view::npos) {
      absl::StrAppend(&what, " (stopped after ", Digits(why.substr(ran + kRan.size())), " ms)");
    }
  } else if (absl::string_view result = ResultName(why); !result.empty()) {
    what = absl::StrCat(FaultWords(result), " (", result, ")");
  } else {
    what = FaultWords("");
  }

  // "device 0 was reset at 2026-12-03 17:00:01.234 UTC" where the reason
  // says when.
  std::string reset = absl::StrCat("device ", device, " was reset");
  const std::string reset_at = absl::StrCat("device ", device, " was reset at ");
  if (const size_t r = why.find(reset_at); r != absl::string_view::npos) {
    const size_t utc = why.find(" UTC", r);
    if (utc != absl::string_view::npos && utc - r < reset_at.size() + 32) {
      absl::string_view when = why.substr(r + reset_at.size(), utc + 4 - r - reset_at.size());
      // The time of day is enough ("2026-12-03 17:00:01.234 UTC").
      if (when.size() > 11 && when[4] == '-' && when[10] == ' ') when.remove_prefix(11);
      reset = absl::StrCat(reset_at, when);
    }
  }
  return absl::StrCat(kernel, " of ", session, " ", what, "; ", reset, ". ",
                      closed ? "The session was closed: open a new session"
                             : "Allocate and write its buffers again");
}

}  // namespace gpuexec::core
