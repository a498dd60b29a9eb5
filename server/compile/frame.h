#ifndef GPUEXEC_SERVER_COMPILE_FRAME_H_
#define GPUEXEC_SERVER_COMPILE_FRAME_H_

// One message each way between the daemon and a compile process: its
// length (4 bytes, little-endian), then its bytes, on a stream socket.

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gpuexec::compile {

absl::Status WriteFrame(int fd, const std::string& bytes, absl::Time deadline);

// A frame of at most `max` bytes. DEADLINE_EXCEEDED past `deadline`;
// UNAVAILABLE when the peer closed before a whole frame; OUT_OF_RANGE for
// a length past `max`.
absl::StatusOr<std::string> ReadFrame(int fd, size_t max, absl::Time deadline);

}  // namespace gpuexec::compile

#endif  // GPUEXEC_SERVER_COMPILE_FRAME_H_
