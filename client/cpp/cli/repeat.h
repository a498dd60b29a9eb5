#ifndef GPUEXEC_CLIENT_CPP_CLI_REPEAT_H_
#define GPUEXEC_CLIENT_CPP_CLI_REPEAT_H_

// run --repeat=N [--graph]: a kernel run N times back to back, timed, as N
// launches or as one graph of N nodes replayed once, so that a user sees
// what a launch costs beside the kernel and what a graph saves.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "cli/failure.h"
#include "gpuexec/client.h"

namespace gpuexec::cli {

// The most --repeat takes, and the most with --graph (the daemon's nodes a
// graph may have).
inline constexpr uint64_t kMaxRepeat = 1000000;
inline constexpr uint64_t kMaxGraphRepeat = 4096;

struct RepeatFlags {
  uint64_t times = 1;
  bool graph = false;
};

// --repeat and --graph from their texts (nullptr: not given); a usage
// failure names the flag and its bound.
std::optional<Failure> ParseRepeat(const std::string* repeat, const std::string* graph,
                                   RepeatFlags* out);

struct RepeatTimes {
  absl::Duration gpu;   // the session's GPU time over the N runs
  absl::Duration wall;  // from the first launch (or the replay) to its end
  // With --graph: building, instantiating and uploading it.
  std::optional<absl::Duration> instantiate;
};

// Runs `function` `flags.times` times with `args`, then waits.
absl::StatusOr<RepeatTimes> RunRepeated(Session& session, const Function& function,
                                        const LaunchConfig& config, const std::vector<Arg>& args,
                                        const RepeatFlags& flags);

// The line printed after the kernel's name and geometry: ": 1000 launches,
// GPU time 12.345 ms (12.3 us each); 20.1 us each end to end".
std::string DescribeRepeat(const RepeatFlags& flags, const RepeatTimes& t);

}  // namespace gpuexec::cli

#endif  // GPUEXEC_CLIENT_CPP_CLI_REPEAT_H_
