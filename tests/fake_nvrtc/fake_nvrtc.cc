// A test double of NVRTC (libnvrtc) at its C ABI.
//
// The compile process opens this library with dlopen() in place of
// libnvrtc and resolves GPUEXEC_NVRTC_ENTRY_POINTS (server/compile/
// nvrtc_api.h) with dlsym(), so CI runs every compile path without a CUDA
// toolkit. Each entry point has exactly its PFN_ signature; nothing else is
// exported. Its "compile" reads the source (source_scan.h), lowers names
// (mangle.h) and writes a PTX module and a cubin that the libcuda double
// loads (image_writer.h), with NVRTC's result codes and log wording.
//
// Model:
//   * nvrtcVersion: 13.0, or GXFAKE_NVRTC_VERSION=MAJOR.MINOR. Supported
//     architectures: CUDA 13.0's (compile_options.h). nvrtcGetErrorString:
//     the code's name, "NVRTC_ERROR unknown" for any other value.
//   * nvrtcCreateProgram copies the source, the name ("default_program"
//     when NULL or empty) and the headers. Headers are the only files: an
//     #include resolves to a header whose include name is exactly the
//     written name, else the compile fails with `<file>(<line>):
//     catastrophic error: cannot open source file "<name>"` (with <name>
//     and no -I option: `could not open source file "<name>" (no
//     directories in search list)`), as NVRTC writes them. A cycle is
//     `#include file "<name>" includes itself`; nesting deeper than 32 is
//     refused too. Every catastrophic error ends the log with `1
//     catastrophic error detected in the compilation of "<program>".` and
//     `Compilation terminated.`; ordinary errors with `N error(s) detected
//     in the compilation of "<program>".`
//   * Preprocessing modelled: #define NAME [VALUE] / #undef, -D / -U,
//     #ifdef, #ifndef, #if and #elif over defined(), !, &&, ||, ==, !=, <,
//     >, <=, >=, parentheses, numbers and macro names (their numeric value);
//     #else, #endif, #pragma once, #error. Predefined: __CUDACC__,
//     __CUDACC_RTC__, __CUDA_ARCH__ (XY0) and __cplusplus (201703).
//     Macros are not expanded in the text; line continuations and raw
//     strings are not modelled. An #if the double cannot evaluate is an
//     error. `#error TEXT` on an active line: `<file>(<line>):
//     catastrophic error: #error directive: TEXT` (NVRTC's wording).
//   * Kernels: every definition `__global__ void NAME(PARAMS) {` (with
//     __launch_bounds__ and similar), extern "C" alone or in an extern "C"
//     { } block: symbol NAME; otherwise the C++ mangled name. A template
//     `template <typename T, ...> __global__ void NAME(...)` gives a kernel
//     per nvrtcAddNameExpression that instantiates it ("NAME<float>",
//     "&NAME<double>"); an expression naming a kernel that is not a
//     template lowers to that kernel's symbol. Parameter types: bool, char,
//     short, int, long, long long (signed / unsigned), float, double,
//     intN_t / uintN_t, size_t, ptrdiff_t, intptr_t, uintptr_t, __half and
//     __nv_bfloat16 (2 bytes; the real NVRTC needs their headers and the
//     typedefs), any pointer (8 bytes), template parameters; const,
//     volatile and __restrict__ ignored for the layout. Anything else:
//     `<file>(<line>): error: identifier "<type>" is undefined`.
//     Namespaces, structs, typedefs in the source, references and arrays
//     are not modelled. Source with no kernel compiles to an empty module.
//   * Name expressions: nvrtcGetLoweredName gives the Itanium name (see
//     mangle.h for what is modelled); valid until the program is
//     destroyed. An expression that names no kernel, or one the double
//     cannot instantiate, fails the compile with NVRTC_ERROR_COMPILATION
//     (as NVRTC does) and `__nv_name_map(<n>): error: ...` log lines.
//     Before a successful compile: NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_
//     COMPILATION; an expression never added: NAME_EXPRESSION_NOT_VALID;
//     adding one once a compile was tried: NO_NAME_EXPRESSIONS_AFTER_
//     COMPILATION.
//   * Outputs (image_writer.h): PTX always (`.target sm_XY` also for
//     compute_XY); a cubin only for sm_XY, else nvrtcGetCUBINSize says 0.
//     Before a successful compile the PTX is "" (size 1) and the cubin
//     size 0. Sizes of the PTX and the log count their NUL; an empty log
//     has size 1. A program may be compiled again: each compile replaces
//     the log and the outputs.
//   * Markers for tests, read anywhere in the program's source (not its
//     headers, comments included), acted on after the options are
//     accepted, in this order (none with GXFAKE_SIMULATOR set, as the
//     daemon's simulator sets it: there the source is a client's):
//       GXFAKE_COMPILE_CRASH       raise(SIGSEGV).
//       GXFAKE_COMPILE_SPIN        busy-loop forever (for CPU and wall
//                                  clock limits).
//       GXFAKE_COMPILE_ALLOC       allocate and touch 64 MiB blocks until
//                                  malloc fails, free them, return
//                                  NVRTC_ERROR_OUT_OF_MEMORY (log `nvrtc:
//                                  error: out of memory`). Only ever run it
//                                  under an RLIMIT_AS.
//       GXFAKE_COMPILE_SLEEP_MS=N  sleep N ms (at most 9 digits), then
//                                  compile as usual.
//       GXFAKE_COMPILE_REACH_OUT   try what a compromised compiler would
//                                  against the daemon (a signal to the
//                                  parent, with signal 0; fork; reading
//                                  the parent's rlimit; renicing it; a
//                                  socket; creating a file in its
//                                  working directory and in /tmp;
//                                  chmod of that directory; F_SETOWN
//                                  of fd 3 to the parent; kill of the
//                                  parent's process group) and
//                                  say in the log, as
//                                  warnings, how each went: `reach-out:
//                                  kill parent: EPERM` or `... allowed`.
//       GXFAKE_COMPILE_WARN        a successful compile's log says
//                                  `<program>(<line>): warning #177-D:
//                                  variable "x" was declared but never
//                                  referenced` (the marker's line).
//
// Ownership: a program is a heap object owned by the caller from
// nvrtcCreateProgram to nvrtcDestroyProgram; lowered names point into it.
// Threads: there is no shared mutable state, so distinct programs may be
// used from distinct threads at once; one program is not thread-safe (as
// NVRTC's is not).

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "server/compile/nvrtc_api.h"
#include "tests/fake_nvrtc/compile_options.h"
#include "tests/fake_nvrtc/image_writer.h"
#include "tests/fake_nvrtc/mangle.h"
#include "tests/fake_nvrtc/source_scan.h"

#define GX_EXPORT extern "C" __attribute__((visibility("default")))

// The program: nvrtc_api.h's opaque struct.
struct _nvrtcProgram {  // NOLINT(bugprone-reserved-identifier): NVRTC's name
  std::string source;
  std::string name;
  std::vector<std::pair<std::string, std::string>> headers;  // include name, text
  std::vector<std::string> expressions;                      // in the order added
  bool compile_tried = false;
  bool compiled = false;  // the last compile succeeded
  std::string log;
  std::string ptx;    // without its NUL
  std::string cubin;  // empty: none
  std::map<std::string, const std::string*> lowered;
  std::deque<std::string> lowered_storage;  // only grows: pointers stay valid
};

namespace {

using gxnvrtc::Diagnostics;
using gxnvrtc::ImageKernelSpec;
using gxnvrtc::ImageParam;
using gxnvrtc::KernelDecl;
using gxnvrtc::TypeRef;

constexpr size_t kAllocStep = size_t{64} << 20;
constexpr size_t kPage = 4096;
constexpr size_t kMaxExpressionEcho = 128;

const char* ResultName(nvrtcResult result) {
  static const char* const kNames[] = {
      "NVRTC_SUCCESS",
      "NVRTC_ERROR_OUT_OF_MEMORY",
      "NVRTC_ERROR_PROGRAM_CREATION_FAILURE",
      "NVRTC_ERROR_INVALID_INPUT",
      "NVRTC_ERROR_INVALID_PROGRAM",
      "NVRTC_ERROR_INVALID_OPTION",
      "NVRTC_ERROR_COMPILATION",
      "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE",
      "NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION",
      "NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION",
      "NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID",
      "NVRTC_ERROR_INTERNAL_ERROR",
      "NVRTC_ERROR_TIME_FILE_WRITE_FAILED",
      "NVRTC_ERROR_NO_PCH_CREATE_ATTEMPTED",
      "NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED",
      "NVRTC_ERROR_PCH_CREATE",
      "NVRTC_ERROR_CANCELLED",
      "NVRTC_ERROR_TIME_TRACE_FILE_WRITE_FAILED",
  };
  const int i = static_cast<int>(result);
  if (i < 0 || i >= static_cast<int>(sizeof(kNames) / sizeof(kNames[0]))) {
    return "NVRTC_ERROR unknown";
  }
  return kNames[i];
}

// The 1-based line of byte `at` of `text`.
int LineOf(const std::string& text, size_t at) {
  return 1 + static_cast<int>(std::count(text.begin(), text.begin() + at, '\n'));
}

std::string LineText(const std::string& text, size_t at) {
  const size_t start = text.rfind('\n', at) == std::string::npos ? 0 : text.rfind('\n', at) + 1;
  const size_t end = std::min(text.find('\n', at), text.size());
  return text.substr(start, end - start);
}

[[noreturn]] void Spin() {
  volatile uint64_t turns = 0;
  for (;;) turns = turns + 1;
}

// Takes memory until malloc says no, touching every page so that the
// resident set grows; gives it all back.
void AllocateUntilFailure() {
  void* chain = nullptr;  // each block's first word points to the previous
  for (;;) {
    void* block = std::malloc(kAllocStep);
    if (block == nullptr) break;
    volatile char* bytes = static_cast<volatile char*>(block);
    for (size_t at = 0; at < kAllocStep; at += kPage) bytes[at] = 1;
    std::memcpy(block, &chain, sizeof(chain));
    chain = block;
  }
  while (chain != nullptr) {
    void* previous = nullptr;
    std::memcpy(&previous, chain, sizeof(previous));
    std::free(chain);
    chain = previous;
  }
}

// A name expression: "&"? NAME ("<" ARG ("," ARG)* ">")?.
struct Expression {
  std::string name;
  std::vector<TypeRef> args;
  bool has_args = false;
};

bool ParseExpression(const std::string& text, Expression* out, std::string* bad) {
  size_t at = text.find_first_not_of(" \t");
  if (at != std::string::npos && text[at] == '&') at = text.find_first_not_of(" \t", at + 1);
  if (at == std::string::npos) {
    *bad = text;
    return false;
  }
  size_t end = at;
  while (end < text.size() &&
         (std::isalnum(static_cast<unsigned char>(text[end])) != 0 || text[end] == '_')) {
    ++end;
  }
  out->name = text.substr(at, end - at);
  if (out->name.empty() || std::isdigit(static_cast<unsigned char>(out->name[0])) != 0) {
    *bad = text;
    return false;
  }
  const size_t open = text.find_first_not_of(" \t", end);
  if (open == std::string::npos) return true;
  const size_t close = text.find_last_not_of(" \t");
  if (text[open] != '<' || text[close] != '>' || close <= open) {
    *bad = text.substr(open);
    return false;
  }
  out->has_args = true;
  size_t start = open + 1;
  for (size_t i = start; i <= close; ++i) {
    if (i != close && text[i] != ',') continue;
    TypeRef arg;
    if (!gxnvrtc::ParseTypeText(text.substr(start, i - start), &arg, bad)) return false;
    out->args.push_back(std::move(arg));
    start = i + 1;
  }
  return true;
}

ImageKernelSpec Instantiate(const KernelDecl& k, const std::vector<TypeRef>& args) {
  ImageKernelSpec spec;
  spec.symbol = gxnvrtc::MangleKernel(k, args);
  for (const TypeRef& p : k.params) {
    TypeRef t = p;
    if (p.template_index >= 0) {
      // T under the parameter's pointers; T's own const joins level 0.
      const TypeRef& arg = args[static_cast<size_t>(p.template_index)];
      t = arg;
      t.const_levels.back() = t.const_levels.back() || p.const_levels[0];
      t.const_levels.insert(t.const_levels.end(), p.const_levels.begin() + 1, p.const_levels.end());
    }
    spec.params.push_back(ImageParam{gxnvrtc::TypeBytes(t), gxnvrtc::PtxType(t)});
  }
  return spec;
}

bool Instantiable(const KernelDecl& k) {
  for (const std::string& p : k.template_params) {
    if (p.empty() || p[0] == '=') return false;  // a non-type parameter
  }
  return true;
}

// Whether the source carries a test's marker. Not under the daemon's
// simulator (GXFAKE_SIMULATOR, which gpuexecd --simulator sets), where
// the source is a client's: a client may not make its compile crash, spin,
// sleep or probe the sandbox at will.
bool Marked(const std::string& src, const char* marker) {
  static const bool simulator = std::getenv("GXFAKE_SIMULATOR") != nullptr;
  return !simulator && src.find(marker) != std::string::npos;
}

// Everything after the options: markers, scan, names, images.
nvrtcResult Compile(_nvrtcProgram* prog, const gxnvrtc::CompileOptions& options) {
  const std::string& src = prog->source;
  if (Marked(src, "GXFAKE_COMPILE_CRASH")) raise(SIGSEGV);
  if (Marked(src, "GXFAKE_COMPILE_SPIN")) Spin();
  if (Marked(src, "GXFAKE_COMPILE_ALLOC")) {
    AllocateUntilFailure();
    prog->log = "nvrtc: error: out of memory\n";
    return NVRTC_ERROR_OUT_OF_MEMORY;
  }
  const std::string sleep_marker = "GXFAKE_COMPILE_SLEEP_MS=";
  if (const size_t at = src.find(sleep_marker);
      at != std::string::npos && Marked(src, "GXFAKE_COMPILE_SLEEP_MS=")) {
    size_t end = at + sleep_marker.size();
    uint64_t ms = 0;
    for (int digits = 0; end < src.size() && digits < 9 && src[end] >= '0' && src[end] <= '9';
         ++digits, ++end) {
      ms = ms * 10 + static_cast<uint64_t>(src[end] - '0');
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }

  const std::string program = gxnvrtc::Printable(prog->name, 128);
  Diagnostics diag;
  gxnvrtc::ScanInput in;
  in.program = prog->name;
  in.source = &prog->source;
  in.headers = &prog->headers;
  in.have_include_paths = options.have_include_paths;
  in.defines = {{"__CUDACC__", "1"},
                {"__CUDACC_RTC__", "1"},
                {"__CUDA_ARCH__", std::to_string(options.arch * 10)},
                {"__cplusplus", "201703"}};
  for (const auto& [name, value] : options.macros) {
    if (value == gxnvrtc::kUndefine) {
      in.defines.erase(name);
    } else {
      in.defines[name] = value;
    }
  }
  if (const size_t at = src.find("GXFAKE_COMPILE_REACH_OUT");
      at != std::string::npos && Marked(src, "GXFAKE_COMPILE_REACH_OUT")) {
    const pid_t parent = getppid();
    auto outcome = [](int rc) {
      if (rc == 0) return std::string("allowed");
      return std::string(errno == EPERM ? "EPERM" : errno == EACCES ? "EACCES" : "failed");
    };
    std::vector<std::pair<std::string, std::string>> tried;
    tried.emplace_back("kill parent", outcome(kill(parent, 0)));
    const pid_t child = fork();
    if (child == 0) _exit(0);
    if (child > 0) waitpid(child, nullptr, 0);
    tried.emplace_back("fork", outcome(child > 0 ? 0 : -1));
    rlimit r{};
    tried.emplace_back("prlimit parent", outcome(prlimit(parent, RLIMIT_NOFILE, nullptr, &r)));
    tried.emplace_back("setpriority parent", outcome(setpriority(PRIO_PROCESS, parent, 19)));
    const int sock = socket(AF_INET, SOCK_STREAM, 0);
    if (sock >= 0) close(sock);
    tried.emplace_back("socket", outcome(sock >= 0 ? 0 : -1));
    // A descriptor's I/O signals sent to the daemon (F_SETOWN, O_ASYNC),
    // and a signal to its process group.
    tried.emplace_back("F_SETOWN parent", outcome(fcntl(3, F_SETOWN, parent)));
    tried.emplace_back("kill group", outcome(kill(-getpgid(parent), 0)));
    // The mode of its own directory (the daemon's uid owns it).
    tried.emplace_back("chmod", outcome(chmod(".", 0777)));
    // A file in its working directory (the compile's own) and in /tmp.
    for (const char* path : {"reach-out", "/tmp/gxfake-reach-out"}) {
      const int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd >= 0) {
        close(fd);
        unlink(path);
      }
      tried.emplace_back(std::string("create ") + path, outcome(fd >= 0 ? 0 : -1));
    }
    for (const auto& [what, how] : tried) {
      diag.Warning(Diagnostics::Where{program, LineOf(src, at),
                                      gxnvrtc::Printable(LineText(src, at), 256), 0},
                   "0-D", "reach-out: " + what + ": " + how);
    }
  }
  if (const size_t at = src.find("GXFAKE_COMPILE_WARN"); at != std::string::npos) {
    diag.Warning(
        Diagnostics::Where{program, LineOf(src, at), gxnvrtc::Printable(LineText(src, at), 256), 0},
        "177-D", "variable \"x\" was declared but never referenced");
  }
  const std::vector<KernelDecl> decls = gxnvrtc::ScanSource(in, &diag);

  std::vector<ImageKernelSpec> kernels;
  for (const KernelDecl& k : decls) {
    if (!k.is_template()) kernels.push_back(Instantiate(k, {}));
  }
  std::map<std::string, std::string> lowered;
  for (size_t i = 0; i < prog->expressions.size() && !diag.catastrophic(); ++i) {
    const std::string& text = prog->expressions[i];
    const std::string where = "__nv_name_map(" + std::to_string(i + 2) + "): error: ";
    Expression e;
    std::string bad;
    const KernelDecl* match = nullptr;
    if (ParseExpression(text, &e, &bad)) {
      for (const KernelDecl& k : decls) {
        if (k.name == e.name && k.is_template() == e.has_args &&
            (!e.has_args || (k.template_params.size() == e.args.size() && Instantiable(k)))) {
          match = &k;
          break;
        }
      }
      if (match == nullptr) bad = e.name;
    }
    if (match == nullptr) {
      diag.ErrorLine(where + "identifier \"" + gxnvrtc::Printable(bad, kMaxExpressionEcho) +
                     "\" is undefined");
      diag.ErrorLine(where +
                     "Error in parsing name expression for lowered name lookup. Input name "
                     "expression was: \"" +
                     gxnvrtc::Printable(text, kMaxExpressionEcho) + "\"");
      continue;
    }
    ImageKernelSpec spec = Instantiate(*match, e.args);
    lowered[text] = spec.symbol;
    const bool seen = std::any_of(kernels.begin(), kernels.end(), [&](const ImageKernelSpec& s) {
      return s.symbol == spec.symbol;
    });
    if (!seen && match->is_template()) kernels.push_back(std::move(spec));
  }
  if (kernels.size() > gxnvrtc::kMaxKernels) {
    diag.ErrorLine(program + ": error: the NVRTC double compiles at most " +
                   std::to_string(gxnvrtc::kMaxKernels) + " kernels");
  }
  for (const ImageKernelSpec& k : kernels) {
    size_t total = 0;
    gxnvrtc::ParamOffsets(k.params, &total);
    if (total > gxnvrtc::kMaxParamBytes) {
      diag.ErrorLine(program + ": error: Formal parameter space overflowed (" +
                     std::to_string(total) + " bytes required, max " +
                     std::to_string(gxnvrtc::kMaxParamBytes) + " bytes allowed) in function " +
                     gxnvrtc::Printable(k.symbol, 128));
    }
  }
  prog->log = diag.Log(program);
  if (diag.catastrophic() || diag.errors() > 0) return NVRTC_ERROR_COMPILATION;

  prog->ptx = gxnvrtc::WritePtx(options.arch, kernels);
  if (options.real_arch) {
    const int registers = options.max_registers > 0 ? std::min(options.max_registers, 32) : 32;
    prog->cubin = gxnvrtc::WriteCubin(options.arch, kernels, registers);
  }
  for (const auto& [expression, symbol] : lowered) {
    prog->lowered_storage.push_back(symbol);
    prog->lowered[expression] = &prog->lowered_storage.back();
  }
  return NVRTC_SUCCESS;
}

// A string out: `size` counts the NUL.
nvrtcResult SizeOut(const std::string& s, size_t* size) {
  if (size == nullptr) return NVRTC_ERROR_INVALID_INPUT;
  *size = s.size() + 1;
  return NVRTC_SUCCESS;
}
nvrtcResult CopyOut(const std::string& s, char* out) {
  if (out == nullptr) return NVRTC_ERROR_INVALID_INPUT;
  std::memcpy(out, s.c_str(), s.size() + 1);
  return NVRTC_SUCCESS;
}

}  // namespace

GX_EXPORT const char* nvrtcGetErrorString(nvrtcResult result) { return ResultName(result); }

GX_EXPORT nvrtcResult nvrtcVersion(int* major, int* minor) {
  if (major == nullptr || minor == nullptr) return NVRTC_ERROR_INVALID_INPUT;
  *major = 13;
  *minor = 0;
  if (const char* v = std::getenv("GXFAKE_NVRTC_VERSION")) {
    char* dot = nullptr;
    const long m = std::strtol(v, &dot, 10);
    if (dot != v && *dot == '.') {
      char* end = nullptr;
      const long n = std::strtol(dot + 1, &end, 10);
      if (end != dot + 1 && *end == '\0' && m >= 0 && m < 1000 && n >= 0 && n < 1000) {
        *major = static_cast<int>(m);
        *minor = static_cast<int>(n);
      }
    }
  }
  return NVRTC_SUCCESS;
}

GX_EXPORT nvrtcResult nvrtcGetNumSupportedArchs(int* num_archs) {
  if (num_archs == nullptr) return NVRTC_ERROR_INVALID_INPUT;
  *num_archs = static_cast<int>(std::size(gxnvrtc::kSupportedArchs));
  return NVRTC_SUCCESS;
}

GX_EXPORT nvrtcResult nvrtcGetSupportedArchs(int* supported_archs) {
  if (supported_archs == nullptr) return NVRTC_ERROR_INVALID_INPUT;
  std::copy(std::begin(gxnvrtc::kSupportedArchs), std::end(gxnvrtc::kSupportedArchs),
            supported_archs);
  return NVRTC_SUCCESS;
}

GX_EXPORT nvrtcResult nvrtcCreateProgram(nvrtcProgram* prog, const char* src, const char* name,
                                         int num_headers, const char* const* headers,
                                         const char* const* include_names) {
  if (prog == nullptr) return NVRTC_ERROR_INVALID_PROGRAM;
  if (src == nullptr || num_headers < 0 ||
      (num_headers > 0 && (headers == nullptr || include_names == nullptr))) {
    return NVRTC_ERROR_INVALID_INPUT;
  }
  for (int i = 0; i < num_headers; ++i) {
    if (headers[i] == nullptr || include_names[i] == nullptr) return NVRTC_ERROR_INVALID_INPUT;
  }
  auto* p = new _nvrtcProgram;
  p->source = src;
  p->name = name == nullptr || *name == '\0' ? "default_program" : name;
  for (int i = 0; i < num_headers; ++i) p->headers.emplace_back(include_names[i], headers[i]);
  *prog = p;
  return NVRTC_SUCCESS;
}

GX_EXPORT nvrtcResult nvrtcDestroyProgram(nvrtcProgram* prog) {
  if (prog == nullptr || *prog == nullptr) return NVRTC_ERROR_INVALID_PROGRAM;
  delete *prog;
  *prog = nullptr;
  return NVRTC_SUCCESS;
}

GX_EXPORT nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int num_options,
                                          const char* const* options) {
  if (prog == nullptr) return NVRTC_ERROR_INVALID_PROGRAM;
  if (num_options < 0 || (num_options > 0 && options == nullptr)) return NVRTC_ERROR_INVALID_INPUT;
  for (int i = 0; i < num_options; ++i) {
    if (options[i] == nullptr) return NVRTC_ERROR_INVALID_INPUT;
  }
  prog->compile_tried = true;
  prog->compiled = false;
  prog->log.clear();
  prog->ptx.clear();
  prog->cubin.clear();
  prog->lowered.clear();
  gxnvrtc::CompileOptions parsed;
  nvrtcResult result = gxnvrtc::ParseCompileOptions(
      num_options, options, gxnvrtc::Printable(prog->name, 128), &parsed, &prog->log);
  if (result == NVRTC_SUCCESS) result = Compile(prog, parsed);
  if (result != NVRTC_SUCCESS) {
    prog->ptx.clear();
    prog->cubin.clear();
    prog->lowered.clear();
  }
  prog->compiled = result == NVRTC_SUCCESS;
  return result;
}

GX_EXPORT nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t* ptx_size) {
  if (prog == nullptr) return NVRTC_ERROR_INVALID_PROGRAM;
  return SizeOut(prog->ptx, ptx_size);
}

GX_EXPORT nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char* ptx) {
  if (prog == nullptr) return NVRTC_ERROR_INVALID_PROGRAM;
  return CopyOut(prog->ptx, ptx);
}

GX_EXPORT nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t* cubin_size) {
  if (prog == nullptr) return NVRTC_ERROR_INVALID_PROGRAM;
  if (cubin_size == nullptr) return NVRTC_ERROR_INVALID_INPUT;
  *cubin_size = prog->cubin.size();
  return NVRTC_SUCCESS;
}

GX_EXPORT nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char* cubin) {
  if (prog == nullptr) return NVRTC_ERROR_INVALID_PROGRAM;
  if (cubin == nullptr) return NVRTC_ERROR_INVALID_INPUT;
  std::memcpy(cubin, prog->cubin.data(), prog->cubin.size());
  return NVRTC_SUCCESS;
}

GX_EXPORT nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t* log_size) {
  if (prog == nullptr) return NVRTC_ERROR_INVALID_PROGRAM;
  return SizeOut(prog->log, log_size);
}

GX_EXPORT nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char* log) {
  if (prog == nullptr) return NVRTC_ERROR_INVALID_PROGRAM;
  return CopyOut(prog->log, log);
}

GX_EXPORT nvrtcResult nvrtcAddNameExpression(nvrtcProgram prog, const char* const name_expression) {
  if (prog == nullptr) return NVRTC_ERROR_INVALID_PROGRAM;
  if (name_expression == nullptr) return NVRTC_ERROR_INVALID_INPUT;
  if (prog->compile_tried) return NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION;
  prog->expressions.emplace_back(name_expression);
  return NVRTC_SUCCESS;
}

GX_EXPORT nvrtcResult nvrtcGetLoweredName(nvrtcProgram prog, const char* const name_expression,
                                          const char** lowered_name) {
  if (prog == nullptr) return NVRTC_ERROR_INVALID_PROGRAM;
  if (name_expression == nullptr || lowered_name == nullptr) return NVRTC_ERROR_INVALID_INPUT;
  if (!prog->compiled) return NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION;
  auto it = prog->lowered.find(name_expression);
  if (it == prog->lowered.end()) return NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID;
  *lowered_name = it->second->c_str();
  return NVRTC_SUCCESS;
}

// Every entry point with exactly its PFN_ type.
#define GX_CHECK_SIGNATURE(name)                             \
  static_assert(std::is_same_v<decltype(&name), PFN_##name>, \
                #name " must have the signature nvrtc_api.h declares");
GPUEXEC_NVRTC_ENTRY_POINTS(GX_CHECK_SIGNATURE)
#undef GX_CHECK_SIGNATURE
