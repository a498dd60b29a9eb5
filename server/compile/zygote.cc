// Starting compile processes, cold or from the warm one (zygote.h).

#include "server/compile/zygote.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "compile.pb.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/compile/compile_main.h"
#include "server/compile/frame.h"
#include "server/shm/region_fd.h"

extern char** environ;

namespace gpuexec::compile {

std::vector<std::string> CompileEnvironment(const std::string& dir) {
  std::vector<std::string> env = {"PATH=/usr/bin:/bin", absl::StrCat("TMPDIR=", dir),
                                  absl::StrCat("HOME=", dir), "LANG=C"};
  for (char** e = environ; *e != nullptr; ++e) {
    if (absl::StartsWith(*e, "LD_LIBRARY_PATH=") || absl::StartsWith(*e, "GXFAKE_")) {
      env.emplace_back(*e);
    }
  }
  return env;
}

absl::StatusOr<pid_t> SpawnCompileProcess(const std::string& program,
                                          const std::vector<std::string>& args,
                                          const std::vector<std::string>& env, int socket) {
  std::vector<char*> argv, envp;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  argv.push_back(nullptr);
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, socket, kCompileSocketFd);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : {SIGPIPE, SIGXCPU, SIGXFSZ, SIGTERM, SIGINT, SIGHUP}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, program.c_str(), &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (spawned != 0) {
    return absl::InternalError(
        absl::StrCat("cannot start the compile process (", program, "): ", strerror(spawned)));
  }
  return pid;
}

absl::StatusOr<std::unique_ptr<Zygote>> Zygote::Start(const Options& options) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return absl::InternalError(absl::StrCat("socketpair: ", strerror(errno)));
  }
  const std::vector<std::string> args = {options.program, kCompileArg, kWarmArg,
                                         absl::StrCat("--parent=", getpid())};
  absl::StatusOr<pid_t> pid =
      SpawnCompileProcess(options.program, args, CompileEnvironment("/nonexistent"), sv[1]);
  close(sv[1]);
  if (!pid.ok()) {
    close(sv[0]);
    return pid.status();
  }
  // From here the destructor kills and reaps it, whatever follows.
  std::unique_ptr<Zygote> z(new Zygote(*pid, sv[0], options.timeout));
  wire::Request req;
  req.add_nvrtc(options.nvrtc);
  req.set_warm_up(options.warm_up);
  req.set_warm_up_arch(options.warm_up_arch);
  std::string bytes;
  req.SerializeToString(&bytes);
  const absl::Time deadline = absl::Now() + options.timeout;
  absl::Status sent = WriteFrame(z->control_, bytes, deadline);
  absl::StatusOr<std::string> answer =
      sent.ok() ? ReadFrame(z->control_, 1 << 20, deadline) : absl::StatusOr<std::string>(sent);
  wire::Reply reply;
  if (!answer.ok() || !reply.ParseFromString(*answer)) {
    return absl::InternalError(
        absl::StrCat("the warm compile process did not answer (",
                     answer.ok() ? "an answer that does not parse" : answer.status().message(),
                     ")"));
  }
  z->threads_ = reply.threads();
  if (reply.outcome() != wire::Reply::OK) {
    return absl::FailedPreconditionError(
        absl::StrCat("the warm compile process cannot serve: ", Quoted(reply.message(), 256)));
  }
  return z;
}

Zygote::~Zygote() {
  close(control_);
  kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

absl::StatusOr<pid_t> Zygote::Fork(const std::string& dir, const sandbox::Limits& limits,
                                   int socket) {
  wire::Fork fork;
  fork.set_tmp(dir);
  fork.set_memory_bytes(limits.memory_bytes);
  fork.set_cpu_s(limits.cpu_seconds);
  std::string bytes;
  fork.SerializeToString(&bytes);
  const absl::Time deadline = absl::Now() + timeout_;
  GPUEXEC_RETURN_IF_ERROR(WriteFrame(control_, bytes, deadline));
  const char byte = 0;
  GPUEXEC_RETURN_IF_ERROR(shm::SendWithDescriptor(control_, &byte, 1, socket));
  GPUEXEC_ASSIGN_OR_RETURN(std::string answer, ReadFrame(control_, 4096, deadline));
  wire::Forked forked;
  if (!forked.ParseFromString(answer)) {
    return absl::InternalError("the warm compile process answered a fork that does not parse");
  }
  if (forked.pid() <= 1) {
    return absl::InternalError(absl::StrCat("the warm compile process could not fork: ",
                                            Quoted(forked.message(), 256)));
  }
  // It must be this process's child: it is killed and waited for as one.
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(forked.pid()), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
    return absl::InternalError(absl::StrCat("the warm compile process answered pid ",
                                            forked.pid(), ", not a child of the daemon"));
  }
  return static_cast<pid_t>(forked.pid());
}

}  // namespace gpuexec::compile
