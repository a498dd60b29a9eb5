#ifndef GPUEXEC_TESTS_SERVICE_DAEMON_PROCESS_H_
#define GPUEXEC_TESTS_SERVICE_DAEMON_PROCESS_H_

// gpuexecd as a process of its own, on the suite's backend (TestBackend()):
// for what only a whole daemon shows (signals, its log, its memory, a pool
// of them). Killed when the object goes.
//
//   DaemonProcess d({"--log_level=info"});      // on a Unix socket of its own
//   DaemonProcess::Options o;
//   o.listen = "127.0.0.2:50051";
//   o.env = {{"GXFAKE_MEMORY_BYTES", "268435456"}};
//   DaemonProcess p({}, o);                     // on TCP, 256 MiB of device

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "service_test_fixture.h"
#include "tests/support/wait.h"

namespace gpuexec::testing {

class DaemonProcess {
 public:
  struct Options {
    // The TCP address to serve on; empty: a Unix socket of the test's own
    // and no TCP listener.
    std::string listen;
    // Set in the daemon's environment (the test double reads GXFAKE_*).
    std::map<std::string, std::string> env;
    // The daemon's stderr goes to this file when set.
    std::string log_path;
  };

  // `args` come after the defaults (--driver, --log_level=warning) and
  // override them.
  explicit DaemonProcess(const std::vector<std::string>& args_after, const Options& options = {}) {
    std::vector<std::string> args = {
        DaemonProgram(), absl::StrCat("--driver=", TestBackend().driver), "--log_level=warning"};
    if (options.listen.empty()) {
      socket_ = absl::StrCat(::testing::TempDir(), "gpuexecd-", getpid(), "-", counter_++, ".sock");
      target_ = absl::StrCat("unix:", socket_);
      args.push_back("--listen=");
      args.push_back(absl::StrCat("--unix_socket=", socket_));
    } else {
      target_ = options.listen;
      args.push_back(absl::StrCat("--listen=", options.listen));
    }
    args.insert(args.end(), args_after.begin(), args_after.end());
    pid_ = fork();
    if (pid_ == 0) {
      for (const auto& [k, v] : options.env) setenv(k.c_str(), v.c_str(), 1);
      if (!options.log_path.empty()) {
        const int fd = open(options.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 2);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~DaemonProcess() {
    Kill();
    if (!socket_.empty()) unlink(socket_.c_str());
  }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  pid_t pid() const { return pid_; }
  // What a client connects to: "unix:PATH" or the TCP address.
  const std::string& target() const { return target_; }
  // SIGTERM, then the exit status (or -1 if it did not exit within 10 s).
  // The exit status of a daemon that ends by itself (a refused start), -1
  // if it is still running after `limit`; no signal is sent.
  int WaitExit(absl::Duration limit) {
    int status = 0;
    if (!WaitFor([&] { return waitpid(pid_, &status, WNOHANG) == pid_; }, limit)) return -1;
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  int Stop() {
    kill(pid_, SIGTERM);
    int status = 0;
    const bool exited =
        WaitFor([&] { return waitpid(pid_, &status, WNOHANG) == pid_; }, absl::Seconds(10));
    if (!exited) return -1;
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  // SIGKILL: the daemon dies as a node does, answering nothing more.
  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

 private:
  static inline int counter_ = 0;
  pid_t pid_ = -1;
  std::string socket_;
  std::string target_;
};

}  // namespace gpuexec::testing

#endif  // GPUEXEC_TESTS_SERVICE_DAEMON_PROCESS_H_
