// gpuexec drain: an operator's drain of the daemon on this host (the
// proto's Drain), for a node's maintenance and the DaemonSet's preStop.

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/connect.h"
#include "gpuexec/client.h"

namespace gpuexec::cli {
namespace {

bool FlagSet(const CommandLine& cl, const char* name) {
  auto it = cl.flags.find(name);
  return it != cl.flags.end() && it->second != "false";
}

void Print(const DrainStatus& st) {
  if (!st.draining) {
    std::printf("not draining: new sessions are served (%u open)\n", st.sessions_open);
    return;
  }
  std::printf("%s\n%u session(s) open", Printable(st.description, 512).c_str(), st.sessions_open);
  if (st.closed_at_deadline != 0) std::printf(", %u closed at the deadline", st.closed_at_deadline);
  std::printf("\n");
}

}  // namespace

std::optional<Failure> DrainDaemon(const CommandLine& cl) {
  if (!cl.positional.empty()) return Usage("drain takes no arguments (see 'gpuexec help drain')");
  DrainOptions o;
  o.wait = FlagSet(cl, "wait");
  o.resume = FlagSet(cl, "resume");
  if (auto it = cl.flags.find("deadline"); it != cl.flags.end()) {
    absl::StatusOr<absl::Duration> d = ParseDurationFlag(it->second);
    if (!d.ok()) return Usage(absl::StrCat("--deadline: ", d.status().message()));
    if (*d <= absl::ZeroDuration() || *d > absl::Hours(24)) {
      return Usage(
          absl::StrCat("--deadline: ", absl::FormatDuration(*d), " is outside 1ms to 24h"));
    }
    o.deadline = *d;
  }
  if (o.resume && (o.wait || o.deadline != absl::ZeroDuration())) {
    return Usage("--resume ends a drain: it takes no --wait and no --deadline");
  }
  Connection c;
  if (auto f = Connect(cl, /*open_session=*/false, &c)) return f;
  if (c.pool.has_value()) {
    return Usage("drain is for one daemon, on its host: give --target=unix:PATH, not a pool");
  }
  absl::StatusOr<DrainStatus> st = c.client->Drain(o);
  if (!st.ok()) return Failed(o.resume ? "resume the daemon" : "drain the daemon", st.status());
  Print(*st);
  return std::nullopt;
}

}  // namespace gpuexec::cli
