#ifndef GPUEXEC_SERVER_SHM_REGION_FD_H_
#define GPUEXEC_SERVER_SHM_REGION_FD_H_

// Host memory a same-host client shares with the daemon: a memfd passed
// by descriptor (SCM_RIGHTS over a Unix socket), never named. What the
// daemon checks of such a descriptor before it maps it, and how it takes
// one descriptor off a socket without being handed more than it asked for.
//
// The checks are those that keep a client from hurting the daemon through
// the mapping: a file the client could shrink under it (a copy into the
// gone pages would kill the process with SIGBUS), one it could grow
// without bound, one it sealed against the daemon's writes, anything
// that is not a memfd (a socket, a pipe, a regular file on a disk), and
// any size other than the one declared.

#include <fcntl.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gpuexec::shm {

// The seals a region must carry.
inline constexpr int kRequiredSeals = F_SEAL_SHRINK | F_SEAL_GROW;

struct RegionLimits {
  // The most bytes one region may have; 0 refuses every region.
  uint64_t max_bytes = 0;
};

// Checks `fd` as a region of `declared_bytes` (what the client says it
// is): a memfd sealed against shrinking and growing, not against writes,
// of exactly that many bytes, at least one page and within the limit.
// INVALID_ARGUMENT (or RESOURCE_EXHAUSTED past the limit) with a message
// that names what is wrong and the figures; the descriptor is left open.
absl::Status CheckRegionFd(int fd, uint64_t declared_bytes, const RegionLimits& limits);

// One message (a SOCK_SEQPACKET socket's) and at most one descriptor from
// a connected Unix socket (blocking, as the socket is). The message's bytes go to `data` (at most
// `capacity`); the descriptor, close-on-exec, to `*fd` (-1 if none came).
// Descriptors beyond the first, and any of a message whose control data
// was cut short, are closed and the message refused (INVALID_ARGUMENT), as
// is a message longer than `capacity`;
// returns the number of bytes, 0 at the end of the stream.
absl::StatusOr<size_t> ReceiveWithDescriptor(int socket, char* data, size_t capacity, int* fd);

// Sends `n` bytes as one message with descriptor `fd` (SCM_RIGHTS) on a
// connected Unix socket, without waiting (MSG_DONTWAIT): UNAVAILABLE when
// the socket is full or broken. The caller keeps its own `fd`.
absl::Status SendWithDescriptor(int socket, const char* data, size_t n, int fd);

}  // namespace gpuexec::shm

#endif  // GPUEXEC_SERVER_SHM_REGION_FD_H_
