#ifndef GPUEXEC_CLIENT_CPP_CLI_CLI_H_
#define GPUEXEC_CLIENT_CPP_CLI_CLI_H_

// The gpuexec command: subcommands devices, load, info, run and help.
// Results go to stdout; an error is one line on stderr,
// "gpuexec: <what failed>: <status>". Exit status: 0 on success, 1 when
// something failed, 2 for a malformed command line.

namespace gpuexec::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

int Main(int argc, char** argv);

}  // namespace gpuexec::cli

#endif  // GPUEXEC_CLIENT_CPP_CLI_CLI_H_
