// Unit test of the NVRTC double's markers and bounds: the compile bombs
// (crash, spin, memory), the markers that delay or warn, distinct programs
// on distinct threads, and hostile sources. Tests that crash, spin or
// exhaust memory run in a fork()ed child.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "server/compile/nvrtc_api.h"
#include "tests/fake_cuda/image_reader.h"
#include "tests/fake_nvrtc/fake_nvrtc_test_util.h"

namespace gxnvrtc_test {
namespace {

using ::testing::HasSubstr;

TEST(FakeNvrtc, WarnMarkerLeavesAWarningInASuccessfulLog) {
  Program prog("extern \"C\" __global__ void k(int x) {}\n// GXFAKE_COMPILE_WARN\n");
  ASSERT_EQ(prog.Compile({"-arch=sm_90"}), NVRTC_SUCCESS);
  EXPECT_THAT(prog.Log(), HasSubstr("prog.cu(2): warning #177-D: variable \"x\" was declared but "
                                    "never referenced\n"));
  EXPECT_EQ(Read(prog.Cubin()).size(), 1u);
}

TEST(FakeNvrtc, SleepMarkerDelaysThenCompiles) {
  Program prog("// GXFAKE_COMPILE_SLEEP_MS=200\nextern \"C\" __global__ void k(int x) {}\n");
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(prog.Compile({"-arch=sm_90"}), NVRTC_SUCCESS);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
  EXPECT_EQ(Read(prog.Cubin()).size(), 1u);
}

// Runs `body` in a child; its wait status.
template <typename Body>
int InChild(Body body, std::chrono::milliseconds deadline, bool* still_running) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  const auto end = std::chrono::steady_clock::now() + deadline;
  *still_running = true;
  while (std::chrono::steady_clock::now() < end) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      *still_running = false;
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return status;
}

int CompileInChild(const char* source) {
  Program prog(source);
  return prog.Compile({"-arch=sm_90"});
}

TEST(FakeNvrtc, CrashMarkerRaisesSigsegv) {
  Nvrtc();  // resolved before the fork
  bool running = false;
  const int status = InChild([] { return CompileInChild("// GXFAKE_COMPILE_CRASH\n"); },
                             std::chrono::seconds(30), &running);
  ASSERT_FALSE(running);
#if defined(__SANITIZE_ADDRESS__)
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0);  // ASan reports the SEGV
#else
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGSEGV);
#endif
}

TEST(FakeNvrtc, SpinMarkerNeverReturns) {
  Nvrtc();
  bool running = false;
  const int status = InChild([] { return CompileInChild("/* GXFAKE_COMPILE_SPIN */\n"); },
                             std::chrono::milliseconds(500), &running);
  EXPECT_TRUE(running);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
}

TEST(FakeNvrtc, AllocMarkerTakesMemoryUntilTheLimitThenFails) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves more address space than an RLIMIT_AS leaves";
#else
  Nvrtc();
  bool running = false;
  const int status = InChild(
      [] {
        const rlim_t limit = rlim_t{1} << 30;
        const rlimit rl{limit, limit};
        if (setrlimit(RLIMIT_AS, &rl) != 0) return 10;
        rusage before{};
        getrusage(RUSAGE_SELF, &before);
        Program prog("GXFAKE_COMPILE_ALLOC\n");
        if (prog.Compile({}) != NVRTC_ERROR_OUT_OF_MEMORY) return 11;
        if (prog.Log() != "nvrtc: error: out of memory\n") return 12;
        rusage after{};
        getrusage(RUSAGE_SELF, &after);
        // The pages were touched: the peak resident set grew by over 512 MiB.
        return after.ru_maxrss - before.ru_maxrss > 512 * 1024 ? 0 : 13;
      },
      std::chrono::seconds(60), &running);
  ASSERT_FALSE(running);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
#endif
}

TEST(FakeNvrtc, DistinctProgramsCompileOnDistinctThreads) {
  std::vector<std::thread> threads;
  std::vector<std::string> results(8);
  for (size_t t = 0; t < results.size(); ++t) {
    threads.emplace_back([t, &results] {
      for (int round = 0; round < 20; ++round) {
        const std::string name = "k" + std::to_string(t);
        Program prog("template <typename T> __global__ void " + name +
                     "(T a, T* b) {}\nextern \"C\" __global__ void c" + std::to_string(t) +
                     "(int x) {}\n");
        const std::string expression = name + "<double>";
        prog.Add(expression.c_str());
        if (prog.Compile({"-arch=sm_90"}) != NVRTC_SUCCESS) return;
        std::vector<ImageKernel> kernels;
        std::string error;
        const std::string cubin = prog.Cubin();
        if (!ReadImage(reinterpret_cast<const uint8_t*>(cubin.data()), cubin.size(), &kernels,
                       &error) ||
            kernels.size() != 2) {
          return;
        }
        results[t] = prog.Lowered(expression.c_str());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t t = 0; t < results.size(); ++t) {
    EXPECT_EQ(results[t], "_Z2k" + std::to_string(t) + "IdEvT_PS0_");
  }
}

// Hostile and truncated sources end in a result, never a fault (run under
// ASan/UBSan too) or a hang.
TEST(FakeNvrtc, HostileSourcesEndInAResult) {
  const std::string seed = ReadFile(GXFAKE_NVRTC_KERNELS) +
                           "#if defined(X) && (1 < 2 || !Y)\n#include \"h\"\n#endif\n"
                           "template <typename T, int N> __global__ void nt(T a) {}\n"
                           "extern \"C\" __global__ __launch_bounds__(128) void lb(int* p) {}\n";
  std::vector<std::string> sources;
  for (size_t cut = 0; cut <= seed.size(); cut += 7) sources.push_back(seed.substr(0, cut));
  std::mt19937 rng(12345);
  for (int i = 0; i < 300; ++i) {
    std::string s = seed;
    for (int k = 0; k < 8; ++k) {
      s[rng() % s.size()] = static_cast<char>("(){}<>,*;#\"'/\\\n\x01\xff_aT"[rng() % 21]);
    }
    sources.push_back(s);
  }
  sources.push_back(std::string(200000, '('));
  sources.push_back(std::string(100000, '<'));
  sources.push_back("extern \"C\" __global__ void k(int" + std::string(100000, '*') + " p) {}\n");
  sources.push_back("#if " + std::string(10000, '(') + "1\n#endif\n");
  sources.push_back("#if " + std::string(10000, '!') + "1\n#endif\n");
  sources.push_back(std::string(5000, '#') + "\n#if\n#elif\n#else\n#endif\n#endif\n#define\n");
  sources.push_back("template <" + std::string(50000, '<') + " __global__ void k() {}\n");
  sources.push_back("/* never closed \n extern \"C\" __global__ void k() {}\n");
  sources.push_back("extern \"C\" __global__ void k(\"unterminated) {}\n");
  for (const std::string& source : sources) {
    Program prog(source);
    prog.Add("saxpy<float>");
    const nvrtcResult r = prog.Compile({"-arch=sm_90"});
    EXPECT_TRUE(r == NVRTC_SUCCESS || r == NVRTC_ERROR_COMPILATION) << r;
    if (r == NVRTC_SUCCESS) Read(prog.Cubin());
    prog.Log();
  }
  // Headers that include each other twice over, 30 levels deep: 2^30
  // inclusions unless the double stops reading.
  std::vector<std::pair<std::string, std::string>> diamond;
  for (int i = 0; i < 30; ++i) {
    const std::string next = "#include \"d" + std::to_string(i + 1) + "\"\n";
    diamond.emplace_back("d" + std::to_string(i), next + next);
  }
  diamond.emplace_back("d30", "extern \"C\" __global__ void k() {}\n");
  Program prog("#include \"d0\"\n", "prog.cu", diamond);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(prog.Compile({}), NVRTC_ERROR_COMPILATION);
  EXPECT_THAT(prog.Log(), HasSubstr("catastrophic error: the NVRTC double "));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

}  // namespace
}  // namespace gxnvrtc_test
