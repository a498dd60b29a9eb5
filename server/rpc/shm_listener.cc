#include "server/rpc/shm_listener.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gpuexec/v1/gpuexec.pb.h"
#include "server/common/log.h"
#include "server/common/thread_name.h"
#include "server/rpc/unix_listener.h"
#include "server/shm/region_fd.h"
#include "server/tenants/tenants.h"

namespace gpuexec::rpc {
namespace {

namespace v1 = ::gpuexec::v1;

// The longest request taken: a session token and a size need far less.
constexpr size_t kMaxRequestBytes = 1024;

void Send(int conn, const v1::RegisterRegionResponse& r) {
  const std::string out = r.SerializeAsString();
  (void)::send(conn, out.data(), out.size(), MSG_NOSIGNAL);
}

void Answer(int conn, const absl::Status& status, uint64_t region, uint64_t bytes) {
  v1::RegisterRegionResponse r;
  r.set_code(static_cast<int>(status.code()));
  // Messages name the limit or the object; they are bounded all the same.
  r.set_message(std::string(status.message().substr(0, 2048)));
  r.set_region(region);
  r.set_bytes(bytes);
  Send(conn, r);
}

// One registration's answer, which may come after the connection's
// thread stopped waiting for it.
struct Pending {
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::StatusOr<core::RegionInfo> result ABSL_GUARDED_BY(mu);
};

}  // namespace

absl::StatusOr<std::unique_ptr<ShmListener>> ShmListener::Start(const std::string& path,
                                                                const std::string& group,
                                                                core::Engine* engine,
                                                                Identity* identity,
                                                                CommandRingServer* rings) {
  absl::StatusOr<int> bound = BindUnixSocket(path, group, SOCK_SEQPACKET);
  if (!bound.ok()) {
    return absl::Status(bound.status().code(),
                        absl::StrCat("--shm_socket: ", bound.status().message()));
  }
  const int wake = eventfd(0, EFD_CLOEXEC);
  if (wake < 0) {
    const int e = errno;
    unlink(path.c_str());
    close(*bound);
    return absl::UnavailableError(absl::StrCat("--shm_socket: eventfd: ", std::strerror(e)));
  }
  return std::unique_ptr<ShmListener>(new ShmListener(path, *bound, wake, engine, identity, rings));
}

ShmListener::ShmListener(std::string path, int fd, int wake_fd, core::Engine* engine,
                         Identity* identity, CommandRingServer* rings)
    : path_(std::move(path)),
      fd_(fd),
      wake_fd_(wake_fd),
      engine_(engine),
      identity_(identity),
      rings_(rings) {
  thread_ = std::thread(&ShmListener::AcceptLoop, this);
}

ShmListener::~ShmListener() {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (int conn : conns_) ::shutdown(conn, SHUT_RDWR);
  }
  for (ConnThread& t : threads_) t.thread.join();
  unlink(path_.c_str());
  close(fd_);
  close(wake_fd_);
}

void ShmListener::AcceptLoop() {
  NameThisThread("gx-shm");
  while (true) {
    pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      log::Error("host memory socket ", path_, ": poll: ", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int conn = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        log::Warning("host memory socket ", path_, ": accept: ", std::strerror(errno));
        poll(nullptr, 0, 100);  // out of descriptors, say: do not spin
      }
      continue;
    }
    ucred peer{};
    socklen_t len = sizeof(peer);
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) {
      log::Warning("host memory socket ", path_, ": SO_PEERCRED: ", std::strerror(errno));
      close(conn);
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      int& of_uid = serving_uid_[peer.uid];
      if (serving_ >= kMaxConnections || of_uid >= kMaxConnectionsPerUid) {
        // A fresh connection's buffer is empty: this send does not wait.
        Answer(conn,
               absl::ResourceExhaustedError(absl::StrCat(
                   "the host memory socket serves ", kMaxConnections, " connections at once, ",
                   kMaxConnectionsPerUid, " of one uid; try again")),
               0, 0);
        if (of_uid == 0) serving_uid_.erase(peer.uid);
        close(conn);
        continue;
      }
      ++of_uid;
      ++serving_;
      conns_.push_back(conn);
    }
    // Threads that finished are joined here, so that they never pile up.
    threads_.erase(std::remove_if(threads_.begin(), threads_.end(),
                                  [](ConnThread& t) {
                                    if (!t.done->load()) return false;
                                    t.thread.join();
                                    return true;
                                  }),
                   threads_.end());
    auto done = std::make_shared<std::atomic<bool>>(false);
    threads_.push_back(ConnThread{std::thread([this, conn, peer, done] {
                                    Serve(conn, peer);
                                    done->store(true);
                                  }),
                                  done});
  }
}

void ShmListener::Serve(int conn, ucred peer) {
  NameThisThread("gx-shm-conn");
  timeval idle{static_cast<time_t>(absl::ToInt64Seconds(kIdleTimeout)), 0};
  setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &idle, sizeof(idle));
  setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &idle, sizeof(idle));
  while (true) {
    char data[kMaxRequestBytes];
    int fd = -1;
    absl::StatusOr<size_t> n = shm::ReceiveWithDescriptor(conn, data, sizeof(data), &fd);
    if (n.ok() && *n == 0) {
      if (fd >= 0) close(fd);
      break;  // the client is done
    }
    if (!n.ok()) {
      // A refused message (too long, too many descriptors) is answered; a
      // broken or idle connection is not.
      if (n.status().code() == absl::StatusCode::kInvalidArgument) {
        Answer(
            conn,
            absl::InvalidArgumentError(absl::StrCat("host memory socket: ", n.status().message())),
            0, 0);
        continue;
      }
      break;
    }
    // Identified for each message, not once per connection: a reload of
    // the tenants file takes effect for the next registration.
    const absl::StatusOr<core::Caller> caller =
        identity_->IdentifyUnixPeer(tenants::PeerCredentials{peer.uid, peer.gid, peer.pid});
    v1::RegisterRegionRequest request;
    absl::Status refused;
    if (!caller.ok()) {
      refused = caller.status();
    } else if (!request.ParseFromArray(data, static_cast<int>(*n))) {
      refused = absl::InvalidArgumentError(
          "host memory socket: the message is not a RegisterRegionRequest");
    } else if (fd < 0) {
      refused = absl::InvalidArgumentError(
          "host memory socket: no descriptor came with the request; pass the region's memfd "
          "with SCM_RIGHTS");
    }
    if (!refused.ok()) {
      if (fd >= 0) close(fd);
      Answer(conn, refused, 0, 0);
      continue;
    }
    if (request.has_command_ring()) {
      absl::Status st = rings_ == nullptr
                            ? absl::FailedPreconditionError(
                                  "this daemon serves no command rings (it runs with "
                                  "--command_rings=false); use the Execute stream")
                            : rings_->Adopt(*caller, request.session(), conn, fd, request.bytes(),
                                            request.command_ring(), Send);
      close(fd);  // mapped, if served
      if (st.ok()) {
        // The connection is the ring's lifeline now, no longer this
        // listener's: it stops counting against the registration slots.
        absl::MutexLock lock(&mu_);
        conns_.erase(std::find(conns_.begin(), conns_.end(), conn));
        --serving_;
        if (--serving_uid_[peer.uid] == 0) serving_uid_.erase(peer.uid);
        return;
      }
      Answer(conn, st, 0, 0);
      continue;
    }
    auto pending = std::make_shared<Pending>();
    engine_->RegisterRegion(*caller, request.session(), fd, request.bytes(),
                            [pending](absl::StatusOr<core::RegionInfo> r) {
                              absl::MutexLock lock(&pending->mu);
                              pending->result = std::move(r);
                              pending->done = true;
                            });
    absl::StatusOr<core::RegionInfo> result;
    {
      const absl::Time deadline = absl::Now() + kRegisterTimeout;
      absl::MutexLock lock(&pending->mu);
      // Looked at again every 100 ms: the daemon may be stopping.
      while (!pending->done && absl::Now() < deadline) {
        pending->mu.AwaitWithTimeout(absl::Condition(&pending->done), absl::Milliseconds(100));
        if (pending->done) break;
        absl::MutexLock stop(&mu_);
        if (stopping_) break;
      }
      result = pending->done ? pending->result
                             : absl::DeadlineExceededError(
                                   absl::StrCat("RegisterRegion did not finish within ",
                                                absl::FormatDuration(kRegisterTimeout),
                                                "; the region is released when the session ends"));
    }
    if (result.ok()) {
      Answer(conn, absl::OkStatus(), result->handle, result->bytes);
    } else {
      Answer(conn, result.status(), 0, 0);
    }
  }
  absl::MutexLock lock(&mu_);
  conns_.erase(std::find(conns_.begin(), conns_.end(), conn));
  close(conn);
  --serving_;
  if (--serving_uid_[peer.uid] == 0) serving_uid_.erase(peer.uid);
}

}  // namespace gpuexec::rpc
