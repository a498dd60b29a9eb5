#include "server/core/fault_words.h"

#include <cctype>

#include "absl/strings/ascii.h"
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

}  // namespace

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
