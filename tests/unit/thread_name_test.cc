// A named thread has a signal stack of its own, so that the daemon's crash
// report is written when that thread overflows its stack.
#include "server/common/thread_name.h"

#include <climits>
#include <thread>

#include "absl/debugging/failure_signal_handler.h"
#include "gtest/gtest.h"

namespace gpuexec {
namespace {

TEST(ThreadNameTest, ANamedThreadHasASignalStackAndAnUnnamedOneNone) {
  bool named = false;
  bool unnamed = true;
  std::thread([&] {
    NameThisThread("gx-test");
    named = ThisThreadHasSignalStack();
    NameThisThread("gx-test-again");  // keeps the one it has
    named = named && ThisThreadHasSignalStack();
  }).join();
  std::thread([&] { unnamed = ThisThreadHasSignalStack(); }).join();
  EXPECT_TRUE(named);
  EXPECT_FALSE(unnamed);
}

volatile int g_depth_limit = INT_MAX;

// Runs the thread's stack out (the limit is never reached).
int Overflow(int depth) {
  volatile char frame[4096];
  frame[0] = static_cast<char>(depth);
  if (depth >= g_depth_limit) return frame[0];
  return Overflow(depth + 1) + frame[0];
}

TEST(ThreadNameDeathTest, AnOverflowInANamedThreadIsReported) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's own handler reports crashes in this build";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  GTEST_SKIP() << "a sanitizer's own handler reports crashes in this build";
#endif
#endif
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // As gpuexecd installs it; without the thread's own signal stack the
  // handler cannot run on an overflowed stack, and the process dies with
  // no report.
  EXPECT_DEATH(
      {
        absl::InstallFailureSignalHandler(absl::FailureSignalHandlerOptions());
        std::thread([] {
          NameThisThread("gx-overflow");
          (void)Overflow(0);
        }).join();
      },
      "\\*\\*\\* SIGSEGV received");
}

}  // namespace
}  // namespace gpuexec
