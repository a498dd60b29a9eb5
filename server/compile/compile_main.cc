// The compile process (compile_main.h).

#include "server/compile/compile_main.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "compile.pb.h"
#include "server/compile/compile_request.h"
#include "server/compile/compile_sandbox.h"
#include "server/compile/frame.h"
#include "server/compile/nvrtc.h"
#include "server/compile/nvrtc_api.h"

namespace gpuexec::compile {
namespace {

constexpr size_t kMaxRequestBytes = size_t{64} << 20;
constexpr absl::Duration kIoTimeout = absl::Seconds(30);
// Lowered names of one compile, together.
constexpr size_t kMaxLoweredBytes = size_t{64} << 10;

struct Flags {
  sandbox::Limits limits;
  std::string tmp;
  pid_t parent = 0;  // the daemon
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view a = argv[i];
    uint64_t v = 0;
    if (a == kCompileArg) continue;
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
  return !f->tmp.empty();
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

wire::Reply Run(const Flags& flags, const wire::Request& req) {
  wire::Reply reply;
  // NVRTC: the first library of the list that loads.
  std::unique_ptr<Nvrtc> nvrtc;
  for (const std::string& path : req.nvrtc()) {
    absl::StatusOr<std::unique_ptr<Nvrtc>> opened = Nvrtc::Open(path);
    if (opened.ok()) {
      nvrtc = *std::move(opened);
      reply.set_nvrtc_path(path);
      break;
    }
    reply.add_nvrtc_tried(std::string(opened.status().message()));
  }
  if (nvrtc == nullptr) {
    reply.set_outcome(wire::Reply::FAILED);
    reply.set_message("no NVRTC library loaded");
    return reply;
  }
  reply.set_nvrtc_version(nvrtc->version());
  for (int arch : nvrtc->archs()) reply.add_archs(arch);
  if (chdir(flags.tmp.c_str()) != 0) {
    reply.set_outcome(wire::Reply::FAILED);
    reply.set_message(absl::StrCat("cannot enter the compile's directory: ", strerror(errno)));
    return reply;
  }
  absl::StatusOr<sandbox::Confinement> confined =
      sandbox::Confine(flags.limits, nvrtc->files(), flags.tmp);
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
  CompileResult r = nvrtc->Compile(input, options);
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

}  // namespace

int RunCompiler(int argc, char** argv) {
  // Out of other processes' reach first; gone with the daemon; no
  // descriptor but the socket and the standard ones.
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;
  if (flags.parent != 0 && getppid() != flags.parent) return 1;
  if (syscall(SYS_close_range, kCompileSocketFd + 1, ~0u, 0) != 0) {
    for (int fd = kCompileSocketFd + 1; fd < 65536; ++fd) close(fd);
  }
  const absl::Time deadline = absl::Now() + kIoTimeout;
  absl::StatusOr<std::string> bytes = ReadFrame(kCompileSocketFd, kMaxRequestBytes, deadline);
  if (!bytes.ok()) return 3;
  wire::Request req;
  if (!req.ParseFromString(*bytes)) return 4;
  const wire::Reply reply = Run(flags, req);
  std::string out;
  if (!reply.SerializeToString(&out)) return 5;
  if (!WriteFrame(kCompileSocketFd, out, absl::Now() + kIoTimeout).ok()) return 6;
  return 0;
}

}  // namespace gpuexec::compile
