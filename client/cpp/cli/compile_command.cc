// compile, and the source half of run: CUDA C++ read and checked here,
// compiled by the daemon.

#include "cli/compile_command.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "cli/commands.h"
#include "cli/connect.h"
#include "cli/output.h"

namespace gpuexec::cli {
namespace {

constexpr const char* kSourceFlags[] = {"nvrtc_option", "include", "name_expression"};

const std::vector<std::string>& Repeated(const CommandLine& cl, const char* name) {
  static const std::vector<std::string>* const none = new std::vector<std::string>;
  auto it = cl.repeated.find(name);
  return it == cl.repeated.end() ? *none : it->second;
}

// "1048576 bytes (1.0 MiB)".
std::string Limit(uint64_t bytes) { return absl::StrCat(bytes, " bytes (", Bytes(bytes), ")"); }

// The bytes of `path`, at most `max` less `already` (those of the files
// before it under the same limit): a failure "COMMAND: SUBJECT: why" when
// it is missing, not a regular file, unreadable or larger.
std::optional<Failure> ReadLimited(absl::string_view command, const std::string& subject,
                                   const std::string& path, uint64_t max, uint64_t already,
                                   absl::string_view limit, std::string* out) {
  const std::string what = absl::StrCat(command, ": ", Printable(subject, 512), ": ");
  // Opened without blocking, then looked at: a FIFO put in the file's
  // place cannot hold the open, and what is read is what was looked at.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return FailedLocally(absl::StrCat(what, "cannot read it: ", std::strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const bool dir = S_ISDIR(st.st_mode);
    close(fd);
    return FailedLocally(
        absl::StrCat(what, dir ? "it is a directory" : "it is not a regular file"));
  }
  (void)fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  auto too_big = [&](uint64_t size) {
    return FailedLocally(absl::StrCat(
        what, "it is ", size, " bytes",
        already == 0 ? "" : absl::StrCat(": with the ", already, " bytes of those before it"),
        ", over the daemon's limit of ", Limit(max), " ", limit));
  };
  const uint64_t cap = max - std::min(max, already);
  if (static_cast<uint64_t>(st.st_size) > cap) {
    close(fd);
    return too_big(st.st_size);
  }
  std::string bytes;
  char chunk[64 << 10];
  for (;;) {
    const ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return FailedLocally(absl::StrCat(what, "cannot read it: ", std::strerror(error)));
    }
    if (n == 0) break;
    bytes.append(chunk, static_cast<size_t>(n));
    if (bytes.size() > cap) break;  // grown since stat()
  }
  close(fd);
  if (bytes.size() > cap) return too_big(bytes.size());
  *out = std::move(bytes);
  return std::nullopt;
}

// The part of `path` after its last '/'.
std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// A name the daemon takes for a source or header: 1 to 128 bytes of
// letters, digits and "_-.+", not "." or "..".
bool IsPlainName(absl::string_view name) {
  if (name.empty() || name.size() > 128 || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(c) || c == '_' || c == '-' || c == '.' || c == '+';
  });
}

bool IsPrintableLine(absl::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
}

// NVRTC's log, one line a line, escaped.
void PrintLog(std::FILE* to, absl::string_view log) {
  std::vector<absl::string_view> lines = absl::StrSplit(log, '\n');
  while (!lines.empty() && absl::StripAsciiWhitespace(lines.back()).empty()) lines.pop_back();
  for (absl::string_view line : lines) std::fprintf(to, "%s\n", Printable(line).c_str());
}

// The lowered name's expression, when it was asked for; "" otherwise.
std::string ExpressionOf(const CompiledModule& compiled, const std::string& kernel) {
  for (const auto& [expression, lowered] : compiled.lowered_names) {
    if (lowered == kernel) return expression;
  }
  return "";
}

// What `compile` prints: the module, how it was compiled, the lowered
// names, each kernel as `info FILE KERNEL` shows it and NVRTC's log.
std::optional<Failure> PrintCompiled(const std::string& file, const CompiledModule& compiled,
                                     unsigned device) {
  std::vector<std::pair<std::string, Function>> kernels;
  for (const std::string& name : compiled.kernels) {
    Function function;
    if (auto f = GetFunction(compiled.module, file, name, &function)) return f;
    kernels.emplace_back(name, std::move(function));
  }
  const std::string took =
      absl::StrFormat("%.3f ms", absl::ToDoubleMilliseconds(compiled.compile_time));
  std::printf("source %s (module %s, device %u)\n", Printable(file, 1024).c_str(),
              compiled.module.sha256().c_str(), device);
  std::printf("  architecture                 %s\n", Printable(compiled.arch, 64).c_str());
  std::printf("  NVRTC version                %s\n", Printable(compiled.nvrtc_version, 64).c_str());
  std::printf("  compiled                     %s\n",
              compiled.cached ? absl::StrCat("before (cached; it took ", took, ")").c_str()
                              : absl::StrCat("now, in ", took).c_str());
  std::printf("  kernels                      %zu%s\n", kernels.size(),
              kernels.empty() ? " (no __global__ function; a template kernel needs "
                                "--name_expression=NAME<TYPES>)"
                              : "");
  if (!compiled.lowered_names.empty()) {
    std::printf("\nNAME EXPRESSION              LOWERED NAME\n");
    for (const auto& [expression, lowered] : compiled.lowered_names) {
      std::printf("%-28s %s\n", Printable(expression, 256).c_str(),
                  Printable(lowered, 1024).c_str());
    }
  }
  for (const auto& [name, function] : kernels) {
    const std::string expression = ExpressionOf(compiled, name);
    std::printf(
        "\nkernel %s%s\n", Printable(name, 1024).c_str(),
        expression.empty() ? "" : absl::StrCat(" (", Printable(expression, 256), ")").c_str());
    PrintKernel(function);
  }
  if (!compiled.log.empty()) {
    std::printf("\nNVRTC's log:\n");
    PrintLog(stdout, compiled.log);
    if (compiled.log_bytes > compiled.log.size()) {
      std::printf("(the first %zu bytes of its %llu)\n", compiled.log.size(),
                  static_cast<unsigned long long>(compiled.log_bytes));
    }
  }
  return std::nullopt;
}

}  // namespace

bool IsCudaSource(absl::string_view file) { return absl::EndsWith(file, ".cu"); }

std::optional<Failure> RefuseSourceAsModule(absl::string_view command, const std::string& file) {
  if (IsCudaSource(file)) {
    return Usage(absl::StrCat(
        command, ": ", Printable(file, 512), " is CUDA C++ source, not a module: 'gpuexec compile ",
        Printable(file, 512), "' compiles it on the daemon and lists its kernels; 'gpuexec run ",
        Printable(file, 512), " KERNEL ...' runs one"));
  }
  if (absl::EndsWith(file, ".cuh")) {
    return Usage(absl::StrCat(command, ": ", Printable(file, 512),
                              " is a CUDA C++ header: give it with --include to 'gpuexec "
                              "compile' or 'gpuexec run' of the .cu file that includes it"));
  }
  return std::nullopt;
}

std::optional<Failure> RefuseSourceFlags(const CommandLine& cl, const std::string& file) {
  for (const char* name : kSourceFlags) {
    if (cl.repeated.count(name) == 0) continue;
    if (absl::EndsWith(file, ".cuh")) return RefuseSourceAsModule("run", file);
    return Usage(absl::StrCat("run: --", name, " is for CUDA C++ source, a FILE named *.cu; ",
                              Printable(file, 512), " is loaded as a module image"));
  }
  return std::nullopt;
}

std::optional<Failure> ReadSource(const CommandLine& cl, absl::string_view command,
                                  const std::string& file, const std::string* kernel,
                                  CompileSpec* spec) {
  if (absl::EndsWith(file, ".cuh")) return RefuseSourceAsModule(command, file);
  const std::string help = absl::StrCat(" (see 'gpuexec help ", command, "')");
  // The flags' values first: a malformed line is refused before any file
  // is read.
  const std::vector<std::string>& options = Repeated(cl, "nvrtc_option");
  if (options.size() > kMaxOptions) {
    return Usage(absl::StrCat(command, ": ", options.size(),
                              " --nvrtc_option flags, over the daemon's limit of ", kMaxOptions));
  }
  for (const std::string& o : options) {
    if (o.empty() || o.size() > kMaxOptionBytes || !IsPrintableLine(o)) {
      return Usage(absl::StrCat(command, ": --nvrtc_option='", Printable(o, 64),
                                "': an option is 1 to ", kMaxOptionBytes,
                                " bytes of printable ASCII: -std=c++17, -DN=4", help));
    }
    if (o[0] != '-') {
      return Usage(absl::StrCat(command, ": --nvrtc_option='", Printable(o, 64),
                                "' is not an option (they start with '-': -DN=4, -std=c++17); "
                                "give each as a flag of its own",
                                help));
    }
  }
  std::vector<std::string> expressions = Repeated(cl, "name_expression");
  if (kernel != nullptr && absl::StrContains(*kernel, '<') &&
      std::find(expressions.begin(), expressions.end(), *kernel) == expressions.end()) {
    expressions.push_back(*kernel);
  }
  if (expressions.size() > kMaxNameExpressions) {
    return Usage(absl::StrCat(command, ": ", expressions.size(),
                              " name expressions, over the daemon's limit of ",
                              kMaxNameExpressions));
  }
  for (const std::string& e : expressions) {
    if (e.empty() || e.size() > kMaxNameExpressionBytes || !IsPrintableLine(e)) {
      return Usage(absl::StrCat(command, ": name expression '", Printable(e, 64), "': 1 to ",
                                kMaxNameExpressionBytes,
                                " bytes of printable ASCII naming a __global__ function: "
                                "axpy<float>",
                                help));
    }
  }
  const std::vector<std::string>& includes = Repeated(cl, "include");
  if (includes.size() > kMaxHeaders) {
    return Usage(absl::StrCat(command, ": ", includes.size(),
                              " --include flags, over the daemon's limit of ", kMaxHeaders,
                              " headers"));
  }
  std::map<std::string, std::string> named;  // base name -> the path given
  for (const std::string& path : includes) {
    if (path.empty()) return Usage(absl::StrCat(command, ": --include names no file", help));
    const std::string name = BaseName(path);
    if (!IsPlainName(name)) {
      return Usage(absl::StrCat(
          command, ": --include=", Printable(path, 512), ": the header's name '",
          Printable(name, 128),
          "' is not one the daemon takes (1 to 128 letters, digits and _-.+); rename the file"));
    }
    auto [at, fresh] = named.emplace(name, path);
    if (!fresh) {
      return Usage(absl::StrCat(command, ": --include=", Printable(at->second, 512),
                                " and --include=", Printable(path, 512), " are both sent as '",
                                name, "', the name the source includes"));
    }
  }

  // The files.
  if (auto f = ReadLimited(command, absl::StrCat("source ", file), file, kMaxSourceBytes, 0,
                           "for a source", &spec->source)) {
    return f;
  }
  if (spec->source.empty()) {
    return FailedLocally(absl::StrCat(command, ": source ", Printable(file, 512),
                                      " is empty; it should define a __global__ function"));
  }
  uint64_t header_bytes = 0;
  for (const std::string& path : includes) {
    std::string content;
    if (auto f = ReadLimited(command, absl::StrCat("--include=", path), path, kMaxHeaderBytes,
                             header_bytes, "for the headers together", &content)) {
      return f;
    }
    header_bytes += content.size();
    spec->headers.emplace_back(BaseName(path), std::move(content));
  }
  // The name NVRTC's log gives the source: its own where the daemon takes
  // it.
  std::string name = BaseName(file);
  for (char& c : name) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '-' && c != '.' && c != '+') c = '_';
  }
  if (name.size() > 128) name = name.substr(name.size() - 128);
  if (IsPlainName(name)) spec->name = name;
  spec->options = options;
  spec->name_expressions = std::move(expressions);
  return std::nullopt;
}

std::optional<Failure> CompileSource(Session& session, const std::string& file,
                                     const CompileSpec& spec, std::FILE* warnings,
                                     CompiledModule* compiled) {
  absl::StatusOr<CompiledModule> out = session.CompileModule(spec);
  const std::string what = absl::StrCat("compile ", file);
  if (!out.ok()) {
    const absl::Status& status = out.status();
    const absl::string_view message = status.message();
    // "the compile of 'x.cu' failed; NVRTC's log:\n<log>": the log, then
    // the line that says so.
    const size_t newline = message.find('\n');
    if (newline != absl::string_view::npos) {
      PrintLog(stderr, message.substr(newline + 1));
      absl::string_view head = message.substr(0, newline);
      absl::ConsumeSuffix(&head, ":");
      return Failure{kExitFailure, absl::StrCat(what, ": ", absl::StatusCodeToString(status.code()),
                                                ": ", Printable(head), " (above)")};
    }
    Failure f = Failed(what, status);
    if (status.code() == absl::StatusCode::kFailedPrecondition &&
        absl::StrContains(message, "cannot compile kernels from source")) {
      absl::StrAppend(&f.message,
                      " (with nvcc: 'nvcc -cubin -arch=sm_XY -o FILE.cubin FILE.cu', then "
                      "'gpuexec run FILE.cubin ...')");
    }
    return f;
  }
  *compiled = *std::move(out);
  if (warnings != nullptr && !compiled->log.empty()) {
    std::fprintf(warnings, "gpuexec: NVRTC's log of %s:\n", Printable(file, 1024).c_str());
    PrintLog(warnings, compiled->log);
  }
  return std::nullopt;
}

std::optional<Failure> KernelSymbol(const CompiledModule& compiled, const std::string& file,
                                    const std::string& kernel, std::string* symbol) {
  *symbol = kernel;
  if (std::string lowered = compiled.LoweredName(kernel); !lowered.empty()) {
    *symbol = std::move(lowered);
    return std::nullopt;
  }
  const std::vector<std::string>& kernels = compiled.kernels;
  if (std::find(kernels.begin(), kernels.end(), kernel) != kernels.end()) return std::nullopt;
  // A function at namespace scope mangles as _Z<length><name><types>.
  const std::string prefix = absl::StrCat("_Z", kernel.size(), kernel);
  std::vector<std::string> matches;
  for (const std::string& k : kernels) {
    if (absl::StartsWith(k, prefix)) matches.push_back(k);
  }
  if (matches.size() == 1) *symbol = matches.front();
  if (matches.size() > 1) {
    std::vector<std::string> named;
    for (const std::string& m : matches) {
      const std::string expression = ExpressionOf(compiled, m);
      named.push_back(expression.empty()
                          ? Printable(m, 256)
                          : absl::StrCat(Printable(m, 256), " (", Printable(expression, 256), ")"));
    }
    return FailedLocally(absl::StrCat(
        "run ", Printable(kernel, 256), ": ", Printable(file, 512), " has ", matches.size(),
        " kernels of that name (overloads or template instantiations): ",
        absl::StrJoin(named, ", "), "; give one as KERNEL, by its lowered name or as NAME<TYPES>"));
  }
  return std::nullopt;
}

std::optional<Failure> Compile(const CommandLine& cl) {
  if (cl.positional.size() != 1) {
    return Usage("compile takes one FILE, the CUDA C++ source (see 'gpuexec help compile')");
  }
  const std::string& file = cl.positional[0];
  CompileSpec spec;
  if (auto f = ReadSource(cl, "compile", file, /*kernel=*/nullptr, &spec)) return f;
  const auto output = cl.flags.find("output");
  spec.return_image = output != cl.flags.end();
  if (spec.return_image && output->second.empty()) {
    return Usage("compile: --output (-o) names the file to write the image to");
  }
  Connection c;
  if (auto f = Connect(cl, /*open_session=*/true, &c)) return f;
  CompiledModule compiled;
  if (auto f = CompileSource(*c.session, file, spec, /*warnings=*/nullptr, &compiled)) return f;
  if (auto f = PrintCompiled(file, compiled, c.session->device())) return f;
  if (!spec.return_image) return std::nullopt;
  std::ofstream out(output->second, std::ios::binary | std::ios::trunc);
  out.write(compiled.image.data(), static_cast<std::streamsize>(compiled.image.size()));
  out.close();
  if (!out) {
    return FailedLocally(absl::StrCat("compile ", Printable(file, 512), ": cannot write ",
                                      Printable(output->second, 512), ": ", std::strerror(errno)));
  }
  std::printf("wrote %zu bytes of %s to %s\n", compiled.image.size(),
              compiled.image_is_ptx ? "PTX" : "cubin", Printable(output->second, 512).c_str());
  return std::nullopt;
}

}  // namespace gpuexec::cli
