#ifndef GPUEXEC_SERVER_CORE_COMMANDS_H_
#define GPUEXEC_SERVER_CORE_COMMANDS_H_

// A session's command as its transports carry it (the Execute stream; the
// command ring, docs/command-ring-plan.md): one representation, and one
// dispatch to the engine with one rule for which commands are answered, so
// that every transport checks and runs a command the same way.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <variant>

#include "absl/status/status.h"
#include "server/core/engine.h"

namespace gpuexec::core {

struct Command {
  // A barrier: answered once every earlier command of the session has been
  // started.
  struct Barrier {};
  struct Synchronize {
    // A command ring's answer area the device may post the success in
    // (LaunchSpec::answer's twin).
    std::shared_ptr<port::DirectAnswer> answer;
  };
  struct Allocate {
    uint64_t size = 0;
  };
  struct Free {
    uint64_t buffer = 0;
  };
  struct Memset {
    uint64_t buffer = 0, offset = 0, size = 0;
    uint32_t value = 0;
  };
  struct CopyBuffer {
    uint64_t dst = 0, dst_offset = 0, src = 0, src_offset = 0, size = 0;
  };
  struct ReleaseRegion {
    uint64_t region = 0;
  };
  struct BeginGraph {};
  struct EndGraph {};

  uint64_t id = 0;     // echoed in the result
  bool reply = false;  // answer a success the rule below would not
  std::variant<Barrier, LaunchSpec, Synchronize, Allocate, Free, Memset, CopyBuffer, RegionCopySpec,
               ReleaseRegion, LaunchGraphSpec, BeginGraph, EndGraph>
      op;
};

struct CommandResult {
  uint64_t id = 0;
  absl::Status status;
  // Whether the client hears of it: every failure; a success when the
  // command was a barrier, Synchronize, Allocate, RegionCopy (the client's
  // memory is not its own again before), a launch or graph replay that
  // synchronizes, EndGraph, or asked for a reply.
  bool answer = false;
  uint64_t gpu_time_ns = 0;             // Synchronize, a synchronizing launch or replay
  std::optional<BufferInfo> allocated;  // Allocate
  std::optional<GraphInfo> graph;       // EndGraph
  const char* op = "";                  // the command's name, for the log
};

// The name of a command's kind ("Launch", "barrier", ...), for the log.
const char* CommandName(const Command& command);

// Runs `command` on `session` for `caller`; `done` gets its result once it
// is answered (on an engine thread, or at once for an early refusal).
void RunCommand(Engine& engine, const Caller& caller, const std::string& session, Command command,
                std::function<void(CommandResult)> done);

}  // namespace gpuexec::core

#endif  // GPUEXEC_SERVER_CORE_COMMANDS_H_
