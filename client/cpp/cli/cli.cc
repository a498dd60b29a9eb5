#include "cli/cli.h"

#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>

#include "cli/command_line.h"
#include "cli/commands.h"
#include "cli/failure.h"
#include "cli/interrupt.h"

namespace gpuexec::cli {

int Main(int argc, char** argv) {
  Parsed parsed;
  std::optional<Failure> failure = ParseCommandLine(argc, argv, &parsed);
  const CommandLine& cl = parsed.cl;
  if (!failure && parsed.print) {
    std::fputs(parsed.print->c_str(), stdout);
    return kExitOk;
  }
  if (!failure && cl.command.empty()) {
    std::fputs(HelpText("")->c_str(), stderr);
    return kExitUsage;
  }
  if (!failure) {
    if (cl.command == "devices") failure = Devices(cl);
    if (cl.command == "load") failure = Load(cl);
    if (cl.command == "info") failure = Info(cl);
    if (cl.command == "compile") failure = Compile(cl);
    if (cl.command == "run") failure = RunKernel(cl);
    if (cl.command == "top") failure = Top(cl);
    if (cl.command == "drain") failure = DrainDaemon(cl);
  }
  // An interrupt ends the process from its own thread; this one, whose
  // call the closed session made fail, says nothing.
  while (Interrupted()) std::this_thread::sleep_for(std::chrono::seconds(1));
  std::fflush(stdout);
  if (!failure) return kExitOk;
  std::fprintf(stderr, "gpuexec: %s\n", failure->message.c_str());
  return failure->exit_code;
}

}  // namespace gpuexec::cli
