#ifndef GPUEXEC_CLIENT_CPP_CLI_COMMANDS_H_
#define GPUEXEC_CLIENT_CPP_CLI_COMMANDS_H_

// The tool's commands, each on a parsed command line: results on stdout,
// a failure returned (cli/failure.h).

#include <optional>

#include "cli/command_line.h"
#include "cli/failure.h"

namespace gpuexec::cli {

std::optional<Failure> Devices(const CommandLine& cl);
std::optional<Failure> Load(const CommandLine& cl);
std::optional<Failure> Info(const CommandLine& cl);
std::optional<Failure> Compile(const CommandLine& cl);      // compile_command.cc
std::optional<Failure> RunKernel(const CommandLine& cl);    // run.cc
std::optional<Failure> Top(const CommandLine& cl);          // top.cc
std::optional<Failure> DrainDaemon(const CommandLine& cl);  // drain_command.cc

}  // namespace gpuexec::cli

#endif  // GPUEXEC_CLIENT_CPP_CLI_COMMANDS_H_
