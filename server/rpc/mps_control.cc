#include "server/rpc/mps_control.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/common/environment.h"
#include "server/common/log.h"
#include "server/common/text.h"

extern char** environ;

namespace gpuexec::rpc {
namespace {

// The daemon's environment with the control daemon's directories set, and
// none of the daemon's own MPS settings (a thread percentage there would
// lower every share).
std::vector<std::string> ControlEnvironment(const std::string& pipes, const std::string& logs) {
  return ChildEnvironment(
      environ, {"CUDA_MPS_PIPE_DIRECTORY=" + pipes, "CUDA_MPS_LOG_DIRECTORY=" + logs}, "CUDA_MPS_");
}

// Starts `argv` with `env`, stdin from `stdin_fd` (or /dev/null when -1).
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv_s,
                            const std::vector<std::string>& env_s, int stdin_fd) {
  std::vector<std::string> a = argv_s, e = env_s;
  std::vector<char*> argv, envp;
  for (auto& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : e) envp.push_back(s.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  int rc = stdin_fd >= 0
               ? posix_spawn_file_actions_adddup2(&fa, stdin_fd, STDIN_FILENO)
               : posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  // The daemon blocks the signals it waits for: its children get them back.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  if (rc == 0) rc = posix_spawnattr_setsigmask(&attr, &none);
  if (rc == 0) rc = posix_spawnattr_setsigdefault(&attr, &all);
  // A group of its own: a Ctrl-C or a stop of the daemon's group reaches
  // the daemon, which tells it to quit once its workers are gone.
  if (rc == 0) rc = posix_spawnattr_setpgroup(&attr, 0);
  if (rc == 0) {
    rc = posix_spawnattr_setflags(
        &attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  }
  // Nothing else of the daemon's reaches it (it outlives every call).
  if (rc == 0) rc = posix_spawn_file_actions_addclosefrom_np(&fa, STDERR_FILENO + 1);
  pid_t pid = -1;
  if (rc == 0) rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--mps=own: ", Quoted(argv_s[0]), " could not be started (", std::strerror(rc),
                     "); install NVIDIA's MPS (nvidia-cuda-mps-control, "
                     "with the driver) or name it with --mps_control"));
  }
  return pid;
}

// Waits for `pid` until `deadline`; true once it is gone.
bool WaitUntil(pid_t pid, absl::Time deadline, int* status) {
  while (true) {
    const pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

// The last lines of the control daemon's log, for a failure's message.
std::string LogTail(const std::string& logs) {
  std::ifstream in(logs + "/control.log");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > 400) text = text.substr(text.size() - 400);
  return text.empty() ? std::string("(its log is empty)") : gpuexec::Quoted(text, 400);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MpsControl>> MpsControl::Start(const std::string& program,
                                                              const std::string& parent,
                                                              absl::Duration timeout) {
  std::string base = parent;
  if (base.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  }
  std::string root = base + "/gpuexec-mps-XXXXXX";
  if (mkdtemp(root.data()) == nullptr) {  // mode 0700
    return absl::FailedPreconditionError(absl::StrCat(
        "--mps=own: no private directory could be made in ", base, ": ", std::strerror(errno)));
  }
  const std::string pipes = root + "/pipe", logs = root + "/log";
  if (mkdir(pipes.c_str(), 0700) != 0 || mkdir(logs.c_str(), 0700) != 0) {
    const int e = errno;
    std::error_code ignored;
    std::filesystem::remove_all(root, ignored);
    return absl::FailedPreconditionError(absl::StrCat("--mps=own: ", root, ": ", std::strerror(e)));
  }
  auto pid = Spawn({program, "-f"}, ControlEnvironment(pipes, logs), -1);
  if (!pid.ok()) {
    std::error_code ignored;
    std::filesystem::remove_all(root, ignored);
    return pid.status();
  }
  std::unique_ptr<MpsControl> control(new MpsControl(program, root, *pid));
  const absl::Time deadline = absl::Now() + timeout;
  struct stat st;
  while (stat((pipes + "/control").c_str(), &st) != 0) {
    int status = 0;
    if (waitpid(*pid, &status, WNOHANG) == *pid) {
      control->pid_ = -1;
      return absl::FailedPreconditionError(
          absl::StrCat("--mps=own: ", Quoted(program), " ended before it served (",
                       WIFEXITED(status) ? absl::StrCat("exit status ", WEXITSTATUS(status))
                                         : absl::StrCat("signal ", WTERMSIG(status)),
                       "); its log: ", LogTail(logs)));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("--mps=own: ", Quoted(program), " made no control pipe in ",
                       absl::FormatDuration(timeout), "; its log: ", LogTail(logs)));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  log::Info("gpuexecd: MPS control daemon of its own (pid ", *pid, "), pipes in ", pipes,
            ", its logs in ", logs);
  return control;
}

bool MpsControl::Serving() const {
  absl::MutexLock lock(&mu_);
  if (ended_) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    ended_ = true;
    log::Error("gpuexecd: the MPS control daemon of its own (pid ", pid_, ") ended (",
               WIFEXITED(status) ? absl::StrCat("exit status ", WEXITSTATUS(status))
                                 : absl::StrCat("signal ", WTERMSIG(status)),
               "): no tenant worker with a compute share starts until gpuexecd is restarted");
    return false;
  }
  struct stat st;
  return stat((pipes_ + "/control").c_str(), &st) == 0;
}

MpsControl::MpsControl(std::string program, std::string root, pid_t pid)
    : program_(std::move(program)),
      root_(std::move(root)),
      pipes_(root_ + "/pipe"),
      logs_(root_ + "/log"),
      pid_(pid) {}

absl::Status MpsControl::Command(const std::string& line, absl::Duration timeout) const {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError(std::strerror(errno));
  const std::string text = line + "\n";
  // A command is a few bytes: the pipe holds it whole.
  (void)!write(fds[1], text.data(), text.size());
  close(fds[1]);
  auto pid = Spawn({program_}, ControlEnvironment(pipes_, logs_), fds[0]);
  close(fds[0]);
  if (!pid.ok()) return pid.status();
  int status = 0;
  if (!WaitUntil(*pid, absl::Now() + timeout, &status)) {
    kill(*pid, SIGKILL);
    waitpid(*pid, &status, 0);
    return absl::DeadlineExceededError(absl::StrCat("'", line, "' was not taken"));
  }
  return absl::OkStatus();
}

MpsControl::~MpsControl() {
  bool ended = false;
  {
    absl::MutexLock lock(&mu_);
    ended = ended_;
  }
  if (pid_ > 0 && !ended) {
    const absl::Status quit = Command("quit", absl::Seconds(5));
    int status = 0;
    if (!quit.ok() || !WaitUntil(pid_, absl::Now() + absl::Seconds(10), &status)) {
      log::Warning("gpuexecd: the MPS control daemon (pid ", pid_,
                   ") did not quit within 10 s; killing it");
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
    }
  }
  std::error_code ignored;
  std::filesystem::remove_all(root_, ignored);
}

}  // namespace gpuexec::rpc
