// The daemon's side of compiling (compiler.h).

#include "server/compile/compiler.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "compile.pb.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/compile/compile_main.h"
#include "server/compile/frame.h"
#include "server/compile/nvrtc.h"

namespace gpuexec::compile {
namespace {

// The log in a status: its first kStatusLogBytes.
constexpr size_t kStatusLogBytes = 2048;

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? absl::StrCat("SIG", abbrev) : absl::StrCat("signal ", sig);
}

}  // namespace

std::string PrintableLog(const std::string& log, size_t max) {
  std::string out;
  size_t i = 0;
  for (; i < log.size() && out.size() < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(log[i]);
    if (c == '\n' || c == '\t' || (c >= 0x20 && c < 0x7f)) {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    }
  }
  if (i < log.size()) out += "\n...";
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

struct Compiler::Outcome {
  absl::StatusOr<std::string> reply = absl::UnknownError("no reply");
  wire::Reply reply_msg;  // `reply` parsed, where `parsed`
  bool parsed = false;
  int wait_status = 0;
  rusage usage{};
  bool timed_out = false;
  absl::Duration took;
};

absl::StatusOr<Compiler::Outcome> Compiler::RunProcess(const std::string& request,
                                                       const std::string& scope) {
  std::string root = options_.tmp_root;
  if (root.empty()) {
    const char* t = std::getenv("TMPDIR");
    root = t != nullptr && *t != '\0' ? t : "/tmp";
  }
  std::string dir = absl::StrCat(root, "/gpuexec-compile-XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot make the compile's directory in ", root, ": ", strerror(errno)));
  }
  struct RemoveDir {
    std::string dir;
    ~RemoveDir() {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  } remove_dir{dir};
  // The probe (before NVRTC is known) starts cold, like any compile
  // process while no warm one serves; a process that served `scope`
  // before may answer (zygote.h).
  GPUEXEC_ASSIGN_OR_RETURN(const CompileStarter::Started started, starter_->Start(dir, scope));
  const pid_t pid = started.pid;
  const int socket = started.socket;
  // The time limit counts from the process's start, not from a wait for
  // the warm one.
  const absl::Time start = absl::Now();
  Outcome out;
  const absl::Time deadline = start + options_.time_limit;
  absl::Status sent = WriteFrame(socket, request, deadline);
  if (sent.ok()) {
    out.reply =
        ReadFrame(socket, options_.max_image_bytes + options_.max_log_bytes + (1 << 20), deadline);
  } else {
    out.reply = sent;
  }
  if (!out.reply.ok() && absl::IsDeadlineExceeded(out.reply.status())) out.timed_out = true;
  out.took = absl::Now() - start;
  if (out.reply.ok()) {
    out.parsed = out.reply_msg.ParseFromString(*out.reply);
    if (out.parsed) std::string().swap(*out.reply);  // the image is held once
    // Answered in time, and an answer that parses: it may wait for the
    // scope's next compile.
    if (out.parsed && starter_->Keep(started, scope)) return out;
  }
  // Its answer read (or not): a process that lingers, or stopped answering
  // and sleeps, is ended here; a dead one is only reaped.
  kill(pid, SIGKILL);
  close(socket);
  while (wait4(pid, &out.wait_status, 0, &out.usage) < 0 && errno == EINTR) {
  }
  starter_->Ended(started, out.wait_status);
  return out;
}

absl::StatusOr<std::unique_ptr<Compiler>> Compiler::Start(CompilerOptions options) {
  if (options.nvrtc.empty()) options.nvrtc = DefaultNvrtcCandidates();
  std::unique_ptr<Compiler> c(new Compiler(std::move(options)));
  CompileStarter::Options so;
  so.program = c->options_.program;
  so.limits = c->options_.limits;
  so.warm = c->options_.warm;
  so.reuse = c->options_.reuse;
  so.warm_up_arch = c->options_.warm_up_arch;
  c->starter_ = std::make_unique<CompileStarter>(so);
  wire::Request probe;
  for (const std::string& p : c->options_.nvrtc) probe.add_nvrtc(p);
  std::string bytes;
  probe.SerializeToString(&bytes);
  absl::StatusOr<Outcome> out = c->RunProcess(bytes, "");
  if (!out.ok()) return out.status();
  const wire::Reply& reply = out->reply_msg;
  if (!out->parsed) {
    return absl::InternalError(absl::StrCat(
        "the compile process did not answer its probe (",
        out->reply.ok() ? "an answer that does not parse" : out->reply.status().message(), ")"));
  }
  if (reply.nvrtc_path().empty()) {
    std::vector<std::string> tried(reply.nvrtc_tried().begin(), reply.nvrtc_tried().end());
    return absl::FailedPreconditionError(
        absl::StrCat("no NVRTC library could be loaded (", absl::StrJoin(tried, "; "),
                     "): install NVRTC of CUDA 12 or newer (the toolkit's libnvrtc.so, or the "
                     "cuda-nvrtc package) or give its file with --nvrtc=PATH"));
  }
  if (reply.outcome() != wire::Reply::OK) {
    return absl::InternalError(
        absl::StrCat("the compile process cannot run: ", PrintableLog(reply.message(), 256)));
  }
  if (!reply.landlock()) {
    return absl::FailedPreconditionError(
        "the kernel has no Landlock (Linux 5.13 or newer, with landlock among its security "
        "modules) to keep the host's files out of the compiler's reach; kernels from source stay "
        "off");
  }
  c->path_ = reply.nvrtc_path();
  c->options_.nvrtc = {c->path_};
  c->version_ = reply.nvrtc_version();
  c->archs_.assign(reply.archs().begin(), reply.archs().end());
  c->starter_->UseNvrtc(c->path_);
  return c;
}

absl::StatusOr<Compiled> Compiler::Compile(const CompileInput& input, int cc_major, int cc_minor,
                                           const std::string& scope) {
  const std::string what = absl::StrCat("the compile of '", Quoted(SourceName(input)), "'");
  if (running_.fetch_add(1) >= options_.max_running) {
    running_.fetch_sub(1);
    return absl::ResourceExhaustedError(
        absl::StrCat(options_.max_running, " compiles are running, the daemon's limit (",
                     options_.running_flag, "); retry when one has ended"));
  }
  struct Release {
    std::atomic<int>* running;
    ~Release() { running->fetch_sub(1); }
  } release{&running_};
  const int arch = cc_major * 10 + cc_minor;
  if (!archs_.empty() && std::find(archs_.begin(), archs_.end(), arch) == archs_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("NVRTC ", version_, " cannot compile for ", ArchName(cc_major, cc_minor),
                     ", the device's architecture; the daemon's operator can give a newer NVRTC "
                     "with --nvrtc"));
  }
  wire::Request req;
  req.add_nvrtc(path_);
  req.set_source(input.source);
  req.set_source_name(input.source_name);
  for (const Header& h : input.headers) {
    wire::Header* out = req.add_headers();
    out->set_name(h.name);
    out->set_content(h.content);
  }
  for (const std::string& o : CompileOptions(input, cc_major, cc_minor)) req.add_options(o);
  for (const std::string& e : input.name_expressions) req.add_name_expressions(e);
  req.set_max_log_bytes(options_.max_log_bytes);
  req.set_max_image_bytes(options_.max_image_bytes);
  std::string bytes;
  req.SerializeToString(&bytes);
  GPUEXEC_ASSIGN_OR_RETURN(Outcome out, RunProcess(bytes, scope));
  const std::string memory =
      absl::StrCat("its memory limit of ", ByteSize(options_.limits.memory_bytes), " (",
                   options_.memory_flag, ")");
  if (out.timed_out) {
    return absl::DeadlineExceededError(absl::StrCat(
        what, " ran past its time limit of ", absl::FormatDuration(options_.time_limit), " (",
        options_.time_flag,
        ") and was stopped; simplify the source (deep template recursion, large unrolled loops)"));
  }
  wire::Reply& reply = out.reply_msg;
  if (!out.parsed) {
    const double cpu = absl::ToDoubleSeconds(absl::DurationFromTimeval(out.usage.ru_utime) +
                                             absl::DurationFromTimeval(out.usage.ru_stime));
    if (WIFSIGNALED(out.wait_status)) {
      const int sig = WTERMSIG(out.wait_status);
      if (sig == SIGXCPU || (sig == SIGKILL && cpu + 0.5 >= options_.limits.cpu_seconds)) {
        return absl::ResourceExhaustedError(
            absl::StrCat(what, " used its CPU time limit of ", options_.limits.cpu_seconds, " s (",
                         options_.cpu_flag, ") and was stopped; simplify the source"));
      }
      if (static_cast<uint64_t>(out.usage.ru_maxrss) * 1024 >= options_.limits.memory_bytes / 2) {
        return absl::ResourceExhaustedError(
            absl::StrCat(what, " ran out of ", memory, " and was stopped"));
      }
      return absl::InternalError(absl::StrCat(
          "NVRTC ", version_, " crashed (", SignalName(sig), ") in ", what,
          "; the daemon and other compiles are unaffected; a change to the source may avoid it"));
    }
    return absl::InternalError(absl::StrCat(
        what, " failed: the compile process ",
        WIFEXITED(out.wait_status) ? absl::StrCat("exited with code ", WEXITSTATUS(out.wait_status))
                                   : std::string("ended"),
        " without an answer"));
  }
  const std::string log = PrintableLog(reply.log(), kStatusLogBytes);
  switch (reply.outcome()) {
    case wire::Reply::OK:
      break;
    case wire::Reply::COMPILE_ERROR:
      return absl::InvalidArgumentError(absl::StrCat(what, " failed; NVRTC's log:\n", log));
    case wire::Reply::INVALID_OPTION:
      return absl::InvalidArgumentError(
          absl::StrCat(what, " failed: NVRTC refused an option; its log:\n", log));
    case wire::Reply::NAME_EXPRESSION:
      return absl::InvalidArgumentError(absl::StrCat(
          what, " failed: a name expression names no __global__ function of the source (",
          PrintableLog(reply.message(), 256), "); NVRTC's log:\n", log));
    case wire::Reply::OUT_OF_MEMORY:
      return absl::ResourceExhaustedError(absl::StrCat(what, " ran out of ", memory));
    case wire::Reply::TOO_LARGE:
      return absl::ResourceExhaustedError(absl::StrCat(what, " made a module past the limit of ",
                                                       ByteSize(options_.max_image_bytes), ": ",
                                                       PrintableLog(reply.message(), 256)));
    default:
      return absl::InternalError(
          absl::StrCat(what, " failed: ", PrintableLog(reply.message(), 256)));
  }
  // What the process answers is checked again here: it ran the client's
  // input, and may be the client's by now.
  if (reply.image().size() > options_.max_image_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(what, " made a module past the limit of ",
                                                     ByteSize(options_.max_image_bytes)));
  }
  if (reply.lowered_names_size() > static_cast<int>(input.name_expressions.size())) {
    return absl::InternalError(absl::StrCat(what, " answered more lowered names than asked"));
  }
  Compiled c;
  c.image = std::move(*reply.mutable_image());
  c.image_is_ptx = reply.image_is_ptx();
  c.log = PrintableLog(reply.log(), options_.max_log_bytes);
  if (reply.log_bytes() > reply.log().size() && !absl::EndsWith(c.log, "...")) c.log += "\n...";
  c.log_bytes = reply.log_bytes();
  for (const wire::LoweredName& l : reply.lowered_names()) {
    if (l.expression().size() + l.lowered().size() > 8192) {
      return absl::InternalError(absl::StrCat(what, " answered a lowered name over 8 KiB"));
    }
    c.lowered_names.emplace_back(l.expression(), l.lowered());
  }
  c.took = out.took;
  return c;
}

}  // namespace gpuexec::compile
