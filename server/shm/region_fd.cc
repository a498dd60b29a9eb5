#include "server/shm/region_fd.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010  // Linux 5.1
#endif

namespace gpuexec::shm {
namespace {

// What a descriptor that cannot carry seals is, asked without touching any
// file system (fstat of a file on FUSE or a hung NFS mount can block for
// ever): a socket, a pipe, or some other file.
const char* KindOfUnsealable(int fd) {
  int type = 0;
  socklen_t len = sizeof(type);
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0) return "a socket";
  if (fcntl(fd, F_GETPIPE_SZ) >= 0) return "a pipe";
  return "a file that cannot carry seals";
}

}  // namespace

absl::Status CheckRegionFd(int fd, uint64_t declared_bytes, const RegionLimits& limits) {
  // Seals first: only shared memory (a memfd) carries them, and asking
  // never reaches a file system that could keep the caller waiting.
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the region's descriptor is ", KindOfUnsealable(fd), ", not a memfd"));
  }
  // The daemon maps it for reading and writing.
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) != O_RDWR) {
    return absl::InvalidArgumentError(
        "the region's memfd is not open for reading and writing (O_RDWR): the daemon copies "
        "both ways");
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError("the region's descriptor is not a memfd");
  }
  if ((seals & kRequiredSeals) != kRequiredSeals) {
    return absl::InvalidArgumentError(
        "the region's memfd is not sealed against shrinking and growing (F_SEAL_SHRINK and "
        "F_SEAL_GROW): the daemon maps only memory whose size cannot change under it");
  }
  if ((seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) {
    return absl::InvalidArgumentError(
        "the region's memfd is sealed against writes: the daemon could not copy into it");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size != declared_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the region's memfd holds ", size, " bytes, not the ", declared_bytes, " declared"));
  }
  if (size == 0) return absl::InvalidArgumentError("the region's memfd is empty");
  if (size > limits.max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("a region of ", size,
                                                     " bytes is over the daemon's limit of ",
                                                     limits.max_bytes, " bytes a region"));
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> ReceiveWithDescriptor(int socket, char* data, size_t capacity, int* fd) {
  *fd = -1;
  // Room for more descriptors than one, so that extra ones are seen (and
  // closed) rather than silently cut off.
  constexpr int kRoom = 8;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kRoom)];
  iovec iov{data, capacity};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    return absl::UnavailableError(absl::StrCat("cannot read the socket: ", strerror(errno)));
  }
  std::vector<int> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int got;
      std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.push_back(got);
    }
  }
  auto refuse = [&fds](std::string why) {
    for (int f : fds) close(f);
    return absl::InvalidArgumentError(std::move(why));
  };
  if ((msg.msg_flags & MSG_CTRUNC) != 0) {
    return refuse(absl::StrCat("a message came with more than ", kRoom,
                               " descriptors; one region's memfd at most"));
  }
  if ((msg.msg_flags & MSG_TRUNC) != 0) {
    return refuse(absl::StrCat("a message is longer than the ", capacity, " bytes taken"));
  }
  if (fds.size() > 1) {
    return refuse(absl::StrCat("a message came with ", fds.size(),
                               " descriptors; one region's memfd at most"));
  }
  if (!fds.empty()) *fd = fds[0];
  return static_cast<size_t>(n);
}

absl::Status SendWithDescriptor(int socket, const char* data, size_t n, int fd) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{const_cast<char*>(data), n};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  ssize_t k;
  do {
    k = sendmsg(socket, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (k < 0 && errno == EINTR);
  if (k < 0) {
    return absl::UnavailableError(absl::StrCat("cannot pass the descriptor: ", strerror(errno)));
  }
  if (static_cast<size_t>(k) != n)
    return absl::UnavailableError("the descriptor's message was cut");
  return absl::OkStatus();
}

}  // namespace gpuexec::shm
