#include "server/rpc/unix_listener.h"

#include <errno.h>
#include <grp.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/common/log.h"
#include "server/rpc/front_limits.h"

namespace gpuexec::rpc {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(
      absl::StrCat("Unix socket ", path, ": ", what, ": ", std::strerror(errno)));
}

absl::StatusOr<gid_t> GroupId(const std::string& group) {
  std::vector<char> buffer(16384);
  struct group entry;
  struct group* found = nullptr;
  if (getgrnam_r(group.c_str(), &entry, buffer.data(), buffer.size(), &found) != 0 ||
      found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--unix_socket_group: no group '", group, "'"));
  }
  return found->gr_gid;
}

}  // namespace

absl::StatusOr<int> BindUnixSocket(const std::string& path, const std::string& group, int type) {
  // Bound in a directory of its own (mode 0700) first, so that nobody can
  // swap the name for a symbolic link under the chmod and chown.
  std::string dir_template = absl::StrCat(path, ".XXXXXX");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (dir_template.size() + 2 >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("Unix socket path ", path, " is too long (",
                                                   sizeof(addr.sun_path) - 10,
                                                   " characters at most)"));
  }
  gid_t gid = static_cast<gid_t>(-1);
  if (!group.empty()) {
    auto g = GroupId(group);
    if (!g.ok()) return g.status();
    gid = *g;
  }
  // A socket left by an earlier daemon is replaced; any other file is not.
  struct stat st;
  if (lstat(path.c_str(), &st) == 0 && !S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("Unix socket path ", path, " exists and is not a socket"));
  }
  if (mkdtemp(dir_template.data()) == nullptr) return Errno("mkdtemp", dir_template);
  const std::string temp = absl::StrCat(dir_template, "/s");
  std::memcpy(addr.sun_path, temp.c_str(), temp.size() + 1);
  const int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  auto fail = [&](absl::string_view what) {
    absl::Status s = Errno(what, path);
    unlink(temp.c_str());
    rmdir(dir_template.c_str());
    if (fd >= 0) close(fd);
    return s;
  };
  if (fd < 0) return fail("socket");
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return fail("bind");
  // Who may connect is decided by the file's mode and group, set before
  // the socket appears under its name.
  if (chmod(temp.c_str(), 0660) != 0) return fail("chmod");
  if (gid != static_cast<gid_t>(-1) && chown(temp.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    return fail("chown");
  }
  if (listen(fd, 128) != 0) return fail("listen");
  if (rename(temp.c_str(), path.c_str()) != 0) return fail("rename");
  rmdir(dir_template.c_str());
  return fd;
}

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Start(const std::string& path,
                                                                  const std::string& group,
                                                                  grpc::Server* server,
                                                                  Identity* identity,
                                                                  const Limits& limits) {
  absl::StatusOr<int> bound = BindUnixSocket(path, group, SOCK_STREAM);
  if (!bound.ok()) return bound.status();
  const int fd = *bound;
  const int wake = eventfd(0, EFD_CLOEXEC);
  if (wake < 0) {
    absl::Status s = Errno("eventfd", path);
    unlink(path.c_str());
    close(fd);
    return s;
  }
  return std::unique_ptr<UnixListener>(new UnixListener(path, fd, wake, server, identity, limits));
}

UnixListener::UnixListener(std::string path, int fd, int wake_fd, grpc::Server* server,
                           Identity* identity, const Limits& limits)
    : path_(std::move(path)),
      fd_(fd),
      wake_fd_(wake_fd),
      server_(server),
      identity_(identity),
      limits_(limits) {
  thread_ = std::thread(&UnixListener::AcceptLoop, this);
}

UnixListener::~UnixListener() {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
  unlink(path_.c_str());
  close(fd_);
  close(wake_fd_);
}

std::string UnixListener::Refusal(int conn, uid_t uid) {
  // Still open: the same descriptor number on the same socket.
  uint32_t of_uid = 0;
  size_t kept = 0;
  for (const Open& o : open_) {
    struct stat st;
    if (fstat(o.fd, &st) != 0 || static_cast<uint64_t>(st.st_dev) != o.dev ||
        static_cast<uint64_t>(st.st_ino) != o.ino || o.fd == conn) {
      continue;
    }
    if (o.uid == uid) ++of_uid;
    open_[kept++] = o;
  }
  open_.resize(kept);
  if (InDescriptorReserve(conn, kDescriptorReserve)) {
    return absl::StrCat("the daemon has fewer than ", kDescriptorReserve,
                        " file descriptors left (its limit is ", DescriptorLimit(),
                        "; LimitNOFILE= in the systemd unit), kept for its workers");
  }
  if (limits_.max_connections != 0 && open_.size() >= limits_.max_connections) {
    return absl::StrCat(open_.size(),
                        " connections are open, the socket's limit (--unix_max_connections)");
  }
  if (limits_.max_per_uid != 0 && of_uid >= limits_.max_per_uid) {
    return absl::StrCat("uid ", uid, " has ", of_uid,
                        " connections open, the limit of one uid (--unix_max_connections_per_uid)");
  }
  return "";
}

void UnixListener::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      log::Error("Unix socket ", path_, ": poll: ", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int conn = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) {
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        log::Warning("Unix socket ", path_, ": accept: ", std::strerror(errno));
        // Out of file descriptors, say: do not spin.
        poll(nullptr, 0, 100);
      }
      continue;
    }
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      log::Warning("Unix socket ", path_, ": SO_PEERCRED: ", std::strerror(errno));
      close(conn);
      continue;
    }
    if (const std::string why = Refusal(conn, cred.uid); !why.empty()) {
      close(conn);
      const int64_t now = absl::ToUnixSeconds(absl::Now());
      if (now - last_warning_s_ >= 60) {
        last_warning_s_ = now;
        log::Warning("Unix socket ", path_, ": a connection of uid ", cred.uid, " (pid ", cred.pid,
                     ") was closed at once: ", why,
                     "; clients should share connections (more are closed likewise, logged at "
                     "most once a minute)");
      }
      continue;
    }
    struct stat st;
    if (fstat(conn, &st) == 0) {
      open_.push_back(
          Open{conn, static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), cred.uid});
    }
    // Recorded before gRPC can read a byte of the connection.
    identity_->SetUnixPeer(conn, tenants::PeerCredentials{cred.uid, cred.gid, cred.pid});
    grpc::AddInsecureChannelFromFd(server_, conn);
  }
}

}  // namespace gpuexec::rpc
