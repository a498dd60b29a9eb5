// The fault words as a table: each sticky CUresult, and the message the
// session of a faulted or hung kernel reads, from the reasons a reset gives.
#include "server/core/fault_words.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/civil_time.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpuexec::core {
namespace {

TEST(FaultWords, EachStickyResultHasItsWords) {
  struct Case {
    std::string result;
    std::string words;
  };
  const std::vector<Case> cases = {
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
      {"CUDA_ERROR_NOT_A_RESULT", "hit a sticky fault"},
      {"", "hit a sticky fault"},
  };
  for (const Case& c : cases) EXPECT_EQ(FaultWords(c.result), c.words) << c.result;
}

absl::Time At(int hour, int minute, int second, int ms) {
  return absl::FromCivil(absl::CivilSecond(2026, 12, 3, hour, minute, second),
                         absl::UTCTimeZone()) +
         absl::Milliseconds(ms);
}

KernelReset Fault(int device, std::string result) {
  KernelReset r;
  r.device = device;
  r.at = At(17, 0, 1, 234);
  r.result = std::move(result);
  return r;
}

KernelReset Hang(int device, uint64_t limit_ms, uint64_t ran_ms) {
  KernelReset r;
  r.device = device;
  r.at = At(17, 0, 2, 500);
  r.hang = true;
  r.limit_ms = limit_ms;
  r.ran_ms = ran_ms;
  return r;
}

std::vector<std::string> Labels(const std::vector<std::string>& quoted_names) {
  std::vector<std::string> labels;
  for (const std::string& q : quoted_names) labels.push_back(KernelLabel(q));
  return labels;
}

// The words come from the reset's facts: the kernels named are the
// session's own, found by stream and kernel id, never read out of text. A
// name that looks like another session's clause is only a name.
TEST(FaultWords, TheSessionReadsWhatHappenedToItsKernelFirst) {
  struct Case {
    std::string what;
    KernelReset reset;
    std::vector<std::string> own;
    bool closed;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"its kernel faulted",
       Fault(0, "CUDA_ERROR_ILLEGAL_ADDRESS"),
       {"gx_fault"},
       true,
       "kernel 'gx_fault' of session 5d629d64 made an illegal memory access "
       "(CUDA_ERROR_ILLEGAL_ADDRESS); device 0 was reset at 17:00:01.234 UTC. The session was "
       "closed: open a new session"},
      {"kept open (charged to no one)",
       Fault(0, "CUDA_ERROR_ILLEGAL_ADDRESS"),
       {"gx_fill_u32"},
       false,
       "kernel 'gx_fill_u32' of session 5d629d64 made an illegal memory access "
       "(CUDA_ERROR_ILLEGAL_ADDRESS); device 0 was reset at 17:00:01.234 UTC. Allocate and "
       "write its buffers again"},
      {"its kernel hung",
       Hang(1, 500, 612),
       {"gx_spin"},
       true,
       "kernel 'gx_spin' of session 5d629d64 ran past its kernel time limit of 500 ms (stopped "
       "after 612 ms); device 1 was reset at 17:00:02.500 UTC. The session was closed: open a "
       "new session"},
      {"its kernel hung in a run of launches watched together (their limits added)",
       [] {
         KernelReset r = Hang(1, 800, 812);
         r.launches = 8;
         return r;
       }(),
       {"gx_spin"},
       true,
       "kernel 'gx_spin' of session 5d629d64 ran past the limit of 8 queued launches (8 x "
       "100 ms) (stopped after 812 ms); device 1 was reset at 17:00:02.500 UTC. The session was "
       "closed: open a new session"},
      {"a name ending in a backslash (escaped: two)",
       Fault(3, "CUDA_ERROR_MISALIGNED_ADDRESS"),
       {"k\\\\"},
       true,
       "kernel 'k\\\\' of session 5d629d64 made a misaligned memory access "
       "(CUDA_ERROR_MISALIGNED_ADDRESS); device 3 was reset at 17:00:01.234 UTC. The session "
       "was closed: open a new session"},
      {"a name with an escaped quote and an owner clause in it",
       Fault(0, "CUDA_ERROR_ASSERT"),
       {"a\\' of session 11111111 on device 0"},
       true,
       "kernel 'a\\' of session 11111111 on device 0' of session 5d629d64 failed a device-side "
       "assert (CUDA_ERROR_ASSERT); device 0 was reset at 17:00:01.234 UTC. The session was "
       "closed: open a new session"},
      {"two of its kernels in flight",
       Fault(0, ""),
       {"a", "b"},
       true,
       "one of the 2 kernels of session 5d629d64 in flight (kernel 'a', ...) hit a sticky "
       "fault; device 0 was reset at 17:00:01.234 UTC. The session was closed: open a new "
       "session"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string got =
        KernelFaultMessage(c.reset, Labels(c.own), "session 5d629d64", c.closed);
    EXPECT_EQ(got, c.message);
    EXPECT_LE(got.size(), 200u);
  }
}

// The reason a session closed by its kernel's reset gives its later calls:
// the kernel when the reset names it alone, else only what is known.
TEST(FaultWords, TheClosedReasonSaysWhatTheKernelDid) {
  struct Case {
    std::string what;
    KernelReset reset;
    std::vector<std::string> own;
    size_t named;
    std::string words;
  };
  const KernelReset hang = [] {
    KernelReset r = Hang(0, 500, 612);
    r.at = At(17, 0, 1, 234);
    return r;
  }();
  const std::vector<Case> cases = {
      {"a fault, its kernel alone in flight",
       Fault(0, "CUDA_ERROR_ILLEGAL_ADDRESS"),
       {"gx_fault"},
       1,
       "its kernel 'gx_fault' made an illegal memory access (CUDA_ERROR_ILLEGAL_ADDRESS) and "
       "reset device 0 at 17:00:01.234 UTC"},
      {"a hang",
       hang,
       {"spin"},
       1,
       "its kernel 'spin' ran past its kernel time limit of 500 ms and reset device 0 at "
       "17:00:01.234 UTC"},
      {"two of its kernels in flight",
       Fault(0, "CUDA_ERROR_MISALIGNED_ADDRESS"),
       {"a", "b"},
       2,
       "one of its 2 kernels in flight made a misaligned memory access "
       "(CUDA_ERROR_MISALIGNED_ADDRESS) and reset device 0 at 17:00:01.234 UTC"},
      {"its kernel and another session's in flight",
       Fault(0, "CUDA_ERROR_ASSERT"),
       {"a"},
       2,
       "one of the 2 kernels in flight (1 of them its own) failed a device-side assert "
       "(CUDA_ERROR_ASSERT) and reset device 0 at 17:00:01.234 UTC"},
      {"none of its kernels named",
       Fault(0, "CUDA_ERROR_ILLEGAL_ADDRESS"),
       {},
       1,
       "a kernel of the session made an illegal memory access (CUDA_ERROR_ILLEGAL_ADDRESS) and "
       "reset device 0 at 17:00:01.234 UTC"},
      {"no CUDA error named",
       Fault(0, ""),
       {"k"},
       1,
       "its kernel 'k' hit a sticky fault and reset device 0 at 17:00:01.234 UTC"},
      {"a name ending in a backslash",
       Fault(0, "CUDA_ERROR_ASSERT"),
       {"evil\\\\"},
       1,
       "its kernel 'evil\\\\' failed a device-side assert (CUDA_ERROR_ASSERT) and reset device "
       "0 at 17:00:01.234 UTC"},
      {"a long name, cut",
       Fault(0, "CUDA_ERROR_ILLEGAL_ADDRESS"),
       {std::string(60, 'x')},
       1,
       absl::StrCat("its kernel '", std::string(40, 'x'), "...' made an illegal memory access ",
                    "(CUDA_ERROR_ILLEGAL_ADDRESS) and reset device 0 at 17:00:01.234 UTC")},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_EQ(ClosedByResetWords(c.reset, Labels(c.own), c.named), c.words);
  }
  // The longest: a cut name of escapes (never cut inside one), the longest
  // words, device 15.
  std::string name;
  for (int i = 0; i < 30; ++i) name += "\\x01";
  const std::string longest =
      ClosedByResetWords(Fault(15, "CUDA_ERROR_LAUNCH_FAILED"), Labels({name}), 1);
  EXPECT_THAT(longest, ::testing::StartsWith("its kernel '\\x01"));
  EXPECT_THAT(longest, ::testing::HasSubstr("\\x01...' failed while it ran"));
  EXPECT_LE(longest.size(), 200u) << longest;
  // A cut through a run of escaped backslashes keeps whole escapes.
  const std::string slashes = ClosedByResetWords(Fault(0, "CUDA_ERROR_ASSERT"),
                                                 Labels({std::string(39, 'y') + "\\\\z"}), 1);
  EXPECT_THAT(slashes, ::testing::HasSubstr(std::string(39, 'y') + "...'")) << slashes;
}

// A replay's kernel: the driver says neither which node ran nor which
// faulted, so the graph is named with each distinct kernel of its nodes.
TEST(FaultWords, AReplayNamesItsGraphAndEveryKernelItMayBe) {
  EXPECT_EQ(ReplayLabel("graph 0x1f", {"fill"}), "kernel 'fill' in a replay of graph 0x1f");
  EXPECT_EQ(ReplayLabel("graph 0x1f", {"fill", "fill", "scale"}),
            "kernel 'fill' or 'scale' in a replay of graph 0x1f");
  EXPECT_EQ(ReplayLabel("graph 0x1f", {"a", "b", "c"}),
            "kernel 'a', 'b' or 'c' in a replay of graph 0x1f");
  EXPECT_EQ(ReplayLabel("graph 0x1f", {"a", "b", "c", "d", "a"}),
            "kernel 'a', 'b', 'c' or another of its 4 kernels in a replay of graph 0x1f");
  EXPECT_EQ(ReplayLabel("graph 0x1f", {}), "a kernel in a replay of graph 0x1f");
  // Names are cut to 24 characters each: the whole stays bounded.
  const std::string many = ReplayLabel(
      "graph 0x1f", {std::string(100, 'x'), std::string(100, 'y'), std::string(100, 'z'), "w"});
  EXPECT_THAT(many, ::testing::HasSubstr(std::string(24, 'x') + "...'"));
  EXPECT_LE(many.size(), 160u) << many;
  EXPECT_EQ(ClosedByResetWords(Fault(0, "CUDA_ERROR_ILLEGAL_ADDRESS"),
                               {ReplayLabel("graph 0x1f", {"fill", "gx_fault"})}, 1),
            "its kernel 'fill' or 'gx_fault' in a replay of graph 0x1f made an illegal memory "
            "access (CUDA_ERROR_ILLEGAL_ADDRESS) and reset device 0 at 17:00:01.234 UTC");
}

}  // namespace
}  // namespace gpuexec::core
