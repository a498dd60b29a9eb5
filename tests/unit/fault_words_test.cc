// The fault words as a table: each sticky CUresult, and the message the
// session of a faulted or hung kernel reads, from the reasons a reset gives.
#include "server/core/fault_words.h"

#include <optional>
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

// The reasons as the worker and the front give them to the session.
constexpr char kFault[] =
    "device 0 was reset at 2026-12-03 17:00:01.234 UTC: device 0 hit a sticky fault: "
    "cuStreamSynchronize(stream of session 5d629d64): CUDA_ERROR_ILLEGAL_ADDRESS (an illegal "
    "memory access was encountered); kernels not yet synchronized then: kernel 'gx_fill_u32' "
    "of session 0badcafe on device 0 (launched 17:00:01.200 UTC); kernel 'gx_fault' of session "
    "5d629d64 on device 0 (launched 17:00:01.210 UTC); the device's memory and queued work are "
    "lost until it is reset";
constexpr char kHang[] =
    "device 1 was reset at 2026-12-03 17:00:02.500 UTC: kernel 'gx_spin' of session 5d629d64 "
    "on device 1 has run for 612 ms, past its kernel time limit of 500 ms";

TEST(FaultWords, TheSessionReadsWhatHappenedToItsKernelFirst) {
  struct Case {
    std::string what;
    std::string why;
    std::string session;
    bool closed;
    std::optional<std::string> message;
  };
  const std::vector<Case> cases = {
      {"its kernel faulted, among another session's", kFault, "session 5d629d64", true,
       "kernel 'gx_fault' of session 5d629d64 made an illegal memory access "
       "(CUDA_ERROR_ILLEGAL_ADDRESS); device 0 was reset at 17:00:01.234 UTC. The session was "
       "closed: open a new session"},
      {"the other session's kernel, kept open (charged to no one)", kFault, "session 0badcafe",
       false,
       "kernel 'gx_fill_u32' of session 0badcafe made an illegal memory access "
       "(CUDA_ERROR_ILLEGAL_ADDRESS); device 0 was reset at 17:00:01.234 UTC. Allocate and "
       "write its buffers again"},
      {"its kernel hung", kHang, "session 5d629d64", true,
       "kernel 'gx_spin' of session 5d629d64 ran past its kernel time limit of 500 ms (stopped "
       "after 612 ms); device 1 was reset at 17:00:02.500 UTC. The session was closed: open a "
       "new session"},
      {"a misaligned access, the reset's time unknown",
       "kernel 'k' of session 11111111 on device 3: CUDA_ERROR_MISALIGNED_ADDRESS",
       "session 11111111", true,
       "kernel 'k' of session 11111111 made a misaligned memory access "
       "(CUDA_ERROR_MISALIGNED_ADDRESS); device 3 was reset. The session was closed: open a "
       "new session"},
      {"a name with an escaped quote and the owner clause in it",
       "kernel 'a\\' of session 5d629d64 on device 0' of session 5d629d64 on device 0: "
       "CUDA_ERROR_ASSERT",
       "session 5d629d64", true,
       "kernel 'a\\' of session 5d629d64 on device 0' of session 5d629d64 failed a device-side "
       "assert (CUDA_ERROR_ASSERT); device 0 was reset. The session was closed: open a new "
       "session"},
      {"no kernel of this session named", kFault, "session 22222222", true, std::nullopt},
      {"a worker that died: no kernel named",
       "device 0 was reset at 2026-12-03 17:00:01.234 UTC: worker pid 42 ended by signal 9",
       "session 5d629d64", true, std::nullopt},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::optional<std::string> got = KernelFaultMessage(c.why, c.session, c.closed);
    EXPECT_EQ(got, c.message);
    if (got.has_value()) EXPECT_LE(got->size(), 200u);
  }
}

// The reason a session closed by its kernel's reset gives its later calls:
// the kernel when the reset names it alone, else only what is known.
TEST(FaultWords, TheClosedReasonSaysWhatTheKernelDid) {
  const absl::Time at =
      absl::FromCivil(absl::CivilSecond(2026, 12, 3, 17, 0, 1), absl::UTCTimeZone()) +
      absl::Milliseconds(234);
  struct Case {
    std::string what;
    std::string why;
    std::string words;
  };
  const std::vector<Case> cases = {
      {"a fault, its kernel named by the call and in flight",
       "device 0 hit a sticky fault: cuEventQuery failed for kernel 'gx_fault' of session "
       "5d629d64 on device 0: CUDA_ERROR_ILLEGAL_ADDRESS (700: an illegal memory access was "
       "encountered); kernels not yet synchronized then: kernel 'gx_fault' of session 5d629d64 "
       "on device 0 (launched 17:00:01.100 UTC)",
       "its kernel 'gx_fault' made an illegal memory access (CUDA_ERROR_ILLEGAL_ADDRESS) and "
       "reset device 0 at 17:00:01.234 UTC"},
      {"a hang",
       "kernel 'spin' of session 5d629d64 on device 0 has run for 612 ms, past its "
       "kernel time limit of 500 ms",
       "its kernel 'spin' ran past its kernel time limit of 500 ms and reset device 0 at "
       "17:00:01.234 UTC"},
      {"two of its kernels in flight",
       "device 0 hit a sticky fault: cuStreamSynchronize: CUDA_ERROR_MISALIGNED_ADDRESS; kernels "
       "not yet synchronized then: kernel 'a' of session 5d629d64 on device 0 (launched ...); "
       "kernel 'b' of session 5d629d64 on device 0 (launched ...)",
       "one of its 2 kernels in flight made a misaligned memory access "
       "(CUDA_ERROR_MISALIGNED_ADDRESS) and reset device 0 at 17:00:01.234 UTC"},
      {"its kernel and another session's in flight",
       "device 0 hit a sticky fault: cuStreamSynchronize: CUDA_ERROR_ASSERT; kernels not yet "
       "synchronized then: kernel 'a' of session 5d629d64 on device 0 (launched ...); kernel 'a' "
       "of session 11111111 on device 0 (launched ...)",
       "one of the 2 kernels in flight (1 of them its own) failed a device-side assert "
       "(CUDA_ERROR_ASSERT) and reset device 0 at 17:00:01.234 UTC"},
      {"none of its kernels named (another worker's reset under MPS)",
       "cuMemGetInfo failed for device 0: CUDA_ERROR_ILLEGAL_ADDRESS",
       "a kernel of the session made an illegal memory access (CUDA_ERROR_ILLEGAL_ADDRESS) and "
       "reset device 0 at 17:00:01.234 UTC"},
      {"no CUDA error named", "kernel 'k' of session 5d629d64 on device 0 failed",
       "its kernel 'k' hit a sticky fault and reset device 0 at 17:00:01.234 UTC"},
      {"a name with an escaped quote and the owner clause in it",
       "kernel 'a\\' of session 11111111 on device 0' of session 5d629d64 on device 0: "
       "CUDA_ERROR_ASSERT",
       "its kernel 'a\\' of session 11111111 on device 0' failed a device-side assert "
       "(CUDA_ERROR_ASSERT) and reset device 0 at 17:00:01.234 UTC"},
      {"a long name, cut",
       absl::StrCat("kernel '", std::string(60, 'x'),
                    "' of session 5d629d64 on device 0: ", "CUDA_ERROR_ILLEGAL_ADDRESS"),
       absl::StrCat("its kernel '", std::string(40, 'x'), "...' made an illegal memory access ",
                    "(CUDA_ERROR_ILLEGAL_ADDRESS) and reset device 0 at 17:00:01.234 UTC")},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_EQ(ClosedByResetWords(c.why, "session 5d629d64", 0, at), c.words);
  }
  // The longest: a cut name of escapes, the longest words, device 15.
  std::string name;
  for (int i = 0; i < 30; ++i) name += "\\x01";
  const std::string longest = ClosedByResetWords(
      absl::StrCat("kernel '", name,
                   "' of session 5d629d64 on device 15: CUDA_ERROR_LAUNCH_FAILED"),
      "session 5d629d64", 15, at);
  EXPECT_THAT(longest, ::testing::StartsWith("its kernel '\\x01"));
  EXPECT_THAT(longest, ::testing::HasSubstr("\\x01...' failed while it ran"));
  EXPECT_LE(longest.size(), 200u) << longest;
}

}  // namespace
}  // namespace gpuexec::core
