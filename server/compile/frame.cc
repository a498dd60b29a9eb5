// Length-framed messages on a socket, with a deadline (frame.h).

#include "server/compile/frame.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace gpuexec::compile {
namespace {

// Waits until `fd` is ready for `events` or the deadline passes.
absl::Status Wait(int fd, short events, absl::Time deadline) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError("the deadline passed");
    pollfd p{fd, events, 0};
    // Capped before the rounding up: an infinite deadline's milliseconds
    // are INT64_MAX, and one more overflowed to a timeout of 0 (the warm
    // compile process, waiting for its next fork, spun a whole core).
    const int64_t ms = std::min<int64_t>(absl::ToInt64Milliseconds(left), (1 << 30) - 1) + 1;
    const int n = poll(&p, 1, static_cast<int>(ms));
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", strerror(errno)));
    }
  }
}

absl::Status ReadExactly(int fd, char* out, size_t size, absl::Time deadline) {
  size_t done = 0;
  while (done < size) {
    if (absl::Status s = Wait(fd, POLLIN, deadline); !s.ok()) return s;
    const ssize_t n = recv(fd, out + done, size - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n == 0) {
      return absl::UnavailableError("the peer closed the socket");
    } else if (errno != EAGAIN && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("recv: ", strerror(errno)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFrame(int fd, const std::string& bytes, absl::Time deadline) {
  const uint32_t size = static_cast<uint32_t>(bytes.size());
  const char header[4] = {static_cast<char>(size), static_cast<char>(size >> 8),
                          static_cast<char>(size >> 16), static_cast<char>(size >> 24)};
  std::string all(header, 4);
  all += bytes;
  size_t done = 0;
  while (done < all.size()) {
    if (absl::Status s = Wait(fd, POLLOUT, deadline); !s.ok()) return s;
    const ssize_t n = send(fd, all.data() + done, all.size() - done, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) {
      done += static_cast<size_t>(n);
    } else if (errno != EAGAIN && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("send: ", strerror(errno)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFrame(int fd, size_t max, absl::Time deadline) {
  unsigned char header[4];
  if (absl::Status s = ReadExactly(fd, reinterpret_cast<char*>(header), 4, deadline); !s.ok()) {
    return s;
  }
  const size_t size =
      header[0] | (header[1] << 8) | (header[2] << 16) | (static_cast<size_t>(header[3]) << 24);
  if (size > max) {
    return absl::OutOfRangeError(
        absl::StrCat("a message of ", size, " bytes, over the limit of ", max));
  }
  std::string bytes(size, '\0');
  if (absl::Status s = ReadExactly(fd, bytes.data(), size, deadline); !s.ok()) return s;
  return bytes;
}

}  // namespace gpuexec::compile
