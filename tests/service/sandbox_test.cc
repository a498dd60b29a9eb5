// The worker as a sandbox (server/worker/sandbox.h): gpuexecd processes on
// the test double, whose workers load a stand-in driver (sandbox_probe.cc)
// that tries, from inside each worker, what an attacker's code there would
// try against the front; and the staging slots cleared on release.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon_process.h"
#include "server/port/staging.h"
#include "service_test_fixture.h"

namespace gpuexec::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using Probe = std::map<std::string, std::string>;

// The probes' reports of one daemon, one per worker: `prefix`.<pid>.
std::vector<Probe> ReadProbes(const std::string& prefix) {
  std::vector<Probe> out;
  const std::filesystem::path dir = std::filesystem::path(prefix).parent_path();
  const std::string stem = std::filesystem::path(prefix).filename().string() + ".";
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (!absl::StartsWith(name, stem) || absl::EndsWith(name, ".tmp")) continue;
    auto text = ReadFile(e.path().string());
    if (!text) continue;
    Probe p;
    for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
      std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
      p[kv.first] = kv.second;
    }
    if (p.count("end") != 0) out.push_back(std::move(p));
  }
  return out;
}

class SandboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!TestBackend().fake) GTEST_SKIP() << "the probe stands in for the test double only";
    prefix_ = absl::StrCat(::testing::TempDir(), "gxprobe-", getpid(), "-", counter_++);
    log_ = prefix_ + ".log";
  }
  void TearDown() override {
    for (const Probe& p : ReadProbes(prefix_)) {
      std::filesystem::remove(absl::StrCat(prefix_, ".", p.at("pid")));
    }
    std::filesystem::remove(log_);
  }

  // A daemon on the probe with two devices (two workers), at info level
  // (device printf is logged at info); waits for both probes' reports.
  std::vector<Probe> RunDaemon(const std::vector<std::string>& flags) {
    DaemonProcess::Options o;
    o.env = {{"GXPROBE_OUT", prefix_}, {"GXFAKE_DEVICE_COUNT", "2"}};
    o.log_path = log_;
    std::vector<std::string> args = {absl::StrCat("--driver=", GPUEXEC_TEST_SANDBOX_PROBE),
                                     "--log_level=info"};
    args.insert(args.end(), flags.begin(), flags.end());
    daemon_ = std::make_unique<DaemonProcess>(args, o);
    std::vector<Probe> probes;
    EXPECT_TRUE(WaitFor(
        [&] {
          probes = ReadProbes(prefix_);
          return probes.size() == 2;
        },
        absl::Seconds(60)))
        << "the workers' probes did not report; the daemon's log:\n"
        << ReadFile(log_).value_or("(none)");
    return probes;
  }

  static inline int counter_ = 0;
  std::string prefix_;
  std::string log_;
  std::unique_ptr<DaemonProcess> daemon_;
};

// Descriptors a worker may hold when the driver loads: stdin, stdout (the
// pipe to the front's reader), stderr, its socket, its rings, its
// descriptor socket (worker_main.h); its staging (4) is closed by then.
bool Expected(int fd) { return fd <= 10 && fd != 4; }

TEST_F(SandboxTest, AWorkerReachesNeitherTheFrontNorOtherTenantsStaging) {
  std::vector<Probe> probes = RunDaemon({});
  ASSERT_EQ(probes.size(), 2u);
  for (const Probe& p : probes) {
    SCOPED_TRACE(absl::StrCat("worker pid ", p.at("pid")));
    EXPECT_EQ(p.at("front"), absl::StrCat(daemon_->pid()));
    EXPECT_EQ(p.at("dumpable"), "0");
    EXPECT_EQ(p.at("no_new_privs"), "1");
    EXPECT_EQ(p.at("seccomp"), "2");
    // CAP_SYS_PTRACE (19) is gone where the daemon had it (run as root).
    uint64_t caps = 0;
    ASSERT_TRUE(absl::SimpleHexAtoi(p.at("cap_eff"), &caps)) << p.at("cap_eff");
    EXPECT_EQ(caps & (uint64_t{1} << 19), 0u) << "CapEff " << p.at("cap_eff");
    EXPECT_EQ(caps & (uint64_t{1} << 21), 0u) << "CAP_SYS_ADMIN kept: " << p.at("cap_eff");
    // The front's /proc: dumpable 0 there, and no CAP_SYS_PTRACE here.
    // (Listing /proc/<front>/fd may still work for a root-run worker,
    // which keeps CAP_DAC_OVERRIDE; opening what it lists does not.)
    EXPECT_EQ(p.at("front_fds_opened"), "0");
    EXPECT_EQ(p.at("front_fd_error"), "EACCES");
    EXPECT_NE(p.at("front_mem"), "ok");
    // The filter (ptrace also fails by the front's dumpable 0, in a
    // sanitized build that keeps ptrace for LeakSanitizer).
    EXPECT_EQ(p.at("ptrace"), "EPERM");
    EXPECT_EQ(p.at("process_vm_readv"), "EPERM");
    EXPECT_EQ(p.at("unshare"), "EPERM");
    // Only its own descriptors; no staging memfd (its own is mapped and
    // closed, the other worker's never reaches it).
    for (const auto& [key, target] : p) {
      if (!absl::StartsWith(key, "fd ")) continue;
      int fd = -1;
      ASSERT_TRUE(absl::SimpleAtoi(key.substr(3), &fd));
      EXPECT_TRUE(Expected(fd)) << "worker holds fd " << fd << " -> " << target;
      EXPECT_THAT(target, Not(HasSubstr("gpuexec-staging"))) << "fd " << fd;
    }
  }
  // Device printf: in the daemon's log, escaped, each line named by its
  // worker; nothing raw (no terminal escape, no forged line of its own).
  std::string log;
  EXPECT_TRUE(WaitFor(
      [&] {
        log = ReadFile(log_).value_or("");
        return absl::StrContains(log, "forged line\"");
      },
      absl::Seconds(20)))
      << log;
  EXPECT_THAT(log, HasSubstr("worker (pid "));
  EXPECT_THAT(log, HasSubstr("printed: \"gxprobe says \\x1b[2J hello\""));
  EXPECT_THAT(log, HasSubstr("printed: \"I 00:00:00 forged line\""));
  EXPECT_EQ(log.find('\x1b'), std::string::npos) << "a raw escape reached the log";
  EXPECT_THAT(log, Not(HasSubstr("\nI 00:00:00 forged line")));
  EXPECT_EQ(daemon_->Stop(), 0);
}

// --worker_sandbox=off: no filter, no no_new_privs (a profiler's way in);
// the front stays undumpable and the descriptors stay the worker's own.
TEST_F(SandboxTest, OffLeavesTheFilterOutAndTheFrontUndumpable) {
  std::vector<Probe> probes = RunDaemon({"--worker_sandbox=off"});
  ASSERT_EQ(probes.size(), 2u);
  for (const Probe& p : probes) {
    SCOPED_TRACE(absl::StrCat("worker pid ", p.at("pid")));
    EXPECT_EQ(p.at("dumpable"), "0");
    EXPECT_EQ(p.at("no_new_privs"), "0");
    EXPECT_EQ(p.at("seccomp"), "0");
    EXPECT_EQ(p.count("ptrace"), 0u);
    uint64_t caps = 0;
    ASSERT_TRUE(absl::SimpleHexAtoi(p.at("cap_eff"), &caps)) << p.at("cap_eff");
    if ((caps & (uint64_t{1} << 19)) == 0) {
      // Without CAP_SYS_PTRACE, the front's dumpable 0 alone stops it.
      EXPECT_EQ(p.at("front_fds_opened"), "0");
    } else {
      // A root-run worker left with CAP_SYS_PTRACE gets in: the probe sees
      // what the sandbox takes away.
      EXPECT_NE(p.at("front_fds_opened"), "0");
    }
    for (const auto& [key, target] : p) {
      if (!absl::StartsWith(key, "fd ")) continue;
      EXPECT_THAT(target, Not(HasSubstr("gpuexec-staging"))) << key;
    }
  }
  EXPECT_THAT(ReadFile(log_).value_or(""), HasSubstr("no sandbox (GPUEXEC_WORKER_SANDBOX=off)"));
  EXPECT_EQ(daemon_->Stop(), 0);
}

TEST(SandboxFlagTest, AnUnknownValueIsRefusedByName) {
  const std::string log = absl::StrCat(::testing::TempDir(), "gxsandbox-flag-", getpid(), ".log");
  DaemonProcess::Options o;
  o.log_path = log;
  DaemonProcess d({"--worker_sandbox=maybe\x1b"}, o);
  std::string text;
  EXPECT_TRUE(WaitFor(
      [&] {
        text = ReadFile(log).value_or("");
        return absl::StrContains(text, "--worker_sandbox");
      },
      absl::Seconds(20)));
  // It exits by itself (a sanitized build takes a while to): no signal.
  EXPECT_EQ(d.WaitExit(absl::Seconds(60)), 2);
  EXPECT_THAT(text, HasSubstr("--worker_sandbox must be on or off, not 'maybe\\x1b'"));
  std::filesystem::remove(log);
}

// C2's leftover: a slot's bytes are gone once it is released, whoever
// takes it next. Prints what clearing costs beside a copy of the slot.
TEST(StagingPoolTest, ClearsASlotOnRelease) {
  constexpr size_t kSlot = 1 << 20;
  std::vector<uint8_t> memory(2 * kSlot, 0);
  port::StagingPool pool;
  pool.Reset({memory.data(), memory.data() + kSlot}, kSlot);
  port::StagingSlot held;
  pool.Acquire([&](port::StagingSlot s) { held = s; });
  ASSERT_NE(held.data, nullptr);
  std::memset(held.data, 0xAB, kSlot);
  // Handed straight to a waiter (both slots taken) and to the free list.
  port::StagingSlot other;
  pool.Acquire([&](port::StagingSlot s) { other = s; });
  port::StagingSlot next;
  pool.Acquire([&](port::StagingSlot s) { next = s; });
  EXPECT_EQ(next.data, nullptr);  // waits
  pool.Release(held);
  ASSERT_EQ(next.data, held.data);
  EXPECT_EQ(std::count(next.data, next.data + kSlot, 0), static_cast<ptrdiff_t>(kSlot));
  std::memset(next.data, 0xCD, kSlot);
  pool.Release(next);
  pool.Release(other);
  EXPECT_EQ(pool.free_slots(), 2u);
  EXPECT_EQ(std::count(memory.begin(), memory.end(), 0), static_cast<ptrdiff_t>(2 * kSlot));

  // The figure for the README: release (clear) against a copy of 1 MiB.
  std::vector<uint8_t> source(kSlot, 0x5A);
  constexpr int kRounds = 256;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kRounds; ++i) {
    port::StagingSlot s;
    pool.Acquire([&](port::StagingSlot got) { s = got; });
    pool.Release(s);
  }
  const auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < kRounds; ++i) {
    std::memcpy(memory.data() + (i % 2) * kSlot, source.data(), kSlot);
  }
  const auto t2 = std::chrono::steady_clock::now();
  const double clear_us = std::chrono::duration<double, std::micro>(t1 - t0).count() / kRounds;
  const double copy_us = std::chrono::duration<double, std::micro>(t2 - t1).count() / kRounds;
  std::printf("[ figures  ] 1 MiB slot: release with clear %.1f us, copy %.1f us\n", clear_us,
              copy_us);
  RecordProperty("clear_us", static_cast<int>(clear_us));
  RecordProperty("copy_us", static_cast<int>(copy_us));
}

}  // namespace
}  // namespace gpuexec::testing
