#include "internal/host_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gpuexec/v1/gpuexec.pb.h"

namespace gpuexec {
namespace internal {
namespace {

// The code of a failed system call: what the caller can do about it.
absl::StatusCode CodeOfErrno(int error) {
  switch (error) {
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case ENOSPC:
    case EFBIG:
      return absl::StatusCode::kResourceExhausted;
    case EACCES:
    case EPERM:
      return absl::StatusCode::kPermissionDenied;
    case EINVAL:
      return absl::StatusCode::kInvalidArgument;
    case EAGAIN:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status ErrnoError(int error, absl::string_view what) {
  return absl::Status(CodeOfErrno(error),
                      absl::StrCat("gpuexec client: ", what, ": ", std::strerror(error)));
}

// The socket's failure as the caller sees it: a daemon that is not there
// (or went away) is UNAVAILABLE, one that does not answer in time
// DEADLINE_EXCEEDED; either names the path.
absl::Status SocketError(int error, absl::string_view what, const std::string& path,
                         absl::Duration timeout) {
  if (error == EAGAIN || error == EWOULDBLOCK) {
    return absl::DeadlineExceededError(
        absl::StrCat("gpuexec client: ", what, " the daemon's host memory socket ", path,
                     ": no progress within ", absl::FormatDuration(timeout)));
  }
  return absl::UnavailableError(absl::StrCat("gpuexec client: ", what,
                                             " the daemon's host memory socket ", path, ": ",
                                             std::strerror(error)));
}

}  // namespace

void UniqueFd::Reset() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::StatusOr<UniqueFd> MakeRegionFd(uint64_t bytes) {
  const std::string what = absl::StrCat("a host memory region of ", bytes, " bytes");
  UniqueFd fd(memfd_create("gpuexec-region", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (fd.get() < 0) return ErrnoError(errno, absl::StrCat("memfd_create for ", what));
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return ErrnoError(errno, absl::StrCat("ftruncate of the memfd of ", what));
  }
  // Not F_SEAL_WRITE: the daemon copies device memory into the region.
  if (fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    return ErrnoError(errno, absl::StrCat("sealing the memfd of ", what));
  }
  return fd;
}

absl::StatusOr<void*> MapRegionFd(int fd, uint64_t bytes) {
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    return ErrnoError(
        errno, absl::StrCat("mmap of the memfd of a host memory region of ", bytes, " bytes"));
  }
  return data;
}

absl::StatusOr<v1::RegisterRegionResponse> RegisterOnSocket(
    const std::string& socket_path, const v1::RegisterRegionRequest& request, int fd,
    absl::Duration timeout, UniqueFd* keep) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpuexec client: the host memory socket path ", socket_path, " is ", socket_path.size(),
        " bytes; a Unix socket's path is at most ", sizeof(address.sun_path) - 1));
  }
  std::memcpy(address.sun_path, socket_path.data(), socket_path.size());

  const std::string message = request.SerializeAsString();
  if (message.size() > kMaxRegionMessageBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpuexec client: a region's registration is ", message.size(),
                     " bytes; the host memory socket takes at most ", kMaxRegionMessageBytes));
  }

  // A connection per registration: registrations are rare (each pins
  // memory, which costs far more than a connect), and a connection kept
  // for later would have to notice a daemon that restarted. A command ring
  // keeps its connection as the ring's lifeline.
  UniqueFd socket(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (socket.get() < 0) {
    return ErrnoError(errno, "socket(AF_UNIX, SOCK_SEQPACKET) for the host memory socket");
  }
  if (timeout != absl::InfiniteDuration()) {
    // Bounds connect and send (SO_SNDTIMEO) and the wait for the answer,
    // which includes the daemon's pinning of the region (SO_RCVTIMEO).
    const timeval tv = absl::ToTimeval(std::max(timeout, absl::Milliseconds(1)));
    setsockopt(socket.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    setsockopt(socket.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  int rc;
  do {
    rc = connect(socket.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return SocketError(errno, "cannot connect to", socket_path, timeout);

  iovec out_iov{const_cast<char*>(message.data()), message.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr out{};
  out.msg_iov = &out_iov;
  out.msg_iovlen = 1;
  out.msg_control = control;
  out.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&out);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  ssize_t n;
  do {
    n = sendmsg(socket.get(), &out, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return SocketError(errno, "cannot send a region to", socket_path, timeout);

  char answer[kMaxRegionMessageBytes];
  iovec in_iov{answer, sizeof(answer)};
  msghdr in{};
  in.msg_iov = &in_iov;
  in.msg_iovlen = 1;
  do {
    n = recvmsg(socket.get(), &in, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0)
    return SocketError(errno, "no answer to a region's registration from", socket_path, timeout);
  if (n == 0) {
    return absl::UnavailableError(
        absl::StrCat("gpuexec client: the daemon's host memory socket ", socket_path,
                     " closed the connection without answering a region's registration"));
  }
  if ((in.msg_flags & MSG_TRUNC) != 0) {
    return absl::DataLossError(
        absl::StrCat("gpuexec client: the answer to a region's registration on ", socket_path,
                     " is longer than the protocol's ", kMaxRegionMessageBytes, " bytes"));
  }
  v1::RegisterRegionResponse response;
  if (!response.ParseFromArray(answer, static_cast<int>(n))) {
    return absl::DataLossError(
        absl::StrCat("gpuexec client: the answer to a region's "
                     "registration on ",
                     socket_path, " (", n, " bytes) is not a RegisterRegionResponse"));
  }
  if (response.code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(response.code()), response.message());
  }
  if (keep != nullptr) *keep = std::move(socket);
  return response;
}

absl::StatusOr<uint64_t> RegisterRegion(const std::string& socket_path, const std::string& token,
                                        int fd, uint64_t bytes, absl::Duration timeout) {
  v1::RegisterRegionRequest request;
  request.set_session(token);
  request.set_bytes(bytes);
  auto response = RegisterOnSocket(socket_path, request, fd, timeout, /*keep=*/nullptr);
  if (!response.ok()) return response.status();
  if (response->region() == 0 || response->bytes() != bytes) {
    return absl::DataLossError(absl::StrCat(
        "gpuexec client: the daemon registered region ", response->region(), " of ",
        response->bytes(), " bytes for a memfd of ", bytes, " bytes (on ", socket_path, ")"));
  }
  return response->region();
}

void HostRegions::Add(const void* data, uint64_t size, uint64_t region) {
  absl::MutexLock lock(&mu_);
  by_start_[reinterpret_cast<uintptr_t>(data)] = {size, region};
  count_.store(by_start_.size(), std::memory_order_release);
}

void HostRegions::Remove(const void* data) {
  absl::MutexLock lock(&mu_);
  by_start_.erase(reinterpret_cast<uintptr_t>(data));
  count_.store(by_start_.size(), std::memory_order_release);
}

std::optional<RegionHit> HostRegions::Find(const void* data, uint64_t size) const {
  if (size == 0 || count_.load(std::memory_order_acquire) == 0) return std::nullopt;
  const uintptr_t start = reinterpret_cast<uintptr_t>(data);
  absl::MutexLock lock(&mu_);
  auto it = by_start_.upper_bound(start);
  if (it == by_start_.begin()) return std::nullopt;
  --it;
  const uint64_t offset = start - it->first;
  const auto [region_size, region] = it->second;
  if (offset >= region_size || size > region_size - offset) return std::nullopt;
  return RegionHit{region, offset};
}

}  // namespace internal
}  // namespace gpuexec
