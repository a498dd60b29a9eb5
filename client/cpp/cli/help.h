#ifndef GPUEXEC_CLIENT_CPP_CLI_HELP_H_
#define GPUEXEC_CLIENT_CPP_CLI_HELP_H_

// The prose of the tool's help: each command's usage lines, what it does
// and its examples. The flags' own lines are generated from their
// definitions (command_line.cc) and printed between the two.

namespace gpuexec::cli::help {

struct Text {
  const char* usage;        // after "Usage: ", one or more lines
  const char* description;  // before the flags
  const char* footer;       // after the flags
};

extern const Text kMain;
extern const Text kDevices;
extern const Text kLoad;
extern const Text kInfo;
extern const Text kCompile;
extern const Text kRun;
extern const Text kTop;
extern const Text kDrain;
extern const Text kHelp;

}  // namespace gpuexec::cli::help

#endif  // GPUEXEC_CLIENT_CPP_CLI_HELP_H_
