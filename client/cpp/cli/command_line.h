#ifndef GPUEXEC_CLIENT_CPP_CLI_COMMAND_LINE_H_
#define GPUEXEC_CLIENT_CPP_CLI_COMMAND_LINE_H_

// The tool's command line, read with CLI11: the commands, their flags and
// the help generated from them. Flags go anywhere after the command (the
// global ones also before it), as --flag=VALUE or --flag VALUE; every long
// flag is spelt with '-' or '_' alike (--tls_ca, --tls-ca), and the values
// are kept under the spelling in kFlags. Everything after "--" is an
// argument. The values are checked by the commands, not here. A
// repeatable flag (--include, --nvrtc_option, --name_expression) keeps
// every value given, in order.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cli/failure.h"

namespace gpuexec::cli {

// "gpuexec 0.1.0 (gpuexec.v1)": the tool's --version, as gpuexecd prints
// its own (gpuexec/version.h).
std::string VersionLine();

struct CommandLine {
  std::string command;                  // "" when none was given
  std::vector<std::string> positional;  // after the command
  // By the name in kFlags; a boolean flag given alone: "true".
  std::map<std::string, std::string> flags;
  // The repeatable flags given, by the name in kFlags: every value in order.
  std::map<std::string, std::vector<std::string>> repeated;
};

// What the command line asks for: a command to run, or text to print and
// an exit status (help, --version).
struct Parsed {
  CommandLine cl;
  std::optional<std::string> print;  // to stdout, then exit 0
};

// A usage failure (exit 2) saying what is wrong with the line.
std::optional<Failure> ParseCommandLine(int argc, const char* const* argv, Parsed* parsed);

// The generated help of the tool ("") or of one of its commands; nullopt
// for a command there is not.
std::optional<std::string> HelpText(const std::string& command);

// The commands a flag belongs to ("run", "top", "compile run"); nullptr
// for a global flag or one there is not.
const char* FlagCommand(const std::string& name);

}  // namespace gpuexec::cli

#endif  // GPUEXEC_CLIENT_CPP_CLI_COMMAND_LINE_H_
