// The gpuexec tool end to end: a gpuexecd process, and the gpuexec binary
// run as a process against it, its stdout, stderr, exit status and files
// checked. The environment picks the pieces:
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
#include <pty.h>
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
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return std::nullopt;
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(file.good()) << "cannot write " << path;
}

template <typename T>
std::string BytesOf(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

template <typename T>
std::vector<T> ValuesOf(const std::string& bytes) {
  std::vector<T> values(bytes.size() / sizeof(T));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
  return values;
}

// Polls `done` until it is true or `timeout` has passed; its last answer.
template <typename F>
bool WaitFor(F done, absl::Duration timeout) {
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

std::ostream& operator<<(std::ostream& os, const Result& r) {
  return os << "exit " << r.exit_code << "\n--- stdout\n" << r.out << "--- stderr\n" << r.err;
}

// The suite's daemon, started once.
class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(absl::StrCat(::testing::TempDir(), "gpuexec-cli-test-", getpid()));
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
    daemon_ = new Process(
        {Env("GPUEXEC_TEST_DAEMON"), "--listen=", absl::StrCat("--unix_socket=", *socket_),
         absl::StrCat("--shm_socket=", *dir_, "/shm.sock"),
         absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port_),
         absl::StrCat("--driver=", driver)},
        absl::StrCat(*dir_, "/gpuexecd.out"), *daemon_log_);
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
void ExpectOneErrorLine(const Result& r) {
  EXPECT_THAT(r.err, StartsWith("gpuexec: ")) << r;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r;
}

// ------------------------------------------------------------ help and usage

TEST_F(CliTest, HelpExplainsTheCommandsAndArguments) {
  Result r = RunRaw({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("Usage: gpuexec"));
  EXPECT_THAT(r.out, HasSubstr("gpuexec run saxpy.cubin saxpy --grid=4096 --block=256"));
  EXPECT_EQ(r.err, "");

  r = RunRaw({"help", "run"});
  EXPECT_EQ(r.exit_code, 0) << r;
  for (const char* s : {"in:FILE", "zeros:SIZE", "fill:TYPE:VALUE:COUNT", "out:SIZE:FILE",
                        "inout:FILE", "bytes:HEX", "null", "--triton=META.json", "f32:2.5"}) {
    EXPECT_THAT(r.out, HasSubstr(s));
  }
  Result same = RunRaw({"run", "--help"});
  EXPECT_EQ(same.exit_code, 0) << same;
  EXPECT_EQ(same.out, r.out);
}

TEST_F(CliTest, UsageErrorsExitTwoWithOneLine) {
  const std::string k = KernelPath();
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"frobnicate"}, "unknown command 'frobnicate'"},
      {{"devices", "--bogus=1"}, "unknown flag '--bogus=1'"},
      {{"devices", "extra"}, "devices takes no arguments"},
      {{"devices", "--grid=1"}, "--grid applies to 'run' only"},
      {{"load"}, "load takes one FILE"},
      {{"info", k, "gx_saxpy", "extra"}, "info takes FILE, or FILE KERNEL"},
      {{"help", "nothing"}, "no command 'nothing'"},
      {{"run", k, "gx_saxpy", "--block=256"}, "--grid is required"},
      {{"run", k, "gx_saxpy", "--grid=1"}, "--block is required"},
      {{"run", k, "gx_saxpy", "--grid=0", "--block=1"}, "--grid"},
      {{"run", k, "gx_saxpy", "--grid=1", "--block=1", "f32:two"}, "argument 0 'f32:two'"},
      {{"run", k, "gx_saxpy", "--grid=1", "--block=1", "f32:2", "x.bin"}, "argument 1 'x.bin'"},
      {{"run", k, "gx_saxpy", "--grid=1", "--block=1", "--shared=lots"}, "--shared"},
      {{"run", "--triton=m.json", k, "--grid=1", "--block=32"}, "--block comes from the Triton"},
      {{"--timeout=soon", "devices"}, "--timeout"},
      {{"--device=first", "load", k}, "--device"},
      {{"--memory=lots", "load", k}, "--memory: 'lots' is not a size"},
      {{"--min_cc=nine", "load", k}, "--min_cc: 'nine' is not a compute capability"},
      {{"--min_cc=9.0", "load", k}, "--min_cc places a session in a pool"},
      {{"--target=pool://127.0.0.1:1", "--device=0", "load", k}, "a pool target places"},
      {{"--target=pool://127.0.0.1", "devices"}, "is not HOST:PORT"},
  };
  for (const auto& [args, message] : cases) {
    // A case that names its own target runs as given.
    Result r = absl::StartsWith(args[0], "--target=") ? RunRaw(args) : RunCli(args);
    EXPECT_EQ(r.exit_code, 2) << absl::StrJoin(args, " ") << "\n" << r;
    EXPECT_THAT(r.err, HasSubstr(message)) << absl::StrJoin(args, " ");
    ExpectOneErrorLine(r);
  }
  Result r = RunRaw({});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("Usage: gpuexec"));
}

TEST_F(CliTest, AnUnreachableDaemonIsOneLineAndExitOne) {
  Result r =
      RunRaw({absl::StrCat("--target=unix:", Path("nobody-here.sock")), "--timeout=2s", "devices"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("connect to unix:"));
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE"));
  ExpectOneErrorLine(r);
}

// A daemon with tenants: the token comes from --token_file or
// $GPUEXEC_TOKEN, and without it the daemon's refusal is the one line.
TEST_F(CliTest, ATokenFromAFileOrTheEnvironmentNamesTheTenant) {
  const std::string token = "cli-test-token-0123456789";
  const std::string tenants = Path("cli-tenants.textproto");
  std::ofstream(tenants) << "tenant { name: \"cli\" token_sha256: \"" << Sha256Hex(token)
                         << "\" }\n";
  std::ofstream(Path("cli-token")) << token << "\n";
  const std::string log = Path("cli-tenants-daemon.log");
  Process daemon({Env("GPUEXEC_TEST_DAEMON"), "--listen=127.0.0.1:0", "--tenants=" + tenants,
                  absl::StrCat("--driver=", Env("GPUEXEC_TEST_DRIVER"))},
                 Path("cli-tenants-daemon.out"), log);
  std::string port;
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::string text = ReadFile(log).value_or("");
        const size_t at = text.find("serving gpuexec.v1 on 127.0.0.1:");
        if (at == std::string::npos) return false;
        port = text.substr(at + 32, text.find(' ', at + 32) - at - 32);
        return true;
      },
      absl::Seconds(60)))
      << ReadFile(log).value_or("");
  const std::string target = absl::StrCat("--target=127.0.0.1:", port);

  Result none = RunRaw({target, "devices"});
  EXPECT_EQ(none.exit_code, 1) << none;
  EXPECT_THAT(none.err, HasSubstr("UNAUTHENTICATED: no credentials"));
  ExpectOneErrorLine(none);

  Result from_file = RunRaw({target, "--token_file=" + Path("cli-token"), "devices"});
  EXPECT_EQ(from_file.exit_code, 0) << from_file;
  EXPECT_THAT(from_file.out, StartsWith("DEVICE NAME"));

  Result from_env = RunRaw({target, "devices"}, {"GPUEXEC_TOKEN=" + token});
  EXPECT_EQ(from_env.exit_code, 0) << from_env;

  Result wrong = RunRaw({target, "devices"}, {"GPUEXEC_TOKEN=not-it"});
  EXPECT_EQ(wrong.exit_code, 1) << wrong;
  EXPECT_THAT(wrong.err, HasSubstr("unknown or revoked bearer token"));
  ExpectOneErrorLine(wrong);

  // Never in clear text to another host.
  Result remote = RunRaw({"--target=192.0.2.1:50051", "devices"}, {"GPUEXEC_TOKEN=" + token});
  EXPECT_EQ(remote.exit_code, 1) << remote;
  EXPECT_THAT(remote.err, HasSubstr("FAILED_PRECONDITION"));
  ExpectOneErrorLine(remote);

  Result missing = RunRaw({target, "--token_file=" + Path("no-such-token"), "devices"});
  EXPECT_EQ(missing.exit_code, 1) << missing;
  EXPECT_THAT(missing.err, HasSubstr("--token_file: cannot read"));
}

// ------------------------------------------------------------ devices, load, info

TEST_F(CliTest, DevicesListsTheDaemonsDevices) {
  Result r = RunCli({"devices"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_GE(lines.size(), 2u) << r;
  EXPECT_THAT(lines[0], StartsWith("DEVICE NAME"));
  std::vector<std::string> first = absl::StrSplit(lines[1], ' ', absl::SkipEmpty());
  EXPECT_EQ(first[0], "0") << lines[1];
  EXPECT_THAT(lines[1], HasSubstr("healthy"));
  EXPECT_THAT(lines[1], HasSubstr("GiB"));
  if (fake()) {
    EXPECT_THAT(lines[1], HasSubstr("9.0"));
  }
  EXPECT_EQ(r.err, "");
}

// A pool of three daemons on 127.0.0.1-3, each on the test double with its
// own device memory: `devices` lists every daemon's; `run` places its
// session where its --memory is free and says where on stderr; a daemon
// killed is listed as not answering and the next run goes elsewhere.
TEST_F(CliTest, APoolTargetPlacesTheSessionAndListsEveryDaemon) {
  if (!fake()) GTEST_SKIP() << "the pool test runs on the test double";
  const int port = FreePort();
  ASSERT_GT(port, 0);
  auto at = [&](int host) { return absl::StrCat("127.0.0.", host, ":", port); };
  const char* memory[] = {"268435456", "2147483648", "4294967296"};  // 256 MiB, 2 GiB, 4 GiB
  std::vector<std::unique_ptr<Process>> daemons;
  for (int host = 1; host <= 3; ++host) {
    const std::string log = Path(absl::StrCat("pool-", host, ".log"));
    daemons.push_back(std::make_unique<Process>(
        std::vector<std::string>{Env("GPUEXEC_TEST_DAEMON"), absl::StrCat("--listen=", at(host)),
                                 absl::StrCat("--driver=", Env("GPUEXEC_TEST_DRIVER"))},
        Path(absl::StrCat("pool-", host, ".out")), log,
        std::vector<std::string>{absl::StrCat("GXFAKE_MEMORY_BYTES=", memory[host - 1])}));
    ASSERT_TRUE(
        WaitFor([&] { return absl::StrContains(ReadFile(log).value_or(""), "gpuexecd serving"); },
                absl::Seconds(60)))
        << ReadFile(log).value_or("");
  }
  const std::string pool = absl::StrCat("--target=pool://", at(1), ",", at(2), ",", at(3));

  Result r = RunRaw({pool, "devices"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << r;
  EXPECT_THAT(lines[0], StartsWith("DAEMON"));
  for (int host = 1; host <= 3; ++host) {
    EXPECT_THAT(lines[host], StartsWith(at(host))) << r;
    EXPECT_THAT(lines[host], HasSubstr("healthy"));
  }

  // 3 GiB fits on the third daemon only.
  constexpr uint64_t n = 4096;
  std::vector<float> x(n, 1.0f), y(n, 2.0f);
  WriteFile(Path("pool-x.bin"), BytesOf(x));
  WriteFile(Path("pool-y.bin"), BytesOf(y));
  const std::vector<std::string> saxpy = {
      "run",
      KernelPath(),
      "gx_saxpy",
      "--grid=16",
      "--block=256",
      "f32:3",
      absl::StrCat("in:", Path("pool-x.bin")),
      absl::StrCat("inout:", Path("pool-y.bin"), ":", Path("pool-y-out.bin")),
      absl::StrCat("u64:", n)};
  std::vector<std::string> args = {pool, "--memory=3G"};
  args.insert(args.end(), saxpy.begin(), saxpy.end());
  r = RunRaw(args);
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.err, absl::StrCat("gpuexec: session on daemon ", at(3), ", device 0\n"));
  EXPECT_EQ(ReadFile(Path("pool-y-out.bin")), BytesOf(std::vector<float>(n, 5.0f)));

  // No device of compute capability 10.0 anywhere: refused, saying why.
  r = RunRaw({pool, "--min_cc=10.0", "load", KernelPath()});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("FAILED_PRECONDITION"));
  EXPECT_THAT(r.err, HasSubstr("3 below compute capability 10.0"));
  ExpectOneErrorLine(r);

  // The third daemon dies: listed as not answering; 1 GiB now goes to the
  // second, the only other with that much.
  daemons[2]->Kill();
  r = RunRaw({pool, "--timeout=2s", "devices"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("daemon ", at(3), ": UNAVAILABLE")));
  args = {pool, "--memory=1G"};
  args.insert(args.end(), saxpy.begin(), saxpy.end());
  r = RunRaw(args);
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.err, absl::StrCat("gpuexec: session on daemon ", at(2), ", device 0\n"));

  // None answers: the listing fails.
  daemons.clear();
  r = RunRaw({pool, "--timeout=1s", "devices"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("none of its 3 daemon(s) answered"));
}

TEST_F(CliTest, TheTargetComesFromTheEnvironmentToo) {
  Result r = RunRaw({"devices"}, {absl::StrCat("GPUEXEC_TARGET=", Target())});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("DEVICE NAME"));
}

TEST_F(CliTest, LoadTwiceUploadsOnceThenItIsCached) {
  // An image no one has loaded: the kernel file plus a unique tail (the
  // double ignores names it does not know; PTX takes a comment).
  std::string image = ReadFile(KernelPath()).value_or("");
  std::string path;
  if (fake()) {
    absl::StrAppend(&image, "gx_cli_test_image_", getpid(), "_", absl::ToUnixNanos(absl::Now()),
                    "\n");
    path = Path("unique.cubin");
  } else {
    image =
        ReadFile(absl::StrCat(KernelPath().substr(0, KernelPath().size() - 5), "ptx")).value_or("");
    absl::StrAppend(&image, "\n// gpuexec cli test ", getpid(), " ", absl::ToUnixNanos(absl::Now()),
                    "\n");
    path = Path("unique.ptx");
  }
  WriteFile(path, image);
  const std::string sha = Sha256Hex(image);

  Result first = RunCli({"load", path});
  ASSERT_EQ(first.exit_code, 0) << first;
  EXPECT_EQ(first.out, absl::StrCat(sha, "  ", path, "  uploaded\n"));
  Result second = RunCli({"load", path});
  ASSERT_EQ(second.exit_code, 0) << second;
  EXPECT_EQ(second.out, absl::StrCat(sha, "  ", path, "  cached\n"));
}

TEST_F(CliTest, LoadOfAMissingFileFails) {
  Result r = RunCli({"load", Path("missing.cubin")});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("missing.cubin"));
  ExpectOneErrorLine(r);
}

TEST_F(CliTest, InfoShowsTheParameterLayout) {
  Result r = RunCli({"info", KernelPath(), "gx_saxpy"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  auto header = std::find(lines.begin(), lines.end(), "PARAM  OFFSET  SIZE");
  ASSERT_NE(header, lines.end()) << r;
  std::vector<std::vector<uint64_t>> rows;
  for (auto it = header + 1; it != lines.end(); ++it) {
    std::vector<std::string> fields = absl::StrSplit(*it, ' ', absl::SkipEmpty());
    ASSERT_EQ(fields.size(), 3u) << *it;
    std::vector<uint64_t> row(3);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(absl::SimpleAtoi(fields[i], &row[i])) << *it;
    rows.push_back(row);
  }
  const std::vector<std::vector<uint64_t>> expected = {
      {0, 0, 4}, {1, 8, 8}, {2, 16, 8}, {3, 24, 8}};
  EXPECT_EQ(rows, expected) << r;
  EXPECT_THAT(r.out, HasSubstr("parameters                   4 (32 bytes)"));
  EXPECT_THAT(r.out, HasSubstr("max threads per block"));
  EXPECT_THAT(r.out, HasSubstr("registers per thread"));
  EXPECT_THAT(r.out, HasSubstr("static shared memory"));
}

TEST_F(CliTest, InfoOfAnUnknownKernelIsTheDaemonsNotFound) {
  Result r = RunCli({"info", KernelPath(), "gx_no_such_kernel"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("gx_no_such_kernel"));
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
  ExpectOneErrorLine(r);
}

// ------------------------------------------------------------ run

TEST_F(CliTest, RunSaxpyWritesTheOutputFile) {
  constexpr uint64_t n = 5000;  // not a multiple of the block
  const float a = 2.5f;
  std::vector<float> x(n), y(n);
  for (uint64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i) * 0.5f;
    y[i] = 1.0f - static_cast<float>(i);
  }
  WriteFile(Path("x.bin"), BytesOf(x));
  WriteFile(Path("y.bin"), BytesOf(y));
  std::remove(Path("y_out.bin").c_str());

  Result r = RunCli({"run", KernelPath(), "gx_saxpy", "--grid", "8", "--block", "256", "f32:2.5",
                     absl::StrCat("in:", Path("x.bin")),
                     absl::StrCat("inout:", Path("y.bin"), ":", Path("y_out.bin")),
                     absl::StrCat("u64:", n)});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("gx_saxpy: grid (8,1,1) block (256,1,1) shared 0: GPU time "));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("saved ", n * 4, " bytes of argument 2 to ",
                                            Path("y_out.bin"))));
  EXPECT_EQ(r.err, "");

  std::optional<std::string> out = ReadFile(Path("y_out.bin"));
  ASSERT_TRUE(out.has_value());
  ASSERT_EQ(out->size(), n * sizeof(float));
  std::vector<float> result = ValuesOf<float>(*out);
  uint64_t wrong = 0;
  for (uint64_t i = 0; i < n; ++i) {
    // The GPU may fuse a*x+y into one rounding.
    if (result[i] != a * x[i] + y[i] && result[i] != std::fma(a, x[i], y[i])) ++wrong;
  }
  EXPECT_EQ(wrong, 0u) << "y[1] = " << result[1] << ", expected " << a * x[1] + y[1];
  EXPECT_EQ(ReadFile(Path("y.bin")), BytesOf(y)) << "the input file must be left alone";
}

// A daemon on this host that serves host memory: files of a megabyte and
// more go through shared memory, not through the Write and Read streams.
TEST_F(CliTest, RunMovesLargeFilesThroughHostMemory) {
  constexpr uint64_t n = 1 << 19;  // 2 MiB of floats
  std::vector<float> x(n), y(n);
  for (uint64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 1000);
    y[i] = 3.0f;
  }
  WriteFile(Path("big_x.bin"), BytesOf(x));
  WriteFile(Path("big_y.bin"), BytesOf(y));
  const int64_t written = Metric("gpuexec_write_bytes_total");
  const int64_t read = Metric("gpuexec_read_bytes_total");
  ASSERT_GE(written, 0) << "the daemon's metrics endpoint is not reached";
  Result r = RunCli({"run", KernelPath(), "gx_saxpy", "--grid", absl::StrCat(n / 256), "--block",
                     "256", "f32:2", absl::StrCat("in:", Path("big_x.bin")),
                     absl::StrCat("inout:", Path("big_y.bin"), ":", Path("big_out.bin")),
                     absl::StrCat("u64:", n)});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::optional<std::string> out = ReadFile(Path("big_out.bin"));
  ASSERT_TRUE(out.has_value());
  ASSERT_EQ(out->size(), n * sizeof(float));
  const std::vector<float> result = ValuesOf<float>(*out);
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_EQ(result[i], 2.0f * x[i] + 3.0f) << "element " << i;
  }
  EXPECT_EQ(Metric("gpuexec_write_bytes_total"), written) << "an input went through Write";
  EXPECT_EQ(Metric("gpuexec_read_bytes_total"), read) << "the output went through Read";
  EXPECT_EQ(Metric("gpuexec_pinned_bytes"), 0) << "the regions outlived the run";
}

TEST_F(CliTest, RunFillIntoAnOutFile) {
  constexpr uint64_t n = 1000;
  Result r = RunCli({"run", KernelPath(), "gx_fill_u32", "--grid=2", "--block=128",
                     absl::StrCat("out:4K:", Path("fill.bin")), "u32:0xdeadbeef",
                     absl::StrCat("u64:", n)});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::optional<std::string> out = ReadFile(Path("fill.bin"));
  ASSERT_TRUE(out.has_value());
  ASSERT_EQ(out->size(), 4096u);
  std::vector<uint32_t> values = ValuesOf<uint32_t>(*out);
  for (uint64_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(values[i], i < n ? 0xdeadbeefu : 0u) << "element " << i;
  }
}

TEST_F(CliTest, RunWithAFilledBufferAnOffsetAndSave) {
  // 64 elements of 7; the kernel writes 16 elements from element 8 on.
  Result r = RunCli({"run", KernelPath(), "gx_fill_u32", "--grid=1", "--block=32",
                     absl::StrCat("fill:u32:7:64,offset=32,save=", Path("offset.bin")), "u32:9",
                     "u64:16"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::vector<uint32_t> values = ValuesOf<uint32_t>(ReadFile(Path("offset.bin")).value_or(""));
  ASSERT_EQ(values.size(), 64u);
  for (uint64_t i = 0; i < 64; ++i) {
    ASSERT_EQ(values[i], (i >= 8 && i < 24) ? 9u : 7u) << "element " << i;
  }
}

TEST_F(CliTest, RunPassesEveryScalarTypeBitExact) {
  Result r = RunCli({"run", KernelPath(), "gx_types", "--grid=1", "--block=1", "i8:-1", "i16:-2",
                     "u32:3", "i64:-4", "f16:1.5", "bf16:-2", "f32:0.25", "f64:-0.5",
                     absl::StrCat("out:64:", Path("types.bin"))});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::vector<uint64_t> bits = ValuesOf<uint64_t>(ReadFile(Path("types.bin")).value_or(""));
  const std::vector<uint64_t> expected = {
      0xff,   0xfffe, 3,          static_cast<uint64_t>(int64_t{-4}),
      0x3e00, 0xc000, 0x3e800000, 0xbfe0000000000000ull};
  EXPECT_EQ(bits, expected);
}

TEST_F(CliTest, RunPassesRawBytesForAStruct) {
  const std::string q("\x01\x00\x00\x00\x02\x00\x00\x00\x00\x00\xc0\x3f\x04\x00\x00\x00", 16);
  WriteFile(Path("quad.bin"), q);
  Result r = RunCli({"run", KernelPath(), "gx_struct", "--grid=1", "--block=1",
                     "bytes:01000000_02000000_0000c03f_04000000",
                     absl::StrCat("out:16:", Path("struct1.bin"))});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(ReadFile(Path("struct1.bin")), q);
  r = RunCli({"run", KernelPath(), "gx_struct", "--grid=1", "--block=1",
              absl::StrCat("bytes:@", Path("quad.bin")),
              absl::StrCat("out:16:", Path("struct2.bin"))});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(ReadFile(Path("struct2.bin")), q);
}

TEST_F(CliTest, RunWithDynamicSharedMemory) {
  Result r = RunCli({"run", KernelPath(), "gx_bigshared", "--grid=3", "--block=128", "--shared=64K",
                     absl::StrCat("out:12:", Path("shared.bin")), "u32:16384"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("shared 65536"));
  std::vector<uint32_t> sums = ValuesOf<uint32_t>(ReadFile(Path("shared.bin")).value_or(""));
  ASSERT_EQ(sums.size(), 3u);
  for (uint32_t b = 0; b < 3; ++b) {
    uint32_t sum = 0;
    for (uint32_t k = 0; k < 16384; ++k) sum += k ^ b;
    EXPECT_EQ(sums[b], sum) << "block " << b;
  }
}

TEST_F(CliTest, WrongArgumentCountNamesTheParameter) {
  Result few = RunCli(
      {"run", KernelPath(), "gx_saxpy", "--grid=1", "--block=32", "f32:1", "zeros:64", "zeros:64"});
  EXPECT_EQ(few.exit_code, 1) << few;
  EXPECT_THAT(few.err, HasSubstr("parameter 3 (offset 24, 8 bytes) has no argument"));
  ExpectOneErrorLine(few);

  Result many = RunCli({"run", KernelPath(), "gx_saxpy", "--grid=1", "--block=32", "f32:1",
                        "zeros:64", "zeros:64", "u64:16", "u64:1"});
  EXPECT_EQ(many.exit_code, 1) << many;
  EXPECT_THAT(many.err, HasSubstr("argument 4 (u64:1) has no parameter"));
  ExpectOneErrorLine(many);

  Result size = RunCli({"run", KernelPath(), "gx_saxpy", "--grid=1", "--block=32", "f32:1", "f32:2",
                        "zeros:64", "u64:16"});
  EXPECT_EQ(size.exit_code, 1) << size;
  EXPECT_THAT(size.err, HasSubstr("parameter 1 (offset 8) is 8 bytes; argument 1 (f32:2) is 4"));
  ExpectOneErrorLine(size);
}

TEST_F(CliTest, RunErrorsFromTheDaemonAreOneLine) {
  Result unknown = RunCli({"run", KernelPath(), "gx_nope", "--grid=1", "--block=1"});
  EXPECT_EQ(unknown.exit_code, 1) << unknown;
  EXPECT_THAT(unknown.err, HasSubstr("NOT_FOUND"));
  EXPECT_THAT(unknown.err, HasSubstr("gx_nope"));
  ExpectOneErrorLine(unknown);

  Result block = RunCli({"run", KernelPath(), "gx_fill_u32", "--grid=1", "--block=4096", "zeros:64",
                         "u32:1", "u64:16"});
  EXPECT_EQ(block.exit_code, 1) << block;
  EXPECT_THAT(block.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(block.err, HasSubstr("gx_fill_u32"));
  ExpectOneErrorLine(block);

  Result missing = RunCli({"run", KernelPath(), "gx_fill_u32", "--grid=1", "--block=1",
                           absl::StrCat("in:", Path("no-such-input.bin")), "u32:1", "u64:1"});
  EXPECT_EQ(missing.exit_code, 1) << missing;
  EXPECT_THAT(missing.err, HasSubstr("no-such-input.bin"));
  ExpectOneErrorLine(missing);
}

// ------------------------------------------------------------ version, kinds, kernels, results

TEST_F(CliTest, VersionIsTheToolsAndTheProtocols) {
  Result r = RunRaw({"--version"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "gpuexec 0.1.0 (gpuexec.v1)\n");
  EXPECT_EQ(r.err, "");
}

// The kind comes from the bytes: a module named anything loads, and runs.
TEST_F(CliTest, AModuleOfAnyNameLoadsAsWhatItsBytesSay) {
  WriteFile(Path("kern.bin"), ReadFile(KernelPath()).value_or(""));
  Result r = RunCli({"load", Path("kern.bin")});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("kern.bin"));
  r = RunCli({"run", Path("kern.bin"), "gx_fill_u32", "--grid=1", "--block=32",
              absl::StrCat("out:64:", Path("kern-out.bin")), "u32:3", "u64:16"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(ValuesOf<uint32_t>(ReadFile(Path("kern-out.bin")).value_or("")),
            std::vector<uint32_t>(16, 3u));
}

// 'info FILE' reads the kernel names from the file, without a daemon (the
// target here is one nobody serves).
TEST_F(CliTest, InfoOfAFileListsItsKernels) {
  WriteFile(Path("two.ptx"),
            ".version 8.0\n.target sm_90\n.address_size 64\n"
            ".visible .entry gx_first(\n\t.param .u64 p\n)\n{\n\tret;\n}\n"
            ".visible .entry gx_second()\n{\n\tret;\n}\n");
  const std::string nobody = absl::StrCat("--target=unix:", Path("nobody-here.sock"));
  Result r = RunRaw({nobody, "info", Path("two.ptx")});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "gx_first\ngx_second\n");
  EXPECT_EQ(r.err, "");
  if (!fake()) {
    // The real cubin: gx_saxpy among its kernels.
    r = RunRaw({nobody, "info", KernelPath()});
    EXPECT_EQ(r.exit_code, 0) << r;
    EXPECT_THAT(r.out, HasSubstr("gx_saxpy\n"));
  }
  WriteFile(Path("none.ptx"), ".version 8.0\n.target sm_90\n");
  r = RunRaw({nobody, "info", Path("none.ptx")});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("none.ptx: no kernels found in this PTX; if it is one, name a "
                               "kernel: gpuexec info FILE KERNEL"));
  ExpectOneErrorLine(r);
}

// out:SIZE:- puts the buffer's bytes alone on stdout; --print shows the
// first elements of each buffer saved.
TEST_F(CliTest, ResultsOnStdoutAndPrinted) {
  Result r = RunCli({"run", KernelPath(), "gx_fill_u32", "--grid=1024", "--block=1024",
                     "out:4MiB:-", "u32:7", "u64:1048576"});
  ASSERT_EQ(r.exit_code, 0) << r.exit_code << r.err;
  EXPECT_EQ(r.out.size(), 4u << 20);
  EXPECT_EQ(ValuesOf<uint32_t>(r.out), std::vector<uint32_t>(1 << 20, 7u));
  EXPECT_THAT(r.err,
              StartsWith("gx_fill_u32: grid (1024,1,1) block (1024,1,1) shared 0: GPU time"));
  EXPECT_THAT(r.err, HasSubstr("saved 4194304 bytes of argument 0 to stdout\n"));

  r = RunCli({"run", KernelPath(), "gx_fill_u32", "--grid=1", "--block=32", "--print=u32:4",
              absl::StrCat("out:64:", Path("printed.bin")), "u32:9", "u64:16"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("\narg0[0:4] = 9 9 9 9\nsaved 64 bytes of argument 0 to "));
  EXPECT_EQ(r.err, "");

  // f32 by default 8 elements; the buffer on stdout, the lines on stderr.
  std::vector<float> x = {1.5f, -2.0f, 0.1f, 1e-3f};
  WriteFile(Path("px.bin"), BytesOf(x));
  WriteFile(Path("py.bin"), BytesOf(std::vector<float>(4, 1.0f)));
  r = RunCli({"run", KernelPath(), "gx_saxpy", "--grid=1", "--block=32", "--print=f32", "f32:2",
              absl::StrCat("in:", Path("px.bin")), absl::StrCat("inout:", Path("py.bin"), ":-"),
              "u64:4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("\narg2[0:4] = 4 -3 1.2 1.002\n"));
  EXPECT_EQ(ValuesOf<float>(r.out), (std::vector<float>{4.0f, -3.0f, 2 * 0.1f + 1, 2 * 1e-3f + 1}));
}

// ------------------------------------------------------------ progress

// gpuexec ARGS... with stderr on a terminal (a pseudo-terminal read here)
// and stdout in a file: its exit status and what the terminal got.
Result RunOnATerminal(const std::vector<std::string>& args, const std::string& out_path) {
  Result r;
  int master = -1, slave = -1;
  if (openpty(&master, &slave, nullptr, nullptr, nullptr) != 0) return r;
  const pid_t pid = fork();
  if (pid == 0) {
    close(master);
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0) _exit(126);
    dup2(out, STDOUT_FILENO);
    dup2(slave, STDERR_FILENO);
    std::vector<std::string> argv = {Env("GPUEXEC_CLI")};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> c_args;
    for (std::string& a : argv) c_args.push_back(a.data());
    c_args.push_back(nullptr);
    execv(c_args[0], c_args.data());
    _exit(127);
  }
  close(slave);
  char buffer[4096];
  for (ssize_t n; (n = read(master, buffer, sizeof(buffer))) > 0;) r.err.append(buffer, n);
  close(master);
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(out_path).value_or("");
  return r;
}

// A copy of 64 MiB shows its progress on a terminal, overwritten in place
// and cleared at the end; elsewhere nothing.
TEST_F(CliTest, ALargeCopyShowsProgressOnATerminalOnly) {
  WriteFile(Path("progress.bin"), std::string(64 << 20, '\0'));
  const std::vector<std::string> args = {
      absl::StrCat("--target=", Target()),
      "run",
      KernelPath(),
      "gx_fill_u32",
      "--grid=1",
      "--block=32",
      absl::StrCat("inout:", Path("progress.bin"), ":", Path("progress-out.bin")),
      "u32:5",
      "u64:16"};
  Result r = RunOnATerminal(args, Path("progress.out"));
  ASSERT_EQ(r.exit_code, 0) << r;
  const std::string what =
      absl::StrCat("inout:", Path("progress.bin"), ":", Path("progress-out.bin"));
  // Each update rewrites the line; the last of each copy is the whole.
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("\r\033[Kfill argument 0 (", what,
                                            "): 64.0 MiB / 64.0 MiB, ")));
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("\r\033[Kread argument 0 (", what,
                                            "): 64.0 MiB / 64.0 MiB, ")));
  EXPECT_THAT(r.err, ::testing::EndsWith("MiB/s\r\033[K")) << "the line is not cleared";
  EXPECT_THAT(r.out, StartsWith("gx_fill_u32: grid (1,1,1)"));

  Result plain = RunRaw(args);
  ASSERT_EQ(plain.exit_code, 0) << plain;
  EXPECT_EQ(plain.err, "");
}

// ------------------------------------------------------------ Ctrl-C

// The suite daemon's device 0 sessions, as `devices` lists them; -1 if it
// cannot be read.
int DeviceSessions(const Result& devices) {
  std::vector<std::string> lines = absl::StrSplit(devices.out, '\n', absl::SkipEmpty());
  if (devices.exit_code != 0 || lines.size() < 2) return -1;
  const size_t at = lines[0].find("SESSIONS");
  if (at == std::string::npos || at < 1 || lines[1].size() < at + 8) return -1;
  int sessions = -1;
  // The column is right-aligned in 8 characters, as its header is.
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(lines[1].substr(at, 8)), &sessions)) return -1;
  return sessions;
}

TEST_F(CliTest, CtrlCClosesTheSessionAtOnce) {
  ASSERT_EQ(DeviceSessions(RunCli({"devices"})), 0);
  // A kernel of a minute.
  Process cli({Env("GPUEXEC_CLI"), absl::StrCat("--target=", Target()), "run", KernelPath(),
               "gx_spin", "--grid=1", "--block=1", "u64:60000000000"},
              Path("spin.out"), Path("spin.err"));
  ASSERT_TRUE(WaitFor([&] { return !cli.running() || DeviceSessions(RunCli({"devices"})) == 1; },
                      absl::Seconds(30)));
  ASSERT_TRUE(cli.running()) << ReadFile(Path("spin.err")).value_or("");

  const absl::Time sent = absl::Now();
  ASSERT_EQ(kill(cli.pid(), SIGINT), 0);
  const int code = cli.Wait(absl::Seconds(1));
  EXPECT_LT(absl::Now() - sent, absl::Seconds(1));
  EXPECT_EQ(code, 130);
  EXPECT_EQ(ReadFile(Path("spin.err")).value_or(""), "gpuexec: interrupted: closing the session\n");
  EXPECT_EQ(ReadFile(Path("spin.out")).value_or(""), "");
  int sessions = -1;
  EXPECT_TRUE(WaitFor([&] { return (sessions = DeviceSessions(RunCli({"devices"}))) == 0; },
                      absl::Seconds(1) - (absl::Now() - sent)))
      << sessions << " sessions";
}

// ------------------------------------------------------------ Triton metadata
// There is no Triton-compiled kernel among the test kernels; these drive the
// --triton path with gx_* kernels whose shapes fit: the launch geometry,
// shared memory and the appended scratch parameter all reach the kernel.

TEST_F(CliTest, TritonClustersOfNumCtas) {
  // Each program is 2 CTAs in a cluster: gx_cluster_rank writes each
  // block's rank in its cluster.
  WriteFile(Path("rank.json"), R"({"name": "gx_cluster_rank", "num_warps": 1, "num_ctas": 2,
                                   "shared": 0})");
  Result r = RunCli({"run", absl::StrCat("--triton=", Path("rank.json")), KernelPath(), "--grid=4",
                     absl::StrCat("out:32:", Path("rank.bin"))});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out,
              StartsWith("gx_cluster_rank: grid (8,1,1) block (32,1,1) shared 0 cluster (2,1,1)"));
  EXPECT_EQ(ValuesOf<uint32_t>(ReadFile(Path("rank.bin")).value_or("")),
            (std::vector<uint32_t>{0, 1, 0, 1, 0, 1, 0, 1}));
}

TEST_F(CliTest, TritonSharedMemoryComesFromTheMetadata) {
  WriteFile(Path("shared.json"), R"({"name": "gx_bigshared", "num_warps": 4, "shared": 8192})");
  Result r = RunCli({"run", absl::StrCat("--triton=", Path("shared.json")), KernelPath(),
                     "--grid=2", absl::StrCat("out:8:", Path("tshared.bin")), "u32:2048"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("gx_bigshared: grid (2,1,1) block (128,1,1) shared 8192:"));
  std::vector<uint32_t> sums = ValuesOf<uint32_t>(ReadFile(Path("tshared.bin")).value_or(""));
  ASSERT_EQ(sums.size(), 2u);
  for (uint32_t b = 0; b < 2; ++b) {
    uint32_t sum = 0;
    for (uint32_t k = 0; k < 2048; ++k) sum += k ^ b;
    EXPECT_EQ(sums[b], sum);
  }
}

TEST_F(CliTest, TritonScratchOfSizeZeroIsANullPointerAppended) {
  // gx_fill_u32(out, value, n): the appended global scratch pointer lands in
  // n; null makes n = 0, so nothing is written.
  WriteFile(Path("scratch.json"), R"({"name": "gx_fill_u32", "num_warps": 4,
                                      "global_scratch_size": 0, "global_scratch_align": 1})");
  Result r =
      RunCli({"run", absl::StrCat("--triton=", Path("scratch.json")), KernelPath(), "--grid=1",
              absl::StrCat("fill:u32:5:16,save=", Path("scratch.bin")), "u32:9"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(ValuesOf<uint32_t>(ReadFile(Path("scratch.bin")).value_or("")),
            std::vector<uint32_t>(16, 5u));

  // The kernel's own arguments only: the scratch pointer is not the user's.
  Result extra = RunCli({"run", absl::StrCat("--triton=", Path("scratch.json")), KernelPath(),
                         "--grid=1", "zeros:64", "u32:9", "u64:16"});
  EXPECT_EQ(extra.exit_code, 1) << extra;
  EXPECT_THAT(extra.err, HasSubstr("argument 2 (u64:16) has no parameter"));
  EXPECT_THAT(extra.err, HasSubstr("Triton scratch pointer"));
  ExpectOneErrorLine(extra);
}

// gx_add_scratch is shaped like a Triton 3.x kernel: (x, y, out, n, global
// scratch, profile scratch); it writes out = x + y, and through each scratch
// pointer that is not null, one 32-bit word per CTA (the double faults if
// the buffer is smaller).
TEST_F(CliTest, TritonScratchBuffersAreAppendedAndSizedPerCta) {
  constexpr int n = 1000;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = 0.5f * static_cast<float>(i) + 3.0f;
  }
  WriteFile(Path("tx.bin"), BytesOf(x));
  WriteFile(Path("ty.bin"), BytesOf(y));
  const std::vector<std::pair<std::string, std::string>> cases = {
      // Each program is 2 CTAs: 8 CTAs, 4 bytes each, in both buffers.
      {"scratch4.json", R"({"name": "gx_add_scratch", "num_warps": 4, "num_ctas": 2,
                            "shared": 0, "global_scratch_size": 4, "global_scratch_align": 4,
                            "profile_scratch_size": 4, "profile_scratch_align": 4})"},
      // Sizes 0: two null pointers.
      {"scratch0.json", R"({"name": "gx_add_scratch", "num_warps": 4, "num_ctas": 1,
                            "shared": 0, "global_scratch_size": 0, "global_scratch_align": 1,
                            "profile_scratch_size": 0, "profile_scratch_align": 1})"},
  };
  for (const auto& [name, json] : cases) {
    WriteFile(Path(name), json);
    const std::string out = Path(absl::StrCat(name, ".out"));
    Result r = RunCli({"run", absl::StrCat("--triton=", Path(name)), KernelPath(), "--grid=4",
                       absl::StrCat("in:", Path("tx.bin")), absl::StrCat("in:", Path("ty.bin")),
                       absl::StrCat("out:", n * 4, ":", out), absl::StrCat("i32:", n)});
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r;
    std::vector<float> sum = ValuesOf<float>(ReadFile(out).value_or(""));
    ASSERT_EQ(sum.size(), static_cast<size_t>(n)) << name;
    for (int i = 0; i < n; ++i) ASSERT_EQ(sum[i], x[i] + y[i]) << name << " element " << i;
  }
}

// The launch flags travel to the daemon (LaunchRequest fields 9 to 12) and
// are echoed on the result line.
TEST_F(CliTest, LaunchFlagsReachTheDaemon) {
  Result r = RunCli({"run", KernelPath(), "gx_cluster_rank", "--grid=4", "--block=32",
                     "--cluster=2", "--cluster-policy=spread", "--non-portable-cluster",
                     absl::StrCat("out:16:", Path("policy.bin"))});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("gx_cluster_rank: grid (4,1,1) block (32,1,1) shared 0 cluster "
                                "(2,1,1) non-portable spread: GPU time"));
  EXPECT_EQ(ValuesOf<uint32_t>(ReadFile(Path("policy.bin")).value_or("")),
            (std::vector<uint32_t>{0, 1, 0, 1}));

  r = RunCli({"run", KernelPath(), "gx_fill_u32", "--grid=1", "--block=32", "--cooperative",
              "--pdl", absl::StrCat("zeros:64,save=", Path("coop.bin")), "u32:9", "u64:16"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("gx_fill_u32: grid (1,1,1) block (32,1,1) shared 0 cooperative "
                                "pdl: GPU time"));
  EXPECT_EQ(ValuesOf<uint32_t>(ReadFile(Path("coop.bin")).value_or("")),
            std::vector<uint32_t>(16, 9u));
}

// A metadata file asking for a cooperative, programmatic dependent launch
// (Triton 3.6) runs as one.
TEST_F(CliTest, TritonCooperativeAndPdlComeFromTheMetadata) {
  WriteFile(Path("coop.json"), R"({"name": "gx_fill_u32", "num_warps": 1,
                                   "launch_cooperative_grid": "True", "launch_pdl": true})");
  Result r = RunCli({"run", absl::StrCat("--triton=", Path("coop.json")), KernelPath(), "--grid=1",
                     absl::StrCat("zeros:64,save=", Path("tcoop.bin")), "u32:7", "u64:16"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("gx_fill_u32: grid (1,1,1) block (32,1,1) shared 0 cooperative "
                                "pdl: GPU time"));
  EXPECT_EQ(ValuesOf<uint32_t>(ReadFile(Path("tcoop.bin")).value_or("")),
            std::vector<uint32_t>(16, 7u));
}

TEST_F(CliTest, TritonMetadataErrorsAreOneLine) {
  WriteFile(Path("bad.json"), R"({"num_warps": 4})");
  Result r = RunCli({"run", absl::StrCat("--triton=", Path("bad.json")), KernelPath(), "--grid=1"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("'name' is missing"));
  ExpectOneErrorLine(r);
}

}  // namespace
}  // namespace gpuexec::testing
