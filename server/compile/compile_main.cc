// The compile process (compile_main.h).

#include "server/compile/compile_main.h"

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "compile.pb.h"
#include "google/protobuf/message_lite.h"
#include "server/compile/compile_request.h"
#include "server/compile/compile_sandbox.h"
#include "server/compile/frame.h"
#include "server/compile/nvrtc.h"
#include "server/compile/nvrtc_api.h"
#include "server/shm/region_fd.h"

namespace gpuexec::compile {
namespace {

constexpr size_t kMaxRequestBytes = size_t{64} << 20;
constexpr absl::Duration kIoTimeout = absl::Seconds(30);
// Lowered names of one compile, together.
constexpr size_t kMaxLoweredBytes = size_t{64} << 10;

struct Flags {
  sandbox::Limits limits;
  std::string tmp;
  pid_t parent = 0;   // the daemon
  bool warm = false;  // the warm compile process
};

void CloseAbove(int fd) {
  if (syscall(SYS_close_range, fd + 1, ~0u, 0) != 0) {
    for (int i = fd + 1; i < 65536; ++i) close(i);
  }
}

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view a = argv[i];
    uint64_t v = 0;
    if (a == kCompileArg) continue;
    if (a == kWarmArg) {
      f->warm = true;
      continue;
    }
    if (absl::ConsumePrefix(&a, "--tmp=")) {
      f->tmp = std::string(a);
    } else if (absl::ConsumePrefix(&a, "--memory_bytes=") && absl::SimpleAtoi(a, &v)) {
      f->limits.memory_bytes = v;
    } else if (absl::ConsumePrefix(&a, "--parent=") && absl::SimpleAtoi(a, &v) && v > 1) {
      f->parent = static_cast<pid_t>(v);
    } else if (absl::ConsumePrefix(&a, "--cpu_s=") && absl::SimpleAtoi(a, &v) && v > 0) {
      f->limits.cpu_seconds = static_cast<uint32_t>(std::min<uint64_t>(v, 86400));
    } else {
      return false;
    }
  }
  return f->warm || !f->tmp.empty();
}

wire::Reply::Outcome OutcomeOf(int result) {
  switch (result) {
    case NVRTC_SUCCESS:
      return wire::Reply::OK;
    case NVRTC_ERROR_COMPILATION:
      return wire::Reply::COMPILE_ERROR;
    case NVRTC_ERROR_INVALID_OPTION:
      return wire::Reply::INVALID_OPTION;
    case NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID:
      return wire::Reply::NAME_EXPRESSION;
    case NVRTC_ERROR_OUT_OF_MEMORY:
      return wire::Reply::OUT_OF_MEMORY;
    default:
      return wire::Reply::FAILED;
  }
}

// NVRTC: the first library of the request's list that loads; nullptr (and
// a FAILED reply) when none does.
std::unique_ptr<Nvrtc> LoadNvrtc(const wire::Request& req, wire::Reply* reply) {
  for (const std::string& path : req.nvrtc()) {
    absl::StatusOr<std::unique_ptr<Nvrtc>> opened = Nvrtc::Open(path);
    if (opened.ok()) {
      reply->set_nvrtc_path(path);
      reply->set_nvrtc_version((*opened)->version());
      for (int arch : (*opened)->archs()) reply->add_archs(arch);
      return *std::move(opened);
    }
    reply->add_nvrtc_tried(std::string(opened.status().message()));
  }
  reply->set_outcome(wire::Reply::FAILED);
  reply->set_message("no NVRTC library loaded");
  return nullptr;
}

// Enters the compile's directory and confines this process (NVRTC, its
// files readable, loaded).
absl::StatusOr<sandbox::Confinement> EnterSandbox(const Flags& flags, const Nvrtc& nvrtc) {
  if (chdir(flags.tmp.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot enter the compile's directory: ", strerror(errno)));
  }
  return sandbox::Confine(flags.limits, nvrtc.files(), flags.tmp);
}

// Compiles `req` with `nvrtc` into `reply`, in the sandbox `confined`.
wire::Reply CompileConfined(const absl::StatusOr<sandbox::Confinement>& confined,
                            const Nvrtc& nvrtc, const wire::Request& req, wire::Reply reply) {
  if (!confined.ok()) {
    reply.set_outcome(wire::Reply::FAILED);
    reply.set_message(std::string(confined.status().message()));
    return reply;
  }
  reply.set_landlock(confined->landlock_abi > 0);
  reply.set_seccomp(confined->seccomp);
  if (req.source().empty()) return reply;  // a probe
  if (confined->landlock_abi == 0) {
    reply.set_outcome(wire::Reply::FAILED);
    reply.set_message("the kernel has no Landlock to shut the file system; no compile runs");
    return reply;
  }

  CompileInput input;
  input.source = req.source();
  input.source_name = req.source_name();
  for (const auto& h : req.headers()) input.headers.push_back({h.name(), h.content()});
  for (const auto& e : req.name_expressions()) input.name_expressions.push_back(e);
  const std::vector<std::string> options(req.options().begin(), req.options().end());
  CompileResult r = nvrtc.Compile(input, options);
  reply.set_outcome(OutcomeOf(r.result));
  if (r.result != NVRTC_SUCCESS) {
    reply.set_message(absl::StrCat(r.failed_call, ": ", r.result_name));
  }
  reply.set_log_bytes(r.log.size());
  if (r.log.size() > req.max_log_bytes()) r.log.resize(req.max_log_bytes());
  reply.set_log(std::move(r.log));
  if (r.result != NVRTC_SUCCESS) return reply;
  if (r.image.size() > req.max_image_bytes()) {
    reply.set_outcome(wire::Reply::TOO_LARGE);
    reply.set_message(absl::StrCat("the module is ", r.image.size(), " bytes"));
    return reply;
  }
  reply.set_image(std::move(r.image));
  reply.set_image_is_ptx(r.image_is_ptx);
  size_t lowered_bytes = 0;
  for (const auto& [expression, lowered] : r.lowered_names) lowered_bytes += lowered.size();
  if (lowered_bytes > kMaxLoweredBytes) {
    reply.set_outcome(wire::Reply::TOO_LARGE);
    reply.set_message(
        absl::StrCat("the lowered names are ", lowered_bytes, " bytes, over ", kMaxLoweredBytes));
    reply.clear_image();
    return reply;
  }
  for (auto& [expression, lowered] : r.lowered_names) {
    wire::LoweredName* l = reply.add_lowered_names();
    l->set_expression(expression);
    l->set_lowered(lowered);
  }
  return reply;
}

// One message from the daemon on the compile socket. False when none came
// (exit code 3 in `*code`) or it does not parse (4).
bool ReadMessage(google::protobuf::MessageLite* m, size_t max, absl::Time deadline, int* code) {
  absl::StatusOr<std::string> bytes = ReadFrame(kCompileSocketFd, max, deadline);
  *code = !bytes.ok() ? 3 : !m->ParseFromString(*bytes) ? 4 : 0;
  return *code == 0;
}

// Writes `m` to the daemon: the exit code, 0 or where it failed (5: it
// would not serialize, 6: it could not be sent).
int WriteMessage(const google::protobuf::MessageLite& m) {
  std::string out;
  if (!m.SerializeToString(&out)) return 5;
  if (!WriteFrame(kCompileSocketFd, out, absl::Now() + kIoTimeout).ok()) return 6;
  return 0;
}

// Answers `req` (read from the compile socket) and returns the exit code.
// `nvrtc` null: the request names NVRTC, loaded here before the
// confinement.
int Answer(const Flags& flags, const Nvrtc* nvrtc, absl::StatusOr<sandbox::Confinement> confined,
           const wire::Request& req) {
  wire::Reply reply;
  std::unique_ptr<Nvrtc> loaded;
  if (nvrtc == nullptr) {
    loaded = LoadNvrtc(req, &reply);
    nvrtc = loaded.get();
    if (nvrtc != nullptr) confined = EnterSandbox(flags, *nvrtc);
  } else {
    reply.set_nvrtc_version(nvrtc->version());
  }
  if (nvrtc != nullptr) reply = CompileConfined(confined, *nvrtc, req, std::move(reply));
  return WriteMessage(reply);
}

// A cold compile process: one request, then it exits.
int ServeOne(const Flags& flags) {
  wire::Request req;
  int code = 0;
  if (!ReadMessage(&req, kMaxRequestBytes, absl::Now() + kIoTimeout, &code)) return code;
  return Answer(flags, nullptr, absl::UnknownError("not confined"), req);
}

// A compile process forked from the warm one: confined before it reads a
// byte, then a request after another until the daemon closes the socket or
// kills it (the daemon gives it the compiles of one tenant: zygote.h). Each
// compile gets the CPU seconds of the limit anew, up to the process's
// total (its hard limit).
int ServeWarm(const Flags& flags, const Nvrtc& nvrtc) {
  const absl::StatusOr<sandbox::Confinement> confined = EnterSandbox(flags, nvrtc);
  for (int n = 0;; ++n) {
    const absl::Time deadline = n == 0 ? absl::Now() + kIoTimeout : absl::InfiniteFuture();
    wire::Request req;
    int code = 0;
    // After its first compile, the daemon closing the socket is its end.
    if (!ReadMessage(&req, kMaxRequestBytes, deadline, &code))
      return n == 0 || code == 4 ? code : 0;
    if (n > 0) {
      rusage used{};
      getrusage(RUSAGE_SELF, &used);
      const uint64_t spent = static_cast<uint64_t>(used.ru_utime.tv_sec + used.ru_stime.tv_sec) + 1;
      rlimit cpu{};
      getrlimit(RLIMIT_CPU, &cpu);
      cpu.rlim_cur = std::min<rlim_t>(spent + flags.limits.cpu_seconds, cpu.rlim_max);
      setrlimit(RLIMIT_CPU, &cpu);
    }
    if (const int code = Answer(flags, &nvrtc, confined, req); code != 0) return code;
  }
}

// This process's threads (/proc/self/task).
int Threads() {
  std::error_code ec;
  int n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/task", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

// A compile of a built-in kernel, so that what NVRTC sets up once (its
// builtins, the code generator) is set up before the warm process forks.
void WarmUp(const Nvrtc& nvrtc, int arch) {
  CompileInput input;
  input.source = "extern \"C\" __global__ void gpuexec_warm_up(float* x) { x[0] = 1.0f; }\n";
  input.source_name = "warm_up.cu";
  std::vector<std::string> options;
  if (arch > 0) options.push_back(absl::StrCat("-arch=sm_", arch));
  nvrtc.Compile(input, options);
}

// The warm compile process (zygote.h): loads NVRTC once, then forks a
// compile process per Fork the daemon sends, each the daemon's own child
// (CLONE_PARENT: the daemon waits for it, kills it and reads its usage as
// for one it started), each confining itself before it reads its source.
// It never sees a source itself.
int RunWarm(const Flags& flags) {
  wire::Request req;
  int code = 0;
  if (!ReadMessage(&req, kMaxRequestBytes, absl::Now() + kIoTimeout, &code)) return code;
  wire::Reply reply;
  std::unique_ptr<Nvrtc> nvrtc = LoadNvrtc(req, &reply);
  if (nvrtc != nullptr && req.warm_up()) WarmUp(*nvrtc, req.warm_up_arch());
  reply.set_threads(Threads());
  if (nvrtc != nullptr && reply.threads() != 1) {
    reply.set_outcome(wire::Reply::FAILED);
    reply.set_message(absl::StrCat("NVRTC left ", reply.threads(),
                                   " threads running; a process with more than one cannot fork"));
  }
  if (const int sent = WriteMessage(reply); sent != 0) return sent;
  if (reply.outcome() != wire::Reply::OK) return 0;
  while (true) {
    // The daemon gone or done: the socket closes and this process ends.
    wire::Fork fork;
    if (!ReadMessage(&fork, 4096, absl::InfiniteFuture(), &code)) return code == 4 ? code : 0;
    char byte = 0;
    int socket = -1;
    absl::StatusOr<size_t> got = shm::ReceiveWithDescriptor(kCompileSocketFd, &byte, 1, &socket);
    if (!got.ok() || *got == 0) return 0;
    wire::Forked forked;
    if (socket < 0) {
      forked.set_message("no socket came with the request");
    } else {
      const long pid =
          syscall(SYS_clone, CLONE_PARENT | SIGCHLD, nullptr, nullptr, nullptr, nullptr);
      if (pid == 0) {
        // The compile process: the socket as fd 3 (the daemon's socket to
        // the warm process closes with it), nothing else open, gone with
        // the daemon.
        if (dup2(socket, kCompileSocketFd) != kCompileSocketFd) _exit(1);
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        if (getppid() != flags.parent) _exit(1);
        CloseAbove(kCompileSocketFd);
        Flags child = flags;
        child.tmp = fork.tmp();
        child.limits.memory_bytes = fork.memory_bytes();
        child.limits.cpu_seconds = std::clamp<uint32_t>(fork.cpu_s(), 1, 86400);
        child.limits.cpu_total_seconds = std::clamp<uint32_t>(fork.cpu_total_s(), 0, 86400 * 16);
        setenv("TMPDIR", child.tmp.c_str(), 1);
        setenv("HOME", child.tmp.c_str(), 1);
        _exit(ServeWarm(child, *nvrtc));
      }
      if (pid < 0) forked.set_message(absl::StrCat("clone: ", strerror(errno)));
      forked.set_pid(pid > 0 ? static_cast<int32_t>(pid) : 0);
      close(socket);
    }
    if (const int sent = WriteMessage(forked); sent != 0) return sent;
  }
}

}  // namespace

int RunCompiler(int argc, char** argv) {
  // Out of other processes' reach first; gone with the daemon; no
  // descriptor but the socket and the standard ones.
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;
  if (flags.parent != 0 && getppid() != flags.parent) return 1;
  CloseAbove(kCompileSocketFd);
  if (flags.warm) return flags.parent != 0 ? RunWarm(flags) : 2;
  return ServeOne(flags);
}

}  // namespace gpuexec::compile
