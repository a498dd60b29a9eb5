#ifndef GPUEXEC_TESTS_CLI_CLI_FIXTURE_H_
#define GPUEXEC_TESTS_CLI_CLI_FIXTURE_H_

// The fixture of the gpuexec tool's end-to-end tests (cli_test.cc,
// cli_results_test.cc, cli_triton_test.cc, cli_top_test.cc): a gpuexecd
// process (a suite may start it with flags and a tenants file of its own:
// StartSuiteDaemon), its metrics endpoint on a loopback port, and the
// gpuexec binary run as a process against it, its stdout, stderr, exit
// status and files checked. The environment picks the pieces:
//   GPUEXEC_CLI           the gpuexec binary
//   GPUEXEC_TEST_DAEMON   the gpuexecd binary
//   GPUEXEC_TEST_DRIVER   the driver library the daemon opens (the libcuda
//                         test double, or libcuda.so.1)
//   GPUEXEC_TEST_KERNELS  the directory with gx_kernels.{cubin,ptx,fatbin}
// On the test double everything must work; on a real driver the tests are
// SKIPPED when the driver does not load, there is no device or the kernels
// were not built.

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gpuexec/sha256.h"
#include "gtest/gtest.h"
#include "tests/support/free_port.h"
#include "tests/support/http_exchange.h"

namespace gpuexec::testing {

inline std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

inline std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return std::nullopt;
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(file.good()) << "cannot write " << path;
}

template <typename T>
inline std::string BytesOf(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

template <typename T>
inline std::vector<T> ValuesOf(const std::string& bytes) {
  std::vector<T> values(bytes.size() / sizeof(T));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
  return values;
}

// Polls `done` until it is true or `timeout` has passed; its last answer.
template <typename F>
inline bool WaitFor(F done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return done();
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

// A child process with stdout and stderr in files; killed if still running
// when destroyed.
class Process {
 public:
  Process(const std::vector<std::string>& argv, const std::string& out_path,
          const std::string& err_path, const std::vector<std::string>& env = {}) {
    pid_ = fork();
    if (pid_ == 0) {
      const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out < 0 || err < 0) _exit(126);
      dup2(out, STDOUT_FILENO);
      dup2(err, STDERR_FILENO);
      for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~Process() { Kill(); }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool running() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_) return true;
    status_ = status;
    pid_ = -1;
    return false;
  }
  // The exit status, or -1 if it has not exited by `timeout` (then killed).
  int Wait(absl::Duration timeout) {
    if (!WaitFor([&] { return !running(); }, timeout)) {
      Kill();
      return -1;
    }
    return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
  }
  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status_, 0);
      pid_ = -1;
    }
  }

 private:
  pid_t pid_ = -1;
  int status_ = 0;
};

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::ostream& operator<<(std::ostream& os, const Result& r) {
  return os << "exit " << r.exit_code << "\n--- stdout\n" << r.out << "--- stderr\n" << r.err;
}

// The suite's daemon, started once.
class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { StartSuiteDaemon({}, ""); }

  // Starts the suite's daemon with `extra_flags` and, when `tenants` is not
  // empty, a tenants file of that text. Each start has a directory of its
  // own.
  static void StartSuiteDaemon(const std::vector<std::string>& extra_flags,
                               const std::string& tenants) {
    static int started = 0;
    dir_ = new std::string(
        absl::StrCat(::testing::TempDir(), "gpuexec-cli-test-", getpid(), "-", started++));
    mkdir(dir_->c_str(), 0755);
    skip_ = new std::string;
    failure_ = new std::string;
    // The build says why this backend cannot serve (the GPU entry, where
    // nvcc did not build the kernels).
    if (!Env("GPUEXEC_TEST_SKIP").empty()) {
      *skip_ = Env("GPUEXEC_TEST_SKIP");
      return;
    }
    const std::string driver = Env("GPUEXEC_TEST_DRIVER");
    kernels_ = new std::string(Env("GPUEXEC_TEST_KERNELS"));
    if (Env("GPUEXEC_CLI").empty() || Env("GPUEXEC_TEST_DAEMON").empty() || driver.empty()) {
      *failure_ = "set GPUEXEC_CLI, GPUEXEC_TEST_DAEMON, GPUEXEC_TEST_DRIVER, GPUEXEC_TEST_KERNELS";
      return;
    }
    // The test double exports its counters; a real driver does not.
    void* handle = dlopen(driver.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* error = dlerror();
      *skip_ = absl::StrCat("driver library ", driver,
                            " cannot be loaded: ", error != nullptr ? error : "?");
      return;
    }
    fake_ = dlsym(handle, "gxfake_module_loads") != nullptr;
    dlclose(handle);
    std::string& cannot = fake_ ? *failure_ : *skip_;
    if (!ReadFile(KernelPath())) {
      cannot = absl::StrCat("kernel image ", KernelPath(), " is missing");
      return;
    }
    socket_ = new std::string(absl::StrCat(*dir_, "/d.sock"));
    daemon_log_ = new std::string(absl::StrCat(*dir_, "/gpuexecd.log"));
    metrics_port_ = FreePort();
    // With a host memory socket: `run` moves large files through it.
    std::vector<std::string> argv = {Env("GPUEXEC_TEST_DAEMON"),
                                     "--listen=",
                                     absl::StrCat("--unix_socket=", *socket_),
                                     absl::StrCat("--shm_socket=", *dir_, "/shm.sock"),
                                     absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port_),
                                     absl::StrCat("--driver=", driver)};
    if (!tenants.empty()) {
      WriteFile(Path("tenants.textproto"), tenants);
      argv.push_back(absl::StrCat("--tenants=", Path("tenants.textproto")));
    }
    argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
    daemon_ = new Process(argv, absl::StrCat(*dir_, "/gpuexecd.out"), *daemon_log_);
    // Ready once it says so on stderr.
    const bool ready = WaitFor(
        [] {
          return !daemon_->running() ||
                 absl::StrContains(ReadFile(*daemon_log_).value_or(""), "gpuexecd serving");
        },
        absl::Seconds(60));
    if (!ready || !daemon_->running()) {
      *failure_ = absl::StrCat("gpuexecd did not start:\n", ReadFile(*daemon_log_).value_or(""));
      return;
    }
    // A daemon without a device serves, with no devices.
    Result devices = RunCli({"devices"});
    if (devices.exit_code == 0 && absl::StartsWith(devices.out, "no devices")) {
      cannot = absl::StrCat("driver ", driver, " has no usable device");
    }
  }

  static void TearDownTestSuite() {
    delete daemon_;  // kills it
    daemon_ = nullptr;
  }

  void SetUp() override {
    if (!failure_->empty()) FAIL() << *failure_;
    if (!skip_->empty()) GTEST_SKIP() << *skip_;
  }

  static std::string KernelPath() { return absl::StrCat(*kernels_, "/gx_kernels.cubin"); }
  // The suite daemon's metric `name` (summed over its labels); -1 if the
  // endpoint is not reached.
  static int64_t Metric(const std::string& name) {
    const std::optional<std::string> response =
        HttpExchange(metrics_port_, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
    if (!response) return -1;
    int64_t sum = 0;
    for (absl::string_view line : absl::StrSplit(*response, '\n')) {
      if (!absl::StartsWith(line, name) || line.size() == name.size()) continue;
      if (line[name.size()] != ' ' && line[name.size()] != '{') continue;
      double value = 0;
      if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) {
        sum += static_cast<int64_t>(value);
      }
    }
    return sum;
  }
  static std::string Target() { return absl::StrCat("unix:", *socket_); }
  // The daemon's --metrics_listen address.
  static std::string MetricsAddress() { return absl::StrCat("127.0.0.1:", metrics_port_); }
  static std::string Path(absl::string_view name) { return absl::StrCat(*dir_, "/", name); }

  // gpuexec --target=<the suite's daemon> ARGS...
  static Result RunCli(const std::vector<std::string>& args) {
    std::vector<std::string> all = {absl::StrCat("--target=", Target())};
    all.insert(all.end(), args.begin(), args.end());
    return RunRaw(all);
  }

  // gpuexec ARGS... as given.
  static Result RunRaw(const std::vector<std::string>& args,
                       const std::vector<std::string>& env = {}) {
    static int counter = 0;
    const std::string out = Path(absl::StrCat("cli-", counter, ".out"));
    const std::string err = Path(absl::StrCat("cli-", counter++, ".err"));
    std::vector<std::string> argv = {Env("GPUEXEC_CLI")};
    argv.insert(argv.end(), args.begin(), args.end());
    Result r;
    {
      Process p(argv, out, err, env);
      r.exit_code = p.Wait(absl::Seconds(120));
    }
    r.out = ReadFile(out).value_or("");
    r.err = ReadFile(err).value_or("");
    return r;
  }

  static bool fake() { return fake_; }

 private:
  static inline std::string* dir_ = nullptr;
  static inline std::string* kernels_ = nullptr;
  static inline std::string* socket_ = nullptr;
  static inline int metrics_port_ = 0;
  static inline std::string* daemon_log_ = nullptr;
  static inline std::string* skip_ = nullptr;
  static inline std::string* failure_ = nullptr;
  static inline Process* daemon_ = nullptr;
  static inline bool fake_ = false;
};

// A failure is one line on stderr, "gpuexec: ...", and nothing on stdout
// after the failing step.
inline void ExpectOneErrorLine(const Result& r) {
  EXPECT_THAT(r.err, ::testing::StartsWith("gpuexec: ")) << r;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r;
}

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_CLI_CLI_FIXTURE_H_
