#ifndef GPUEXEC_CLIENT_CPP_CLI_COMPILE_COMMAND_H_
#define GPUEXEC_CLIENT_CPP_CLI_COMPILE_COMMAND_H_

// Kernels from CUDA C++ source, compiled by the daemon
// (Session::CompileModule): the `compile` command (commands.h) and what
// `run` does with a FILE.cu. The source and the files of its flags are
// read and checked here, against the daemon's limits, before the daemon
// is called:
//   --include=FILE          a header, sent under FILE's base name
//   --nvrtc_option=OPTION   an NVRTC option (the daemon's allow-list)
//   --name_expression=EXPR  a template instantiation: "axpy<float>"
// NVRTC's log is printed as it came, one line a line, each escaped
// (failure.h's Printable).

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "cli/command_line.h"
#include "cli/failure.h"
#include "gpuexec/client.h"

namespace gpuexec::cli {

// The daemon's limits on one compile (server/compile/compile_request.h).
inline constexpr uint64_t kMaxSourceBytes = uint64_t{1} << 20;
inline constexpr size_t kMaxHeaders = 64;
inline constexpr uint64_t kMaxHeaderBytes = uint64_t{4} << 20;  // all together
inline constexpr size_t kMaxOptions = 64;
inline constexpr size_t kMaxOptionBytes = 256;
inline constexpr size_t kMaxNameExpressions = 64;
inline constexpr size_t kMaxNameExpressionBytes = 256;

// Whether `run` compiles FILE: its name ends in ".cu".
bool IsCudaSource(absl::string_view file);

// `load` or `info` of CUDA C++ source (FILE.cu, FILE.cuh): a usage failure
// that says what takes it; nullopt for any other file.
std::optional<Failure> RefuseSourceAsModule(absl::string_view command, const std::string& file);

// `run` of a module image given the flags of a source: a usage failure.
std::optional<Failure> RefuseSourceFlags(const CommandLine& cl, const std::string& file);

// The compile of FILE as the flags of `cl` ask for it, every file read and
// checked; `command` ("compile", "run") leads the messages. `kernel`, for
// `run`: the KERNEL given, added as a name expression when it names a
// template instantiation ("axpy<float>") not asked for with
// --name_expression.
std::optional<Failure> ReadSource(const CommandLine& cl, absl::string_view command,
                                  const std::string& file, const std::string* kernel,
                                  CompileSpec* spec);

// Compiles `spec` in the session. NVRTC's warnings go to `warnings`
// (nullptr: not printed). A source that does not compile: NVRTC's log on
// stderr, and a failure that says so.
std::optional<Failure> CompileSource(Session& session, const std::string& file,
                                     const CompileSpec& spec, std::FILE* warnings,
                                     CompiledModule* compiled);

// The name GetFunction takes for `run`'s KERNEL in a compiled module: a
// name expression's lowered name; a kernel of the module by that name
// (extern "C", or a lowered name as given); else the one C++ kernel whose
// mangled name is of a function KERNEL. Several such kernels (overloads,
// instantiations): a failure naming them. None: KERNEL, for the daemon's
// NOT_FOUND to list the module's kernels.
std::optional<Failure> KernelSymbol(const CompiledModule& compiled, const std::string& file,
                                    const std::string& kernel, std::string* symbol);

}  // namespace gpuexec::cli

#endif  // GPUEXEC_CLIENT_CPP_CLI_COMPILE_COMMAND_H_
