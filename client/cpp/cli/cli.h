#ifndef GPUEXEC_CLIENT_CPP_CLI_CLI_H_
#define GPUEXEC_CLIENT_CPP_CLI_CLI_H_

// The gpuexec command: subcommands devices, load, info, compile, run, top, drain
// and help. Results go to stdout; an error is one line on stderr,
// "gpuexec: <what failed>: <status>" (led by NVRTC's log for a source that
// does not compile). Exit status: 0 on success, 1 when
// something failed, 2 for a malformed command line, 130 when interrupted
// (interrupt.h).
//
// The pieces: command_line (flags and help, on CLI11), help (its prose),
// args (the syntax of kernel arguments), connect (the daemon and session),
// module_file (what is read from a module image here), commands and run
// (the commands), compile_command (CUDA C++ source: `compile`, and `run`
// of a .cu file), transfer (run's copies), output (how results are
// written), interrupt (Ctrl-C); top's own: http_get (one GET of the
// metrics endpoint), metrics_text (the exposition, read), top_frame (what a
// frame shows) and top (the loop).

namespace gpuexec::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

int Main(int argc, char** argv);

}  // namespace gpuexec::cli

#endif  // GPUEXEC_CLIENT_CPP_CLI_CLI_H_
