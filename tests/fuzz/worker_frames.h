#ifndef GPUEXEC_TESTS_FUZZ_WORKER_FRAMES_H_
#define GPUEXEC_TESTS_FUZZ_WORKER_FRAMES_H_

// The frames a worker's byte stream holds, as worker::Channel's format cuts
// it (a 4-byte little-endian length, then the message), up to a length
// over kMaxMessageBytes or a frame cut off by the end: what the harnesses
// of the front's reading expect it to deliver.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "server/worker/channel.h"

namespace gpuexec::fuzz {

inline std::vector<absl::string_view> WorkerFrames(absl::string_view stream) {
  std::vector<absl::string_view> out;
  while (stream.size() >= 4) {
    const auto* p = reinterpret_cast<const uint8_t*>(stream.data());
    const uint32_t n = p[0] | p[1] << 8 | p[2] << 16 | uint32_t{p[3]} << 24;
    if (n > worker::kMaxMessageBytes || stream.size() - 4 < n) break;
    out.push_back(stream.substr(4, n));
    stream.remove_prefix(4 + size_t{n});
  }
  return out;
}

}  // namespace gpuexec::fuzz

#endif  // GPUEXEC_TESTS_FUZZ_WORKER_FRAMES_H_
