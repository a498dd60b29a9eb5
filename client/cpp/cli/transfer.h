#ifndef GPUEXEC_CLIENT_CPP_CLI_TRANSFER_H_
#define GPUEXEC_CLIENT_CPP_CLI_TRANSFER_H_

// The copies of `run`: a buffer argument filled before the launch and read
// back after it, through host memory shared with the daemon where it is on
// this host, else through gRPC; copies of 64 MiB or more show a progress
// line on a terminal (output.h).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "cli/args.h"
#include "cli/failure.h"
#include "gpuexec/client.h"

namespace gpuexec::cli {

// One argument of `run` with what it needs at the daemon.
struct RunArg {
  ArgSpec spec;
  std::string host;  // kFile: the buffer's initial bytes
  Buffer buffer;
};

// Fills argument `index`'s buffer as its spec says (zeros, a file's bytes,
// a repeated element).
std::optional<Failure> FillBuffer(Session& session, RunArg& a, size_t index);

// A buffer's bytes read back: in host memory shared with the daemon, or in
// a vector.
struct ReadBack {
  std::optional<HostMemory> local;
  std::vector<uint8_t> copy;
  absl::Span<const uint8_t> bytes;
};
absl::Status ReadBuffer(Session& session, const RunArg& a, size_t index, ReadBack* out);

}  // namespace gpuexec::cli

#endif  // GPUEXEC_CLIENT_CPP_CLI_TRANSFER_H_
