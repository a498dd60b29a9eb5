// run --repeat=N [--graph] (repeat.h).
#include "cli/repeat.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cli/args.h"

namespace gpuexec::cli {

std::optional<Failure> ParseRepeat(const std::string* repeat, const std::string* graph,
                                   RepeatFlags* out) {
  if (graph != nullptr) {
    absl::StatusOr<bool> on = ParseFlagBool(*graph);
    if (!on.ok()) return Usage(absl::StrCat("run: --graph: ", on.status().message()));
    out->graph = *on;
  }
  if (repeat != nullptr) {
    uint64_t n = 0;
    if (!absl::SimpleAtoi(*repeat, &n) || n == 0 || n > kMaxRepeat) {
      return Usage(absl::StrCat("run: --repeat takes a count from 1 to ", kMaxRepeat, ", not '",
                                Printable(*repeat, 32), "'"));
    }
    out->times = n;
  }
  if (out->graph && out->times > kMaxGraphRepeat) {
    return Usage(absl::StrCat("run: --graph records --repeat launches as one graph of at most ",
                              kMaxGraphRepeat, " nodes (the daemon's limit); ", out->times,
                              " asked: repeat fewer, or drop --graph"));
  }
  return std::nullopt;
}

absl::StatusOr<RepeatTimes> RunRepeated(Session& session, const Function& function,
                                        const LaunchConfig& config, const std::vector<Arg>& args,
                                        const RepeatFlags& flags) {
  RepeatTimes t;
  if (!flags.graph) {
    // A wait every kRepeatBatch launches: a session's stream holds at most
    // 8192 operations behind its 256 running launches (the daemon refuses
    // more, RESOURCE_EXHAUSTED), and a GPU's kernels outlast their launch.
    // The GPU times of the batches add up to the run's.
    constexpr uint64_t kRepeatBatch = 4096;
    const absl::Time start = absl::Now();
    for (uint64_t i = 0; i < flags.times; ++i) {
      if (absl::Status st = session.LaunchAsync(function, config, args); !st.ok()) return st;
      if ((i + 1) % kRepeatBatch == 0 || i + 1 == flags.times) {
        absl::StatusOr<absl::Duration> gpu = session.Synchronize();
        if (!gpu.ok()) return gpu.status();
        t.gpu += *gpu;
      }
    }
    t.wall = absl::Now() - start;
    return t;
  }
  if (absl::Status st = session.BeginGraph(); !st.ok()) return st;
  absl::Status recorded = absl::OkStatus();
  for (uint64_t i = 0; i < flags.times && recorded.ok(); ++i) {
    recorded = session.LaunchAsync(function, config, args);
  }
  // EndGraph also ends a recording a refused launch spoiled.
  absl::StatusOr<Graph> graph = session.EndGraph();
  if (!recorded.ok()) {
    if (graph.ok()) (void)graph->Free();
    return recorded;
  }
  if (!graph.ok()) return graph.status();
  t.instantiate = graph->instantiate_time();
  const absl::Time start = absl::Now();
  absl::StatusOr<absl::Duration> gpu = graph->LaunchAndWait();
  t.wall = absl::Now() - start;
  absl::Status freed = graph->Free();
  if (!gpu.ok()) return gpu.status();
  if (!freed.ok()) return freed;
  t.gpu = *gpu;
  return t;
}

std::string DescribeRepeat(const RepeatFlags& flags, const RepeatTimes& t) {
  const double n = static_cast<double>(flags.times);
  const double gpu_ms = absl::ToDoubleMilliseconds(t.gpu);
  std::string out =
      flags.graph ? absl::StrFormat(
                        ": %d runs as one graph (built in %.3f ms), replayed once", flags.times,
                        absl::ToDoubleMilliseconds(t.instantiate.value_or(absl::ZeroDuration())))
                  : absl::StrFormat(": %d launches", flags.times);
  absl::StrAppendFormat(&out, ", GPU time %.3f ms (%.1f us each); %.1f us each end to end", gpu_ms,
                        gpu_ms * 1e3 / n, absl::ToDoubleMicroseconds(t.wall) / n);
  return out;
}

}  // namespace gpuexec::cli
